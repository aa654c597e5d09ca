"""Patch grids and their positions (2D for images, 3D for video), shared by the vision encodings
and the ViT.

Convention: a token's 2D position is its ``(row, col)`` on the patch grid, so positions are
``[B or 1, T, 2]`` (integer or float) beside tokens ``[B, T, C]``. A video token's position is
``(t, row, col)`` on the grid of tubelets, ``[B or 1, T, 3]``, with ``t`` the tubelet index in
time; video tokens are in raster order with time outermost (:func:`grid_positions3d`). The
encodings over 3D grids (``sincos3d``, ``axial3d``, ``rope3d``) set the class attribute
``grid_ndim = 3``; every other vision encoding reads 2D grids. Prefix tokens (class token,
registers) come first; an encoding built with ``num_prefix_tokens = P`` treats the first ``P``
tokens of every call as prefix tokens and ignores their position entries (:func:`grid_positions`
fills them with zeros). The number of prefix tokens is constructor configuration, never per-call
state.

Encodings that hold tables at a training grid (learned 2D, axial, axial 3D, 2D relative bias,
PEG's scatter) read the grid of a call from the positions themselves (:func:`grid_extent`), so the
grid reaches them explicitly with every call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.checks import check_positions
from ..primitives.budget import check_allocation

AXIS_NAMES = {2: ("row", "col"), 3: ("t", "row", "col")}


def to_tuple(value: int | tuple[int, ...] | list[int], n: int, name: str) -> tuple[int, ...]:
    """``8 -> (8,) * n``; a sequence of ``n`` positive ints as a tuple; anything else is a
    TypeError / ValueError naming ``name``."""
    what = "a pair" if n == 2 else "a triple" if n == 3 else f"{n}"
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if is_int(value):
        out = (int(value),) * n
    elif isinstance(value, (tuple, list)) and len(value) == n and all(is_int(v) for v in value):
        out = tuple(int(v) for v in value)
    else:
        raise TypeError(f"{name} must be an int or {what} of ints; got {value!r}")
    if any(v <= 0 for v in out):
        raise ValueError(f"{name} must be positive; got {value!r}")
    return out


def to_pair(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """``8 -> (8, 8)``; ``(8, 6) -> (8, 6)``; anything else is a ValueError naming ``name``."""
    return to_tuple(value, 2, name)  # type: ignore[return-value]


def to_triple(value: int | tuple[int, int, int] | list[int], name: str) -> tuple[int, int, int]:
    """``4 -> (4, 4, 4)``; ``(2, 8, 6) -> (2, 8, 6)``; anything else is a ValueError naming ``name``."""
    return to_tuple(value, 3, name)  # type: ignore[return-value]


def _raster(sizes: tuple[int, ...], num_prefix_tokens: int, device) -> Tensor:
    """Integer coordinates of every cell of a grid of ``sizes``, the last axis fastest, after
    ``num_prefix_tokens`` zero entries: ``[1, P + prod(sizes), len(sizes)]``."""
    if any(s <= 0 for s in sizes):
        names = AXIS_NAMES.get(len(sizes), tuple(f"axis{i}" for i in range(len(sizes))))
        shown = ", ".join(f"{n}s={s}" if n != "t" else f"frames={s}" for n, s in zip(names, sizes))
        raise ValueError(f"grid must be positive; got {shown}")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0; got {num_prefix_tokens}")
    axes = [torch.arange(s, device=device) for s in sizes]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))
    prefix = torch.zeros(num_prefix_tokens, len(sizes), dtype=torch.long, device=device)
    return torch.cat((prefix, coords), dim=0).unsqueeze(0)


def check_table_grid(what: str, grid: tuple[int, int], shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
    """Refuse, before resampling, a table for ``grid`` (read from the positions of a call) that
    could not fit in memory: positions of 10^9 would otherwise ask for gigabytes (or exabytes)."""
    check_allocation(f"{what}'s table resampled to the grid {tuple(grid)} (from the largest positions)", shape, dtype, device)


def grid_positions(rows: int, cols: int, *, num_prefix_tokens: int = 0, device=None) -> Tensor:
    """``(row, col)`` of every patch in raster order, after ``num_prefix_tokens`` zero entries.

    Returns:
        ``[1, num_prefix_tokens + rows * cols, 2]`` long.
    """
    return _raster((rows, cols), num_prefix_tokens, device)


def grid_positions3d(frames: int, rows: int, cols: int, *, num_prefix_tokens: int = 0, device=None) -> Tensor:
    """``(t, row, col)`` of every tubelet of a ``frames x rows x cols`` grid in raster order (time
    outermost, then rows, then columns), after ``num_prefix_tokens`` zero entries.

    Returns:
        ``[1, num_prefix_tokens + frames * rows * cols, 3]`` long.
    """
    return _raster((frames, rows, cols), num_prefix_tokens, device)


def raster_positions(num_patches: int, *, num_prefix_tokens: int = 0, device=None) -> Tensor:
    """1D positions ``0 .. N-1`` of the patches in raster order, after zero prefix entries: ``[1, P + N]``."""
    pos = torch.arange(num_patches, device=device)
    return torch.cat((torch.zeros(num_prefix_tokens, dtype=torch.long, device=device), pos)).unsqueeze(0)


def patch_coords(positions: Tensor, num_tokens: int, num_prefix_tokens: int, what: str, ndim: int = 2) -> Tensor:
    """Validate ``positions [B or 1, T, ndim]`` (2D: ``(row, col)``; 3D: ``(t, row, col)``) for
    ``T = num_tokens`` and return the patch part ``[B or 1, T - P, ndim]``. ``what`` names the
    caller in error messages."""
    if not isinstance(positions, Tensor) or positions.dim() != 3 or positions.shape[-1] != ndim:
        shape = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
        names = ", ".join(AXIS_NAMES[ndim])
        raise ValueError(f"{what} needs {ndim}D positions [batch or 1, tokens, {ndim}] as ({names}); got {shape}")
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
            raise ValueError(f"{what} indexes a table and needs integer positions; got fractional ones")
        return coords.round().long()
    return coords.long()


# Run eagerly under torch.compile: the extent sets sizes (a resampled table), so it must be read
# off the data; one graph break per forward instead of one per scalar read.
@torch.compiler.disable
def coord_extent(coords: Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(minima, sizes)`` per axis: the bounding box of integer ``coords [..., n]`` (a host
    sync, the price of following any grid); all zeros when there are no coordinates."""
    n = coords.shape[-1]
    if coords.numel() == 0:
        return (0,) * n, (0,) * n
    flat = coords.reshape(-1, n)
    lo, hi = torch.stack((flat.amin(0), flat.amax(0))).tolist()  # one sync, not two
    return tuple(int(v) for v in lo), tuple(int(h - l + 1) for l, h in zip(lo, hi))


def grid_extent(coords: Tensor) -> tuple[int, int, int, int]:
    """``(row_min, col_min, rows, cols)``: the bounding box of integer ``coords [..., 2]``."""
    (r0, c0), (rows, cols) = coord_extent(coords)
    return r0, c0, rows, cols


def absolute_grid(coords: Tensor, what: str) -> tuple[int, ...]:
    """Grid ``max + 1`` per axis of absolute integer coordinates ``[..., n]`` (which must be >= 0):
    ``(rows, cols)`` in 2D, ``(frames, rows, cols)`` in 3D."""
    lo, sizes = coord_extent(coords)
    if any(v < 0 for v in lo):
        names = ", ".join(AXIS_NAMES.get(len(lo), ()))
        raise ValueError(f"{what} needs ({names}) positions >= 0; got a minimum of {tuple(lo)}")
    return tuple(l + s for l, s in zip(lo, sizes))


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
