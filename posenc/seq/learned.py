"""Learned absolute position embedding (Gehring et al. 2017, https://arxiv.org/abs/1705.03122;
BERT, GPT-2): a trained ``(max_len, dim)`` table whose row ``p`` is added to the token at
position ``p``.

Past the table it has no answer. ``beyond="error"`` (default) raises, naming the position and
``max_len``. ``beyond="interpolate"`` stretches the table when asked for more: in a batch row
whose largest position ``P`` exceeds ``max_len - 1``, position ``p`` reads the table at the
fractional row ``p * (max_len - 1) / P`` (linear interpolation between neighbouring rows, the
1D analogue of resizing ViT position embeddings), so the row's positions span the whole table;
rows that fit are read unchanged. Because the stretch depends on the largest position of the
call, cached decoding beyond the table would see different stretches than the full forward:
``supports_kv_cache`` is False in that mode.

Float positions read the table by linear interpolation between the two neighbouring rows (exact
at integers); negative positions are an error. Hook: input. Kernel: whatever the rest of the
model allows (plain SDPA when nothing else touches the scores).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.budget import check_allocation

BEYOND = ("error", "interpolate")


def lerp_rows(table: Tensor, coords: Tensor) -> Tensor:
    """``table [N, C]`` read at fractional rows ``coords [...]`` in ``[0, N-1]`` -> ``[..., C]``."""
    lo = coords.floor().clamp(0, table.shape[0] - 1)
    frac = (coords - lo).unsqueeze(-1).to(table.dtype)
    lo = lo.long()
    hi = (lo + 1).clamp(max=table.shape[0] - 1)
    return table[lo] * (1 - frac) + table[hi] * frac


@register(
    "learned",
    modality="seq",
    paper="Gehring et al. 2017, Convolutional Sequence to Sequence Learning, https://arxiv.org/abs/1705.03122",
    summary="trained (max_len, dim) table added to the input; error or interpolation past it",
)
class LearnedEncoding(PositionEncoding):
    """Args:
        dim: model width ``C``.
        max_len: rows of the table (positions ``0 .. max_len - 1``).
        beyond: "error" or "interpolate" (see the module docstring).
        init_std: standard deviation of the normal initialisation (0.02, as GPT-2).

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T]`` (integer or float, >= 0) -> ``[B, T, C]``.
    """

    hooks = frozenset({Hook.INPUT})

    def __init__(
        self, dim: int, max_len: int, beyond: Literal["error", "interpolate"] = "error", init_std: float = 0.02
    ) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_int("max_len", max_len, minimum=1)
        check_choice("beyond", beyond, BEYOND)
        check_number("init_std", init_std, minimum=0.0)
        self.dim, self.max_len, self.beyond = dim, max_len, beyond
        if beyond == "interpolate":
            self.supports_kv_cache = False
        check_allocation(f"learned(max_len={max_len}, dim={dim}): the table [max_len, dim]", (max_len, dim), torch.float32)
        self.table = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def embeddings(self, positions: Tensor) -> Tensor:
        """The position embeddings ``[B or 1, T, C]`` of ``positions [B or 1, T]``."""
        check_positions("positions", positions, ndim=(2,), minimum=0)  # a table has no row -1 (nor NaN)
        if positions.numel() == 0:
            return self.table.new_zeros(*positions.shape, self.dim)
        last = self.max_len - 1
        top = positions.amax(dim=-1)  # [B]
        if self.beyond == "error":
            # (a value check: skipped while torch.compile traces, where it would break the graph)
            if not torch.compiler.is_compiling() and bool((top > last).any()):
                raise ValueError(
                    f"position {top.max().item()} is past the learned table (max_len={self.max_len}, positions "
                    f"0..{last}); build it with a larger max_len, or beyond='interpolate' to stretch the table"
                )
            if not positions.is_floating_point():
                return self.table[positions]
            return lerp_rows(self.table, positions.to(torch.float64))
        coords = positions.to(torch.float64)
        stretch = (last / top.to(torch.float64).clamp(min=last)).clamp(max=1.0)  # 1 for rows that fit
        return lerp_rows(self.table, coords * stretch.unsqueeze(-1))

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x has {x.shape[-1]} features; this encoding was built for dim={self.dim}")
        return x + self.embeddings(positions).to(x.dtype)
