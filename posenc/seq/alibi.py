"""ALiBi, attention with linear biases (Press et al. 2022, https://arxiv.org/abs/2108.12409).

``bias(h, i, j) = -m_h * (i - j)`` on causal attention; the symmetric variant
``-m_h * |i - j|`` serves bidirectional attention. Slopes ``m_h = 2^(-8h/H)``, ``h = 1..H``, for ``H``
a power of two; otherwise the slopes of the largest power of two below ``H`` followed by every
other slope of the next power of two. Hook: score bias (a pure function, no gradient).
Kernel: the dense bias into SDPA's fused kernel on CPU, FlexAttention ``score_mod`` on CUDA.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..common.checks import check_bool, check_int
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, take
from ..common.registry import register


def alibi_slopes(num_heads: int) -> Tensor:
    """The standard ALiBi slopes (float32 ``[num_heads]``), for any head count."""
    check_int("num_heads", num_heads, minimum=1)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(p)
    if p < num_heads:
        slopes += power_of_two(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


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
        if q_pos.dim() != 2 or kv_pos.dim() != 2:
            raise ValueError(f"positions must be [batch or 1, tokens]; got {tuple(q_pos.shape)} and {tuple(kv_pos.shape)}")
        slopes, symmetric = self.slopes, self.symmetric
        if slopes.dtype != torch.float32:  # the module was cast (.half()): keep the slopes exact
            slopes = alibi_slopes(self.num_heads).to(slopes.device)

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            # Subtract in the positions' own dtype (exact for integers), then go to float32.
            dist = (take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx)).to(torch.float32)
            if symmetric:
                dist = dist.abs()
            return -slopes[h] * dist

        return PairwiseBias(bias, per_batch=max(q_pos.shape[0], kv_pos.shape[0]) > 1, name="ALiBi")
