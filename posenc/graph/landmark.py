"""Landmark (anchor) distance encoding: each node's shortest-path distances to ``k`` anchor nodes.

You et al. 2019, Position-aware Graph Neural Networks (P-GNN), https://arxiv.org/abs/1906.04817;
Li et al. 2020, Distance Encoding, https://arxiv.org/abs/2009.00142.

``LM(u) = [f(d(u, a_1)), ..., f(d(u, a_k))]`` with ``f(d) = 1 / (d + 1)`` (P-GNN's transform:
1 at the anchor itself, towards 0 far away) and ``f = 0`` where the anchor is unreachable from
``u``; ``d(u, a)`` is the hop count along edge direction from ``u`` to ``a`` (the same both ways in
an undirected graph, which lists each edge in both directions).

Anchors, chosen per graph (``anchors=``):

* ``"degree"``: the ``k`` nodes of largest out-degree (edges listed with the node as source:
  self-loops and duplicate edges count), ties broken by the lower node index, in that order
  (column ``j`` is the ``j``-th largest degree);
* ``"random"``: ``k`` distinct nodes uniformly at random, in draw order: one uniform key per node
  is drawn in node order from ``generator`` (torch's global RNG when None) and each graph takes
  the nodes of its ``k`` smallest keys. Per-graph calls in order with one generator therefore
  equal one batched call (the same stream of keys);
* an explicit ``[G, k]`` long tensor of local node indices (``-1``: no anchor, a zero column).

Equivariance: the features permute with the nodes only when the anchor choice does. ``"degree"``
does so when the ``k`` largest degrees are distinct and the ``k``-th is larger than the next; with
ties the lower *index* wins, which depends on the node order and breaks equivariance (as do the
random draws for any one fixed node order; they are equivariant in distribution only).

Graphs with fewer than ``k`` nodes: the batched function and the transforms zero-pad (the
missing anchor columns are 0, the value of an unreachable anchor), so that every node has ``k``
features and graphs of any size batch together. The single-graph :func:`landmark_pe` raises
instead unless ``pad=True``: asking one graph for more anchors than it has nodes is an error there.

Computation: breadth-first search from the anchors only (``k`` searches per graph, not ``N``),
batched over graphs of similar size by :func:`~posenc.graph.shortest_path.shortest_path_distances_batch`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..common.checks import check_int
from ..primitives.budget import check_allocation
from .edges import check_batch, check_edge_index, check_same_graph, graph_sizes, local_index
from .shortest_path import check_sources, shortest_path_distances_batch

AnchorMethod = Literal["degree", "random"]
ANCHOR_METHODS = ("degree", "random")


def _check_k(k: object) -> None:
    check_int("k (the number of anchors)", k, minimum=1)


def landmark_features(distances: Tensor) -> Tensor:
    """``1 / (d + 1)`` of integer hop distances (any shape), ``0`` where ``d = -1`` (unreachable
    or no anchor); float32."""
    if not isinstance(distances, Tensor) or distances.dtype.is_floating_point or distances.dtype == torch.bool:
        what = distances.dtype if isinstance(distances, Tensor) else type(distances).__name__
        raise ValueError(f"distances must be an integer tensor of hop counts (-1: unreachable); got {what}")
    d = distances.to(torch.float32)
    return torch.where(distances >= 0, 1.0 / (d + 1.0), torch.zeros_like(d))


def select_anchors(
    edge_index: Tensor,
    batch: Tensor,
    k: int,
    *,
    anchors: AnchorMethod = "degree",
    generator: torch.Generator | None = None,
    num_graphs: int | None = None,
) -> Tensor:
    """The anchors of every graph of a batch: ``[G, k]`` long local node indices, ``-1`` in the
    columns past a graph's size. See the module docstring for ``anchors`` and ``generator``."""
    _check_k(k)
    if anchors not in ANCHOR_METHODS:
        raise ValueError(f"anchors must be one of {ANCHOR_METHODS} or a [num_graphs, k] tensor; got {anchors!r}")
    num_graphs = check_batch(batch, num_graphs)
    num_nodes = batch.numel()
    check_edge_index(edge_index, num_nodes)
    device = batch.device
    if anchors == "degree":
        deg = torch.bincount(edge_index[0], minlength=num_nodes)
        key = -deg.to(torch.float64)  # the largest degree first
    else:
        key = torch.rand(num_nodes, generator=generator, dtype=torch.float64).to(device)
    # Sort by (graph, key, node index): a stable sort by key keeps the lower index first on ties,
    # then a stable sort by graph groups the graphs and keeps that order inside each.
    order = torch.argsort(key, stable=True)
    order = order[torch.argsort(batch[order], stable=True)]
    sizes = graph_sizes(batch, num_graphs)
    ptr = torch.cumsum(sizes, 0) - sizes
    graph = batch[order]
    rank = torch.arange(num_nodes, device=device) - ptr[graph]
    keep = rank < k
    out = torch.full((num_graphs, k), -1, dtype=torch.long, device=device)
    out[graph[keep], rank[keep]] = local_index(batch, sizes)[order[keep]]
    return out


