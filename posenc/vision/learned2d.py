"""Learned 2D absolute position embedding with bicubic resampling to new grids.

Paper: Dosovitskiy et al. 2021, An Image is Worth 16x16 Words (ViT), https://arxiv.org/abs/2010.11929;
resampling as in timm's ``resample_abs_pos_embed`` (and ``VisionTransformer(dynamic_img_size=True)``).

A table ``E [R, C, d]`` at the training grid; the patch at ``(r, c)`` gets ``x + E[r, c]``. A call
whose grid (``max row + 1, max col + 1`` of its positions) differs from ``(R, C)`` uses the whole
table resampled to that grid: bicubic, ``align_corners=False``, antialiased, in float32 (timm's
defaults); so a larger image sees a stretched table, not an extrapolated one. Resampling to the
training grid is exactly the identity (the table itself). ``new_grid="refuse"`` raises instead.
Prefix tokens (class, registers) are kept apart: no entry of the table, no encoding (a learned
class-token embedding is the same as a learned class token). Hook: input. Kernel: plain SDPA.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number
from ..common.registry import register
from .grid import check_table_grid, resample_grid, to_pair
from .grid_table import GridTableEncoding, init_table

NEW_GRID = ("resample", "refuse")


@register(
    "learned2d",
    modality="vision",
    paper="Dosovitskiy et al. 2021, ViT, https://arxiv.org/abs/2010.11929 (timm resample_abs_pos_embed)",
    summary="learned (rows, cols, dim) table added to the patches; bicubic resampling to new grids",
)
class Learned2D(GridTableEncoding):
    """Args:
        dim: model width ``C``.
        grid_size: training grid ``(R, C)`` (or one int for a square grid).
        num_prefix_tokens: leading tokens (class, registers) left without an encoding.
        new_grid: "resample" (bicubic, as timm) or "refuse" (ValueError) for a grid other than ``grid_size``.
        init_std: standard deviation of the truncated-normal initialisation (0.02 as ViT/timm).

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T, 2]`` integer (row, col) >= 0 -> ``[B, T, C]``.
    """

    label = "learned2d"

    def __init__(
        self,
        dim: int,
        grid_size: int | tuple[int, int],
        num_prefix_tokens: int = 0,
        new_grid: Literal["resample", "refuse"] = "resample",
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_choice("new_grid", new_grid, NEW_GRID)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        check_number("init_std", init_std, minimum=0.0, strict=True)
        self.dim, self.grid_size = dim, to_pair(grid_size, "grid_size")
        self.num_prefix_tokens, self.new_grid = num_prefix_tokens, new_grid
        self.table = nn.Parameter(torch.empty(*self.grid_size, dim))
        init_table(self.table, init_std)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid_size={self.grid_size}, num_prefix_tokens={self.num_prefix_tokens}, new_grid={self.new_grid!r}"

    def table_for(self, grid: tuple[int, int]) -> Tensor:
        """The table at ``grid``: ``[rows, cols, dim]`` (resampled unless it is the training grid)."""
        grid = tuple(grid)
        if grid != self.grid_size and self.new_grid == "refuse":
            raise ValueError(
                f"learned2d was built for the grid {self.grid_size} with new_grid='refuse'; got the grid {grid}"
            )
        if grid != self.grid_size:
            check_table_grid("learned2d", grid, (*grid, self.dim), torch.float32, self.table.device)
        return resample_grid(self.table, grid)

    def encode_coords(self, coords: Tensor, grid: tuple[int, ...]) -> Tensor:
        table = self.table_for(grid)
        return table[coords[..., 0], coords[..., 1]]  # [B or 1, N, C]
