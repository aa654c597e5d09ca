"""Multi-head attention with position-encoding hooks and kernel dispatch.

:func:`attend` is the functional core: it applies an encoding's q/k transform, score bias and
after-softmax terms, and runs the kernel path its plan names (:mod:`.plan`, :mod:`.kernels`);
:func:`plan` returns that plan without running it.
:class:`MultiheadAttention` wraps it with projections, grouped-query heads, cross attention,
explicit positions and an optional KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from . import kernels
from .checks import check_bool, check_int, check_number, check_positions
from .encoding import NO_NEEDS, PositionEncoding
from .kv_cache import LayerKVCache
from .linear_attention import LINEAR_CHUNK_ROWS, FeatureMap, run_linear
from .masks import AttentionMask
from .pairwise import PairwiseBias, dense_bias, sum_of_biases
from .plan import BACKENDS, Backend, Plan, make_plan
from .shapes import check_qkv


def check_attention_args(
    encoding: PositionEncoding | None, mask: AttentionMask | None, batch: int, heads: int, q_len: int, kv_len: int
) -> None:
    """The checks of one attention call that need no tensor data: the types of ``encoding`` and
    ``mask``, mask shapes, causal-only encodings, and the head count of encodings with per-head
    parameters (``num_heads``)."""
    if mask is not None and not isinstance(mask, AttentionMask):
        raise TypeError(
            f"mask must be an AttentionMask (e.g. AttentionMask(key_valid=valid) for a bool [B, Tk] tensor) or None; "
            f"got {type(mask).__name__}"
        )
    if encoding is not None and not isinstance(encoding, PositionEncoding):
        raise TypeError(f"encoding must be a PositionEncoding (posenc.build(name, ...)) or None; got {type(encoding).__name__}")
    if mask is not None:
        mask.validate(batch, q_len, kv_len)
    if encoding is None:
        return
    name = type(encoding).__name__
    if encoding.causal_only and (mask is None or not mask.causal):
        raise ValueError(f"{name} is defined for causal attention only; pass a causal mask")
    if encoding.num_heads is not None and encoding.num_heads != heads:
        raise ValueError(f"this {name} was built for num_heads={encoding.num_heads}; the attention has {heads} query heads")


@dataclass
class _Prepared:
    """One call, ready to run: transformed q/k, the encoding's terms and the plan."""

    plan: Plan
    q: Tensor
    k: Tensor
    v: Tensor
    scale: float
    bias: PairwiseBias | None = None
    prob_bias: PairwiseBias | None = None
    score_transform: kernels.ScoreTransform | None = None
    value_term: kernels.ValueTerm | None = None
    offset_table: Tensor | None = None
    transform_inputs: tuple[Tensor, ...] = ()
    feature_map: FeatureMap | None = None


def _prepare(
    q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, kv_pos: Tensor, encoding: PositionEncoding | None,
    mask: AttentionMask | None, scale: float | None, backend: str, qk_transformed: bool,
    feature_map: FeatureMap | None = None, attn_bias: Tensor | None = None,
) -> _Prepared:
    """Apply the q/k transform, build the encoding's terms and make the plan (no attention yet)."""
    b, hq, tq, d = q.shape
    tk = k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    needs = encoding.attention_needs() if encoding is not None else NO_NEEDS
    encoding_bias = needs.score_bias
    if attn_bias is not None:
        if feature_map is not None:
            raise ValueError("attn_bias is added to softmax scores; linear attention (feature_map) has none")
        needs = replace(needs, score_bias=True)  # the caller's bias takes the score-bias paths
    if needs.qk and not qk_transformed:
        q, k = encoding.transform_qk(q, k, q_pos, kv_pos)
    if mask is not None and feature_map is None:  # (linear attention zeroes its key features itself)
        k, v = mask.zero_padding(k, v)  # padded keys never reach a real row, NaN included
    prep = _Prepared(plan=None, q=q, k=k, v=v, scale=scale, feature_map=feature_map)  # type: ignore[arg-type]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    what = type(encoding).__name__ if encoding is not None else "this call"
    if feature_map is not None:  # linear attention: no scores, so only the q/k and input hooks apply
        prep.plan = make_plan(
            needs, mask=mask, device=q.device, needs_grad=needs_grad, batch=b, heads=hq, q_len=tq, kv_len=tk,
            backend=backend, what=what, feature_map=feature_map.name,
        )
        return prep
    if needs.score_bias:
        own = encoding.score_bias(q, k, q_pos, kv_pos) if encoding_bias else None
        prep.bias = sum_of_biases(own, None if attn_bias is None else dense_bias(attn_bias))
    if needs.score_transform:

        def score_transform(scores: Tensor, q: Tensor, k: Tensor, rows: slice, keys: slice, allowed) -> Tensor:
            return encoding.transform_scores(scores, q, k, q_pos[:, rows], kv_pos[:, keys], allowed)

        prep.score_transform = score_transform
    if needs.prob_bias:
        prep.prob_bias = encoding.prob_bias(q_pos, kv_pos)
    if needs.score_transform or needs.value_term:
        prep.transform_inputs = tuple(encoding.math_parameters())
    if needs.value_term:

        def value_term(probs: Tensor, rows: slice, keys: slice) -> Tensor:
            return encoding.value_term(probs, q_pos[:, rows], kv_pos[:, keys])

        prep.value_term = value_term
    consecutive = needs.offset_values and kernels.contiguous_causal(mask, q_pos, kv_pos, tq, tk)
    bias = prep.bias
    prep.plan = make_plan(
        needs, mask=mask, device=q.device, needs_grad=needs_grad, batch=b, heads=hq, q_len=tq, kv_len=tk,
        backend=backend, bias_per_batch=bias is not None and bias.per_batch,
        bias_learned=bias is not None and bias.requires_grad, consecutive_causal=consecutive, what=what,
    )
    if prep.plan.offset_values:
        prep.offset_table = encoding.offset_values()
    return prep


