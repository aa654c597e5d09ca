"""Axial (factorised) learned 3D position embedding for video tokens.

Papers: Ho et al. 2019, Axial Attention in Multidimensional Transformers,
https://arxiv.org/abs/1912.12180 (axial embeddings); the separable space + time tables of
TimeSformer (Bertasius et al. 2021, https://arxiv.org/abs/2102.05095) and MAE-ST
(https://arxiv.org/abs/2205.09113) factorise once more here, the space table into rows and columns.

Three learned tables, one per axis, ``E_t [F, d_t]``, ``E_row [R, d_r]``, ``E_col [C, d_c]``:

* ``mode="sum"`` (default): ``PE(t, r, c) = E_t[t] + E_row[r] + E_col[c]``, each ``d`` wide;
* ``mode="concat"``: ``PE(t, r, c) = [E_t[t], E_row[r], E_col[c]]`` with ``d_t + d_r + d_c = d``
  (``axis_dims``; default ``d_t = d // 4`` as ``sincos3d``, the rest halved, the odd channel to
  the columns).

That is ``(F + R + C) d`` parameters (sum) instead of ``F R C d``.

New grids: a call whose grid (``max + 1`` of its positions per axis) differs from the training
grid resamples each axis table on its own, 1D, to the new length, exactly as the 2D ``axial``
encoding does (:func:`posenc.vision.axial.resample_axis`: ``new_grid="bicubic"`` (default) or
``"linear"``, ``align_corners=False``, antialiased when shrinking), or raises
(``new_grid="refuse"``). Resampling to the training length is exactly the identity, so at the
training grid the encoding is the tables themselves. Prefix tokens get no encoding. Hook: input.
Kernel: plain SDPA.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Sequence

import torch
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number, is_int
from ..common.registry import register
from .axial import MODES, NEW_GRID, resample_axis
from .grid import check_table_grid, to_triple
from .grid_table import GridTableEncoding, init_table


def _check_axis_dims(axis_dims: object) -> None:
    """None, or three ints (a list or tuple; ``True`` is not a width)."""
    if axis_dims is not None and not (isinstance(axis_dims, (tuple, list)) and len(axis_dims) == 3
                                      and all(is_int(v) for v in axis_dims)):
        raise TypeError(f"axis_dims must be three ints (t, row, col) or None; got {axis_dims!r}")


def _concat_dims(dim: int, axis_dims: Sequence[int] | None) -> tuple[int, int, int]:
    _check_axis_dims(axis_dims)
    if axis_dims is None:
        t = dim // 4
        r = (dim - t) // 2
        dims = (t, r, dim - t - r)
    else:
        dims = tuple(int(v) for v in axis_dims)
    if any(v <= 0 for v in dims) or sum(dims) != dim:
        raise ValueError(
            f"axis_dims (t, row, col) must be positive and add up to dim={dim} for mode='concat'; got {dims}"
            + (" (dim is too small to split in three)" if axis_dims is None else "")
        )
    return dims  # type: ignore[return-value]


@register(
    "axial3d",
    modality="vision",
    paper="Ho et al. 2019, Axial Attention, https://arxiv.org/abs/1912.12180 (space-time tables: TimeSformer, MAE-ST)",
    summary="video: learned t, row and col tables, summed or concatenated; each axis resampled on new grids",
)
class Axial3D(GridTableEncoding):
    """Args:
        dim: model width ``C``.
        grid_size: training grid ``(F, R, W)`` of tubelets (frames / tubelet, rows, cols), or one int.
        mode: "sum" (``E_t[t] + E_row[r] + E_col[c]``, each ``dim`` wide) or "concat".
        axis_dims: widths ``(d_t, d_r, d_c)`` of the tables in "concat" mode (default ``dim // 4``
            for time, the rest halved).
        num_prefix_tokens: leading tokens (class, registers) left without an encoding.
        new_grid: "bicubic", "linear" (resample each axis) or "refuse" for a grid other than ``grid_size``.
        init_std: truncated-normal initialisation (0.02).

    Parameters: ``tables[0] [F, d_t]``, ``tables[1] [R, d_r]``, ``tables[2] [W, d_c]``.
    Shapes: ``x [B, T, C]``, ``positions [B or 1, T, 3]`` integer (t, row, col) >= 0 -> ``[B, T, C]``.
    """

    grid_ndim: ClassVar[int] = 3
    label = "axial3d"

    def __init__(
        self,
        dim: int,
        grid_size: int | tuple[int, int, int],
        mode: Literal["sum", "concat"] = "sum",
        axis_dims: Sequence[int] | None = None,
        num_prefix_tokens: int = 0,
        new_grid: Literal["bicubic", "linear", "refuse"] = "bicubic",
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_choice("mode", mode, MODES)
        _check_axis_dims(axis_dims)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        check_choice("new_grid", new_grid, NEW_GRID)
        check_number("init_std", init_std, minimum=0.0, strict=True)
        if mode == "sum":
            if axis_dims is not None:
                raise ValueError("axis_dims applies to mode='concat' only")
            dims = (dim, dim, dim)
        else:
            dims = _concat_dims(dim, axis_dims)
        self.dim, self.mode, self.axis_dims = dim, mode, dims
        self.grid_size = to_triple(grid_size, "grid_size")
        self.num_prefix_tokens, self.new_grid = num_prefix_tokens, new_grid
        self.tables = nn.ParameterList(nn.Parameter(torch.empty(n, d)) for n, d in zip(self.grid_size, dims))
        for t in self.tables:
            init_table(t, init_std)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, grid_size={self.grid_size}, mode={self.mode!r}, axis_dims={self.axis_dims}, "
                f"num_prefix_tokens={self.num_prefix_tokens}, new_grid={self.new_grid!r}")

    def tables_for(self, grid: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
        """``(E_t [frames, d_t], E_row [rows, d_r], E_col [cols, d_c])`` at ``grid`` (each axis
        resampled if its length differs from training)."""
        grid = tuple(int(g) for g in grid)
        if len(grid) != 3:
            raise ValueError(f"grid must be (frames, rows, cols); got {grid}")
        if grid != self.grid_size and self.new_grid == "refuse":
            raise ValueError(
                f"axial3d was built for the grid {self.grid_size} (frames, rows, cols) with new_grid='refuse'; "
                f"got the grid {grid}"
            )
        for axis, (table, n) in enumerate(zip(self.tables, grid)):
            if n != table.shape[0]:  # resampling is refused before it asks for the memory
                check_table_grid(f"axial3d (axis {('frames', 'rows', 'cols')[axis]})", grid, (n, table.shape[1]),
                                 table.dtype, table.device)
        return tuple(resample_axis(t, n, self.new_grid) for t, n in zip(self.tables, grid))  # type: ignore[return-value]

    def encode_coords(self, coords: Tensor, grid: tuple[int, ...]) -> Tensor:
        tables = self.tables_for(grid)
        parts = [table[coords[..., i]] for i, table in enumerate(tables)]  # each [B or 1, N, d_axis]
        return parts[0] + parts[1] + parts[2] if self.mode == "sum" else torch.cat(parts, dim=-1)