def landmark_pe_batch(
    edge_index: Tensor,
    batch: Tensor,
    k: int,
    *,
    anchors: AnchorMethod | Tensor = "degree",
    generator: torch.Generator | None = None,
    num_graphs: int | None = None,
) -> Tensor:
    """Landmark distances of every graph of a batch (``data.edge_index``, ``data.batch`` of a PyG
    ``Batch``), graphs with fewer than ``k`` nodes zero-padded.

    Args:
        edge_index: ``[2, E]`` long, edges inside graphs (directed allowed).
        batch: ``[N]`` sorted graph id per node.
        k: anchors per graph (>= 1).
        anchors: "degree", "random" or a ``[G, k]`` long tensor of local indices (-1: none).
        generator: random source of ``"random"`` (global RNG when None).
        num_graphs: ``G`` (default ``batch.max() + 1``).

    Returns:
        ``[N, k]`` float32 on the device of ``edge_index``: ``1 / (d(u, a_j) + 1)``, 0 where
        ``a_j`` is unreachable from ``u`` or missing.
    """
    _check_k(k)
    num_graphs = check_batch(batch, num_graphs)
    largest = int(graph_sizes(batch, num_graphs).max()) if batch.numel() else 0
    check_allocation(f"landmark_pe(k={k}): the anchor distances [graphs={num_graphs}, k, nmax={largest}]",
                     (num_graphs, k, largest), torch.long, edge_index.device)
    check_allocation(f"landmark_pe(k={k}): the encodings [N={batch.numel()}, k]", (batch.numel(), k), torch.float32,
                     edge_index.device)
    check_edge_index(edge_index, batch.numel())
    check_same_graph(edge_index, batch)
    if isinstance(anchors, Tensor):
        if anchors.dim() != 2 or anchors.shape[1] != k:
            raise ValueError(f"anchors must be [num_graphs={num_graphs}, k={k}] local node indices; got "
                             f"{tuple(anchors.shape)}")
        check_sources(anchors, graph_sizes(batch, num_graphs), name="anchors")
        chosen = anchors
    else:
        chosen = select_anchors(edge_index, batch, k, anchors=anchors, generator=generator, num_graphs=num_graphs)
    # d(u, a) along the edges = d(a, u) in the reversed graph: one search from each anchor.
    dist = shortest_path_distances_batch(edge_index.flip(0), batch, num_graphs=num_graphs, sources=chosen)
    local = local_index(batch, graph_sizes(batch, num_graphs))
    return landmark_features(dist[batch, :, local])  # [N, k]


def landmark_pe(
    edge_index: Tensor,
    num_nodes: int,
    k: int,
    *,
    anchors: AnchorMethod | Tensor = "degree",
    generator: torch.Generator | None = None,
    pad: bool = False,
) -> Tensor:
    """Landmark distances of one graph: ``[N, k]`` float32 (see :func:`landmark_pe_batch`).

    Args:
        anchors: "degree", "random" or a ``[k]`` (or ``[1, k]``) long tensor of node indices.
        pad: allow ``k > num_nodes`` (the columns past ``num_nodes`` are zero); otherwise that is
            a ValueError.
    """
    _check_k(k)
    check_edge_index(edge_index, num_nodes)
    if k > num_nodes and not pad:
        raise ValueError(f"k={k} anchors asked of a graph with {num_nodes} nodes; pass pad=True to zero-pad the "
                         "missing anchors (the transforms and the batched function always pad)")
    if isinstance(anchors, Tensor) and anchors.dim() == 1:
        anchors = anchors.unsqueeze(0)
    batch = torch.zeros(num_nodes, dtype=torch.long, device=edge_index.device)
    return landmark_pe_batch(edge_index, batch, k, anchors=anchors, generator=generator, num_graphs=1)


__all__ = ["ANCHOR_METHODS", "landmark_features", "landmark_pe", "landmark_pe_batch", "select_anchors"]