def _run(prep: _Prepared, mask: AttentionMask | None) -> Tensor:
    plan, q, k, v, scale = prep.plan, prep.q, prep.k, prep.v, prep.scale
    hq, tq = q.shape[1], q.shape[2]
    if plan.path == "linear":
        # the plan has checked the mask; a bidirectional unpacked call has no blocks
        return run_linear(q, k, v, prep.feature_map, mask, plan.chunk_rows or LINEAR_CHUNK_ROWS)
    if plan.path == "math":
        return kernels.math_path(
            q, k, v, mask, prep.bias, scale, prep.prob_bias, prep.value_term, prep.score_transform, plan.chunk_rows,
            transform_inputs=prep.transform_inputs,
        )
    if plan.offset_values:
        q, k = q.contiguous(), k.contiguous()  # compacted once for both terms
        out, lse = kernels.dense_path(q, k, v, mask, prep.bias, scale, plan.chunk_rows, return_lse=True)
        out = out + kernels.offset_value_term(q, k, prep.bias, lse, prep.offset_table, scale)
    elif plan.path == "flex":
        out = kernels.flex_path(q, k, v, mask, prep.bias, scale)
    elif plan.path == "dense":
        out = kernels.dense_path(q, k, v, mask, prep.bias, scale, plan.chunk_rows)
    else:
        out = kernels.sdpa_path(q, k, v, mask, scale)
    if plan.prob_bias:
        out = out + kernels.prob_bias_term(v, hq, mask, prep.prob_bias, tq)
    return out


