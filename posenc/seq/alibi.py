"""ALiBi, attention with linear biases (Press et al. 2022, https://arxiv.org/abs/2108.12409).

``bias(h, i, j) = -m_h * (i - j)`` on causal attention; the symmetric variant
``-m_h * |i - j|`` serves bidirectional attention. Slopes ``m_h = 2^(-8h/H)``, ``h = 1..H``, for ``H``
a power of two; otherwise the slopes of the largest power of two below ``H`` followed by every
other slope of the next power of two. Hook: score bias (a pure function, no gradient).
Functional form: :func:`alibi_slopes`, :func:`alibi_bias` (the dense bias, causal with the mask
folded in as ``-inf``, or symmetric) and :func:`alibi_penalty` (the formula both use).
Kernel: the dense bias into SDPA's fused kernel on CPU, FlexAttention ``score_mod`` on CUDA.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..common.checks import (
    check_bool,
    check_dtype,
    check_int,
    check_positions,
    check_sequence_positions,
    check_tensor,
)
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, take
from ..common.registry import register
from ..primitives.budget import check_allocation
from .relative import relative_position_grid


def alibi_slopes(num_heads: int) -> Tensor:
    """The standard ALiBi slopes (float32 ``[num_heads]``), for any head count: ``2^(-8h/H)``,
    ``h = 1..H``, for ``H`` a power of two; otherwise those of the largest power of two below
    ``H``, then every other slope of the next power of two."""
    check_int("num_heads", num_heads, minimum=1)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(p)
    if p < num_heads:
        slopes += power_of_two(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


def _check_slopes(slopes: Tensor) -> None:
    check_tensor("slopes", slopes, floating=True)
    if slopes.numel() == 0:
        raise ValueError(f"slopes must hold one slope a head; got shape {tuple(slopes.shape)}")
    if not torch.compiler.is_compiling() and not bool(torch.isfinite(slopes).all()):
        raise ValueError(f"slopes must be finite; got {slopes.flatten().tolist()[:8]}")


def alibi_penalty(distance: Tensor, slopes: Tensor, *, symmetric: bool) -> Tensor:
    """ALiBi's linear penalty, element-wise: ``-m * d`` (causal form) or ``-m * |d|`` (symmetric).

    ``distance`` is the query position minus the key position (``i - j``), real and finite (NaN or
    inf is a ValueError, read unless ``torch.compile`` traces); ``slopes`` (finite, floating)
    broadcasts against it. For keys after the query (``d < 0``) the causal form is *positive*: it
    is only meaningful under a causal mask that removes those keys. :func:`alibi_bias` applies that
    mask itself; :class:`ALiBi` requires a causal mask from the attention call.
    """
    check_positions("distance", distance)
    _check_slopes(slopes)
    check_bool("symmetric", symmetric)
    return _penalty(distance, slopes, symmetric)


def _penalty(distance: Tensor, slopes: Tensor, symmetric: bool) -> Tensor:
    """:func:`alibi_penalty` without the checks: the bias functions' form (their positions were
    checked where the call entered, and a value read inside a traced ``score_mod`` would break it)."""
    return -slopes * (distance.abs() if symmetric else distance)


def alibi_bias(
    q_len: int,
    k_len: int,
    slopes: Tensor,
    *,
    causal: bool,
    offset: int | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The dense ALiBi bias ``[H, q_len, k_len]`` to add to the attention scores.

    Query ``i`` sits at position ``i + offset`` and key ``j`` at ``j``; ``d = i + offset - j``.

    * ``causal=True``: ``-m_h * d`` for keys at or before the query (``d >= 0``) and ``-inf`` for
      keys after it: the causal mask is part of the bias, so nothing is ever positive and the
      result is a complete float mask (``F.scaled_dot_product_attention(q, k, v, attn_mask=bias)``,
      no ``is_causal``).
    * ``causal=False``: the symmetric bidirectional variant ``-m_h * |d|``.

    Args:
        q_len: query count.
        k_len: key count.
        slopes: ``[H]`` per-head slopes (:func:`alibi_slopes`).
        causal: required, so the treatment of keys after the query is always a stated choice.
        offset: position of query 0 minus position of key 0; default ``k_len - q_len`` (queries
            at the end of the keys, as with a KV cache; 0 for equal lengths).
        dtype: of the result; default ``slopes.dtype``.

    Returns ``[H, q_len, k_len]`` on ``slopes``' device.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    _check_slopes(slopes)
    if slopes.dim() != 1:
        raise ValueError(f"slopes must be a [num_heads] tensor (alibi_slopes(H)); got {getattr(slopes, 'shape', slopes)!r}")
    check_int("q_len", q_len, minimum=0)
    check_int("k_len", k_len, minimum=0)
    dtype = slopes.dtype if dtype is None else check_dtype("dtype", dtype)
    check_allocation(f"alibi_bias(q_len={q_len}, k_len={k_len}): the bias [H, q_len, k_len]",
                     (slopes.shape[0], q_len, k_len), dtype, slopes.device)
    distance = -relative_position_grid(q_len, k_len, offset=offset, device=slopes.device)  # [Tq, Tk], i - j
    bias = _penalty(distance.to(dtype), slopes.to(dtype)[:, None, None], not causal)
    if causal:
        bias = bias.masked_fill(distance < 0, float("-inf"))
    return bias


@register(
    "alibi",
    modality="seq",
    paper="Press et al. 2022, Train Short, Test Long, https://arxiv.org/abs/2108.12409",
    summary="linear distance penalty per head on the scores; causal or symmetric",
)
class ALiBi(PositionEncoding):
    """Args:
        num_heads: query heads ``H``.
        symmetric: use ``-m_h * |i - j|`` (bidirectional); otherwise causal-only.

    Positions ``[B or 1, T]``, integer or float.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    causal_only = True  # the default; the symmetric variant lifts it

    def __init__(self, num_heads: int, symmetric: bool = False) -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        check_bool("symmetric", symmetric)
        self.num_heads, self.symmetric = num_heads, symmetric
        self.causal_only = not symmetric
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        check_sequence_positions(q_pos, kv_pos)
        slopes, symmetric = self.slopes, self.symmetric
        if slopes.dtype != torch.float32:  # the module was cast (.half()): keep the slopes exact
            slopes = alibi_slopes(self.num_heads).to(slopes.device)

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            # Subtract in the positions' own dtype (exact for integers), then go to float32. The
            # causal form is positive for keys after the query: the causal mask this encoding
            # requires (causal_only) removes them.
            dist = (take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx)).to(torch.float32)
            return _penalty(dist, slopes[h], symmetric)

        def by_offset(offsets: Tensor) -> Tensor:  # offsets kv - q [R] -> [H, R]
            return _penalty((-offsets).to(torch.float32), slopes[:, None], symmetric)

        return PairwiseBias(bias, per_batch=max(q_pos.shape[0], kv_pos.shape[0]) > 1, name="ALiBi", by_offset=by_offset)
