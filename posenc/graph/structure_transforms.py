"""PyG transforms of the pair and directed encodings: RRWP (:class:`AddRRWP`), the magnetic
Laplacian PE (:class:`AddMagneticLaplacianPE`) and the eigenpairs of SPE (:class:`AddStablePE`),
each also for a whole ``Batch`` at once (``add_*_batch``), with the attribute conventions of
:mod:`posenc.graph.transforms` (``attr_name=None`` concatenates a node encoding to ``data.x``).

:class:`~posenc.graph.gps.GPS` reads what they store (``node_positions``): ``rrwp`` the pair
attributes ``rrwp_index [2, P]`` and ``rrwp_val [P, K]`` (PyG shifts an attribute named ``*index``
by the node count when it collates graphs, so a ``Batch`` holds global node ids, as GRIT's
``add_full_rrwp``), ``maglap`` ``maglap_pe`` and ``maglap_eigenvalues``, ``stable_pe``
``stable_pe_vecs`` and ``stable_pe_vals``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import pyg as _pyg  # noqa: F401  (first: PyG without its import-time FutureWarning)

# isort: split
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from ..common.checks import check_bool
from .magnetic import magnetic_laplacian_pe, magnetic_laplacian_pe_batch
from .rrwp import rrwp, rrwp_batch, rrwp_diagonal
from .stable_pe import stable_pe_features, stable_pe_features_batch
from .transforms import _batch_vector, _check_attr, _check_k, _store, _store_eigenpairs

RRWP_ATTR, RRWP_INDEX_ATTR, RRWP_VALUE_ATTR = "rrwp", "rrwp_index", "rrwp_val"
MAGLAP_ATTR, MAGLAP_EIGENVALUES_ATTR = "maglap_pe", "maglap_eigenvalues"
STABLE_PE_VECS_ATTR, STABLE_PE_VALS_ATTR = "stable_pe_vecs", "stable_pe_vals"
_EMPTY_EDGES = torch.zeros(2, 0, dtype=torch.long)  # a graph of no node: the options are checked at construction


class AddRRWP(BaseTransform):
    """RRWP (:func:`posenc.graph.rrwp`): stores the node encoding (the diagonal, ``[N, K]``) under
    ``attr_name`` (None: concatenated to ``data.x``) and the pairs of the ``(K-1)``-hop support as
    ``data.rrwp_index [2, P]`` and ``data.rrwp_val [P, K]`` float32."""

    def __init__(self, walk_length: int = 8, attr_name: str | None = RRWP_ATTR, *, method: str = "auto") -> None:
        _check_k("walk_length", walk_length)
        _check_attr("attr_name", attr_name)
        self.walk_length, self.attr_name, self.method = walk_length, attr_name, method

    def forward(self, data: Data) -> Data:
        pairs, values = rrwp(data.edge_index, data.num_nodes, self.walk_length,
                             edge_weight=getattr(data, "edge_weight", None), method=self.method)
        return _store_rrwp(data, pairs, values, self.attr_name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(walk_length={self.walk_length}, attr_name={self.attr_name!r})"


def _store_rrwp(data: Any, pairs: Tensor, values: Tensor, attr_name: str | None) -> Any:
    data[RRWP_INDEX_ATTR], data[RRWP_VALUE_ATTR] = pairs, values
    return _store(data, rrwp_diagonal(pairs, values, data.num_nodes), attr_name)


def add_rrwp_batch(data: Any, walk_length: int = 8, attr_name: str | None = RRWP_ATTR, *, method: str = "auto") -> Any:
    """:class:`AddRRWP` for a whole PyG ``Batch`` at once (:func:`posenc.graph.rrwp_batch`)."""
    _check_k("walk_length", walk_length)
    _check_attr("attr_name", attr_name)
    batch, num_graphs = _batch_vector(data)
    pairs, values = rrwp_batch(data.edge_index, batch, walk_length, num_graphs=num_graphs,
                               edge_weight=getattr(data, "edge_weight", None), method=method)
    return _store_rrwp(data, pairs, values, attr_name)


class AddMagneticLaplacianPE(BaseTransform):
    """MagLapPE (:func:`posenc.graph.magnetic_laplacian_pe`): stores ``[N, 2k]`` float32 (real
    parts, then imaginary parts) under ``attr_name`` and, with ``eigenvalues`` (the default, which
    the ``maglap`` encoding reads), the ``k`` eigenvalues per node ``[N, k]`` under
    ``eigenvalues_attr`` (concatenated after the eigenvectors when ``attr_name`` is None). The
    other arguments are :func:`~posenc.graph.magnetic_laplacian_pe`'s."""

    def __init__(
        self, k: int = 8, q: float = 0.25, attr_name: str | None = MAGLAP_ATTR, *, eigenvalues: bool = True,
        eigenvalues_attr: str = MAGLAP_EIGENVALUES_ATTR, **options: Any,
    ) -> None:
        _check_k("k", k)
        _check_attr("attr_name", attr_name)
        _check_attr("eigenvalues_attr", eigenvalues_attr)
        check_bool("eigenvalues", eigenvalues)
        self.k, self.q, self.attr_name, self.eigenvalues, self.eigenvalues_attr = k, q, attr_name, eigenvalues, \
            eigenvalues_attr
        self.options = options
        magnetic_laplacian_pe(_EMPTY_EDGES, 0, k, q=q, **options)

    def forward(self, data: Data) -> Data:
        vecs, vals = magnetic_laplacian_pe(data.edge_index, data.num_nodes, self.k, q=self.q,
                                           edge_weight=getattr(data, "edge_weight", None), **self.options)
        return self._store(data, vecs, vals.expand(data.num_nodes, self.k).clone())

    def forward_batch(self, data: Any) -> Any:
        batch, num_graphs = _batch_vector(data)
        vecs, vals = magnetic_laplacian_pe_batch(data.edge_index, batch, self.k, num_graphs=num_graphs, q=self.q,
                                                 edge_weight=getattr(data, "edge_weight", None), **self.options)
        return self._store(data, vecs, vals[batch])

    def _store(self, data: Any, vecs: Tensor, per_node: Tensor) -> Any:
        return _store_eigenpairs(data, vecs, per_node if self.eigenvalues else None, self.attr_name,
                                 self.eigenvalues_attr)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, q={self.q}, attr_name={self.attr_name!r})"