def _checked_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor | None,
    kv_pos: Tensor | None,
    encoding: PositionEncoding | None,
    mask: AttentionMask | None,
    attn_bias: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """The checks :func:`attend`, :func:`attend_with_weights` and :func:`plan` share; returns the
    positions normalised to ``[B or 1, T(, C)]`` (None: ``0 .. T-1`` on ``q``'s device)."""
    check_qkv(q, k, v)
    b, hq, tq, _ = q.shape
    tk = k.shape[2]
    q_pos = normalize_positions(q_pos, tq, b, "q_pos", device=q.device)
    kv_pos = normalize_positions(kv_pos, tk, b, "kv_pos", device=q.device)
    check_attention_args(encoding, mask, b, hq, tq, tk)
    check_attn_bias(attn_bias, b, hq, tq, tk)
    return q_pos, kv_pos


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    q_pos: Tensor,
    kv_pos: Tensor,
    encoding: PositionEncoding | None = None,
    mask: AttentionMask | None = None,
    scale: float | None = None,
    backend: Backend = "auto",
    qk_transformed: bool = False,
    feature_map: FeatureMap | None = None,
    attn_bias: Tensor | None = None,
) -> Tensor:
    """Attention of ``q [B, Hq, Tq, D]`` over ``k, v [B, Hkv, Tk, D]`` (``Hq`` a multiple of ``Hkv``).

    Args:
        q_pos, kv_pos: positions ``[B or 1, Tq]`` and ``[B or 1, Tk]`` (a trailing coordinate axis
            for 2D encodings), integer or float.
        encoding: its q/k, score-bias and after-softmax hooks are applied (the input hook is not:
            that belongs to the model, before the blocks).
        mask: which keys each query sees; None for full attention.
        scale: score scale, default ``D ** -0.5``.
        backend: "auto" follows the kernel plan (:func:`posenc.common.plan.make_plan`: SDPA when
            nothing touches the scores, FlexAttention on CUDA for a score bias, the chunked dense
            path elsewhere, math when the probabilities or the whole score matrix are needed);
            naming a path forces it, and a path that cannot honour the encoding is a ValueError.
            :func:`plan` tells which path a call takes.
        qk_transformed: ``q`` and ``k`` have already been through the encoding's q/k transform
            (as with a KV cache, where each key is transformed once, at its own position).
        feature_map: run linear attention with this feature map instead of softmax attention
            (:func:`posenc.common.linear_attention.linear_attention`; ``scale`` is then unused, the
            map defines the similarity). Only the q/k hooks apply; an encoding with a score bias
            or an after-softmax term is a ValueError.
        attn_bias: a float tensor ``[B or 1, Hq or 1, Tq, Tk]`` added to the scores before the
            softmax, beside the encoding's bias (a caller's additive attention mask; ``-inf``
            removes a pair, and a row removed whole gives NaN, as in torch). It takes the
            score-bias paths (dense on CPU, FlexAttention on CUDA).

    Returns:
        ``[B, Hq, Tq, D]``.
    """
    q_pos, kv_pos = _checked_call(q, k, v, q_pos, kv_pos, encoding, mask, attn_bias)
    b, hq, tq, d = q.shape
    tk = k.shape[2]
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if tq == 0 or tk == 0:  # nothing to attend to (or from): zeros, as for fully masked rows
        return q.new_zeros(b, hq, tq, d)
    prep = _prepare(q, k, v, q_pos, kv_pos, encoding, mask, scale, backend, qk_transformed, feature_map, attn_bias)
    return _run(prep, mask)


def attend_with_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    q_pos: Tensor,
    kv_pos: Tensor,
    encoding: PositionEncoding | None = None,
    mask: AttentionMask | None = None,
    scale: float | None = None,
    qk_transformed: bool = False,
    attn_bias: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """:func:`attend` with the attention weights returned too, by the explicit math path in one
    block (:func:`posenc.common.kernels.weights_path`): ``(out [B, Hq, Tq, D], weights [B, Hq,
    Tq, Tk])``. ``weights`` is the matrix applied to ``V``: the probabilities after dropout, plus an
    after-softmax bias (eRPE). This path keeps the whole ``[B, H, Tq, Tk]`` matrix and gives up
    the fused kernels: use it when the weights are wanted, or for attention dropout
    (``dropout_p``, applied as given: pass 0 outside training), which only it implements."""
    q_pos, kv_pos = _checked_call(q, k, v, q_pos, kv_pos, encoding, mask, attn_bias)
    b, hq, tq, d = q.shape
    tk = k.shape[2]
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p!r}")
    if tq == 0 or tk == 0:
        return q.new_zeros(b, hq, tq, d), q.new_zeros(b, hq, tq, tk)
    prep = _prepare(q, k, v, q_pos, kv_pos, encoding, mask, scale, "auto", qk_transformed, None, attn_bias)
    return kernels.weights_path(prep.q, prep.k, prep.v, mask, prep.bias, prep.scale, prep.prob_bias, prep.value_term,
                                prep.score_transform, dropout_p)


def check_attn_bias(attn_bias: Tensor | None, batch: int, heads: int, q_len: int, kv_len: int) -> None:
    """``attn_bias`` is None or a float ``[B or 1, H or 1, Tq, Tk]`` tensor; else a ValueError."""
    if attn_bias is None:
        return
    if (not isinstance(attn_bias, Tensor) or attn_bias.dim() != 4 or not attn_bias.dtype.is_floating_point
            or attn_bias.shape[0] not in (1, batch) or attn_bias.shape[1] not in (1, heads)
            or tuple(attn_bias.shape[2:]) != (q_len, kv_len)):
        got = f"{tuple(attn_bias.shape)} {attn_bias.dtype}" if isinstance(attn_bias, Tensor) else type(attn_bias).__name__
        raise ValueError(f"attn_bias must be a float tensor [batch={batch} or 1, heads={heads} or 1, {q_len}, {kv_len}]; "
                         f"got {got}")


