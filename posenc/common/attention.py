"""Multi-head attention with position-encoding hooks and kernel dispatch.

:func:`attend` is the functional core: it applies an encoding's q/k transform, score bias and
after-softmax terms, and picks the fastest kernel path those allow (see :mod:`.kernels`).
:class:`MultiheadAttention` wraps it with projections, grouped-query heads, cross attention,
explicit positions and an optional KV cache.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from . import kernels
from .encoding import Hook, PositionEncoding
from .kv_cache import LayerKVCache
from .masks import AttentionMask
from .pairwise import PairwiseBias

Backend = Literal["auto", "sdpa", "flex", "dense", "math"]
BACKENDS: tuple[str, ...] = ("auto", "sdpa", "flex", "dense", "math")


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def choose_backend(
    backend: str,
    *,
    device: torch.device,
    has_score_bias: bool,
    needs_probs: bool,
    needs_grad: bool,
    what: str = "this encoding",
    needs_scores: bool = False,
) -> str:
    """Resolve ``backend`` for one call; a path that cannot honour the hooks is a ValueError."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "auto":
        if needs_probs or needs_scores:
            return "math"
        if not has_score_bias:
            return "sdpa"
        return "flex" if device.type == "cuda" and flex_available() else "dense"
    if needs_probs and backend != "math":
        raise ValueError(f"backend={backend!r} cannot serve {what}: it needs the attention probabilities; use 'math' or 'auto'")
    if needs_scores and backend != "math":
        raise ValueError(f"backend={backend!r} cannot serve {what}: it transforms the whole score matrix; use 'math' or 'auto'")
    if has_score_bias and backend == "sdpa":
        raise ValueError(f"backend='sdpa' cannot apply the score bias of {what}; use 'auto', 'dense', 'flex' or 'math'")
    if backend == "flex":
        if not flex_available():
            raise ValueError("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)")
        if device.type == "cpu" and needs_grad:
            raise ValueError(
                "backend='flex' has no backward pass on CPU; use 'dense' (or 'auto') for training on CPU, "
                "or call under torch.no_grad()"
            )
    return backend


