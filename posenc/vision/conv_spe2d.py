"""Convolutional stochastic positional encoding on the patch grid, ``conv_spe2d``.

Liutkus et al. 2021, Relative Positional Encoding for Transformers with Linear Complexity (ICML),
https://arxiv.org/abs/2105.08399 (the authors' convSPE takes 1, 2 or 3 dimensions). The 2D
version of :class:`posenc.seq.ConvSPE`: white noise on the grid through learned 2D filters of
``kernel_size`` taps per axis, ``Qbar_{y,x} = sum_{a,b} phi^Q_{a,b} Z_{y+a, x+b}`` (``Kbar`` with
``phi^K``), so the kernel is the filters' 2D cross-correlation
``P_d(dy, dx) = sum_{a,b} phi^Q_{a,b} phi^K_{a+dy, b+dx}``: a function of the 2D offset only,
zero beyond ``kernel_size - 1`` on either axis. Gating, the ``1 / sqrt(R)`` estimate and the
chunked, recomputed codes are :mod:`posenc.primitives.spe`'s. Prefix tokens (class token, registers)
get the position-free code: their scores are plain dot products (in expectation).

Hook: q/k transform to width ``R``; linear attention only (``feature_map=`` on the ViT).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.registry import register
from ..primitives.budget import check_allocation
from ..primitives.spe import (
    StochasticPositionalEncoding,
    check_integer_positions,
    conv_cross_correlation,
    positional_noise,
)
from .grid import to_pair


@register(
    "conv_spe2d",
    modality="vision",
    paper="Liutkus et al. 2021, Relative Positional Encoding for Transformers with Linear Complexity, "
    "https://arxiv.org/abs/2105.08399",
    summary="2D convolutional stochastic PE for linear attention: kernel = 2D cross-correlation of learned filters",
)
class ConvSPE2d(StochasticPositionalEncoding):
    """Args:
        num_heads: query heads ``H``.
        head_dim: per-head width ``D``.
        kernel_size: filter taps per axis (an int or ``(rows, cols)``); default 8.
        num_realizations: ``R``, the width of the encoded queries and keys.
        gated: mix in position-free noise with a learned gate (the paper's gating).
        seed: noise seed in evaluation mode.
        num_prefix_tokens: leading tokens (class, registers) that get the position-free code.

    Shapes: ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T, 2]`` (integer
    ``(row, col)``; prefix entries ignored) -> ``[B, H, Tq, R]``, ``[B, H, Tk, R]``.
    """

    coords = 2

    def __init__(self, num_heads: int, head_dim: int, kernel_size: int | tuple[int, int] = 8,
                 num_realizations: int = 64, gated: bool = True, seed: int = 0, num_prefix_tokens: int = 0) -> None:
        super().__init__(num_heads, head_dim, num_realizations, gated, seed, num_prefix_tokens)
        self.kernel_size = to_pair(kernel_size, "kernel_size")
        kh, kw = self.kernel_size
        scale = math.sqrt(kh * kw / 2)
        self.filter_q = nn.Parameter(torch.rand(num_heads, head_dim, kh, kw) / scale)
        self.filter_k = nn.Parameter(torch.rand(num_heads, head_dim, kh, kw) / scale)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", kernel_size={self.kernel_size}"

    def kernel(self, offsets: Tensor) -> Tensor:
        """``offsets [*S, 2]`` (``(dy, dx)``) -> ``[H, D, *S]``."""
        if offsets.shape[-1:] != (2,):
            raise ValueError(f"conv_spe2d's kernel takes offsets [..., 2] (dy, dx); got {tuple(offsets.shape)}")
        kh, kw = self.kernel_size
        h, d = self.num_heads, self.head_dim
        xcorr = conv_cross_correlation(self.filter_q.reshape(h * d, kh, kw).to(torch.float64),
                                       self.filter_k.reshape(h * d, kh, kw).to(torch.float64))  # [HD, 2kh-1, 2kw-1]
        dy, dx = offsets[..., 0].to(torch.long), offsets[..., 1].to(torch.long)
        inside = (dy.abs() < kh) & (dx.abs() < kw)
        iy = (dy.clamp(-(kh - 1), kh - 1) + kh - 1).reshape(-1)
        ix = (dx.clamp(-(kw - 1), kw - 1) + kw - 1).reshape(-1)
        values = xcorr[:, iy, ix] * inside.reshape(-1).to(torch.float64)
        return values.reshape(h, d, *dy.shape)

    def _check_positions(self, positions: Tensor, name: str) -> None:
        check_integer_positions(positions, 2, name, "conv_spe2d")

    def _codes(self, positions: Tensor, seed: int, noise: Tensor | None, is_query: bool, scale: Tensor | None,
               dtype: torch.dtype) -> Tensor:
        h, d, r = self.num_heads, self.head_dim, self.num_realizations
        kh, kw = self.kernel_size
        pos = positions.to(torch.long)  # [B', C, 2]
        r0, c0 = (int(v) for v in pos.amin(dim=(0, 1)).tolist())
        r1, c1 = (int(v) for v in pos.amax(dim=(0, 1)).tolist())
        # the codes on the chunk's bounding box need the noise on it plus the filter's reach
        check_allocation(f"conv_spe2d's noise over the positions' bounding box rows {r0}..{r1}, cols {c0}..{c1}",
                         (r, h * d, r1 - r0 + kh, c1 - c0 + kw), dtype, pos.device)
        z = positional_noise(seed, (r0, c0), (r1 + kh, c1 + kw), (r, h * d), pos.device, dtype)
        weight = (self.filter_q if is_query else self.filter_k).to(dtype)
        if scale is not None:
            weight = weight * scale[..., None, None]
        weight = weight.reshape(h * d, 1, kh, kw)
        field = F.conv2d(z, weight, groups=h * d)  # [R, HD, rows, cols] of the box
        cols = c1 - c0 + 1
        index = ((pos[..., 0] - r0) * cols + (pos[..., 1] - c0)).reshape(-1)
        codes = field.flatten(2)[:, :, index]  # [R, HD, B'C]
        return codes.reshape(r, h, d, *pos.shape[:2]).permute(3, 1, 4, 2, 0).contiguous()  # [B', H, C, D, R]
