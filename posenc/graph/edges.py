"""Validation and small utilities for graph input: ``edge_index``, batch vectors, symmetry.

Every graph function of :mod:`posenc.graph` checks its input here, so that bad input fails with
one clear message naming the argument, the offending value and what was expected, instead of an
index error deep inside a kernel.

Conventions (those of PyTorch Geometric): ``edge_index`` is a ``long`` tensor ``[2, E]`` of
(source, target) pairs in ``[0, num_nodes)``; an undirected graph lists each edge in both
directions; a batch vector ``[N]`` gives the graph id of each node, sorted ascending (as in a PyG
``Batch``).

Under ``torch.compile`` the checks that read tensor values (index ranges, sortedness, edges
between graphs) are skipped: each would be a host sync and a graph break in every compiled
forward. Run the model once eagerly on your data to have them; the shape and dtype checks
always run.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_edge_index(edge_index: Tensor, num_nodes: int, *, name: str = "edge_index") -> None:
    """Raise a ``TypeError``/``ValueError`` unless ``edge_index`` is a long ``[2, E]`` tensor with
    values in ``[0, num_nodes)``.

    Args:
        edge_index: the edges to check.
        num_nodes: the number of nodes ``N`` (an int >= 0).
        name: the argument name used in error messages.
    """
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 0:
        raise ValueError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [2, num_edges], got {type(edge_index).__name__}")
    if edge_index.dtype != torch.long:
        raise TypeError(f"{name} must have dtype torch.long (int64), got {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"{name} must have shape [2, num_edges], got {tuple(edge_index.shape)}")
    if edge_index.numel() == 0 or torch.compiler.is_compiling():
        return
    low, high = int(edge_index.min()), int(edge_index.max())
    if low < 0:
        col = int((edge_index < 0).any(0).nonzero()[0])
        raise ValueError(
            f"{name} has a negative node index {low} (first at edge {col}: "
            f"{tuple(edge_index[:, col].tolist())}); indices must be in [0, num_nodes={num_nodes})"
        )
    if high >= num_nodes:
        col = int((edge_index >= num_nodes).any(0).nonzero()[0])
        raise ValueError(
            f"{name} has node index {high} out of range (first at edge {col}: "
            f"{tuple(edge_index[:, col].tolist())}); indices must be in [0, num_nodes={num_nodes})"
        )


def check_edge_weight(edge_weight: Tensor | None, num_edges: int, *, name: str = "edge_weight") -> None:
    """``edge_weight`` is None or a floating ``[E]`` tensor of finite, non-negative values."""
    if edge_weight is None:
        return
    if not isinstance(edge_weight, Tensor) or not edge_weight.dtype.is_floating_point:
        what = edge_weight.dtype if isinstance(edge_weight, Tensor) else type(edge_weight).__name__
        raise TypeError(f"{name} must be a floating-point tensor [num_edges], got {what}")
    if edge_weight.shape != (num_edges,):
        raise ValueError(f"{name} must have shape [num_edges={num_edges}], got {tuple(edge_weight.shape)}")
    if num_edges and not torch.compiler.is_compiling() and not bool(torch.isfinite(edge_weight).all() and (edge_weight >= 0).all()):
        raise ValueError(f"{name} must hold finite, non-negative weights")


def check_batch(batch: Tensor, num_graphs: int | None = None, *, name: str = "batch") -> int:
    """Check a batch vector ``[N]`` (long, sorted graph ids >= 0) and return the number of graphs
    (``num_graphs`` when given, else ``batch.max() + 1``)."""
    if not isinstance(batch, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [num_nodes] of graph ids, got {type(batch).__name__}")
    if batch.dtype != torch.long:
        raise TypeError(f"{name} must have dtype torch.long (int64), got {batch.dtype}")
    if batch.dim() != 1:
        raise ValueError(f"{name} must have shape [num_nodes], got {tuple(batch.shape)}")
    # Under compile the value checks are skipped, and the graph count is read from the data only
    # when num_graphs is not given (a compiled caller passes it).
    compiling = torch.compiler.is_compiling()
    seen = int(batch.max()) + 1 if batch.numel() and not (compiling and num_graphs is not None) else 0
    if batch.numel() and not compiling:
        if int(batch.min()) < 0:
            raise ValueError(f"{name} has a negative graph id {int(batch.min())}; ids must be >= 0")
        if bool((batch[1:] < batch[:-1]).any()):
            at = int((batch[1:] < batch[:-1]).nonzero()[0]) + 1
            raise ValueError(f"{name} must be sorted (nodes of one graph together, as in a PyG Batch); "
                             f"it decreases at node {at}")
    if num_graphs is None:
        return seen
    if not isinstance(num_graphs, int) or num_graphs < seen:
        raise ValueError(f"num_graphs must be an int >= the largest graph id + 1 ({seen}), got {num_graphs!r}")
    return num_graphs


def check_same_graph(edge_index: Tensor, batch: Tensor, *, name: str = "edge_index") -> None:
    """Every edge joins two nodes of the same graph of ``batch``."""
    if torch.compiler.is_compiling():
        return
    if edge_index.numel() and bool((batch[edge_index[0]] != batch[edge_index[1]]).any()):
        col = int((batch[edge_index[0]] != batch[edge_index[1]]).nonzero()[0])
        u, v = edge_index[:, col].tolist()
        raise ValueError(f"{name} edge {col} ({u}, {v}) joins graph {int(batch[u])} to graph {int(batch[v])}; "
                         "edges must stay inside one graph of the batch")


def _edge_keys(edge_index: Tensor, num_nodes: int) -> Tensor:
    return edge_index[0] * max(num_nodes, 1) + edge_index[1]


def is_undirected(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None) -> bool:
    """True when every edge ``(u, v)`` has its reverse ``(v, u)`` (with the same total weight)."""
    keys = _edge_keys(edge_index, num_nodes)
    rkeys = _edge_keys(edge_index.flip(0), num_nodes)
    if edge_weight is None:
        return bool(torch.equal(torch.unique(keys), torch.unique(rkeys)))
    # Sum duplicate weights per key, forward and reversed, and compare.
    uniq, inv = torch.unique(torch.cat([keys, rkeys]), return_inverse=True)
    fwd = torch.zeros(len(uniq), dtype=edge_weight.dtype, device=edge_weight.device)
    bwd = torch.zeros_like(fwd)
    fwd.index_add_(0, inv[: len(keys)], edge_weight)
    bwd.index_add_(0, inv[len(keys):], edge_weight)
    return bool(torch.allclose(fwd, bwd))


def symmetrize(
    edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """The undirected version of a graph: the union of its edges and their reverses, each once
    per direction (duplicates merged). With weights, ``(u, v)`` and ``(v, u)`` both get
    ``max(w(u, v), w(v, u))`` (PyG's ``to_undirected`` sums instead, which doubles the weight of an
    edge already listed both ways). Returns ``(edge_index, edge_weight)`` sorted by source."""
    both = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    keys = _edge_keys(both, num_nodes)
    uniq, inv = torch.unique(keys, return_inverse=True)
    out = torch.stack([uniq // max(num_nodes, 1), uniq % max(num_nodes, 1)])
    if edge_weight is None:
        return out, None
    w = torch.cat([edge_weight, edge_weight])
    merged = torch.full((len(uniq),), float("-inf"), dtype=w.dtype, device=w.device)
    merged = merged.scatter_reduce(0, inv, w, reduce="amax")
    return out, merged


def require_undirected(
    edge_index: Tensor,
    num_nodes: int,
    edge_weight: Tensor | None = None,
    *,
    symmetrize_graph: bool = False,
    what: str = "this encoding",
    name: str = "edge_index",
) -> tuple[Tensor, Tensor | None]:
    """Return the graph when it is undirected; symmetrise it when ``symmetrize_graph``; raise a
    ``ValueError`` otherwise (an encoding defined on undirected graphs only)."""
    if symmetrize_graph:
        return symmetrize(edge_index, num_nodes, edge_weight)
    if not is_undirected(edge_index, num_nodes, edge_weight):
        raise ValueError(
            f"{what} needs an undirected graph, but {name} is directed (some edge (u, v) has no reverse "
            "(v, u) of equal weight); pass symmetrize=True to add the reverse edges, or fix the input"
        )
    return edge_index, edge_weight


def graph_sizes(batch: Tensor, num_graphs: int) -> Tensor:
    """Nodes per graph ``[G]`` of a sorted batch vector."""
    return torch.bincount(batch, minlength=num_graphs)


def local_index(batch: Tensor, sizes: Tensor) -> Tensor:
    """Index of each node within its own graph ``[N]`` (batch sorted)."""
    ptr = torch.cumsum(sizes, 0) - sizes
    return torch.arange(batch.numel(), device=batch.device) - ptr[batch]


def dense_adjacency_stack(
    edge_index: Tensor,
    edge_weight: Tensor,
    batch: Tensor,
    local: Tensor,
    graphs: Tensor,
    size: int,
    num_graphs: int,
    *,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """Dense adjacency ``[len(graphs), size, size]`` of the listed graphs of a batch (duplicate
    edges summed; nodes past a graph's own size are isolated padding), and ``slot [num_graphs]``:
    the position of each listed graph in the stack (-1 for the others).

    Args:
        edge_index: edges of the whole batch ``[2, E]``.
        edge_weight: their weights ``[E]``.
        batch: graph id of every node ``[N]``.
        local: index of every node within its graph ``[N]``.
        graphs: ids of the graphs to stack, each with at most ``size`` nodes.
    """
    device = edge_index.device
    slot = torch.full((num_graphs,), -1, dtype=torch.long, device=device)
    slot[graphs] = torch.arange(len(graphs), device=device)
    edge_slot = slot[batch[edge_index[0]]]
    keep = edge_slot >= 0
    adj = torch.zeros(len(graphs), size, size, dtype=dtype, device=device)
    adj.index_put_(
        (edge_slot[keep], local[edge_index[0, keep]], local[edge_index[1, keep]]),
        edge_weight[keep].to(dtype),
        accumulate=True,
    )
    return adj, slot
