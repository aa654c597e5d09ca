"""PEG, the positional encoding generator of CPVT (conditional position encoding).

Paper: Chu et al. 2023, Conditional Positional Encodings for Vision Transformers (CPVT),
https://arxiv.org/abs/2102.10882. (timm's ``twins.PosConv`` is a maintained PEG.)

The patch tokens are laid out on their grid, ``X [B, C, R, W]``, and
``Y = X + DWConv_kxk(X)`` (depthwise: ``groups = C``, zero padding ``k // 2``, with bias) is
flattened back. The encoding is conditioned on the content; absolute position leaks in through the
zero padding at the borders, and the convolution is translation-equivariant elsewhere. Class and
register tokens are split off and re-attached untouched.

Where it goes: CPVT places it after the first block (after blocks 0-4 in its best variant). Use
``TransformerEncoder(conditional={i: PEG(...)})``: that slot adds ``module(x, positions, mask=...,
cache=...)`` (PEG takes no mask -- padding, packing or causality -- and no KV cache), and
:meth:`PEG.forward` returns the convolution term ``DWConv(X)`` (zeros at prefix tokens). As an
input encoding (:meth:`PEG.encode_input`, ``X + DWConv(X)``) it acts before the first block.

The grid comes with every call, from the 2D positions ``[B or 1, T, 2]``: each patch token is
placed at its ``(row, col)`` within the bounding box of the positions (cells without a token are
zero, like the padding), so raster grids of any size, crops and dropped tokens all work. Kernel:
no attention hook (plain SDPA).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_int
from ..common.encoding import Hook, PositionEncoding
from ..common.masks import AttentionMask
from ..common.registry import register
from ..primitives.budget import check_allocation
from .grid import grid_extent, integer_coords, patch_coords


@register(
    "peg",
    modality="vision",
    paper="Chu et al. 2023, CPVT, https://arxiv.org/abs/2102.10882",
    summary="depthwise conv over the patch grid added after chosen blocks (conditional); zero padding leaks position",
)
class PEG(PositionEncoding):
    """Args:
        dim: model width ``C``.
        kernel_size: odd convolution size ``k`` (3 in CPVT).
        num_prefix_tokens: leading tokens (class, registers) kept out of the convolution.

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T, 2]`` integer (row, col) -> ``[B, T, C]``
    (``forward``: the added term; ``encode_input``: ``x`` plus it).
    """

    hooks = frozenset({Hook.INPUT})
    between_blocks = True

    def __init__(self, dim: int, kernel_size: int = 3, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_int("kernel_size", kernel_size, minimum=1)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd number; got {kernel_size}")
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        self.dim, self.kernel_size, self.num_prefix_tokens = dim, kernel_size, num_prefix_tokens
        self.proj = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=True)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kernel_size={self.kernel_size}, num_prefix_tokens={self.num_prefix_tokens}"

    def forward(self, x: Tensor, positions: Tensor, *, mask: AttentionMask | None = None, cache=None) -> Tensor:
        """The PEG term ``DWConv(X)`` at every token (zeros at prefix tokens): ``[B, T, C]``.
        ``mask`` and ``cache`` (the encoder's conditional slot passes them) must be None or empty:
        the grid comes from the positions alone."""
        if cache is not None:
            raise ValueError("PEG has no cached decoding; run the whole token grid")
        if mask is not None and not mask.is_empty:
            raise ValueError("PEG takes no attention mask (padding, packing, causal): the grid comes from positions")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}]; got {tuple(x.shape)}")
        p = self.num_prefix_tokens
        coords = integer_coords(patch_coords(positions, x.shape[1], p, "PEG"), "PEG")
        patches = x[:, p:]
        b, n, c = patches.shape
        if n == 0:
            return torch.zeros_like(x)
        r0, c0, rows, cols = grid_extent(coords)
        check_allocation(f"PEG's feature map over the positions' bounding box ({rows} rows x {cols} cols)",
                         (b, c, rows, cols), x.dtype, x.device)
        cell = ((coords[..., 0] - r0) * cols + (coords[..., 1] - c0)).expand(b, n)  # [B, N]
        raster = coords.shape[0] == 1 and n == rows * cols and torch.equal(cell[0], torch.arange(n, device=cell.device))
        if raster:
            grid = patches.transpose(1, 2).reshape(b, c, rows, cols)
        else:
            counts = torch.zeros(b, rows * cols, device=cell.device).scatter_add_(1, cell, torch.ones_like(cell, dtype=torch.float))
            if bool((counts > 1).any()):
                raise ValueError("PEG: two tokens share one (row, col) position")
            flat = patches.new_zeros(b, rows * cols, c).scatter(1, cell[..., None].expand(b, n, c), patches)
            grid = flat.transpose(1, 2).reshape(b, c, rows, cols)
        out = self.proj(grid).flatten(2).transpose(1, 2)  # [B, R*W, C]
        if not raster:
            out = out.gather(1, cell[..., None].expand(b, n, c))
        return torch.cat((out.new_zeros(b, p, c), out), dim=1)

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self(x, positions)
