"""2D sinusoidal position encoding (fixed; MoCo v3 / MAE / timm).

Paper: Chen, Xie & He 2021, An Empirical Study of Training Self-Supervised Vision Transformers
(MoCo v3), https://arxiv.org/abs/2104.02057; used by MAE (He et al. 2022,
https://arxiv.org/abs/2111.06377).

The width ``d`` is split into four quarters with ``omega_k = base^(-k / (d/4))``,
``k = 0 .. d/4 - 1`` (base 10000), and a patch at ``(row r, col c)`` gets the sines and cosines
of ``r * omega`` and ``c * omega``. Two layouts are met in real checkpoints, both named here:

* ``layout="timm"`` (timm ``build_sincos2d_pos_embed``, grid in (H, W) order):
  ``[sin(r omega), sin(c omega), cos(r omega), cos(c omega)]``;
* ``layout="mae"`` (MAE ``get_2d_sincos_pos_embed``: its ``meshgrid(grid_w, grid_h)`` puts the
  column first): ``[sin(c omega), cos(c omega), sin(r omega), cos(r omega)]``.

Prefix tokens (class, registers) get a zero encoding, as in MAE. Hook: input. Kernel: whatever the
rest of the model allows (plain SDPA). Follows any grid (and float positions): nothing is stored.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..common.checks import check_choice, check_int, check_number, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.sinusoid import sinusoid_frequencies
from .grid import patch_coords

LAYOUTS = ("timm", "mae")


def sincos2d_table(coords: Tensor, dim: int, *, layout: str = "timm", base: float = 10000.0) -> Tensor:
    """The 2D sinusoidal encoding of ``coords [..., 2]`` (row, col) -> ``[..., dim]`` float64."""
    check_positions("coords", coords)  # finite: NaN would be a NaN row, without a word
    if coords.dim() == 0 or coords.shape[-1] != 2:
        raise ValueError(f"coords must be [..., 2] (row, col); got shape {tuple(coords.shape)}")
    check_int("dim", dim, minimum=4)
    if dim % 4:
        raise ValueError(f"dim must be a positive multiple of 4 for a 2D sinusoidal encoding; got {dim}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    # sinusoid_frequencies(d/2) gives base^(-2j/(d/2)) for j < d/4, i.e. base^(-k/(d/4)) per quarter.
    omega = sinusoid_frequencies(dim // 2, base, device=coords.device)
    coords = coords.to(torch.float64)
    row = coords[..., 0:1] * omega
    col = coords[..., 1:2] * omega
    if layout == "timm":
        parts = (row.sin(), col.sin(), row.cos(), col.cos())
    else:
        parts = (col.sin(), col.cos(), row.sin(), row.cos())
    return torch.cat(parts, dim=-1)


def sincos2d_grid(
    rows: int, cols: int, dim: int, *, layout: str = "timm", base: float = 10000.0, dtype: torch.dtype = torch.float32,
    device=None,
) -> Tensor:
    """The 2D sinusoidal table of a ``rows x cols`` patch grid in raster order: ``[rows * cols, dim]``
    (row-major: token ``r * cols + c`` is patch ``(r, c)``), to add to the patch tokens."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    coords = torch.cartesian_prod(torch.arange(rows, device=device), torch.arange(cols, device=device))
    return sincos2d_table(coords.reshape(rows * cols, 2), dim, layout=layout, base=base).to(dtype)


@register(
    "sincos2d",
    modality="vision",
    paper="Chen et al. 2021, MoCo v3, https://arxiv.org/abs/2104.02057 (MAE, timm layouts)",
    summary="fixed 2D sin/cos of row and column added to the patch tokens; timm or MAE layout",
)
class SinCos2D(PositionEncoding):
    """Args:
        dim: model width ``C`` (a multiple of 4).
        layout: "timm" ``[sin r, sin c, cos r, cos c]`` or "mae" ``[sin c, cos c, sin r, cos r]``.
        base: frequency base (10000).
        num_prefix_tokens: leading tokens (class, registers) that get no encoding.

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T, 2]`` (row, col; integer or float) -> ``[B, T, C]``.
    """

    hooks = frozenset({Hook.INPUT})

    def __init__(
        self,
        dim: int,
        layout: Literal["timm", "mae"] = "timm",
        base: float = 10000.0,
        num_prefix_tokens: int = 0,
    ) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        if dim % 4:
            raise ValueError(f"dim must be a positive multiple of 4 for a 2D sinusoidal encoding; got {dim}")
        check_choice("layout", layout, LAYOUTS)
        check_number("base", base, minimum=1.0, strict=True)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        self.dim, self.layout, self.base, self.num_prefix_tokens = dim, layout, base, num_prefix_tokens

    def extra_repr(self) -> str:
        return f"dim={self.dim}, layout={self.layout!r}, base={self.base}, num_prefix_tokens={self.num_prefix_tokens}"

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}]; got {tuple(x.shape)}")
        coords = patch_coords(positions, x.shape[1], self.num_prefix_tokens, "sincos2d")
        pe = sincos2d_table(coords, self.dim, layout=self.layout, base=self.base).to(x.dtype)
        p = self.num_prefix_tokens
        return torch.cat((x[:, :p], x[:, p:] + pe), dim=1)
