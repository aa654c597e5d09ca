"""Axial (factorised) learned 2D position embedding.

Paper: Ho et al. 2019, Axial Attention in Multidimensional Transformers,
https://arxiv.org/abs/1912.12180 (axial position embeddings; also Reformer's axial embeddings).

Two learned tables, one per axis. ``mode="sum"``: ``PE(r, c) = E_row[r] + E_col[c]`` with
``E_row [R, d]``, ``E_col [C, d]``; ``mode="concat"``: ``PE(r, c) = [E_row[r], E_col[c]]`` with
``d_row + d_col = d``. That is ``(R + C) d`` parameters instead of ``R C d``.

New grids: a call whose grid (``max row + 1``, ``max col + 1`` of its positions) differs from the
training grid resamples each axis table on its own, 1D, to the new length (``new_grid="bicubic"``
(default, like learned 2D) or ``"linear"``; ``align_corners=False``, antialiased when shrinking),
or raises (``new_grid="refuse"``). Resampling to the training length is exactly the identity.
Prefix tokens get no encoding. Hook: input. Kernel: plain SDPA.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number
from ..common.registry import register
from .grid import check_table_grid, to_pair
from .grid_table import GridTableEncoding, init_table

MODES = ("sum", "concat")
NEW_GRID = ("bicubic", "linear", "refuse")


def resample_axis(table: Tensor, length: int, mode: str = "bicubic") -> Tensor:
    """Resample ``[L, D]`` along its first axis to ``[length, D]`` (``align_corners=False``, float32)."""
    if length == table.shape[0]:
        return table
    x = table.t().unsqueeze(0).float()  # [1, D, L]
    if mode == "linear":
        out = F.interpolate(x, size=length, mode="linear", align_corners=False, antialias=False)
    elif mode == "bicubic":  # 1D bicubic as a [L x 1] image (the unit axis is left as it is)
        out = F.interpolate(x.unsqueeze(-1), size=(length, 1), mode="bicubic", align_corners=False, antialias=True)
        out = out.squeeze(-1)
    else:
        raise ValueError(f"mode must be 'bicubic' or 'linear'; got {mode!r}")
    return out.squeeze(0).t().to(table.dtype)


@register(
    "axial",
    modality="vision",
    paper="Ho et al. 2019, Axial Attention, https://arxiv.org/abs/1912.12180",
    summary="learned row and column tables, summed or concatenated; each axis resampled on new grids",
)
class AxialEncoding(GridTableEncoding):
    """Args:
        dim: model width ``C``.
        grid_size: training grid ``(R, W)`` (or one int).
        mode: "sum" (``E_row[r] + E_col[c]``, each ``dim`` wide) or "concat" (``[E_row[r], E_col[c]]``).
        row_dim: width of the row table in "concat" mode (default ``dim // 2``; the column table gets the rest).
        num_prefix_tokens: leading tokens (class, registers) left without an encoding.
        new_grid: "bicubic", "linear" (resample each axis) or "refuse" for a grid other than ``grid_size``.
        init_std: truncated-normal initialisation (0.02).

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T, 2]`` integer (row, col) >= 0 -> ``[B, T, C]``.
    """

    label = "axial"

    def __init__(
        self,
        dim: int,
        grid_size: int | tuple[int, int],
        mode: Literal["sum", "concat"] = "sum",
        row_dim: int | None = None,
        num_prefix_tokens: int = 0,
        new_grid: Literal["bicubic", "linear", "refuse"] = "bicubic",
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_choice("mode", mode, MODES)
        check_choice("new_grid", new_grid, NEW_GRID)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        check_number("init_std", init_std, minimum=0.0, strict=True)
        if row_dim is not None:
            check_int("row_dim", row_dim, minimum=1)
        if mode == "sum":
            if row_dim is not None:
                raise ValueError("row_dim applies to mode='concat' only")
            row_dim, col_dim = dim, dim
        else:
            row_dim = dim // 2 if row_dim is None else row_dim
            col_dim = dim - row_dim
            if row_dim <= 0 or col_dim <= 0:
                raise ValueError(f"row_dim must be in 1..{dim - 1} for mode='concat'; got {row_dim}")
        self.dim, self.mode, self.grid_size = dim, mode, to_pair(grid_size, "grid_size")
        self.row_dim, self.col_dim = row_dim, col_dim
        self.num_prefix_tokens, self.new_grid = num_prefix_tokens, new_grid
        self.row_table = nn.Parameter(torch.empty(self.grid_size[0], row_dim))
        self.col_table = nn.Parameter(torch.empty(self.grid_size[1], col_dim))
        for t in (self.row_table, self.col_table):
            init_table(t, init_std)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, grid_size={self.grid_size}, mode={self.mode!r}, row_dim={self.row_dim}, "
                f"num_prefix_tokens={self.num_prefix_tokens}, new_grid={self.new_grid!r}")

    def tables_for(self, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """``(E_row [rows, d_row], E_col [cols, d_col])`` at ``grid`` (resampled per axis if needed)."""
        grid = tuple(grid)
        if grid != self.grid_size and self.new_grid == "refuse":
            raise ValueError(f"axial was built for the grid {self.grid_size} with new_grid='refuse'; got the grid {grid}")
        if grid != self.grid_size:  # both axis tables, resampled in float32
            check_table_grid("axial", grid, (grid[0] * self.row_dim + grid[1] * self.col_dim,), torch.float32,
                             self.row_table.device)
        return resample_axis(self.row_table, grid[0], self.new_grid), resample_axis(self.col_table, grid[1], self.new_grid)

    def encode_coords(self, coords: Tensor, grid: tuple[int, ...]) -> Tensor:
        rows, cols = self.tables_for(grid)
        e_row, e_col = rows[coords[..., 0]], cols[coords[..., 1]]
        return e_row + e_col if self.mode == "sum" else torch.cat((e_row, e_col), dim=-1)
