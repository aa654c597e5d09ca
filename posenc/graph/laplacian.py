"""Laplacian eigenvector positional encoding (LapPE).

Dwivedi et al. 2020, Benchmarking Graph Neural Networks, https://arxiv.org/abs/2003.00982;
with eigenvalues as in SAN (Kreuzer et al. 2021) and GraphGPS (Rampasek et al. 2022).

``L = I - D^-1/2 A D^-1/2`` (``normalization="sym"``, the default), ``L = D - A`` (``None``,
combinatorial) or ``L = I - D^-1 A`` (``"rw"``). Self-loops are ignored and a node of degree 0
gets ``D^-1/2 = 0`` (so ``L_ii = 1`` for an isolated node under "sym" and "rw"), exactly as PyG's
``get_laplacian``. The encoding of node ``u`` is ``[v_2(u), ..., v_(k+1)(u)]``: the eigenvectors of
the ``k`` smallest eigenvalues after dropping the first one (ascending order), PyG's
``AddLaplacianEigenvectorPE`` convention. Only the single first eigenvector is dropped, also for a
disconnected graph (whose eigenvalue 0 repeats once per component): the values then equal PyG's
up to sign and, inside a repeated eigenvalue, up to a rotation of the eigenspace (any orthonormal
basis of it is as valid). A graph with ``n <= k`` nodes has only ``n - 1`` such eigenvectors; the
remaining columns are zero (PyG returns fewer columns there, which cannot be batched).

Computation: batched dense ``torch.linalg.eigh`` for small graphs (graphs of equal size share one
call), ``scipy.sparse.linalg.eigsh`` for large graphs on CPU and ``torch.lobpcg`` on an
accelerator; all on the device of ``edge_index``.

Eigenvectors are defined up to sign: :func:`random_sign_flip` flips them at random per training
step, or :class:`~posenc.graph.signnet.SignNet` makes the model invariant to the sign.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Normalization = Literal["sym", "rw"] | None
Method = Literal["auto", "dense", "sparse"]

#: Graphs with at least this many nodes use the sparse eigensolver under ``method="auto"``.
SPARSE_MIN_NODES = 400


def laplacian(
    edge_index: Tensor,
    num_nodes: int,
    *,
    normalization: Normalization = "sym",
    edge_weight: Tensor | None = None,
) -> Tensor:
    """The dense Laplacian ``[N, N]`` (float32, or the weights' dtype) of one graph."""
    raise NotImplementedError


def laplacian_pe(
    edge_index: Tensor,
    num_nodes: int,
    k: int,
    *,
    normalization: Normalization = "sym",
    edge_weight: Tensor | None = None,
    symmetrize: bool = False,
    method: Method = "auto",
) -> tuple[Tensor, Tensor]:
    """LapPE of one graph.

    Args:
        edge_index: ``[2, E]`` long, undirected (both directions listed).
        num_nodes: ``N``.
        k: number of non-trivial eigenvectors.
        normalization: "sym" (default), "rw" or None (combinatorial ``D - A``).
        edge_weight: optional ``[E]`` non-negative weights.
        symmetrize: add missing reverse edges instead of raising for a directed graph.
        method: "dense" (``torch.linalg.eigh``), "sparse" (eigsh / LOBPCG) or "auto" (sparse from
            :data:`SPARSE_MIN_NODES` nodes).

    Returns:
        ``(vecs [N, k], vals [k])``, float32 on the device of ``edge_index``; columns past
        ``N - 1`` are zero (``vals`` too). Unit-norm eigenvectors (for "rw", the right eigenvectors
        of ``I - D^-1 A``, normalised to unit norm).
    """
    raise NotImplementedError


def laplacian_pe_batch(
    edge_index: Tensor,
    batch: Tensor,
    k: int,
    *,
    num_graphs: int | None = None,
    normalization: Normalization = "sym",
    edge_weight: Tensor | None = None,
    symmetrize: bool = False,
    method: Method = "auto",
) -> tuple[Tensor, Tensor]:
    """LapPE of every graph of a batch at once (a PyG ``Batch``: ``data.edge_index``, ``data.batch``).

    Graphs of equal size share one batched ``eigh`` call (no padding, so no foreign eigenpairs);
    graphs of :data:`SPARSE_MIN_NODES` nodes or more go to the sparse solver one by one.

    Returns:
        ``(vecs [N, k], vals [G, k])``; per-node eigenvalues are ``vals[batch]``.
    """
    raise NotImplementedError


def random_sign_flip(vecs: Tensor, *, generator: torch.Generator | None = None, num_vecs: int | None = None) -> Tensor:
    """Multiply each eigenvector column by an independent random sign.

    Args:
        vecs: ``[..., T, F]``; the first ``num_vecs`` features (default all) are eigenvectors and
            flipped per leading index (one sign per column and sequence: per batch row, as
            GraphGPS flips one sign per eigenvector and batch); later features (eigenvalues) are kept.
        generator: the random source (default torch's global one).
    """
    raise NotImplementedError
