"""A GPS-style graph transformer (Rampasek et al. 2022, "Recipe for a General, Powerful, Scalable
Graph Transformer", https://arxiv.org/abs/2205.12454).

A stack of :class:`~posenc.graph.gps_layer.GPSLayer` (the GPSConv-shaped layer, usable on its own
in any PyG model) between a node embedding and a head. Each layer runs a local message-passing
layer (here PyG's ``GINEConv`` with edge features, ``GINConv`` without: :func:`local_conv`) beside
global multi-head attention over all nodes of the same graph; the two residual branches are
normalised, summed, and followed by an MLP::

    h_local = Norm(x + Dropout(MPNN(x, edges)))
    h_attn  = Norm(x + Dropout(Attn(x)))
    x'      = Norm(h + Dropout(MLP(h))),   h = h_local + h_attn

The global attention is posenc's :class:`~posenc.common.multihead.MultiheadAttention` over the whole
mini-batch as ONE packed sequence ``[1, N_total, C]`` with a block-diagonal mask
(``AttentionMask.packed(graph_ids)``): nodes attend only within their own graph, and no graph is
padded to the size of the largest one.

Encodings. Any registered graph encoding: one with an input hook (``lap``, ``rwse``, ``landmark``,
``maglap``, ``stable_pe``) turns the node features plus precomputed per-node encodings into the
first layer's input; one with attention hooks (``spd``) acts in every layer's attention; ``rrwp``
does both (its diagonal on the input, its pairs as a bias per head in every layer).
In both cases the per-node structure is the
explicit ``positions`` argument of :meth:`GPS.forward` (``[N, F]``); :meth:`GPS.forward_data` reads
it from a PyG batch (see :func:`node_positions`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from . import pyg as _pyg  # noqa: F401  (first: PyG without its import-time FutureWarning)

# isort: split
from torch_geometric.nn import GINConv, GINEConv, global_add_pool, global_max_pool, global_mean_pool

from ..common.attention import Backend
from ..common.checks import check_number
from ..common.encoding import Hook, PositionEncoding, attention_part
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, build
from ..primitives.budget import check_build
from ..training.pretrained import PretrainedMixin
from .edges import check_batch, check_edge_index, check_same_graph
from .gps_layer import GPSLayer, NormKind
from .transforms import EIGENVALUES_ATTR

LocalKind = Literal["gine", "gin", "none"]
Task = Literal["graph", "node"]
Pool = Literal["mean", "add", "max"]

_POOLS = {"mean": global_mean_pool, "add": global_add_pool, "max": global_max_pool}


def local_conv(kind: LocalKind, dim: int) -> nn.Module | None:
    """The message-passing layer of a GPS layer: "gine" (``GINEConv``, needs ``edge_attr [E, dim]``),
    "gin" (``GINConv``) -- both with a 2-layer MLP and a learned epsilon, as GraphGPS -- or "none"."""
    if kind == "none":
        return None
    if kind not in ("gine", "gin"):
        raise ValueError(f"local must be 'gine', 'gin' or 'none'; got {kind!r}")
    mlp = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
    return GINEConv(mlp, train_eps=True) if kind == "gine" else GINConv(mlp, train_eps=True)


# The batch attributes holding the precomputed per-node features of the input-hook encodings, as
# written by posenc.graph.AddLaplacianPE(k, eigenvalues=True) and
# AddRandomWalkSE (the first two names are PyG's, shared by AddLaplacianEigenvectorPE / AddRandomWalkPE).
LAP_ATTR = "laplacian_eigenvector_pe"
LAP_EIGENVALUES_ATTR = EIGENVALUES_ATTR
RWSE_ATTR = "random_walk_pe"
LANDMARK_ATTR = "landmark_pe"  # posenc.graph.AddLandmarkPE(k)


class GPS(nn.Module, PretrainedMixin):
    """GPS graph transformer with node- or graph-level output.

    Args:
        in_dim: node feature width (``x [N, in_dim]``, float).
        out_dim: outputs per graph (``task="graph"``) or per node (``task="node"``).
        dim: width.
        depth: number of :class:`GPSLayer`.
        num_heads: attention heads.
        edge_dim: edge feature width (``edge_attr [E, edge_dim]``); None for graphs without edge
            features (the local layer is then GIN).
        encoding: a registered graph encoding name (built with ``encoding_options`` for this
            width and head count), an instance, or None. Input-hook encodings transform the
            embedded node features once, before the first layer; attention hooks act in every layer
            (one shared instance).
        encoding_options: constructor arguments of a named encoding.
        local: the message-passing layer: "auto" (GINE with edge features, GIN without), "gine",
            "gin" or "none".
        task: "graph" (pool, then an MLP head) or "node" (an MLP head per node).
        pool: "mean", "add" or "max" graph pooling (PyG's global pools).
        dropout: as for :class:`GPSLayer`, like ``norm``, ``mlp_ratio`` and ``backend``.

    Shapes: :meth:`forward` takes ``x [N, in_dim]``, ``edge_index [2, E]``, ``batch [N]``,
    ``edge_attr [E, edge_dim]``, ``positions [N, F]`` and returns ``[G, out_dim]`` (graph task,
    ``G`` graphs) or ``[N, out_dim]`` (node task).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        dim: int = 64,
        depth: int = 4,
        num_heads: int = 4,
        edge_dim: int | None = None,
        encoding: str | PositionEncoding | None = None,
        encoding_options: dict | None = None,
        local: Literal["auto", "gine", "gin", "none"] = "auto",
        task: Task = "graph",
        pool: Pool = "mean",
        dropout: float = 0.0,
        norm: NormKind = "batch",
        mlp_ratio: float = 2.0,
        backend: Backend = "auto",
    ) -> None:
        super().__init__()
        for name, v in (("in_dim", in_dim), ("out_dim", out_dim), ("dim", dim), ("depth", depth), ("num_heads", num_heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        check_number("dropout", dropout, minimum=0.0, maximum=1.0)
        check_number("mlp_ratio", mlp_ratio, minimum=0.0, strict=True)
        check_build(f"GPS(dim={dim}, depth={depth})", parameters=depth * int((6 + 2 * mlp_ratio) * dim * dim) + in_dim * dim,
                    blocks=depth)
        if edge_dim is not None and (not isinstance(edge_dim, int) or isinstance(edge_dim, bool) or edge_dim < 1):
            raise ValueError(f"edge_dim must be a positive int or None; got {edge_dim!r}")
        if task not in ("graph", "node"):
            raise ValueError(f"task must be 'graph' or 'node'; got {task!r}")
        if pool not in _POOLS:
            raise ValueError(f"pool must be one of {', '.join(_POOLS)}; got {pool!r}")
        if local == "auto":
            local = "gine" if edge_dim is not None else "gin"
        if local == "gine" and edge_dim is None:
            raise ValueError("local='gine' needs edge features: give edge_dim, or use local='gin'")
        if isinstance(encoding, str):
            # graph encodings have no length-dependent tables: max_len is unused
            encoding = build(encoding, dims=ModelDims(dim=dim, num_heads=num_heads, max_len=1), **(encoding_options or {}))
        elif encoding_options:
            raise ValueError("encoding_options are for a named encoding; got an instance (or None) as encoding")
        if encoding is not None and not isinstance(encoding, PositionEncoding):
            raise TypeError(f"encoding must be a registered name, a PositionEncoding or None; got {type(encoding).__name__}")
        self.in_dim, self.out_dim, self.edge_dim, self.task = in_dim, out_dim, edge_dim, task
        self.encoding = encoding
        self.node_embed = nn.Linear(in_dim, dim)
        self.edge_embed = nn.Linear(edge_dim, dim) if edge_dim is not None and local == "gine" else None
        shared = attention_part(encoding)
        self.local = local
        self.layers = nn.ModuleList(
            GPSLayer(dim, local_conv(local, dim), num_heads, encoding=shared, dropout=dropout, norm=norm,
                     mlp_ratio=mlp_ratio, backend=backend)
            for _ in range(depth)
        )
        self.pool = _POOLS[pool]
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, out_dim))

    @property
    def uses_input_hook(self) -> bool:
        return self.encoding is not None and Hook.INPUT in self.encoding.hooks

    @property
    def uses_attention_hooks(self) -> bool:
        return attention_part(self.encoding) is not None

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        *,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
        positions: Tensor | None = None,
        num_graphs: int | None = None,
    ) -> Tensor:
        """Run the model on a batch of graphs given as one disjoint union (PyG's convention).

        Args:
            x: ``[N, in_dim]`` node features.
            edge_index: ``[2, E]`` edges (long), inside graphs.
            batch: ``[N]`` sorted graph id of each node; None for a single graph.
            edge_attr: ``[E, edge_dim]`` edge features (needed when the model has ``edge_dim``).
            positions: ``[N, F]`` per-node structure for the encoding (precomputed LapPE / RWSE
                features for an input hook, the encoding's node description for attention hooks);
                required when the model has an encoding, ignored otherwise.
            num_graphs: the number of graphs (PyG's ``Batch.num_graphs``), at least the largest
                id in ``batch`` + 1; None reads it from ``batch``, a host sync (and under
                ``torch.compile`` a graph break) per forward.
        """
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.in_dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be [num_nodes, in_dim={self.in_dim}]; got {shape}")
        n = x.shape[0]
        if batch is None:
            batch = torch.zeros(n, dtype=torch.long, device=x.device)
            num_graphs = (1 if n else 0) if num_graphs is None else num_graphs
        num_graphs = check_batch(batch, num_graphs)
        if batch.shape != (n,):
            raise ValueError(f"batch must be a long tensor [num_nodes={n}]; got {tuple(batch.shape)} {batch.dtype}")
        # Here, not inside PyG's message passing: an index past num_nodes (or a negative one, or an
        # edge between two graphs) is one clear error naming the edge.
        check_edge_index(edge_index, n)
        check_same_graph(edge_index, batch)
        if self.edge_dim is not None:
            if edge_attr is None:
                raise ValueError(f"this model was built with edge_dim={self.edge_dim}: pass edge_attr [num_edges, {self.edge_dim}]")
            if edge_attr.shape != (edge_index.shape[1], self.edge_dim):
                raise ValueError(f"edge_attr must be [num_edges={edge_index.shape[1]}, edge_dim={self.edge_dim}]; got {tuple(edge_attr.shape)}")
        if self.encoding is not None:
            if positions is None:
                raise ValueError(f"the model has encoding {type(self.encoding).__name__}: pass positions [num_nodes, features]")
            if positions.shape[0] != n:
                raise ValueError(f"positions must have one row per node ({n}); got {tuple(positions.shape)}")
        else:
            positions = None
        h = self.node_embed(x)
        if self.uses_input_hook:
            h = self.encoding.encode_input(h.unsqueeze(0), positions.unsqueeze(0)).squeeze(0)
        e = self.edge_embed(edge_attr) if self.edge_embed is not None else None
        mask = AttentionMask.packed(batch.unsqueeze(0))
        attn_pos = positions if self.uses_attention_hooks else None
        for layer in self.layers:
            h = layer(h, edge_index, mask=mask, edge_attr=e, positions=attn_pos)
        if self.task == "graph":
            h = self.pool(h, batch, num_graphs)
        return self.head(h)

    def forward_data(self, data) -> Tensor:
        """:meth:`forward` on a PyG ``Data``/``Batch``: ``x``, ``edge_index``, ``batch``,
        ``edge_attr`` (when the model uses edge features) and the encoding's
        :func:`node_positions`."""
        return self(
            data.x, data.edge_index, batch=getattr(data, "batch", None),
            edge_attr=data.edge_attr if self.edge_dim is not None else None,
            positions=node_positions(data, self.encoding) if self.encoding is not None else None,
            num_graphs=getattr(data, "num_graphs", None),
        )


