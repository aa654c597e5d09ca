"""2D relative position bias (Swin, BEiT).

Papers: Liu et al. 2021, Swin Transformer, https://arxiv.org/abs/2103.14030; Bao et al. 2022, BEiT,
https://arxiv.org/abs/2106.08254.

A learned table ``B [H, (2R-1)(2C-1)]`` per head over every 2D offset of a ``R x C`` grid; the score
of query token ``i`` at ``(r_i, c_i)`` and key ``j`` gets
``B[h, (r_i - r_j + R - 1) (2C - 1) + (c_i - c_j + C - 1)]`` before the softmax.

Prefix tokens (class, registers): with ``prefix_bias=False`` (default) every pair involving one
gets zero bias; with ``prefix_bias=True`` three more learned values per head, as BEiT has, serve
prefix -> patch, patch -> prefix and prefix -> prefix.

New grid sizes: the grid of a call is the bounding box of its positions. When it differs from the
training grid, the offset table (seen as a ``(2R-1) x (2C-1)`` image per head) is resampled
bicubically to ``(2R'-1) x (2C'-1)``, as Swin and BEiT do when fine-tuning at a new size
(``new_grid="resample"``, default); ``new_grid="refuse"`` raises instead. The prefix values are
kept as they are.

Swin and BEiT (fine-tuning) learn one table per block, so the ViT builds one instance per block
(``per_layer = True``); a single instance shared by every layer is BEiT's shared variant.

Hook: score bias through a :class:`~posenc.common.pairwise.PairwiseBias` ``fn(b, h, q, kv)`` that
gathers the table by the 2D offset of the two tokens. Kernel: dense bias into SDPA on CPU,
FlexAttention (``score_mod``) on CUDA; math also serves it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_bool, check_choice, check_int, check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, gather, take
from ..common.registry import register
from .grid import check_table_grid, grid_extent, integer_coords, patch_coords, to_pair

NEW_GRID = ("resample", "refuse")


def resample_offset_table(table: Tensor, grid: tuple[int, int], new_grid: tuple[int, int]) -> Tensor:
    """``[H, (2R-1)(2C-1)]`` -> ``[H, (2R'-1)(2C'-1)]``: bicubic, ``align_corners=False``, float32."""
    if tuple(grid) == tuple(new_grid):
        return table
    h = table.shape[0]
    image = table.reshape(1, h, 2 * grid[0] - 1, 2 * grid[1] - 1).float()
    size = (2 * new_grid[0] - 1, 2 * new_grid[1] - 1)
    out = F.interpolate(image, size=size, mode="bicubic", align_corners=False, antialias=True)
    return out.reshape(h, -1).to(table.dtype)


@register(
    "relbias2d",
    modality="vision",
    paper="Liu et al. 2021, Swin Transformer, https://arxiv.org/abs/2103.14030; Bao et al. 2022, BEiT, "
    "https://arxiv.org/abs/2106.08254",
    summary="learned per-head bias for each 2D offset on the scores; bicubic resampling on new grids",
)
class RelativePositionBias2D(PositionEncoding):
    """Args:
        num_heads: heads ``H``.
        grid_size: training grid ``(R, C)`` (or one int).
        num_prefix_tokens: leading tokens (class, registers).
        prefix_bias: learn BEiT's three extra values per head for pairs with a prefix token (else zero).
        new_grid: "resample" (bicubic) or "refuse" for a grid other than ``grid_size``.
        init_std: truncated-normal initialisation of the table (0.02, as Swin).

    Parameters: ``table [H, (2R-1)(2C-1) (+3 with prefix_bias)]``.
    Shapes: positions ``[B or 1, T, 2]`` integer (row, col); the bias is ``[B or 1, H, Tq, Tk]``.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    per_layer: ClassVar[bool] = True

    def __init__(
        self,
        num_heads: int,
        grid_size: int | tuple[int, int],
        num_prefix_tokens: int = 0,
        prefix_bias: bool = False,
        new_grid: Literal["resample", "refuse"] = "resample",
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        check_choice("new_grid", new_grid, NEW_GRID)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        check_bool("prefix_bias", prefix_bias)
        check_number("init_std", init_std, minimum=0.0, strict=True)
        self.num_heads, self.grid_size = num_heads, to_pair(grid_size, "grid_size")
        self.num_prefix_tokens, self.prefix_bias, self.new_grid = num_prefix_tokens, prefix_bias, new_grid
        r, c = self.grid_size
        self.num_offsets = (2 * r - 1) * (2 * c - 1)
        self.table = nn.Parameter(torch.empty(num_heads, self.num_offsets + (3 if prefix_bias else 0)))
        nn.init.trunc_normal_(self.table, std=init_std, a=-2 * init_std, b=2 * init_std)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, grid_size={self.grid_size}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"prefix_bias={self.prefix_bias}, new_grid={self.new_grid!r}")

    def table_for(self, grid: tuple[int, int]) -> Tensor:
        """``[H, (2R'-1)(2C'-1) (+3)]``: the offset table at ``grid`` (prefix values unchanged)."""
        grid = tuple(grid)
        if grid == self.grid_size:
            return self.table
        if self.new_grid == "refuse":
            raise ValueError(
                f"relbias2d was built for the grid {self.grid_size} with new_grid='refuse'; got the grid {grid}"
            )
        check_table_grid("relbias2d", grid, (self.num_heads, 2 * grid[0] - 1, 2 * grid[1] - 1), torch.float32, self.table.device)
        offsets = resample_offset_table(self.table[:, : self.num_offsets], self.grid_size, grid)
        return torch.cat((offsets, self.table[:, self.num_offsets:]), dim=1)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        if q.shape[1] != self.num_heads:
            raise ValueError(f"relbias2d was built for num_heads={self.num_heads}; q has {q.shape[1]} heads")
        p = self.num_prefix_tokens
        q_coords = integer_coords(patch_coords(q_pos, q.shape[2], p, "relbias2d"), "relbias2d")
        kv_coords = integer_coords(patch_coords(kv_pos, k.shape[2], p, "relbias2d"), "relbias2d")
        both = torch.cat((q_coords.reshape(-1, 2), kv_coords.reshape(-1, 2)))
        r0, c0, rows, cols = grid_extent(both)
        table = self.table_for((max(rows, 1), max(cols, 1)))
        span = 2 * cols - 1
        base = (2 * rows - 1) * span  # index of the first prefix value

        def with_prefix(coords: Tensor) -> tuple[Tensor, Tensor]:
            # Prefix tokens get (0, 0): any valid index, overridden below.
            pad = coords.new_zeros(coords.shape[0], p)
            return torch.cat((pad, coords[..., 0] - r0), 1), torch.cat((pad, coords[..., 1] - c0), 1)

        q_row, q_col = with_prefix(q_coords)
        kv_row, kv_col = with_prefix(kv_coords)
        prefix_bias = self.prefix_bias

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            dr = take(q_row, b, q_idx) - take(kv_row, b, kv_idx) + (rows - 1)
            dc = take(q_col, b, q_idx) - take(kv_col, b, kv_idx) + (cols - 1)
            idx = dr * span + dc
            q_pre, kv_pre = q_idx < p, kv_idx < p
            if prefix_bias:
                idx = torch.where(q_pre & kv_pre, base + 2, torch.where(q_pre, base, torch.where(kv_pre, base + 1, idx)))
                return gather(table, h, idx)
            value = gather(table, h, idx)
            return torch.where(q_pre | kv_pre, torch.zeros_like(value), value)

        per_batch = max(q_pos.shape[0], kv_pos.shape[0]) > 1
        return PairwiseBias(bias, per_batch=per_batch, learned=(table,), name="relbias2d")
