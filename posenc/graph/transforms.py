"""PyG transforms: drop-in replacements for ``AddLaplacianEigenvectorPE`` and ``AddRandomWalkPE``,
and the same encodings for a whole ``Batch`` at once.

Same constructor arguments and attribute conventions as PyG: the result is stored as
``data[attr_name]`` (defaults ``"laplacian_eigenvector_pe"`` and ``"random_walk_pe"``), or
concatenated to ``data.x`` when ``attr_name=None``.
"""

from __future__ import annotations

from typing import Any

from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform


class AddLaplacianPE(BaseTransform):
    """Laplacian eigenvector PE (:func:`posenc.graph.laplacian_pe`), drop-in for PyG's
    ``AddLaplacianEigenvectorPE(k, attr_name, is_undirected)``.

    Args:
        k: number of non-trivial eigenvectors.
        attr_name: where to store ``[N, k]`` (None: concatenate to ``data.x``).
        is_undirected: accepted for compatibility; the graph is checked either way and a directed
            one raises unless ``symmetrize``.
        random_sign: flip each eigenvector's sign at random (PyG does); False keeps eigsh's signs.
        eigenvalues_attr: also store ``[N, k]`` eigenvalues (per node) under this name.
        normalization, symmetrize, method: as in :func:`~posenc.graph.laplacian_pe`.
    """

    def __init__(
        self,
        k: int,
        attr_name: str | None = "laplacian_eigenvector_pe",
        is_undirected: bool = False,
        *,
        random_sign: bool = True,
        eigenvalues_attr: str | None = None,
        normalization: str | None = "sym",
        symmetrize: bool = False,
        method: str = "auto",
    ) -> None:
        raise NotImplementedError

    def forward(self, data: Data) -> Data:
        raise NotImplementedError


class AddRandomWalkSE(BaseTransform):
    """Random-walk SE (:func:`posenc.graph.random_walk_se`), drop-in for PyG's
    ``AddRandomWalkPE(walk_length, attr_name)``; stores ``[N, walk_length]`` float32."""

    def __init__(self, walk_length: int, attr_name: str | None = "random_walk_pe", *, method: str = "auto") -> None:
        raise NotImplementedError

    def forward(self, data: Data) -> Data:
        raise NotImplementedError


def add_laplacian_pe_batch(
    data: Any,
    k: int,
    attr_name: str | None = "laplacian_eigenvector_pe",
    *,
    random_sign: bool = True,
    eigenvalues_attr: str | None = None,
    normalization: str | None = "sym",
    symmetrize: bool = False,
    method: str = "auto",
) -> Any:
    """:class:`AddLaplacianPE` for a whole PyG ``Batch`` at once (one batched eigensolve per graph
    size); returns ``data`` with the attribute set."""
    raise NotImplementedError


def add_random_walk_se_batch(
    data: Any, walk_length: int, attr_name: str | None = "random_walk_pe", *, method: str = "auto"
) -> Any:
    """:class:`AddRandomWalkSE` for a whole PyG ``Batch`` at once."""
    raise NotImplementedError
