"""Shortest-path distances and the Graphormer shortest-path bias (``spd``).

Ying et al. 2021, Do Transformers Really Perform Bad for Graph Representation?,
https://arxiv.org/abs/2106.05234.

``bias(h, u, v) = b[bucket(d(u, v)), h]``: one learned scalar per distance bucket and head, where
``bucket(d) = min(d, max_distance)`` for reachable pairs and ``max_distance + 1`` for unreachable
ones (and for pairs of different graphs, which a block-diagonal mask hides anyway).

How the graph structure reaches the bias (explicit, no ``N_total x N_total`` tensor): a batch of
graphs is attended as ONE packed sequence of all nodes ``[1, N, C]`` with the block-diagonal mask
``AttentionMask.packed(batch[None])``. The positions of node ``u`` (graph ``g``, local index
``i``) are the integer row

    ``pos[u] = [g, i, d(i, 0), d(i, 1), ..., d(i, nmax - 1)]``  (``-1``: unreachable or padding)

so ``q_pos = kv_pos = spd_positions(batch, distances)`` is ``[1, N, 2 + nmax]``: the node's own
row of its graph's distance matrix. The bias of (query ``u``, key ``w``) reads
``q_pos[u, 2 + kv_pos[w, 1]]``, the distance from ``u`` to the local index of ``w``; memory is
``N * nmax`` (the size of the per-graph distance stack ``[G, nmax, nmax]``), never ``N^2``.
The same function serves the dense, math and flex kernel paths.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_int, check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, gather
from ..common.registry import register
from ..primitives.budget import check_allocation
from .edges import check_batch, check_edge_index, check_same_graph, dense_adjacency_stack, graph_sizes, local_index

#: Single graphs up to this size use the batched breadth-first search on CPU under "auto";
#: larger ones ``scipy.sparse.csgraph``.
BFS_MAX_NODES = 512

_METHODS = ("auto", "bfs", "scipy")


def _bfs(adj: Tensor, sizes: Tensor | None = None, sources: Tensor | None = None) -> Tensor:
    """Hop distances of a stack ``adj [g, n, n]`` (bool, True for an edge source -> target) by
    breadth-first search with batched products: ``[g, n, n]`` int64, ``-1`` where unreachable.
    ``sizes [g]``: nodes past a graph's size are padding (all ``-1``, also on the diagonal).
    ``sources [g, s]``: search from these local nodes only (``-1``: none, a row of ``-1``) and
    return ``[g, s, n]``, the distances from each source."""
    g, n, _ = adj.shape
    step = adj.to(torch.float32)
    if sources is None:
        frontier = torch.eye(n, dtype=torch.bool, device=adj.device).expand(g, n, n).clone()
        if sizes is not None:
            real = torch.arange(n, device=adj.device) < sizes.unsqueeze(1)  # [g, n]
            frontier &= real.unsqueeze(2)
    else:
        frontier = torch.zeros(g, sources.shape[1], n, dtype=torch.bool, device=adj.device)
        gi, si = (sources >= 0).nonzero(as_tuple=True)
        frontier[gi, si, sources[gi, si]] = True
    dist = torch.full(frontier.shape, -1, dtype=torch.long, device=adj.device)
    dist[frontier] = 0
    hops = 0
    while bool(frontier.any()):
        hops += 1
        reached = torch.bmm(frontier.to(torch.float32), step) > 0
        frontier = reached & (dist < 0)
        dist[frontier] = hops
    return dist


def _scipy_distances(edge_index: Tensor, num_nodes: int) -> Tensor:
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.csgraph import shortest_path

    ei = edge_index.cpu().numpy()
    adj = sp.coo_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(num_nodes, num_nodes)).tocsr()
    dist = shortest_path(adj, method="D", directed=True, unweighted=True)
    out = np.where(np.isinf(dist), -1, dist).astype(np.int64)
    return torch.from_numpy(out).to(edge_index.device)


def shortest_path_distances(edge_index: Tensor, num_nodes: int, *, method: str = "auto") -> Tensor:
    """Hop distances ``[N, N]`` (int64) of one graph along edge direction (source -> target);
    ``-1`` where unreachable, ``0`` on the diagonal. An undirected graph lists both directions.

    Args:
        method: "bfs" (batched boolean products, any device), "scipy" (``scipy.sparse.csgraph``
            breadth-first search, computed on CPU) or "auto" (bfs up to :data:`BFS_MAX_NODES`
            nodes or off CPU, else scipy).
    """
    check_edge_index(edge_index, num_nodes)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}")
    check_allocation(f"shortest_path_distances(num_nodes={num_nodes}): the distance matrix [N, N]",
                     (num_nodes, num_nodes), torch.long, edge_index.device)
    if method == "scipy" or (method == "auto" and edge_index.device.type == "cpu" and num_nodes > BFS_MAX_NODES):
        return _scipy_distances(edge_index, num_nodes)
    adj = torch.zeros(1, num_nodes, num_nodes, dtype=torch.bool, device=edge_index.device)
    adj[0, edge_index[0], edge_index[1]] = True
    return _bfs(adj)[0]


def check_sources(sources: Tensor, sizes: Tensor, *, name: str = "sources") -> None:
    """``sources`` is a long ``[G, s]`` tensor of local node indices of each graph (``sizes [G]``
    nodes), ``-1`` for none."""
    g = sizes.shape[0]
    if not isinstance(sources, Tensor) or sources.dtype != torch.long or sources.dim() != 2 or sources.shape[0] != g:
        what = f"{sources.dtype} {tuple(sources.shape)}" if isinstance(sources, Tensor) else type(sources).__name__
        raise ValueError(f"{name} must be a long tensor [num_graphs={g}, num_sources] of local node indices "
                         f"(-1 for none); got {what}")
    bad = (sources < -1) | (sources >= sizes.unsqueeze(1))
    if sources.numel() and bool(bad.any()):
        gi, si = bad.nonzero()[0].tolist()
        raise ValueError(f"{name}[{gi}, {si}] = {int(sources[gi, si])} is not a node of graph {gi} "
                         f"(local indices 0..{int(sizes[gi]) - 1}, or -1 for none)")


def shortest_path_distances_batch(
    edge_index: Tensor, batch: Tensor, *, num_graphs: int | None = None, sources: Tensor | None = None
) -> Tensor:
    """Per-graph hop distances of a batch as one stack ``[G, nmax, nmax]`` (int64, ``-1`` where
    unreachable and in the padding past each graph's size), computed by a batched breadth-first
    search on the device of ``edge_index``; graphs are grouped by size (rounded up to a multiple
    of 8) so that small graphs do not pay for the largest one.

    ``sources [G, s]`` (long, local node indices, ``-1`` for none): search from those nodes only
    and return ``[G, s, nmax]``, row ``j`` the distances from graph ``g``'s ``sources[g, j]`` to
    each of its nodes (all ``-1`` for a ``-1`` source); ``s`` searches instead of ``nmax``."""
    num_graphs = check_batch(batch, num_graphs)
    num_nodes = batch.numel()
    check_edge_index(edge_index, num_nodes)
    check_same_graph(edge_index, batch)
    device = edge_index.device
    sizes = graph_sizes(batch, num_graphs)
    if sources is not None:
        check_sources(sources, sizes)
    local = local_index(batch, sizes)
    nmax = int(sizes.max()) if num_graphs else 0
    rows = nmax if sources is None else sources.shape[1]
    check_allocation(f"shortest_path_distances_batch: the distance stack [graphs={num_graphs}, rows={rows}, nmax={nmax}]",
                     (num_graphs, rows, nmax), torch.long, device)
    out = torch.full((num_graphs, rows, nmax), -1, dtype=torch.long, device=device)
    bucket = (sizes + 7) // 8 * 8
    ones = torch.ones(edge_index.shape[1], device=device)
    for size in torch.unique(bucket).tolist():
        if size == 0:
            continue
        graphs = (bucket == size).nonzero().squeeze(1)
        adj, _ = dense_adjacency_stack(edge_index, ones, batch, local, graphs, size, num_graphs)
        dist = _bfs(adj > 0, sizes[graphs], None if sources is None else sources[graphs])
        width = min(size, nmax)
        if sources is None:
            out[graphs, :width, :width] = dist[:, :width, :width]
        else:
            out[graphs, :, :width] = dist[:, :, :width]
    return out


def spd_positions(batch: Tensor, distances: Tensor) -> Tensor:
    """Positions for the ``spd`` bias over a packed batch: ``[1, N, 2 + nmax]`` int64 rows
    ``[graph id, local index, distance row...]`` (see the module docstring); pass them as both
    ``q_pos`` and ``kv_pos``, with the mask ``AttentionMask.packed(batch[None])``.

    Args:
        batch: ``[N]`` sorted graph id per node.
        distances: ``[G, nmax, nmax]`` from :func:`shortest_path_distances_batch` (or one graph's
            ``[N, N]`` from :func:`shortest_path_distances`, with ``batch`` all zeros).
    """
    if distances.dim() == 2:
        distances = distances.unsqueeze(0)
    if distances.dim() != 3 or distances.shape[1] != distances.shape[2] or distances.dtype.is_floating_point:
        raise ValueError(f"distances must be an integer [graphs, nmax, nmax] (or [N, N]) tensor, got "
                         f"{distances.dtype} {tuple(distances.shape)}")
    num_graphs = check_batch(batch, distances.shape[0])
    sizes = graph_sizes(batch, num_graphs)
    if num_graphs and int(sizes.max()) > distances.shape[1]:
        raise ValueError(f"batch has a graph of {int(sizes.max())} nodes but distances cover only nmax="
                         f"{distances.shape[1]} nodes per graph")
    local = local_index(batch, sizes)
    rows = distances[batch, local].to(torch.long)
    return torch.cat([batch.unsqueeze(1), local.unsqueeze(1), rows], dim=1).unsqueeze(0)


@register(
    "spd",
    modality="graph",
    paper="Ying et al. 2021, Do Transformers Really Perform Bad for Graph Representation? (Graphormer), "
    "https://arxiv.org/abs/2106.05234",
    summary="learned scalar per (shortest-path distance bucket, head) on the scores; unreachable bucket",
)
class ShortestPathBias(PositionEncoding):
    """Graphormer's spatial encoding: ``score(u, w) += b[bucket(d(u, w)), h]``.

    Args:
        num_heads: heads ``H``.
        max_distance: distances beyond it share its bucket; ``max_distance + 1`` is the bucket of
            unreachable pairs (and of pairs from different graphs).
        init_std: the table starts as ``N(0, init_std^2)`` (Graphormer: 0.02).

    Positions ``[B or 1, T, 2 + nmax]`` int64 from :func:`spd_positions` (``q_pos`` and
    ``kv_pos`` alike; see the module docstring). Hook: score bias, a learned ``[max_distance + 2,
    H]`` table. Kernel: dense bias into SDPA (chunked on CPU), FlexAttention ``score_mod`` on
    CUDA, math path; use the block-diagonal mask ``AttentionMask.packed(batch[None])``.
    """

    hooks = frozenset({Hook.SCORE_BIAS})

    def __init__(self, num_heads: int, max_distance: int = 20, init_std: float = 0.02) -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        check_int("max_distance", max_distance, minimum=0)
        check_number("init_std", init_std, minimum=0.0)
        self.num_heads, self.max_distance = num_heads, max_distance
        self.weight = nn.Parameter(torch.randn(max_distance + 2, num_heads) * init_std)

    @property
    def unreachable_bucket(self) -> int:
        return self.max_distance + 1

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        for name, p in (("q_pos", q_pos), ("kv_pos", kv_pos)):
            if p.dim() != 3 or p.shape[2] < 3 or p.dtype.is_floating_point or p.dtype == torch.bool:
                raise ValueError(
                    f"spd needs integer positions [batch or 1, nodes, 2 + nmax] from spd_positions "
                    f"(graph id, local index, distance row); {name} is {p.dtype} {tuple(p.shape)}"
                )
        width = q_pos.shape[2] - 2
        if not torch.compiler.is_compiling() and kv_pos.numel() and int(kv_pos[..., 1].max()) >= width:
            raise ValueError(
                f"spd: kv_pos has local index {int(kv_pos[..., 1].max())} but q_pos carries distance rows "
                f"of only {width} entries; build both with spd_positions from one distance stack"
            )
        for name, p in (("q_pos", q_pos), ("kv_pos", kv_pos)):
            # a local index of -1 would read the graph-id column as a distance: a silent wrong bias
            if not torch.compiler.is_compiling() and p.numel() and int(p[..., 1].min()) < 0:
                raise ValueError(
                    f"spd: {name} has local index {int(p[..., 1].min())} (column 1 of the positions); local indices "
                    f"are >= 0 (build the positions with spd_positions)"
                )
        weight, cap, unreachable = self.weight, self.max_distance, self.max_distance + 1
        q_batched, kv_batched = q_pos.shape[0] > 1, kv_pos.shape[0] > 1

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bq = b if q_batched else b * 0
            bk = b if kv_batched else b * 0
            key_local = kv_pos[bk, kv_idx, 1]
            dist = q_pos[bq, q_idx, key_local + 2]
            same_graph = q_pos[bq, q_idx, 0] == kv_pos[bk, kv_idx, 0]
            bucket = torch.where(same_graph & (dist >= 0), dist.clamp(max=cap), unreachable)
            return gather(weight, bucket, h)

        per_batch = q_batched or kv_batched
        return PairwiseBias(bias, per_batch=per_batch, learned=(weight,), name="spd")
