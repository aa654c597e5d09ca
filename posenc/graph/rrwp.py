"""Relative random-walk probabilities (RRWP; GRIT, Ma et al. 2023, Graph Inductive Biases in
Transformers without Message Passing, ICML, https://arxiv.org/abs/2305.20082).

For every pair of nodes ``(u, v)`` of a graph, ``RRWP(u, v) = [I_uv, M_uv, (M^2)_uv, ...,
(M^(K-1))_uv]`` with ``M = D^-1 A``: the probability that a random walk from ``u`` stands on ``v``
after ``0 .. K-1`` steps. ``D^-1 A`` (row-stochastic), not ``A D^-1``: a row of ``M^k`` is the
distribution of the walk's position, which is what "the probability from ``u`` to ``v``" means
(GRIT's ``add_full_rrwp`` normalises the rows as well). The diagonal is the same for both (the
two are similar matrices), and it is posenc's RWSE shifted by one step: ``RRWP(u, u) = [1,
RWSE(u)_1, ..., RWSE(u)_(K-1)]``. ``D`` is the weighted out-degree with self-loops kept and
duplicate edges summed, clamped at 1 as in RWSE (an isolated node's row of ``M`` is zero:
``RRWP(u, u) = [1, 0, ...]``); a directed graph walks along its edges (source -> target).

Sparse: only the pairs within ``K - 1`` hops can be non-zero, and only those are returned, as
``(pairs [2, P], values [P, K])`` sorted by source then target (every node's own pair included).
On a graph whose ``(K-1)``-hop balls are small this is far less than ``N^2 K``; on a graph of small
diameter (a random graph of mean degree 10: every pair lies within 5 hops) the support is every
pair, and the values alone are ``N^2 K`` floats (a 10,000-node graph, ``K = 20``: 8 GB), which
:func:`rrwp` estimates and refuses before allocating when it cannot fit.

Computation: small graphs (and the graphs of a batch, stacked by size) by dense powers ``M^k``;
large graphs by blocks of source nodes, ``X_(k+1) = X_k M`` as sparse x dense products (a block's
``K`` rows of ``[|B|, N]``), keeping the block's support only; blocks and size chunks are spread
over the CPU threads as in :mod:`posenc.graph.random_walk`.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import Tensor

from ..common.checks import check_int
from ..primitives.budget import check_allocation
from ._threads import batch_parts, run_items, single_threaded
from .edges import check_batch, check_edge_index, check_edge_weight, check_same_graph, graph_sizes, local_index
from .random_walk import _csr, _transition_weights

#: Graphs with at least this many nodes use the blocked sparse path under ``method="auto"``.
SPARSE_MIN_NODES = 1000

#: Source nodes per block of the sparse path: a block keeps ``K`` rows of ``[|B|, N]`` float32
#: (about this many bytes), at least :data:`MIN_BLOCK` nodes.
BLOCK_BYTES = 16 << 20
MIN_BLOCK = 8

#: Small graphs of a batch are padded up to a multiple of this many nodes and stacked by size,
#: in chunks of at most :data:`CHUNK_ENTRIES` adjacency entries.
SIZE_BUCKET = 8
CHUNK_ENTRIES = 1 << 15

_METHODS = ("auto", "dense", "sparse")


def _check_options(walk_length: int, method: str) -> None:
    check_int("walk_length", walk_length, minimum=1)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}")


def _dense_powers(adj: Tensor, deg: Tensor, walk_length: int) -> Tensor:
    """``[g, K, n, n]``: ``M^0 .. M^(K-1)`` of a stack ``adj [g, n, n]`` (weights summed), ``M = A /
    deg`` with ``deg [g, n]`` (clamped degrees, 1 on padding)."""
    mat = adj / deg.unsqueeze(-1)
    g, n, _ = adj.shape
    out = adj.new_empty((g, walk_length, n, n))
    out[:, 0] = torch.eye(n, dtype=adj.dtype, device=adj.device)
    for k in range(1, walk_length):
        out[:, k] = out[:, k - 1] @ mat
    return out


def _pairs_of_stack(powers: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The support of a stack of powers ``[g, K, n, n]`` among the real nodes ``real [g, n]``:
    ``(slot, source, target, values [P, K])`` in row-major order."""
    support = (powers != 0).any(1) & real.unsqueeze(2) & real.unsqueeze(1)  # [g, n, n]
    slot, src, dst = support.nonzero(as_tuple=True)
    return slot, src, dst, powers[slot, :, src, dst]