def plan(
    q: Tensor,
    k: Tensor,
    v: Tensor | None = None,
    *,
    q_pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    encoding: PositionEncoding | None = None,
    mask: AttentionMask | None = None,
    scale: float | None = None,
    backend: Backend = "auto",
    qk_transformed: bool = False,
    feature_map: FeatureMap | None = None,
    attn_bias: Tensor | None = None,
) -> Plan:
    """The :class:`~posenc.common.plan.Plan` that :func:`attend` would follow for these
    arguments, in the current grad mode, without running the attention (the encoding's q/k
    transform and bias tables are built, as the plan depends on them). ``v`` defaults to ``k``;
    positions to ``0 .. T-1``. A forced ``backend`` that cannot serve the call raises the same
    ValueError as :func:`attend`."""
    v = k if v is None else v
    q_pos, kv_pos = _checked_call(q, k, v, q_pos, kv_pos, encoding, mask, attn_bias)
    tq, tk = q.shape[2], k.shape[2]
    if tq == 0 or tk == 0:
        return Plan("sdpa", "an empty sequence: zeros, no kernel runs")
    return _prepare(q, k, v, q_pos, kv_pos, encoding, mask, scale, backend, qk_transformed, feature_map, attn_bias).plan


def normalize_positions(pos: Tensor | None, length: int, batch: int, name: str, device=None) -> Tensor:
    """Positions as ``[B or 1, T(, C)]`` (a 1D ``[T]`` gains the batch axis); None means ``0 .. T-1``.
    A tensor of real, finite numbers (never ``bool``: ``True`` would be read as position 1); the
    range an encoding allows is its own to check."""
    if pos is None:
        return torch.arange(length, device=device).unsqueeze(0)
    check_positions(name, pos)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    if pos.dim() not in (2, 3) or pos.shape[1] != length or pos.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} must have shape [{length}], [batch={batch} or 1, {length}] or [batch or 1, {length}, coords]; "
            f"got {tuple(pos.shape)}"
        )
    return pos


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
    :class:`~posenc.common.torch_attention.TorchMultiheadAttention`.
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
        if encoding is not None and not isinstance(encoding, PositionEncoding):
            raise TypeError(f"encoding must be a PositionEncoding (posenc.build(name, ...)) or None; got {type(encoding).__name__}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads}), or give head_dim")
            head_dim = dim // num_heads
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
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

    def _project(
        self,
        x: Tensor,
        context: Tensor | None,
        q_pos: Tensor | None,
        kv_pos: Tensor | None,
        mask: AttentionMask | None,
        cache: LayerKVCache | None,
        grow_cache: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, bool]:
        """Checked projections: ``(q, k, v, q_pos, kv_pos, qk_transformed)`` as :func:`attend`
        takes them; with ``cache`` and ``grow_cache`` the new keys are appended to it."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}]; got {tuple(x.shape)}")
        if context is not None and cache is not None:
            raise ValueError("a KV cache is for self-attention; pass either context or cache, not both")
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
        if cache is None:
            return q, k, v, q_pos, new_kv_pos, qk_transformed
        if enc is not None and enc.attention_needs().qk:
            # Cache rotated keys: each key is rotated once, at its own position.
            q, k = enc.transform_qk(q, k, q_pos, new_kv_pos)
            qk_transformed = True
        if grow_cache:
            k, v, kv_pos_all = cache.append(k, v, new_kv_pos)
        else:
            k, v, kv_pos_all = cache.peek(k, v, new_kv_pos)
        return q, k, v, q_pos, kv_pos_all, qk_transformed

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        q_pos: Tensor | None = None,
        kv_pos: Tensor | None = None,
        mask: AttentionMask | None = None,
        cache: LayerKVCache | None = None,
    ) -> Tensor:
        """Attend from ``x`` to itself (with ``cache``: to the cached keys and itself) or to ``context``.

        Positions default to ``0 .. T-1``; with a cache, the new queries continue after the last
        cached position. Pass them explicitly for packed sequences, float or 2D positions.
        """
        q, k, v, q_pos, kv_pos, qk_transformed = self._project(x, context, q_pos, kv_pos, mask, cache, grow_cache=True)
        out = attend(
            q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=self.encoding, mask=mask,
            scale=self.scale, backend=self.backend, qk_transformed=qk_transformed, feature_map=self.feature_map,
        )
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
        """The kernel :class:`~posenc.common.plan.Plan` that ``forward`` with these arguments would
        follow, in the current grad mode. Runs the projections, not the attention; a cache is
        read, never grown."""
        q, k, v, q_pos, kv_pos, qk_transformed = self._project(x, context, q_pos, kv_pos, mask, cache, grow_cache=False)
        return plan(
            q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=self.encoding, mask=mask,
            scale=self.scale, backend=self.backend, qk_transformed=qk_transformed, feature_map=self.feature_map,
        )
