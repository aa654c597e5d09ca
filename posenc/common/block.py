"""Pre-norm transformer block and encoder stack, with a place between blocks for conditional
encoders (PEG) and an optional KV cache."""

from __future__ import annotations

from typing import Mapping, Sequence

from torch import Tensor, nn

from .multihead import MultiheadAttention
from .call import normalize_positions
from .encoding import Hook, PositionEncoding, attention_part
from .decoding_state import DecodingState
from .kv_cache import KVCache
from .linear_attention import make_feature_map
from .masks import AttentionMask
from .planning import Backend, check_attention_kind


def _dropout(drop: nn.Dropout, x: Tensor) -> Tensor:
    """``drop(x)``, without the module call where it is the identity (evaluation, ``p = 0``): three
    per block, in every decoding step."""
    return drop(x) if drop.training and drop.p > 0 else x


class MLP(nn.Module):
    """``Linear -> GELU -> Dropout -> Linear``."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(_dropout(self.drop, self.act(self.fc1(x))))


class TransformerBlock(nn.Module):
    """``x + Attn(LN(x))`` then ``x + MLP(LN(x))``.

    ``feature_map``: None for softmax attention, or ``"elu"`` / ``"favor"`` for linear attention
    with that feature map (:func:`~posenc.common.linear_attention.make_feature_map`), built for
    the width of the queries after the encoding's q/k transform.

    Shapes: ``x [B, T, C]`` -> ``[B, T, C]``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        encoding: PositionEncoding | None = None,
        backend: Backend = "auto",
        attn_scale: float | None = None,
        feature_map: str | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        if encoding is not None:  # an illegal encoding / attention pair fails here, not at the first call
            check_attention_kind(encoding.attention_needs(), feature_map, type(encoding).__name__)
        fmap = None
        if feature_map is not None:
            head_dim = dim // num_heads
            fmap = make_feature_map(feature_map, encoding.qk_width(head_dim) if encoding is not None else head_dim)
        self.attn = MultiheadAttention(
            dim, num_heads, num_kv_heads=num_kv_heads, encoding=encoding, backend=backend, scale=attn_scale,
            feature_map=fmap,
        )
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        mask: AttentionMask | None = None,
        cache=None,
        decoding_state=None,
    ) -> Tensor:
        attn = self.attn(self.norm1(x), q_pos=positions, mask=mask, cache=cache, decoding_state=decoding_state)
        x = x + _dropout(self.drop, attn)
        return x + _dropout(self.drop, self.mlp(self.norm2(x)))


class TransformerEncoder(nn.Module):
    """A stack of pre-norm blocks with a position encoding.

    Args:
        dim: model width.
        depth: number of blocks.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention), as for the blocks.
        mlp_ratio: MLP width as a multiple of ``dim``.
        dropout: dropout rate of the blocks.
        backend: attention backend, as for the blocks.
        feature_map: None for softmax, ``"elu"`` or ``"favor"`` for linear attention.
        encoding: one encoding shared by every layer, or a sequence of ``depth`` encodings (one per
            layer). Its input hook is applied to ``x`` before the first block (from the first
            encoding of a sequence); its attention hooks inside every block.
        conditional: ``{i: module}``: ``module(x, positions, mask=mask, cache=layer_cache)`` is
            added after block ``i`` (0-based); conditional encoders such as PEG live here. They
            receive the stack's mask (padding, packed segments, causality) and, during cached
            decoding, the :class:`~posenc.common.kv_cache.TokenRows` of their place (the rows of
            the tokens before, from ``cache.rows(i)``; else None), which they read and extend.
        final_norm: apply a LayerNorm after the last block.

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T(, coords)]`` -> ``[B, T, C]``.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        *,
        encoding: PositionEncoding | Sequence[PositionEncoding] | None = None,
        num_kv_heads: int | None = None,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        conditional: Mapping[int, nn.Module] | None = None,
        backend: Backend = "auto",
        attn_scale: float | None = None,
        final_norm: bool = True,
        feature_map: str | None = None,
    ) -> None:
        super().__init__()
        if depth <= 0:
            raise ValueError(f"depth must be positive, got {depth}")
        if encoding is None or isinstance(encoding, PositionEncoding):
            per_layer = [encoding] * depth
            self.encoding = encoding
        else:
            per_layer = list(encoding)
            if len(per_layer) != depth:
                raise ValueError(f"encoding: got {len(per_layer)} per-layer encodings for depth {depth}")
            for i, enc in enumerate(per_layer[1:], start=1):
                if enc is not None and Hook.INPUT in enc.hooks:
                    raise ValueError(
                        f"encoding[{i}] ({type(enc).__name__}) has an input hook, which acts once before the "
                        "first block: only encoding[0] may have one"
                    )
            self.encoding = per_layer[0]
        self.blocks = nn.ModuleList(
            TransformerBlock(
                dim, num_heads, num_kv_heads=num_kv_heads, mlp_ratio=mlp_ratio, dropout=dropout,
                encoding=attention_part(enc), backend=backend, attn_scale=attn_scale, feature_map=feature_map,
            )
            for enc in per_layer
        )
        conditional = dict(conditional or {})
        for i in conditional:
            if not 0 <= i < depth:
                raise ValueError(f"conditional: block index {i} is outside 0..{depth - 1}")
        self.conditional = nn.ModuleDict({str(i): m for i, m in sorted(conditional.items())})
        self.norm = nn.LayerNorm(dim) if final_norm else nn.Identity()

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        mask: AttentionMask | None = None,
        cache: KVCache | None = None,
        decoding_state: DecodingState | None = None,
    ) -> Tensor:
        """``decoding_state``: what encodings keep between cached decoding steps (with ``cache``;
        optional: without it they recompute it from the cached keys)."""
        if decoding_state is not None:
            if not isinstance(decoding_state, DecodingState):
                raise TypeError(f"decoding_state must be a posenc DecodingState (DecodingState(len(cache))) or None; "
                                f"got {type(decoding_state).__name__}")
            if cache is None or len(decoding_state) != len(self.blocks):
                raise ValueError(f"decoding_state goes with a KV cache, one layer a block: this stack has "
                                 f"{len(self.blocks)} blocks, the state {len(decoding_state)} layers"
                                 + ("" if cache is not None else ", and no cache was passed"))
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a posenc KVCache (model.new_cache()) or None; got {type(cache).__name__}")
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"cache must hold one layer a block: this stack has {len(self.blocks)} blocks, the cache "
                             f"{len(cache)} layers (a cache of another model? model.new_cache() makes one)")
        if positions is None and cache is not None:
            positions = cache.next_positions(x.shape[1], device=x.device)
        positions = normalize_positions(positions, x.shape[1], x.shape[0], "positions", device=x.device)
        if self.encoding is not None and Hook.INPUT in self.encoding.hooks:
            x = self.encoding.encode_input(x, positions)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache[i]
            layer_state = None if decoding_state is None else decoding_state[i]
            x = block(x, positions=positions, mask=mask, cache=layer_cache, decoding_state=layer_state)
            if str(i) in self.conditional:
                rows = None if cache is None else cache.rows(i)
                x = x + self.conditional[str(i)](x, positions, mask=mask, cache=rows)
        return self.norm(x)
