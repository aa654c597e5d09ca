"""PyG transforms: drop-in replacements for ``AddLaplacianEigenvectorPE`` and ``AddRandomWalkPE``,
the landmark-distance encoding (:class:`AddLandmarkPE`), and the same encodings for a whole
``Batch`` at once.

Same constructor arguments and attribute conventions as PyG: the result is stored as
``data[attr_name]`` (defaults ``"laplacian_eigenvector_pe"``, ``"random_walk_pe"`` and
``"landmark_pe"``), or concatenated to ``data.x`` when ``attr_name=None``. Values equal PyG's
(LapPE up to sign, and up to a rotation inside a repeated eigenvalue). Differences, on purpose:

* concatenated to an integer ``data.x`` (node labels), ``x`` becomes float32 (PyG casts the
  encoding to the integer dtype, which truncates it); a floating ``x`` keeps its dtype;
* a graph with ``n <= k`` nodes gets ``k`` columns, the missing ones zero (PyG returns ``n - 1``
  columns, which cannot be batched);
* a directed graph raises for LapPE unless ``symmetrize=True`` (PyG's ``is_undirected=False``
  runs a non-symmetric eigensolver and keeps the real part, which is not a Laplacian PE);
* duplicate edges are summed for RWSE on every graph size (PyG's dense path, used up to 2,000
  nodes, keeps one copy; its sparse path sums);
* with ``edge_weight``, RWSE uses ``P_uv = w_uv / D_u`` (PyG puts ``1 / D_u`` in every entry);
* concatenated to an integer or bool ``data.x`` (atom types, one-hot flags), the features become
  float32 first (PyG casts the encodings to ``x``'s dtype, which truncates them to zeros); a
  floating ``x`` keeps its dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import pyg as _pyg  # noqa: F401  (first: PyG without its import-time FutureWarning)

# isort: split
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from ..common.checks import check_bool, check_int
from .landmark import ANCHOR_METHODS, landmark_pe, landmark_pe_batch
from .laplacian import check_eigsh_options, laplacian_pe, laplacian_pe_batch
from .random_walk import random_walk_se, random_walk_se_batch

#: Where ``eigenvalues=True`` stores the per-node eigenvalues ``[N, k]`` by default (read by
#: ``posenc.graph.node_positions`` for the ``lap`` encoding).
EIGENVALUES_ATTR = "laplacian_eigenvalues"


def _store(data: Any, value: Tensor, attr_name: str | None) -> Any:
    """PyG's attribute convention: ``data[attr_name] = value``, or concatenate to ``data.x`` (in
    ``x``'s dtype when it is floating, else in the encoding's float32: never truncated to integers)."""
    if attr_name is None:
        x = getattr(data, "x", None)
        if x is not None:
            x = x.view(-1, 1) if x.dim() == 1 else x
            dtype = x.dtype if x.is_floating_point() else value.dtype
            data.x = torch.cat([x.to(dtype), value.to(x.device, dtype)], dim=-1)
        else:
            data.x = value
    else:
        data[attr_name] = value
    return data


def _random_signs(rows: int, k: int, device: torch.device) -> Tensor:
    return (torch.randint(0, 2, (rows, k)) * 2 - 1).to(device, torch.float32)


def _check_k(name: str, value: int) -> None:
    check_int(name, value, minimum=1)


def _store_eigenpairs(data: Any, vecs: Tensor, per_node: Tensor | None, attr_name: str | None,
                      eigenvalues_attr: str | None) -> Any:
    """Store eigenvectors ``vecs [N, k]`` under ``attr_name`` and, unless ``per_node`` is None, each
    node's eigenvalues ``per_node [N, k]`` under ``eigenvalues_attr``; with ``attr_name=None`` both
    go onto ``data.x``, the eigenvalues after the vectors (the order the node encodings read)."""
    if per_node is None:
        return _store(data, vecs, attr_name)
    if attr_name is None:
        return _store(data, torch.cat([vecs, per_node], dim=-1), None)
    data[eigenvalues_attr] = per_node
    return _store(data, vecs, attr_name)


def _check_attr(name: str, value: str | None) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be an attribute name (str) or None; got {value!r}")


class AddLaplacianPE(BaseTransform):
    """Laplacian eigenvector PE (:func:`posenc.graph.laplacian_pe`), drop-in for PyG's
    ``AddLaplacianEigenvectorPE(k, attr_name, is_undirected, **kwargs)``: stores ``[N, k]`` float32,
    and with ``eigenvalues=True`` the eigenvalues too, which the ``lap`` encoding reads
    (``LapPE(use_eigenvalues=True)``, the default) and PyG's transform does not give.

    Args:
        k: number of non-trivial eigenvectors.
        attr_name: where to store ``[N, k]`` (None: concatenate to ``data.x``).
        is_undirected: accepted for compatibility; the graph is checked either way and a directed
            one raises unless ``symmetrize``.
        eigenvalues: also store the ``k`` eigenvalues of each node's graph, ``[N, k]`` float32:
            under ``eigenvalues_attr``, or, with ``attr_name=None``, concatenated to ``data.x``
            after the eigenvectors (``x = [x, vecs, vals]``: the layout ``lap`` reads).
        eigenvalues_attr: the attribute of the eigenvalues (default ``"laplacian_eigenvalues"``,
            where :func:`posenc.graph.node_positions` looks); giving it implies ``eigenvalues``.
        random_sign: flip each eigenvector's sign at random (torch's global RNG, as PyG does);
            False keeps the deterministic signs of :func:`~posenc.graph.laplacian_pe`.
        normalization: as in :func:`~posenc.graph.laplacian_pe`, like ``symmetrize`` and ``method``.
        **kwargs: keyword arguments of ``scipy.sparse.linalg.eigsh``, as PyG's transform takes
            them: ``tol``, ``maxiter``, ``ncv``, ``v0`` (validated here). They apply where eigsh
            runs: graphs of at least ``SPARSE_MIN_NODES`` nodes on CPU (``method="auto"``), or every
            graph larger than ``3 (k + 1)`` with ``method="sparse"``; smaller graphs are solved
            densely (PyG: below 100 nodes).
    """

    def __init__(
        self,
        k: int,
        attr_name: str | None = "laplacian_eigenvector_pe",
        is_undirected: bool = False,
        *,
        eigenvalues: bool = False,
        eigenvalues_attr: str | None = None,
        random_sign: bool = True,
        normalization: str | None = "sym",
        symmetrize: bool = False,
        method: str = "auto",
        **kwargs: Any,
    ) -> None:
        _check_k("k", k)
        _check_attr("attr_name", attr_name)
        _check_attr("eigenvalues_attr", eigenvalues_attr)
        if eigenvalues_attr == "":
            raise ValueError("eigenvalues_attr must be a non-empty str or None; got ''")
        check_bool("eigenvalues", eigenvalues)
        check_bool("random_sign", random_sign)
        check_bool("symmetrize", symmetrize)
        self.k, self.attr_name, self.is_undirected = k, attr_name, is_undirected
        self.eigenvalues = eigenvalues or eigenvalues_attr is not None
        self.eigenvalues_attr = eigenvalues_attr if eigenvalues_attr is not None else EIGENVALUES_ATTR
        self.random_sign = random_sign
        self.normalization, self.symmetrize, self.method = normalization, symmetrize, method
        self.kwargs = check_eigsh_options(kwargs, k, method)

    def forward(self, data: Data) -> Data:
        num_nodes = data.num_nodes
        vecs, vals = laplacian_pe(
            data.edge_index, num_nodes, self.k, normalization=self.normalization,
            edge_weight=getattr(data, "edge_weight", None), symmetrize=self.symmetrize, method=self.method,
            eigsh_options=self.kwargs,
        )
        return self._store(data, vecs, vals.expand(num_nodes, self.k).clone(), graphs=1, batch=None)

    def forward_batch(self, data: Any) -> Any:
        """This transform on a whole PyG ``Batch`` at once (one batched eigensolve per graph size;
        see :func:`add_laplacian_pe_batch`)."""
        batch, num_graphs = _batch_vector(data)
        vecs, vals = laplacian_pe_batch(
            data.edge_index, batch, self.k, num_graphs=num_graphs, normalization=self.normalization,
            edge_weight=getattr(data, "edge_weight", None), symmetrize=self.symmetrize, method=self.method,
            eigsh_options=self.kwargs,
        )
        return self._store(data, vecs, vals[batch], graphs=num_graphs, batch=batch)

    def _store(self, data: Any, vecs: Tensor, per_node: Tensor, *, graphs: int, batch: Tensor | None) -> Any:
        """Store ``vecs [N, k]`` (with ``random_sign``, times one random sign per graph and column:
        ``graphs`` of them, read at ``batch [N]``) and, when asked, the eigenvalues
        ``per_node [N, k]``, where the options say."""
        if self.random_sign:
            signs = _random_signs(graphs, self.k, vecs.device)
            vecs = vecs * (signs if batch is None else signs[batch])
        return _store_eigenpairs(data, vecs, per_node if self.eigenvalues else None, self.attr_name,
                                 self.eigenvalues_attr)

    def __repr__(self) -> str:
        vals = f", eigenvalues_attr={self.eigenvalues_attr!r}" if self.eigenvalues else ""
        return f"{type(self).__name__}(k={self.k}, attr_name={self.attr_name!r}{vals})"


class AddRandomWalkSE(BaseTransform):
    """Random-walk SE (:func:`posenc.graph.random_walk_se`), drop-in for PyG's
    ``AddRandomWalkPE(walk_length, attr_name)``: stores ``[N, walk_length]`` float32."""

    def __init__(self, walk_length: int, attr_name: str | None = "random_walk_pe", *, method: str = "auto") -> None:
        _check_k("walk_length", walk_length)
        _check_attr("attr_name", attr_name)
        self.walk_length, self.attr_name, self.method = walk_length, attr_name, method

    def forward(self, data: Data) -> Data:
        pe = random_walk_se(
            data.edge_index, data.num_nodes, self.walk_length,
            edge_weight=getattr(data, "edge_weight", None), method=self.method,
        )
        return _store(data, pe, self.attr_name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(walk_length={self.walk_length}, attr_name={self.attr_name!r})"


def _check_anchors(anchors: str, seed: int | None) -> None:
    if anchors not in ANCHOR_METHODS:
        raise ValueError(f"anchors must be one of {ANCHOR_METHODS}; got {anchors!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an int or None; got {seed!r}")


class AddLandmarkPE(BaseTransform):
    """Landmark distances (:func:`posenc.graph.landmark_pe`): stores ``[N, k]`` float32,
    ``1 / (d + 1)`` to each of ``k`` anchors (0: unreachable). A graph with fewer than ``k``
    nodes gets zero columns for the missing anchors.

    Args:
        k: anchors per graph.
        attr_name: where to store ``[N, k]`` (None: concatenate to ``data.x``).
        anchors: "degree" (top-``k`` out-degree, ties to the lower node index) or "random".
        seed: "random" draws from a generator seeded once here and advanced graph by graph, so a
            dataset transformed in the same order gets the same anchors; None: torch's global RNG.
    """

    def __init__(self, k: int, attr_name: str | None = "landmark_pe", *, anchors: str = "degree",
                 seed: int | None = None) -> None:
        _check_k("k", k)
        _check_anchors(anchors, seed)
        self.k, self.attr_name, self.anchors, self.seed = k, attr_name, anchors, seed
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def forward(self, data: Data) -> Data:
        pe = landmark_pe(data.edge_index, data.num_nodes, self.k, anchors=self.anchors, generator=self.generator,
                         pad=True)
        return _store(data, pe, self.attr_name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, attr_name={self.attr_name!r}, anchors={self.anchors!r})"


def _batch_vector(data: Any) -> tuple[Tensor, int]:
    batch = getattr(data, "batch", None)
    if batch is None:  # a single graph
        return torch.zeros(data.num_nodes, dtype=torch.long, device=data.edge_index.device), 1
    return batch, int(data.num_graphs)


def add_laplacian_pe_batch(
    data: Any,
    k: int,
    attr_name: str | None = "laplacian_eigenvector_pe",
    *,
    eigenvalues: bool = False,
    eigenvalues_attr: str | None = None,
    random_sign: bool = True,
    normalization: str | None = "sym",
    symmetrize: bool = False,
    method: str = "auto",
    **kwargs: Any,
) -> Any:
    """:class:`AddLaplacianPE` for a whole PyG ``Batch`` at once (one batched eigensolve per graph
    size); random signs are drawn per graph and eigenvector. Same arguments (``**kwargs``: eigsh
    options). Returns ``data`` with the attribute(s) set."""
    return AddLaplacianPE(k, attr_name, eigenvalues=eigenvalues, eigenvalues_attr=eigenvalues_attr,
                          random_sign=random_sign, normalization=normalization, symmetrize=symmetrize,
                          method=method, **kwargs).forward_batch(data)


def add_random_walk_se_batch(
    data: Any, walk_length: int, attr_name: str | None = "random_walk_pe", *, method: str = "auto"
) -> Any:
    """:class:`AddRandomWalkSE` for a whole PyG ``Batch`` at once."""
    _check_k("walk_length", walk_length)
    batch, num_graphs = _batch_vector(data)
    pe = random_walk_se_batch(
        data.edge_index, batch, walk_length, num_graphs=num_graphs,
        edge_weight=getattr(data, "edge_weight", None), method=method,
    )
    return _store(data, pe, attr_name)


def add_landmark_pe_batch(
    data: Any, k: int, attr_name: str | None = "landmark_pe", *, anchors: str = "degree",
    generator: torch.Generator | None = None,
) -> Any:
    """:class:`AddLandmarkPE` for a whole PyG ``Batch`` at once (``"random"``: the same anchors as
    the transform applied graph by graph with a generator in the same state)."""
    _check_k("k", k)
    _check_anchors(anchors, None)
    batch, num_graphs = _batch_vector(data)
    pe = landmark_pe_batch(data.edge_index, batch, k, anchors=anchors, generator=generator, num_graphs=num_graphs)
    return _store(data, pe, attr_name)