class _Blocks:
    """The sparse RRWP of one large graph, by blocks of source nodes (each independent)."""

    def __init__(self, edge_index: Tensor, w: Tensor, deg: Tensor, num_nodes: int, walk_length: int):
        row, col = edge_index
        self.num_nodes, self.walk_length = num_nodes, walk_length
        self.transposed = _csr(col, row, w / deg[row], num_nodes)  # M^T: X M = (M^T X^T)^T

    def block(self, start: int, end: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(source, target, values [P, K])`` of the sources ``start .. end``."""
        width, n = end - start, self.num_nodes
        device = self.transposed.device
        cols = torch.zeros(n, width, device=device)  # X_0^T: the identity columns of the block
        cols[torch.arange(start, end, device=device), torch.arange(width, device=device)] = 1.0
        steps = torch.empty(self.walk_length, width, n, device=device)  # [K, |B|, N]
        steps[0] = cols.T
        for k in range(1, self.walk_length):
            cols = self.transposed @ cols
            steps[k] = cols.T
        b, dst = (steps != 0).any(0).nonzero(as_tuple=True)  # row-major: by source, then target
        return b + start, dst, steps[:, b, dst].T


def _block_size(num_nodes: int, walk_length: int) -> int:
    return max(MIN_BLOCK, min(num_nodes, BLOCK_BYTES // (4 * walk_length * max(num_nodes, 1))))


def _refuse_huge(what: str, num_nodes: int, walk_length: int, device) -> None:
    """``walk_length`` or a graph too large for even the node PE, refused with the estimate;
    the pairs themselves are counted as they come (:func:`_check_growth`)."""
    check_allocation(f"{what}: the diagonal [N={num_nodes}, K={walk_length}]", (num_nodes, walk_length),
                     torch.float32, device)
    check_allocation(f"{what}: one step of a block of sources [K={walk_length}, {MIN_BLOCK}, N={num_nodes}]",
                     (walk_length, MIN_BLOCK, num_nodes), torch.float32, device)


def _check_growth(what: str, done_sources: int, all_sources: int, pairs: int, walk_length: int, device) -> None:
    """Refuse, with the estimate, a support that will not fit: ``pairs`` found for the first
    ``done_sources`` of ``all_sources`` sources, extrapolated. A pair is two int64 ids and ``K``
    float32 values (``K + 4`` floats), held twice at the peak where the blocks come out of order
    (a batch: the support and its sorted copy); counted twice always, as the order is known late."""
    if done_sources == 0:
        return
    expected = pairs * all_sources // done_sources
    check_allocation(f"{what}: the pairs within {walk_length - 1} hops (about {expected} of them, extrapolated from "
                     f"{done_sources} of {all_sources} sources), twice at the peak [2, P, K + 4]",
                     (2, expected, walk_length + 4), torch.float32, device)


def rrwp(
    edge_index: Tensor,
    num_nodes: int,
    walk_length: int,
    *,
    edge_weight: Tensor | None = None,
    method: str = "auto",
) -> tuple[Tensor, Tensor]:
    """RRWP of one graph over its ``(K-1)``-hop support.

    Args:
        edge_index: ``[2, E]`` long (directed graphs walk along their edges).
        num_nodes: ``N``.
        walk_length: ``K >= 1``, the features per pair (``M^0 .. M^(K-1)``; GRIT uses 8 to 21).
        edge_weight: optional ``[E]`` non-negative weights (``M_uv = w_uv / D_u``).
        method: "dense" (``M``'s powers, ``N x N`` each), "sparse" (blocks of sources) or "auto"
            (sparse from :data:`SPARSE_MIN_NODES` nodes).

    Returns:
        ``(pairs [2, P], values [P, K])``: long and float32, on the device of ``edge_index``,
        sorted by source then target; ``values[:, 0]`` is 1 on the diagonal pairs, 0 elsewhere.
    """
    _check_options(walk_length, method)
    check_edge_index(edge_index, num_nodes)
    check_edge_weight(edge_weight, edge_index.shape[1])
    what = f"rrwp(num_nodes={num_nodes}, walk_length={walk_length})"
    _refuse_huge(what, num_nodes, walk_length, edge_index.device)
    batch = torch.zeros(num_nodes, dtype=torch.long, device=edge_index.device)
    return _rrwp_parts(edge_index, batch, 1, walk_length, edge_weight, method, what)


def rrwp_batch(
    edge_index: Tensor,
    batch: Tensor,
    walk_length: int,
    *,
    num_graphs: int | None = None,
    edge_weight: Tensor | None = None,
    method: str = "auto",
) -> tuple[Tensor, Tensor]:
    """RRWP of every graph of a batch at once (``data.edge_index``, ``data.batch`` of a PyG
    ``Batch``): the small graphs stacked by size (one chain of batched products per chunk), the
    large ones by blocks of sources. Arguments as :func:`rrwp`; ``batch [N]`` sorted graph ids.

    Returns ``(pairs [2, P], values [P, K])`` over the whole batch (global node ids, pairs inside a
    graph only), sorted by source then target."""
    _check_options(walk_length, method)
    num_graphs = check_batch(batch, num_graphs)
    check_edge_index(edge_index, batch.numel())
    check_edge_weight(edge_weight, edge_index.shape[1])
    check_same_graph(edge_index, batch)
    what = f"rrwp_batch(walk_length={walk_length})"
    _refuse_huge(what, batch.numel(), walk_length, edge_index.device)
    return _rrwp_parts(edge_index, batch, num_graphs, walk_length, edge_weight, method, what)


def _rrwp_parts(
    edge_index: Tensor, batch: Tensor, num_graphs: int, walk_length: int, edge_weight: Tensor | None, method: str,
    what: str,
) -> tuple[Tensor, Tensor]:
    device = edge_index.device
    num_nodes = batch.numel()
    with single_threaded(device) as count:
        w, deg = _transition_weights(edge_index, num_nodes, edge_weight)
        sizes = graph_sizes(batch, num_graphs)
        local = local_index(batch, sizes)

        def sparse(n: int) -> bool:
            return method == "sparse" or (method == "auto" and n >= SPARSE_MIN_NODES)

        split = batch_parts(edge_index, batch, local, sizes.tolist(), sparse,
                            lambda n: -(-n // SIZE_BUCKET) * SIZE_BUCKET, CHUNK_ENTRIES)
        # (cost, sources, compute -> (source, target, values))
        tasks: list[tuple[float, int, Callable[[], tuple[Tensor, Tensor, Tensor]]]] = []
        for p, (part, edges, nodes) in enumerate(zip(split.parts, split.edges, split.nodes)):
            if part[0] == "dense":
                _, size, graphs = part
                check_allocation(f"{what}: the powers of {len(graphs)} graph(s) of {size} nodes [g, K, n, n]",
                                 (len(graphs), walk_length, size, size), torch.float32, device)
                tasks.append((len(graphs) * float(size) ** 3 * walk_length, nodes.numel(),
                              partial(_dense_part, split, p, w, deg, nodes, walk_length)))
                continue
            first, n = int(nodes[0]), nodes.numel()  # a graph's nodes are contiguous (sorted batch)
            walk = _Blocks(local[edge_index[:, edges]], w[edges], deg[first: first + n], n, walk_length)
            size = _block_size(n, walk_length)
            for s in range(0, n, size):
                end = min(n, s + size)
                tasks.append((float(edges.numel() + n) * walk_length * (end - s), end - s,
                              partial(_shifted, walk.block, s, end, first)))
        order = sorted(range(len(tasks)), key=lambda i: -tasks[i][0])  # the largest first
        found: list[tuple[Tensor, Tensor, Tensor]] = [None] * len(tasks)  # type: ignore[list-item]
        done = pairs = 0
        # in rounds, so that a support too large to keep is refused early, with an estimate
        step = max(1, 4 * count)
        for start in range(0, len(order), step):
            chunk = order[start: start + step]
            for i, result in zip(chunk, run_items([tasks[i][2] for i in chunk], count)):
                found[i] = result
                done += tasks[i][1]
                pairs += result[0].numel()
            _check_growth(what, done, num_nodes, pairs, walk_length, device)
        pairs, values = _assemble(found, walk_length, device)
        code = pairs[0] * max(num_nodes, 1) + pairs[1]
        if code.numel() > 1 and not bool((code[1:] >= code[:-1]).all()):  # (one large graph's blocks come in order)
            key = torch.argsort(code)
            pairs, values = pairs[:, key], values[key]
    return pairs, values


def _assemble(found: list, walk_length: int, device) -> tuple[Tensor, Tensor]:
    """The blocks' pairs ``[2, P]`` and values ``[P, K]`` in block order, each block copied in and
    released at once: the peak is one copy of the support, not the blocks beside their concatenation."""
    total = sum(int(f[0].numel()) for f in found)
    pairs = torch.empty(2, total, dtype=torch.long, device=device)
    values = torch.empty(total, walk_length, dtype=found[0][2].dtype if found else torch.float32, device=device)
    at = 0
    for i, (src, dst, vals) in enumerate(found):
        n = src.numel()
        pairs[0, at: at + n], pairs[1, at: at + n], values[at: at + n] = src, dst, vals
        at += n
        found[i] = None  # type: ignore[call-overload]
    return pairs, values


def _dense_part(split, p: int, w: Tensor, deg: Tensor, nodes: Tensor, walk_length: int) -> tuple[Tensor, Tensor, Tensor]:
    """The pairs of one dense chunk of a batch, in global node ids."""
    _, size, graphs = split.parts[p]
    adj = split.dense_stack(p, w, torch.float32)  # [g, size, size]
    flat = split.node_flat[nodes]  # each node's row in the flattened stack
    padded_deg = torch.ones(len(graphs) * size, device=adj.device)
    padded_deg[flat] = deg[nodes]
    node_of = torch.full((len(graphs) * size,), -1, dtype=torch.long, device=adj.device)
    node_of[flat] = nodes
    real = (node_of >= 0).view(len(graphs), size)
    slot, src, dst, values = _pairs_of_stack(_dense_powers(adj, padded_deg.view(len(graphs), size), walk_length), real)
    return node_of[slot * size + src], node_of[slot * size + dst], values


def _shifted(block: Callable, start: int, end: int, first: int) -> tuple[Tensor, Tensor, Tensor]:
    src, dst, values = block(start, end)
    return src + first, dst + first, values


def rrwp_diagonal(pairs: Tensor, values: Tensor, num_nodes: int) -> Tensor:
    """The node-level RRWP ``[N, K]``: the values of the pairs ``(u, u)`` (posenc's RWSE shifted by
    one step, after a leading 1)."""
    _check_pairs(pairs, values, num_nodes)
    own = pairs[0] == pairs[1]
    out = values.new_zeros(num_nodes, values.shape[1])
    out[pairs[0, own]] = values[own]
    return out


def _check_pairs(pairs: Tensor, values: Tensor, num_nodes: int) -> None:
    if not isinstance(pairs, Tensor) or pairs.dtype != torch.long or pairs.dim() != 2 or pairs.shape[0] != 2:
        raise ValueError(f"pairs must be a long tensor [2, P] (rrwp's first output); got "
                         f"{getattr(pairs, 'dtype', type(pairs).__name__)} {tuple(getattr(pairs, 'shape', ()))}")
    if not isinstance(values, Tensor) or values.dim() != 2 or values.shape[0] != pairs.shape[1] \
            or not values.is_floating_point():
        raise ValueError(f"values must be a float tensor [P={pairs.shape[1]}, K] (rrwp's second output); got "
                         f"{getattr(values, 'dtype', type(values).__name__)} {tuple(getattr(values, 'shape', ()))}")
    check_edge_index(pairs, num_nodes, name="pairs")


def rrwp_positions(batch: Tensor, pairs: Tensor, values: Tensor, *, num_graphs: int | None = None) -> Tensor:
    """Positions of the ``rrwp`` encoding over a packed batch: ``[1, N, 2 + nmax K]`` float32 rows
    ``[graph id, local index, RRWP(u, v_0), ..., RRWP(u, v_(nmax-1))]`` (``v_t`` the node of local
    index ``t`` of ``u``'s graph; zeros outside the support and past the graph's size): each node
    carries its own row of its graph's pair features, ``N nmax K`` numbers in all, never ``N^2``.
    Pass them as ``q_pos`` and ``kv_pos`` with the mask ``AttentionMask.packed(batch[None])``.

    Args:
        batch: ``[N]`` sorted graph id per node.
        pairs, values: :func:`rrwp_batch`'s output for this batch (or :func:`rrwp`'s for one graph,
            with ``batch`` all zeros).
    """
    num_graphs = check_batch(batch, num_graphs)
    num_nodes = batch.numel()
    _check_pairs(pairs, values, num_nodes)
    check_same_graph(pairs, batch, name="pairs")
    sizes = graph_sizes(batch, num_graphs)
    nmax = int(sizes.max()) if num_graphs else 0
    walk_length = values.shape[1]
    check_allocation(f"rrwp_positions: the rows [N={num_nodes}, 2 + nmax={nmax} x K={walk_length}]",
                     (num_nodes, 2 + nmax * walk_length), torch.float32, batch.device)
    local = local_index(batch, sizes)
    out = torch.zeros(num_nodes, nmax, walk_length, device=batch.device)
    out[pairs[0], local[pairs[1]]] = values.to(torch.float32)
    head = torch.stack([batch, local], dim=1).to(torch.float32)
    return torch.cat([head, out.view(num_nodes, -1)], dim=1).unsqueeze(0)


__all__ = ["rrwp", "rrwp_batch", "rrwp_diagonal", "rrwp_positions"]
