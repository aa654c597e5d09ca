"""3D (space-time) sinusoidal position encoding for video tokens (fixed).

Used by the MAE family of video models: MAE-ST (Feichtenhofer et al. 2022, Masked Autoencoders
As Spatiotemporal Learners, https://arxiv.org/abs/2205.09113) and its followers (UMT, InternVideo,
CogVideoX; diffusers ``get_3d_sincos_pos_embed``); VideoMAE (Tong et al. 2022,
https://arxiv.org/abs/2203.12602) uses a 1D table over the flattened tokens, which any sequence
encoding over the raster order gives here.

The width ``d`` is split over the three axes and a 1D sin-cos table of each axis is concatenated:

* channel split: ``time_dim`` channels for ``t`` (default ``d / 4``, as in those models), and the
  remaining ``d - time_dim`` split equally between columns and rows (``3d/8`` each by default);
* each axis block of width ``w`` holds ``[sin(p omega), cos(p omega)]`` with
  ``omega_k = base^(-2k/w)``, ``k = 0 .. w/2 - 1`` (base 10000): the 1D table of
  :func:`posenc.primitives.sinusoid.sinusoid_table`, sines first then cosines (MAE's 1D layout);
* layout ``[t | col | row]`` = ``[sin t, cos t, sin c, cos c, sin r, cos r]``: time first, then
  MAE's 2D table (whose ``meshgrid(w, h)`` puts the column first). So the spatial part is
  exactly ``sincos2d(layout="mae")`` of width ``d - time_dim``.

Positions are ``(t, row, col)`` per token (``t`` the tubelet index). Prefix tokens (class,
registers) get a zero encoding. Hook: input. Kernel: plain SDPA. Follows any grid and float
positions: nothing is stored.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from ..common.checks import check_int, check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.sinusoid import sinusoid_table
from .grid import patch_coords


def sincos3d_split(dim: int, time_dim: int | None = None) -> tuple[int, int, int]:
    """Channels per axis ``(t, row, col)``: ``time_dim`` (default ``dim // 4``) for time, the rest
    halved between rows and columns; every part must be a positive even number."""
    check_int("dim", dim, minimum=1)
    if time_dim is None:
        time_dim = dim // 4
    else:
        check_int("time_dim", time_dim, minimum=1)
    space = dim - time_dim
    if time_dim <= 0 or time_dim % 2 or space <= 0 or space % 4:
        hint = " (the default time_dim = dim // 4 needs dim to be a multiple of 16)" if time_dim == dim // 4 else ""
        raise ValueError(
            f"sincos3d splits dim={dim} into time_dim={time_dim} for time and (dim - time_dim) / 2 for rows and for "
            f"columns; each part needs an even number of channels (sin and cos), so time_dim must be even and "
            f"dim - time_dim a multiple of 4{hint}"
        )
    return time_dim, space // 2, space // 2


def _axis_block(pos: Tensor, width: int, base: float) -> Tensor:
    """MAE's 1D layout ``[sin(p omega_0..), cos(p omega_0..)]`` of ``pos [...]`` -> ``[..., width]``
    float64, from the shared (interleaved) sinusoid table."""
    table = sinusoid_table(pos, width, base, dtype=torch.float64)
    return torch.cat((table[..., 0::2], table[..., 1::2]), dim=-1)


def sincos3d_table(coords: Tensor, dim: int, *, time_dim: int | None = None, base: float = 10000.0) -> Tensor:
    """The 3D sinusoidal encoding of ``coords [..., 3]`` ``(t, row, col)`` -> ``[..., dim]`` float64,
    laid out ``[sin t, cos t, sin c, cos c, sin r, cos r]`` (see the module docstring)."""
    if coords.shape[-1] != 3:
        raise ValueError(f"coords must be [..., 3] as (t, row, col); got shape {tuple(coords.shape)}")
    t_dim, r_dim, c_dim = sincos3d_split(dim, time_dim)
    return torch.cat(
        (_axis_block(coords[..., 0], t_dim, base), _axis_block(coords[..., 2], c_dim, base),
         _axis_block(coords[..., 1], r_dim, base)),
        dim=-1,
    )


@register(
    "sincos3d",
    modality="vision",
    paper="Feichtenhofer et al. 2022, MAE-ST, https://arxiv.org/abs/2205.09113 (3D sin-cos of UMT, InternVideo, CogVideoX)",
    summary="video: fixed 1D sin/cos tables of t, col and row concatenated (d/4 time, 3d/8 each space axis)",
)
class SinCos3D(PositionEncoding):
    """Args:
        dim: model width ``C``.
        time_dim: channels for time (default ``dim // 4``); rows and columns get ``(dim - time_dim) / 2`` each.
        base: frequency base (10000).
        num_prefix_tokens: leading tokens (class, registers) that get no encoding.

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T, 3]`` (t, row, col; integer or float) -> ``[B, T, C]``.
    """

    hooks = frozenset({Hook.INPUT})
    grid_ndim: ClassVar[int] = 3

    def __init__(self, dim: int, time_dim: int | None = None, base: float = 10000.0, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        self.time_dim = sincos3d_split(dim, time_dim)[0]
        check_number("base", base, minimum=1.0, strict=True)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        self.dim, self.base, self.num_prefix_tokens = dim, base, num_prefix_tokens

    def extra_repr(self) -> str:
        return f"dim={self.dim}, time_dim={self.time_dim}, base={self.base}, num_prefix_tokens={self.num_prefix_tokens}"

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}]; got {tuple(x.shape)}")
        coords = patch_coords(positions, x.shape[1], self.num_prefix_tokens, "sincos3d", ndim=3)
        pe = sincos3d_table(coords, self.dim, time_dim=self.time_dim, base=self.base).to(x.dtype)
        p = self.num_prefix_tokens
        return torch.cat((x[:, :p], x[:, p:] + pe), dim=1)