def node_positions(data, encoding: PositionEncoding) -> Tensor:
    """The per-node input ``[N, F]`` of ``encoding`` for a PyG ``Data``/``Batch``.

    * ``lap`` (:class:`~posenc.graph.LapPE`): ``data.laplacian_eigenvector_pe [N, k]``, followed by
      ``data.laplacian_eigenvalues [N, k]`` when the encoding uses eigenvalues (write both with
      ``AddLaplacianPE(k, eigenvalues=True)``).
    * ``rwse`` (:class:`~posenc.graph.RWSE`): ``data.random_walk_pe [N, K]``
      (``AddRandomWalkSE(K)`` or PyG's ``AddRandomWalkPE(K)``).
    * ``landmark`` (:class:`~posenc.graph.LandmarkPE`): ``data.landmark_pe [N, k]``
      (``AddLandmarkPE(k)``).
    * ``spd`` (:class:`~posenc.graph.ShortestPathBias`): computed here from the batch's edges,
      ``spd_positions(batch, shortest_path_distances_batch(edge_index, batch))[0]``, rows
      ``[graph id, local index, distances to the graph's nodes...]``.
    * ``rrwp`` (:class:`~posenc.graph.RRWPBias`): ``rrwp_positions(batch, data.rrwp_index,
      data.rrwp_val)[0]`` (``AddRRWP(K)``), rows ``[graph id, local index, pair features...]``.
    * ``maglap`` (:class:`~posenc.graph.MagLapPE`): ``data.maglap_pe [N, 2k]``, followed by
      ``data.maglap_eigenvalues [N, k]`` when the encoding uses eigenvalues
      (``AddMagneticLaplacianPE(k, q)``).
    * ``stable_pe`` (:class:`~posenc.graph.StablePE`): ``stable_pe_positions(batch,
      data.stable_pe_vecs, data.stable_pe_vals)[0]`` (``AddStablePE(k)``).
    """
    from .encodings import RWSE, LandmarkPE, LapPE
    from .maglap_encoding import MagLapPE
    from .rrwp import rrwp_positions
    from .rrwp_bias import RRWPBias
    from .shortest_path import ShortestPathBias, shortest_path_distances_batch, spd_positions
    from .stable_pe import StablePE, stable_pe_positions
    from .structure_transforms import (
        MAGLAP_ATTR,
        MAGLAP_EIGENVALUES_ATTR,
        RRWP_INDEX_ATTR,
        RRWP_VALUE_ATTR,
        STABLE_PE_VALS_ATTR,
        STABLE_PE_VECS_ATTR,
    )

    def need(attr: str, how: str) -> Tensor:
        value = getattr(data, attr, None)
        if value is None:
            raise ValueError(f"encoding {type(encoding).__name__} needs data.{attr}: precompute it with {how}")
        return value

    if isinstance(encoding, LapPE):
        vecs = need(LAP_ATTR, f"posenc.graph.AddLaplacianPE({encoding.k}, eigenvalues=True)")
        if not encoding.use_eigenvalues:
            return vecs
        vals = need(LAP_EIGENVALUES_ATTR, f"posenc.graph.AddLaplacianPE({encoding.k}, eigenvalues=True)")
        return torch.cat([vecs, vals], dim=-1)
    if isinstance(encoding, RWSE):
        return need(RWSE_ATTR, f"posenc.graph.AddRandomWalkSE({encoding.walk_length})")
    if isinstance(encoding, LandmarkPE):
        return need(LANDMARK_ATTR, f"posenc.graph.AddLandmarkPE({encoding.k})")
    batch = getattr(data, "batch", None)
    if batch is None:
        batch = torch.zeros(data.num_nodes, dtype=torch.long, device=data.edge_index.device)
    if isinstance(encoding, ShortestPathBias):
        distances = shortest_path_distances_batch(data.edge_index, batch)
        return spd_positions(batch, distances)[0]
    if isinstance(encoding, RRWPBias):
        how = f"posenc.graph.AddRRWP({encoding.walk_length})"
        return rrwp_positions(batch, need(RRWP_INDEX_ATTR, how), need(RRWP_VALUE_ATTR, how))[0]
    if isinstance(encoding, MagLapPE):
        how = f"posenc.graph.AddMagneticLaplacianPE({encoding.k}, q)"
        vecs = need(MAGLAP_ATTR, how)
        return torch.cat([vecs, need(MAGLAP_EIGENVALUES_ATTR, how)], dim=-1) if encoding.use_eigenvalues else vecs
    if isinstance(encoding, StablePE):
        how = f"posenc.graph.AddStablePE({encoding.k})"
        return stable_pe_positions(batch, need(STABLE_PE_VECS_ATTR, how), need(STABLE_PE_VALS_ATTR, how))[0]
    raise ValueError(f"no known per-node input for {type(encoding).__name__}; call GPS.forward with positions yourself")
