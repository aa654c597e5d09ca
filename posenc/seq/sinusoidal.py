"""Sinusoidal absolute position encoding (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762).

``PE(p, 2k) = sin(p / base^(2k/d))``, ``PE(p, 2k+1) = cos(p / base^(2k/d))``, added to the token
features before the first block. Hook: input. Kernel: whatever the rest of the model allows
(plain SDPA when nothing else touches the scores).
"""

from __future__ import annotations

from torch import Tensor

from ..common.checks import check_int, check_number, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.sinusoid import sinusoid_table


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
        check_int("dim", dim, minimum=1)
        if dim % 2:
            raise ValueError(f"dim must be a positive even number, got {dim}")
        check_number("base", base, minimum=1.0, strict=True)
        check_number("scale", scale, minimum=0.0, strict=True)
        self.dim, self.base, self.scale = dim, base, scale

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x has {x.shape[-1]} features; this encoding was built for dim={self.dim}")
        check_positions("positions", positions, ndim=(2,))
        return x + self.scale * sinusoid_table(positions, self.dim, self.base, dtype=x.dtype)