def check_attention_args(
    encoding: PositionEncoding | None, mask: AttentionMask | None, batch: int, heads: int, q_len: int, kv_len: int
) -> None:
    """The checks of one attention call that need no tensor data: mask shapes, causal-only
    encodings, and the head count of encodings with per-head parameters (``num_heads``)."""
    if mask is not None:
        mask.validate(batch, q_len, kv_len)
    if encoding is None:
        return
    name = type(encoding).__name__
    if encoding.causal_only and (mask is None or not mask.causal):
        raise ValueError(f"{name} is defined for causal attention only; pass a causal mask")
    built_for = getattr(encoding, "num_heads", None)
    if built_for is not None and built_for != heads:
        raise ValueError(f"this {name} was built for num_heads={built_for}; the attention has {heads} query heads")


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
) -> Tensor:
    """Attention of ``q [B, Hq, Tq, D]`` over ``k, v [B, Hkv, Tk, D]`` (``Hq`` a multiple of ``Hkv``).

    Args:
        q_pos, kv_pos: positions ``[B or 1, Tq]`` and ``[B or 1, Tk]`` (a trailing coordinate axis
            for 2D encodings), integer or float.
        encoding: its q/k, score-bias and after-softmax hooks are applied (the input hook is not:
            that belongs to the model, before the blocks).
        mask: which keys each query sees; None for full attention.
        scale: score scale, default ``D ** -0.5``.
        backend: "auto" picks SDPA when nothing touches the scores, FlexAttention on CUDA for a
            score bias, a dense bias into SDPA elsewhere, and math when the probabilities or the
            whole score matrix are needed.
        qk_transformed: ``q`` and ``k`` have already been through the encoding's q/k transform
            (as with a KV cache, where each key is transformed once, at its own position).

    Returns:
        ``[B, Hq, Tq, D]``.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, H, T, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, hq, tq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be [B={b}, Hkv, Tk, D={d}] alike; got {tuple(k.shape)} and {tuple(v.shape)}")
    if hq % k.shape[1]:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({k.shape[1]})")
    tk = k.shape[2]
    q_pos = normalize_positions(q_pos, tq, b, "q_pos")
    kv_pos = normalize_positions(kv_pos, tk, b, "kv_pos")
    check_attention_args(encoding, mask, b, hq, tq, tk)
    if tq == 0 or tk == 0:  # nothing to attend to (or from): zeros, as for fully masked rows
        return q.new_zeros(b, hq, tq, d)
    scale = d ** -0.5 if scale is None else scale
    hooks = encoding.hooks if encoding is not None else frozenset()

    if Hook.QK in hooks and not qk_transformed:
        q, k = encoding.transform_qk(q, k, q_pos, kv_pos)

    bias: PairwiseBias | None = None
    score_transform = None
    if Hook.SCORE_BIAS in hooks:
        if encoding.has_score_bias:
            bias = encoding.score_bias(q, k, q_pos, kv_pos)
        if encoding.needs_scores:

            def score_transform(scores: Tensor, q: Tensor, k: Tensor, allowed: Tensor | None) -> Tensor:
                return encoding.transform_scores(scores, q, k, q_pos, kv_pos, allowed)

    prob_bias: PairwiseBias | None = None
    value_term = None
    if Hook.POST_SOFTMAX in hooks:
        if encoding.has_prob_bias:
            prob_bias = encoding.prob_bias(q_pos, kv_pos)
        if encoding.needs_probs:

            def value_term(probs: Tensor) -> Tensor:
                return encoding.value_term(probs, q_pos, kv_pos)

    # A value term over clipped offsets has a fused form on CPU (causal, consecutive positions).
    offset_table = None
    if value_term is not None and bias is not None and q.device.type == "cpu" and backend in ("auto", "dense"):
        offset_table = encoding.offset_values()
        if offset_table is not None and not kernels.contiguous_causal(mask, q_pos, kv_pos, tq, tk):
            offset_table = None
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    path = choose_backend(
        backend,
        device=q.device,
        has_score_bias=bias is not None,
        needs_probs=value_term is not None and offset_table is None,
        needs_grad=needs_grad or (bias is not None and bias.requires_grad),
        what=type(encoding).__name__ if encoding is not None else "this call",
        needs_scores=score_transform is not None,
    )
    if path == "math":
        return kernels.math_path(q, k, v, mask, bias, scale, prob_bias, value_term, score_transform)
    if offset_table is not None:  # path == "dense", on CPU
        out, lse = kernels.dense_path(q, k, v, mask, bias, scale, return_lse=True)
        out = out + kernels.offset_value_term(q, k, bias, lse, offset_table, scale)
        if prob_bias is not None:
            out = out + kernels.prob_bias_term(v, hq, mask, prob_bias, tq)
        return out
    if path == "sdpa" and backend == "auto" and _needs_square_mask(mask, tq, tk) and q.is_cuda and flex_available():
        # On CUDA a mask that SDPA could only take as a dense [Tq, Tk] tensor goes to FlexAttention's
        # block-sparse kernel instead (packed sequences, sliding windows, causal + padding).
        out = kernels.flex_path(q, k, v, mask, None, scale)
    elif path == "sdpa" and bias is None:
        out = kernels.sdpa_path(q, k, v, mask, scale)
    elif path == "flex":
        out = kernels.flex_path(q, k, v, mask, bias, scale)
    elif bias is None:  # "dense" with nothing to add: the masks go to SDPA as they would anyway
        out = kernels.sdpa_path(q, k, v, mask, scale)
    else:
        out = kernels.dense_path(q, k, v, mask, bias, scale)
    if prob_bias is not None:
        out = out + kernels.prob_bias_term(v, hq, mask, prob_bias, tq)
    return out


def _needs_square_mask(mask: AttentionMask | None, q_len: int, kv_len: int) -> bool:
    return mask is not None and not mask.is_empty and not mask.only_causal(q_len, kv_len) and not mask.only_key_padding


def normalize_positions(pos: Tensor | None, length: int, batch: int, name: str, device=None) -> Tensor:
    """Positions as ``[B or 1, T(, C)]`` (a 1D ``[T]`` gains the batch axis); None means ``0 .. T-1``."""
    if pos is None:
        return torch.arange(length, device=device).unsqueeze(0)
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

    Shapes:
        ``x [B, Tq, C]``, ``context [B, Tk, kv_dim]`` -> ``[B, Tq, C]``.
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
    ) -> None:
        super().__init__()
        if dim <= 0 or num_heads <= 0:
            raise ValueError(f"dim and num_heads must be positive; got dim={dim}, num_heads={num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
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

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

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

        q = self._heads(self.q_proj(x), self.num_heads)
        k = self._heads(self.k_proj(src), self.num_kv_heads)
        v = self._heads(self.v_proj(src), self.num_kv_heads)
        qk_transformed = False
        if cache is not None:
            if enc is not None and not enc.supports_kv_cache:
                raise ValueError(f"{type(enc).__name__} does not support a KV cache; run the full sequence instead")
            if enc is not None and Hook.QK in enc.hooks:
                # Cache rotated keys: each key is rotated once, at its own position.
                q, k = enc.transform_qk(q, k, q_pos, new_kv_pos)
                qk_transformed = True
            k, v, kv_pos_all = cache.append(k, v, new_kv_pos)
        else:
            kv_pos_all = new_kv_pos
        out = attend(
            q, k, v, q_pos=q_pos, kv_pos=kv_pos_all, encoding=enc, mask=mask,
            scale=self.scale, backend=self.backend, qk_transformed=qk_transformed,
        )
        return self.out_proj(out.transpose(1, 2).flatten(2))
