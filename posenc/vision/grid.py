"""Patch grids and 2D positions, shared by the vision encodings and the ViT.

Convention: a token's 2D position is its ``(row, col)`` on the patch grid, so positions are
``[B or 1, T, 2]`` (integer or float) beside tokens ``[B, T, C]``. Prefix tokens (class token,
registers) come first; an encoding built with ``num_prefix_tokens = P`` treats the first ``P``
tokens of every call as prefix tokens and ignores their position entries (:func:`grid_positions`
fills them with zeros). The number of prefix tokens is constructor configuration, never per-call
state.

Encodings that hold tables at a training grid (learned 2D, axial, 2D relative bias, PEG's
scatter) read the grid of a call from the positions themselves (:func:`grid_extent`), so the
grid reaches them explicitly with every call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.checks import check_allocation, check_positions


def to_pair(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """``8 -> (8, 8)``; ``(8, 6) -> (8, 6)``; anything else is a ValueError naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a pair of ints; got {value!r}")
    if isinstance(value, int):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name} must be an int or a pair of ints; got {value!r}")
    if pair[0] <= 0 or pair[1] <= 0:
        raise ValueError(f"{name} must be positive; got {value!r}")
    return pair


def check_table_grid(what: str, grid: tuple[int, int], shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
    """Refuse, before resampling, a table for ``grid`` (read from the positions of a call) that
    could not fit in memory: positions of 10^9 would otherwise ask for gigabytes (or exabytes)."""
    check_allocation(f"{what}'s table resampled to the grid {tuple(grid)} (from the largest positions)", shape, dtype, device)


def grid_positions(rows: int, cols: int, *, num_prefix_tokens: int = 0, device=None) -> Tensor:
    """``(row, col)`` of every patch in raster order, after ``num_prefix_tokens`` zero entries.

    Returns:
        ``[1, num_prefix_tokens + rows * cols, 2]`` long.
    """
    if rows <= 0 or cols <= 0:
        raise ValueError(f"grid must be positive; got rows={rows}, cols={cols}")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0; got {num_prefix_tokens}")
    r = torch.arange(rows, device=device).repeat_interleave(cols)
    c = torch.arange(cols, device=device).repeat(rows)
    coords = torch.stack((r, c), dim=-1)
    prefix = torch.zeros(num_prefix_tokens, 2, dtype=torch.long, device=device)
    return torch.cat((prefix, coords), dim=0).unsqueeze(0)


def raster_positions(num_patches: int, *, num_prefix_tokens: int = 0, device=None) -> Tensor:
    """1D positions ``0 .. N-1`` of the patches in raster order, after zero prefix entries: ``[1, P + N]``."""
    pos = torch.arange(num_patches, device=device)
    return torch.cat((torch.zeros(num_prefix_tokens, dtype=torch.long, device=device), pos)).unsqueeze(0)


def patch_coords(positions: Tensor, num_tokens: int, num_prefix_tokens: int, what: str) -> Tensor:
    """Validate 2D ``positions [B or 1, T, 2]`` for ``T = num_tokens`` and return the patch part
    ``[B or 1, T - P, 2]``. ``what`` names the caller in error messages."""
    if not isinstance(positions, Tensor) or positions.dim() != 3 or positions.shape[-1] != 2:
        shape = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
        raise ValueError(f"{what} needs 2D positions [batch or 1, tokens, 2] as (row, col); got {shape}")
    check_positions("positions", positions)  # real and finite, never bool (True would be row 1)
    if positions.shape[1] != num_tokens:
        raise ValueError(
            f"{what}: positions cover {positions.shape[1]} tokens but there are {num_tokens} "
            f"(grid does not match the token count)"
        )
    if num_tokens < num_prefix_tokens:
        raise ValueError(f"{what} was built for {num_prefix_tokens} prefix tokens but got only {num_tokens} tokens")
    return positions[:, num_prefix_tokens:]


def integer_coords(coords: Tensor, what: str) -> Tensor:
    """Integer-valued coordinates as long; fractional ones are a ValueError (tables are indexed)."""
    if coords.dtype.is_floating_point:
        if coords.numel() and not bool((coords == coords.round()).all()):
            raise ValueError(f"{what} indexes a table and needs integer (row, col) positions; got fractional ones")
        return coords.round().long()
    return coords.long()


def grid_extent(coords: Tensor) -> tuple[int, int, int, int]:
    """``(row_min, col_min, rows, cols)``: the bounding box of integer ``coords [..., 2]``
    (a host sync, the price of following any grid)."""
    if coords.numel() == 0:
        return 0, 0, 0, 0
    lo = coords.reshape(-1, 2).amin(0).tolist()
    hi = coords.reshape(-1, 2).amax(0).tolist()
    return int(lo[0]), int(lo[1]), int(hi[0] - lo[0] + 1), int(hi[1] - lo[1] + 1)


def absolute_grid(coords: Tensor, what: str) -> tuple[int, int]:
    """Grid ``(max row + 1, max col + 1)`` of absolute integer coordinates (which must be >= 0)."""
    r0, c0, rows, cols = grid_extent(coords)
    if r0 < 0 or c0 < 0:
        raise ValueError(f"{what} needs (row, col) positions >= 0; got a minimum of ({r0}, {c0})")
    return r0 + rows, c0 + cols


def resample_grid(table: Tensor, size: tuple[int, int], *, mode: str = "bicubic", antialias: bool = True) -> Tensor:
    """Resample a ``[rows, cols, D]`` table to ``[size[0], size[1], D]``.

    Follows timm's ``resample_abs_pos_embed``: ``F.interpolate`` with ``align_corners=False``,
    bicubic with antialiasing (which only acts when shrinking), computed in float32. The same
    size returns ``table`` itself, so resampling to the training grid is exactly the identity.
    """
    if tuple(size) == tuple(table.shape[:2]):
        return table
    if mode not in ("bicubic", "bilinear"):
        raise ValueError(f"mode must be 'bicubic' or 'bilinear'; got {mode!r}")
    grid = table.permute(2, 0, 1).unsqueeze(0).float()
    out = F.interpolate(grid, size=tuple(size), mode=mode, align_corners=False, antialias=antialias)
    return out.squeeze(0).permute(1, 2, 0).to(table.dtype)
