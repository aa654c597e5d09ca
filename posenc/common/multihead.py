"""The multi-head attention layer: projections, grouped-query heads, cross attention, explicit
positions and an optional KV cache around one :class:`~posenc.common.call.AttentionCall` a forward,
which :mod:`.attention` prepares, plans and runs."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from .attention import _attend, make_plan
from .call import AttentionCall, check_attention_args, check_encoding, normalize_positions
from .checks import check_bool, check_int, check_number
from .decoding_state import LayerDecodingState, tracked_edits_only
from .encoding import PositionEncoding
from .kv_cache import LayerKVCache
from .linear_attention import FeatureMap
from .masks import AttentionMask
from .planning import Backend, Plan, check_backend


class MultiheadAttention(nn.Module):
    """Multi-head attention (self or cross) with a position encoding plugged into the core.

    Args:
        dim: query feature width ``C``.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads (grouped-query attention); default ``H``.
        head_dim: per-head width ``D``; default ``C // H``.
        kv_dim: key/value input width for cross attention; default ``C``.
        encoding: a :class:`PositionEncoding` whose attention hooks this layer applies. It may be
            shared by several layers (then its parameters are shared too).
        backend: "auto", "sdpa", "flex", "dense" or "math" (see :func:`attend`).
        scale: score scale, default ``D ** -0.5``.
        bias: whether the projections have a bias.
        feature_map: linear attention with this feature map (:class:`EluFeatureMap`,
            :class:`FavorFeatureMap`) instead of softmax; None for softmax attention.

    Shapes:
        ``x [B, Tq, C]``, ``context [B, Tk, kv_dim]`` -> ``[B, Tq, C]``.

    For ``torch.nn.MultiheadAttention``'s call (``query, key, value, attn_mask=...``), to replace
    torch's layer in existing code or inside ``torch.nn.TransformerEncoderLayer``, use
    :class:`~posenc.torch_attention.TorchMultiheadAttention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        kv_dim: int | None = None,
        encoding: PositionEncoding | None = None,
        backend: Backend = "auto",
        scale: float | None = None,
        bias: bool = True,
        feature_map: FeatureMap | None = None,
    ) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_int("num_heads", num_heads, minimum=1)
        for name, value in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("kv_dim", kv_dim)):
            if value is not None:
                check_int(name, value, minimum=1)
        if scale is not None:
            check_number("scale", scale, minimum=0.0, strict=True)
        check_bool("bias", bias)
        check_encoding(encoding)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads}), or give head_dim")
            head_dim = dim // num_heads
        check_backend(backend)
        self.dim, self.num_heads, self.num_kv_heads, self.head_dim = dim, num_heads, num_kv_heads, head_dim
        self.backend = backend
        self.scale = head_dim ** -0.5 if scale is None else scale
        kv_dim = dim if kv_dim is None else kv_dim
        self.kv_dim = kv_dim
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(kv_dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(kv_dim, num_kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)
        self.encoding = encoding
        if feature_map is not None and not isinstance(feature_map, FeatureMap):
            raise TypeError(f"feature_map must be a posenc FeatureMap (EluFeatureMap(), FavorFeatureMap(d)); got {feature_map!r}")
        self.feature_map = feature_map  # a submodule: FAVOR+'s projection is saved with the layer

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def _call(
        self,
        x: Tensor,
        context: Tensor | None,
        q_pos: Tensor | None,
        kv_pos: Tensor | None,
        mask: AttentionMask | None,
        cache: LayerKVCache | None,
        grow_cache: bool,
        decoding_state: LayerDecodingState | None = None,
    ) -> AttentionCall:
        """The inputs checked once, then projected into the :class:`AttentionCall` of this
        forward; with ``cache`` and ``grow_cache`` the new keys are appended to it."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}]; got {tuple(x.shape)}")
        if context is not None and cache is not None:
            raise ValueError("a KV cache is for self-attention; pass either context or cache, not both")
        if decoding_state is not None and not isinstance(decoding_state, LayerDecodingState):
            raise TypeError(f"decoding_state must be a posenc LayerDecodingState (DecodingState(depth)[i]) or None; "
                            f"got {type(decoding_state).__name__}")
        if decoding_state is not None and cache is None:
            raise ValueError("decoding_state goes with a KV cache (it keeps values of the cached keys); pass cache too")
        src = x if context is None else context
        if src.dim() != 3 or src.shape[0] != x.shape[0] or src.shape[-1] != self.kv_dim:
            what = "context" if context is not None else "x (self-attention: kv_dim must equal dim)"
            raise ValueError(f"{what} must be [batch={x.shape[0]}, keys, kv_dim={self.kv_dim}]; got {tuple(src.shape)}")
        b, tq, _ = x.shape
        if q_pos is None and cache is not None:
            q_pos = cache.next_positions(tq, device=x.device)
        q_pos = normalize_positions(q_pos, tq, b, "q_pos", device=x.device)
        if context is None:
            new_kv_pos = q_pos if kv_pos is None else normalize_positions(kv_pos, tq, b, "kv_pos", device=x.device)
        else:
            new_kv_pos = normalize_positions(kv_pos, src.shape[1], b, "kv_pos", device=x.device)
        enc = self.encoding
        past = 0 if cache is None else cache.length
        # Check before the cache grows: a refused call must leave the cache as it was.
        check_attention_args(enc, mask, b, self.num_heads, tq, past + new_kv_pos.shape[1])
        if cache is not None and enc is not None and not enc.supports_kv_cache:
            raise ValueError(f"{type(enc).__name__} does not support a KV cache; run the full sequence instead")

        q = self._heads(self.q_proj(x), self.num_heads)  # [B, H, Tq, D]
        k = self._heads(self.k_proj(src), self.num_kv_heads)  # [B, Hkv, Tk, D]
        v = self._heads(self.v_proj(src), self.num_kv_heads)
        qk_transformed = False
        if cache is not None:
            if enc is not None and enc.attention_needs().qk:
                # Cache rotated keys: each key is rotated once, at its own position.
                q, k = enc.transform_qk(q, k, q_pos, new_kv_pos)
                qk_transformed = True
            # the cached keys and values before the new ones: [B, Hkv, past + Tk, D], positions [B or 1, past + Tk]
            k, v, new_kv_pos = (cache.append if grow_cache else cache.peek)(k, v, new_kv_pos)
            if decoding_state is not None and grow_cache:
                decoding_state.follow(cache)
            else:
                decoding_state = None  # a plan reads the cache without growing it: nothing to keep
        # Every argument was checked above (the shapes by construction): the call is built as is.
        return AttentionCall(q, k, v, q_pos, new_kv_pos, enc, mask, self.scale, self.backend, qk_transformed,
                             self.feature_map, decoding_state=decoding_state)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        q_pos: Tensor | None = None,
        kv_pos: Tensor | None = None,
        mask: AttentionMask | None = None,
        cache: LayerKVCache | None = None,
        decoding_state: LayerDecodingState | None = None,
    ) -> Tensor:
        """Attend from ``x`` to itself (with ``cache``: to the cached keys and itself) or to ``context``.

        Positions default to ``0 .. T-1``; with a cache, the new queries continue after the last
        cached position. Pass them explicitly for packed sequences, float or 2D positions.
        ``decoding_state``: with ``cache``, this layer's
        :class:`~posenc.common.decoding_state.LayerDecodingState`, the same at every step (optional).
        """
        # A step over a non-empty KV cache already takes the parameters as they were when the cache
        # was filled: tables kept from them are checked by version counters, not bit by bit.
        # (Traced code keeps no table.)
        decoding = cache is not None and cache.length > 0 and not torch.compiler.is_compiling()
        with tracked_edits_only() if decoding else contextlib.nullcontext():
            out = _attend(self._call(x, context, q_pos, kv_pos, mask, cache, grow_cache=True,
                                     decoding_state=decoding_state))  # [B, H, Tq, D]
        return self.out_proj(out.transpose(1, 2).flatten(2))

    def plan(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        q_pos: Tensor | None = None,
        kv_pos: Tensor | None = None,
        mask: AttentionMask | None = None,
        cache: LayerKVCache | None = None,
    ) -> Plan:
        """The kernel :class:`~posenc.common.planning.Plan` that ``forward`` with these arguments would
        follow, in the current grad mode. Runs the projections, not the attention; a cache is
        read, never grown."""
        return make_plan(self._call(x, context, q_pos, kv_pos, mask, cache, grow_cache=False))
