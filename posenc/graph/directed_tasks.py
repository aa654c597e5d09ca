"""A generated task on directed graphs, where the direction of the edges decides the answer: the
depth of each node of a random DAG (:func:`dag_depth_dataset`).

Each graph is a random DAG whose hidden topological order is a random permutation of its nodes
(an edge ``u -> v`` exists with probability ``edge_prob`` when ``u`` comes before ``v``); the target
of node ``v`` is the length of the longest directed path ending at ``v`` (0 for a source), capped
at ``max_depth``. The node features are constant, so a model knows a node only by its place in the
graph. Reversing every edge changes the answer (sources become sinks) while the undirected graph,
hence LapPE, stays the same: an attention-only model with LapPE cannot tell a node's depth from its
height, one with the magnetic Laplacian (whose phases follow the edges' direction) can.
"""

from __future__ import annotations

import torch

from . import pyg as _pyg  # noqa: F401  (first: PyG without its import-time FutureWarning)

# isort: split
from torch_geometric.data import Data

from ..common.checks import check_int, check_number


def dag_depth_graph(num_nodes: int, *, edge_prob: float = 0.15, max_depth: int = 5,
                    generator: torch.Generator | None = None) -> Data:
    """One random DAG: ``Data(x=ones [n, 1], edge_index [2, E] (directed), y [n] long, num_nodes=n)``."""
    check_int("num_nodes", num_nodes, minimum=1)
    check_number("edge_prob", edge_prob, minimum=0.0, maximum=1.0)
    check_int("max_depth", max_depth, minimum=1)
    order = torch.randperm(num_nodes, generator=generator)  # order[r] is the node of rank r
    upper = torch.rand(num_nodes, num_nodes, generator=generator) < edge_prob
    upper = torch.triu(upper, diagonal=1)  # rank a -> rank b, a < b
    ranks_from, ranks_to = upper.nonzero(as_tuple=True)
    depth = torch.zeros(num_nodes, dtype=torch.long)  # by rank
    for b in range(num_nodes):  # ranks in order: every predecessor is final before b
        before = ranks_from[ranks_to == b]
        if before.numel():
            depth[b] = int(depth[before].max()) + 1
    y = torch.empty(num_nodes, dtype=torch.long)
    y[order] = depth.clamp(max=max_depth)
    edge_index = torch.stack([order[ranks_from], order[ranks_to]])
    return Data(x=torch.ones(num_nodes, 1), edge_index=edge_index, y=y, num_nodes=num_nodes)


def dag_depth_dataset(count: int, *, min_nodes: int = 12, max_nodes: int = 24, edge_prob: float = 0.15,
                      max_depth: int = 5, seed: int = 0) -> list[Data]:
    """``count`` graphs of :func:`dag_depth_graph` with ``min_nodes .. max_nodes`` nodes, from a
    generator seeded with ``seed`` (the same list for the same arguments). Classes ``0 ..
    max_depth``: a node task (``y`` per node)."""
    check_int("count", count, minimum=1)
    check_int("min_nodes", min_nodes, minimum=1)
    check_int("max_nodes", max_nodes, minimum=min_nodes)
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(min_nodes, max_nodes + 1, (count,), generator=gen).tolist()
    return [dag_depth_graph(n, edge_prob=edge_prob, max_depth=max_depth, generator=gen) for n in sizes]


__all__ = ["dag_depth_dataset", "dag_depth_graph"]
