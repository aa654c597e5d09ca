"""Sinusoidal absolute position encoding (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762).

``PE(p, 2k) = sin(p / base^(2k/d))``, ``PE(p, 2k+1) = cos(p / base^(2k/d))``, added to the token
features before the first block. Hook: input. Kernel: whatever the rest of the model allows
(plain SDPA when nothing else touches the scores).
"""

from __future__ import annotations

from torch import Tensor

from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..common.sinusoid import sinusoid_table


@register(
    "sinusoidal",
    modality="seq",
    paper="Vaswani et al. 2017, Attention Is All You Need, https://arxiv.org/abs/1706.03762",
    summary="fixed sin/cos table added to the input",
)
class SinusoidalEncoding(PositionEncoding):
    """Args:
        dim: model width ``C`` (even).
        base: wavelength base, 10000 in the paper.
        scale: multiplies the table before it is added (1 in the paper).

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T]`` (integer or float) -> ``[B, T, C]``.
    """

    hooks = frozenset({Hook.INPUT})

    def __init__(self, dim: int, base: float = 10000.0, scale: float = 1.0) -> None:
        super().__init__()
        if dim <= 0 or dim % 2:
            raise ValueError(f"dim must be a positive even number, got {dim}")
        self.dim, self.base, self.scale = dim, base, scale

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x has {x.shape[-1]} features; this encoding was built for dim={self.dim}")
        if positions.dim() != 2:
            raise ValueError(f"positions must be [batch or 1, tokens]; got {tuple(positions.shape)}")
        return x + self.scale * sinusoid_table(positions, self.dim, self.base, dtype=x.dtype)
