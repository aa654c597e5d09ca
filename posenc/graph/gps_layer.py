"""One GPS layer for your own PyG model: a message-passing layer of your choice beside posenc's
global attention (Rampasek et al. 2022, "Recipe for a General, Powerful, Scalable Graph
Transformer", https://arxiv.org/abs/2205.12454).

Shaped like ``torch_geometric.nn.GPSConv(channels, conv, heads)`` and used the same way::

    layer = GPSLayer(64, GINConv(mlp), heads=4, encoding="spd")
    x = layer(x, edge_index, batch, positions=spd)            # [N, 64]

What it computes (as GPSConv, with the same residuals, norms and MLP)::

    h_local = Norm(x + Dropout(conv(x, edge_index, ...)))     (skipped when conv is None)
    h_attn  = Norm(x + Dropout(Attn(x)))
    out     = Norm(h + Dropout(MLP(h))),  h = h_local + h_attn

The difference is the attention. GPSConv pads the batch to ``[G, N_max, C]`` (``to_dense_batch``)
and runs ``torch.nn.MultiheadAttention`` with a key padding mask, which has no place for a
position encoding. Here the batch is attended as ONE packed sequence ``[1, N, C]`` with a
block-diagonal mask (``AttentionMask.packed(batch)``): a node attends only to the nodes of its
own graph, no graph is padded, and score-bias encodings such as the shortest-path bias (``spd``)
act inside the attention with the per-node structure given explicitly as ``positions``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from ..common.attention import Backend
from ..common.multihead import MultiheadAttention
from ..common.encoding import PositionEncoding, attention_part
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, build

NormKind = Literal["batch", "layer"]

__all__ = ["GPSLayer"]


def _norm(kind: str | None, dim: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm1d(dim)
    if kind == "layer":
        return nn.LayerNorm(dim)
    if kind is None:
        return nn.Identity()
    raise ValueError(f"norm must be 'batch', 'layer' or None; got {kind!r}")


class GPSLayer(nn.Module):
    """Local message passing plus global attention over each graph of the batch, summed, then an MLP.

    Args:
        channels: node feature width ``C`` (input and output).
        conv: the local message-passing layer (any PyG ``MessagePassing`` taking
            ``(x, edge_index, ...)`` and returning ``[N, C]``, e.g. ``GINConv``, ``GINEConv``,
            ``GCNConv``), or None for attention only. As in GPSConv.
        heads: attention heads (``channels`` divisible by it).
        encoding: the position encoding of the attention: a registered graph encoding name
            (built for ``channels`` and ``heads`` with ``encoding_options``), an instance (give the
            same instance to several layers to share it), or None. Only attention hooks belong
            here (``spd``); ``lap``/``rwse`` act once on the input features, before the first
            layer, and are refused with a pointer to ``encode_input``.
        encoding_options: constructor options of a named encoding (e.g. ``{"max_distance": 5}``).
        dropout: dropout of both residual branches and inside the MLP.
        norm: "batch" (BatchNorm over nodes, GPSConv's default), "layer" or None.
        mlp_ratio: the MLP's hidden width over ``channels`` (2, as GPSConv).
        backend: the attention kernel path (see :func:`posenc.attend`).

    Shapes: ``x [N, C]``, ``edge_index [2, E]``, ``batch [N]`` -> ``[N, C]``.
    """

    def __init__(
        self,
        channels: int,
        conv: nn.Module | None,
        heads: int = 1,
        *,
        encoding: str | PositionEncoding | None = None,
        encoding_options: dict | None = None,
        dropout: float = 0.0,
        norm: NormKind | None = "batch",
        mlp_ratio: float = 2.0,
        backend: Backend = "auto",
    ) -> None:
        super().__init__()
        for name, value in (("channels", channels), ("heads", heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if channels % heads:
            raise ValueError(f"channels ({channels}) must be divisible by heads ({heads})")
        if conv is not None and not isinstance(conv, nn.Module):
            raise TypeError(f"conv must be a message-passing nn.Module (e.g. GINConv) or None; got {type(conv).__name__}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout!r}")
        if not mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be positive; got {mlp_ratio!r}")
        if isinstance(encoding, str):
            # graph encodings have no length-dependent tables: max_len is unused
            encoding = build(encoding, dims=ModelDims(dim=channels, num_heads=heads, max_len=1), **(encoding_options or {}))
        elif encoding_options:
            raise ValueError("encoding_options are for a named encoding; got an instance (or None) as encoding")
        if encoding is not None and not isinstance(encoding, PositionEncoding):
            raise TypeError(f"encoding must be a registered name, a PositionEncoding or None; got {type(encoding).__name__}")
        if encoding is not None and attention_part(encoding) is None:
            raise ValueError(
                f"{type(encoding).__name__} acts on the input features once (input hook), not in the attention: apply "
                "it before the first layer, x = encoding.encode_input(x[None], features[None])[0], and give the "
                "layers encoding=None (or an attention encoding such as 'spd')"
            )
        self.channels, self.heads = channels, heads
        self.conv = conv
        self.norm_local = _norm(norm, channels) if conv is not None else None
        self.attn = MultiheadAttention(channels, heads, encoding=encoding, backend=backend)
        self.norm_attn = _norm(norm, channels)
        hidden = int(channels * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, channels))
        self.norm_out = _norm(norm, channels)
        self.drop = nn.Dropout(dropout)

    @property
    def encoding(self) -> PositionEncoding | None:
        return self.attn.encoding

    def extra_repr(self) -> str:
        enc = type(self.encoding).__name__ if self.encoding is not None else None
        return f"channels={self.channels}, heads={self.heads}, encoding={enc}"

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        *,
        edge_attr: Tensor | None = None,
        edge_weight: Tensor | None = None,
        positions: Tensor | None = None,
        mask: AttentionMask | None = None,
    ) -> Tensor:
        """Args:
            x: ``[N, C]`` node features of a batch of graphs (PyG's disjoint union).
            edge_index: ``[2, E]`` edges, each inside one graph.
            batch: ``[N]`` graph id of each node; None for a single graph (every node attends to
                every node).
            edge_attr: passed on to ``conv`` by keyword when given (``GINEConv``/``GATConv``).
            edge_weight: passed on to ``conv`` by keyword when given (``GCNConv``).
            positions: ``[N, F]`` per-node structure of the attention encoding, e.g. for ``spd``
                ``posenc.graph.node_positions(data, layer.encoding)`` (compute it once per batch
                and give it to every layer); required with an encoding, ignored without.
            mask: the packed block-diagonal mask, when already built for the batch
                (``AttentionMask.packed(batch[None])``); by default built from ``batch``.

        Returns:
            ``[N, C]``.
        """
        if x.dim() != 2 or x.shape[1] != self.channels:
            raise ValueError(f"x must be [num_nodes, channels={self.channels}]; got {tuple(x.shape)}")
        n = x.shape[0]
        if mask is None and batch is not None:
            if batch.shape != (n,) or batch.dtype != torch.long:
                raise ValueError(f"batch must be a long tensor [num_nodes={n}]; got {tuple(batch.shape)} {batch.dtype}")
            mask = AttentionMask.packed(batch.unsqueeze(0))
        attn_pos = None
        if self.encoding is not None:
            if positions is None:
                raise ValueError(
                    f"this layer's encoding {type(self.encoding).__name__} needs positions [num_nodes, features]: "
                    "posenc.graph.node_positions(data, layer.encoding)"
                )
            if positions.shape[0] != n:
                raise ValueError(f"positions must have one row per node ({n}); got {tuple(positions.shape)}")
            attn_pos = positions.unsqueeze(0)
        h = self.drop(self.attn(x.unsqueeze(0), q_pos=attn_pos, mask=mask).squeeze(0))
        h = self.norm_attn(x + h)
        if self.conv is not None:
            conv_kwargs = {}
            if edge_attr is not None:
                conv_kwargs["edge_attr"] = edge_attr
            if edge_weight is not None:
                conv_kwargs["edge_weight"] = edge_weight
            m = self.conv(x, edge_index, **conv_kwargs)
            h = h + self.norm_local(x + self.drop(m))
        return self.norm_out(h + self.drop(self.mlp(h)))
