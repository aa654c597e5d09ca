"""tAPE, time absolute position encoding (Foumani et al. 2023, ConvTran,
https://arxiv.org/abs/2305.16642).

The sinusoid of Vaswani et al. with its frequencies stretched by ``d / L``:
``PE(p, 2k) = sin(p * omega_k * d / L)``, ``PE(p, 2k+1) = cos(p * omega_k * d / L)``,
``omega_k = 10000^(-2k/d)``, ``d`` the model width, ``L`` the series length. For short series and
small models (``L = 100``, ``d = 16``) the plain sinusoid's low frequencies barely change along
the series; the stretch spreads them over it. Hook: input (added to the features). Kernel:
whatever the rest of the model allows.

``L`` is the length the encoding is built for (``max_len``, the model's longest series), as in
ConvTran, whose tAPE table is built once for the dataset's longest series. It is not the length of
each call: a series then gets the same encoding whatever it is batched or padded with. ConvTran
applies dropout right after adding the table; :class:`~posenc.timeseries.convtran.ConvTranClassifier`
does that after any input encoding (``dropout``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..common.checks import check_int, check_number, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.sinusoid import sinusoid_table


@register(
    "tape",
    modality="timeseries",
    paper="Foumani et al. 2023, Improving position encoding of transformers for multivariate time series "
    "classification (ConvTran), https://arxiv.org/abs/2305.16642",
    summary="sinusoid with frequencies scaled by d_model / series length, added to the input",
)
class TAPE(PositionEncoding):
    """Args:
        dim: model width ``d`` (even).
        max_len: the series length ``L`` the frequencies are scaled for.
        base: wavelength base, 10000 in the paper.

    Shapes: ``x [B, T, d]``, ``positions [B or 1, T]`` (integer or float) -> ``[B, T, d]``.
    """

    hooks = frozenset({Hook.INPUT})

    def __init__(self, dim: int, max_len: int, base: float = 10000.0) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        if dim % 2:
            raise ValueError(f"dim must be a positive even number, got {dim}")
        check_int("max_len", max_len, minimum=1)
        check_number("base", base, minimum=1.0, strict=True)
        self.dim, self.max_len, self.base = dim, max_len, base

    def table(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """``PE [..., d]`` at ``positions [...]`` (angles computed in float64)."""
        return sinusoid_table(positions, self.dim, self.base, scale=self.dim / self.max_len, dtype=dtype)

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x has {x.shape[-1]} features; this tAPE was built for dim={self.dim}")
        check_positions("positions", positions, ndim=(2,))
        return x + self.table(positions, dtype=x.dtype)