def add_magnetic_laplacian_pe_batch(data: Any, k: int = 8, q: float = 0.25, attr_name: str | None = MAGLAP_ATTR,
                                    **options: Any) -> Any:
    """:class:`AddMagneticLaplacianPE` for a whole PyG ``Batch`` at once (one batched complex
    eigensolve per graph size). Same arguments."""
    return AddMagneticLaplacianPE(k, q, attr_name, **options).forward_batch(data)


class AddStablePE(BaseTransform):
    """The eigenpairs of SPE (:func:`posenc.graph.stable_pe_features`): ``data.stable_pe_vecs [N,
    k]`` and, per node, ``data.stable_pe_vals [N, k]`` (float32). Options as there."""

    def __init__(self, k: int = 16, **options: Any) -> None:
        _check_k("k", k)
        self.k, self.options = k, options
        stable_pe_features(_EMPTY_EDGES, 0, k, **options)

    def forward(self, data: Data) -> Data:
        vecs, vals = stable_pe_features(data.edge_index, data.num_nodes, self.k,
                                        edge_weight=getattr(data, "edge_weight", None), **self.options)
        return _store_eigenpairs(data, vecs, vals.expand(data.num_nodes, self.k).clone(), STABLE_PE_VECS_ATTR,
                                 STABLE_PE_VALS_ATTR)

    def forward_batch(self, data: Any) -> Any:
        batch, num_graphs = _batch_vector(data)
        vecs, vals = stable_pe_features_batch(data.edge_index, batch, self.k, num_graphs=num_graphs,
                                              edge_weight=getattr(data, "edge_weight", None), **self.options)
        return _store_eigenpairs(data, vecs, vals[batch], STABLE_PE_VECS_ATTR, STABLE_PE_VALS_ATTR)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k})"


def add_stable_pe_batch(data: Any, k: int = 16, **options: Any) -> Any:
    """:class:`AddStablePE` for a whole PyG ``Batch`` at once."""
    return AddStablePE(k, **options).forward_batch(data)



__all__ = ["AddMagneticLaplacianPE", "AddRRWP", "AddStablePE", "add_magnetic_laplacian_pe_batch", "add_rrwp_batch",
           "add_stable_pe_batch", "MAGLAP_ATTR", "MAGLAP_EIGENVALUES_ATTR", "RRWP_ATTR", "RRWP_INDEX_ATTR",
           "RRWP_VALUE_ATTR", "STABLE_PE_VECS_ATTR", "STABLE_PE_VALS_ATTR"]
