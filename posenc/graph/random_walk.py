"""Random-walk structural encoding (RWSE).

Dwivedi et al. 2022, Graph Neural Networks with Learnable Structural and Positional
Representations, https://arxiv.org/abs/2110.07875; GraphGPS uses ``K = 20``.

``RWSE(u) = [(P^1)_uu, ..., (P^K)_uu]`` with ``P = D^-1 A`` (``D`` the out-degree, self-loops kept,
edge weights summed): the probability that a random walk from ``u`` is back at ``u`` after
``k`` steps. As in PyG's ``AddRandomWalkPE`` the degree is clamped at 1, so an isolated node has a
row of zeros and encoding ``0``.

Computation, on the device of ``edge_index``:

* small graphs (dense): one chain of batched matrix products over a stack ``[G, n, n]`` of the
  graphs of equal size;
* large graphs (sparse): blocks of columns of the identity pushed through sparse products.

For an undirected graph ``P = D^-1/2 S D^1/2`` with the symmetric ``S = D^-1/2 A D^-1/2``, so
``diag(P^k) = diag(S^k)``, and with ``X_m = S^m e_u``: ``(S^2m)_uu = ||X_m||^2`` and
``(S^(2m+1))_uu = <X_m, X_(m+1)>``: ``K/2`` products instead of ``K``. A directed graph uses
``(P^(a+b))_uu = <(P^T)^a e_u, P^b e_u>`` (``K`` products).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

Method = Literal["auto", "dense", "sparse"]

#: Graphs with at least this many nodes use the blocked sparse path under ``method="auto"``.
SPARSE_MIN_NODES = 1000


def random_walk_se(
    edge_index: Tensor,
    num_nodes: int,
    walk_length: int,
    *,
    edge_weight: Tensor | None = None,
    method: Method = "auto",
    block_size: int | None = None,
) -> Tensor:
    """RWSE of one graph.

    Args:
        edge_index: ``[2, E]`` long (directed graphs are allowed).
        num_nodes: ``N``.
        walk_length: ``K >= 1``.
        edge_weight: optional ``[E]`` non-negative weights.
        method: "dense", "sparse" or "auto" (sparse from :data:`SPARSE_MIN_NODES` nodes).
        block_size: identity columns per sparse block (default: sized to about 256 MB of work memory).

    Returns:
        ``[N, K]`` float32 on the device of ``edge_index``.
    """
    raise NotImplementedError


def random_walk_se_batch(
    edge_index: Tensor,
    batch: Tensor,
    walk_length: int,
    *,
    num_graphs: int | None = None,
    edge_weight: Tensor | None = None,
    method: Method = "auto",
) -> Tensor:
    """RWSE of every graph of a batch at once (``data.edge_index``, ``data.batch`` of a PyG ``Batch``).

    Returns:
        ``[N, K]`` float32.
    """
    raise NotImplementedError
