"""The shared body of the learned-table vision encodings (:class:`~posenc.vision.Learned2D`,
:class:`~posenc.vision.AxialEncoding`, :class:`~posenc.vision.Axial3D`): tables read at each
patch's integer grid coordinates and added to the patch tokens, the prefix tokens (class,
registers) left as they are. Each subclass says how it reads its tables at a grid
(:meth:`GridTableEncoding.encode_coords`)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from ..common.encoding import Hook, PositionEncoding
from .grid import absolute_grid, integer_coords, patch_coords


def init_table(table: Tensor, std: float) -> None:
    """Truncated-normal initialisation at ``std``, cut at two standard deviations (ViT/timm)."""
    nn.init.trunc_normal_(table, std=std, a=-2 * std, b=2 * std)


class GridTableEncoding(PositionEncoding):
    """``x [B, T, C]``, ``positions [B or 1, T, grid_ndim]`` integer grid coordinates ``>= 0`` ->
    ``[B, T, C]``: the first ``num_prefix_tokens`` tokens unchanged, each patch token plus
    :meth:`encode_coords` at its coordinates. Subclasses set ``dim``, ``num_prefix_tokens`` and
    ``label`` (the registry name, for messages)."""

    hooks = frozenset({Hook.INPUT})
    grid_ndim: ClassVar[int] = 2
    label: ClassVar[str] = "grid table"
    dim: int
    num_prefix_tokens: int

    def encode_coords(self, coords: Tensor, grid: tuple[int, ...]) -> Tensor:
        """The encodings ``[B or 1, N, C]`` of the patch coordinates ``coords [B or 1, N, grid_ndim]``
        on a grid of ``grid`` cells per axis."""
        raise NotImplementedError

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}]; got {tuple(x.shape)}")
        coords = patch_coords(positions, x.shape[1], self.num_prefix_tokens, self.label, ndim=self.grid_ndim)
        coords = integer_coords(coords, self.label)
        if coords.shape[1] == 0:
            return x
        pe = self.encode_coords(coords, absolute_grid(coords, self.label))
        p = self.num_prefix_tokens
        return torch.cat((x[:, :p], x[:, p:] + pe.to(x.dtype)), dim=1)
