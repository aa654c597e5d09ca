"""Sinusoid tables (Vaswani et al. 2017), shared by the sequence, vision and time-series encodings."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..common.checks import check_dtype, check_int, check_number, check_positions


def sinusoid_frequencies(dim: int, base: float = 10000.0, device=None) -> Tensor:
    """``omega_k = base^(-2k/dim)`` for ``k = 0 .. dim/2 - 1`` (float64)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even number, got {dim!r}")
    check_number("base", base, minimum=1.0, strict=True)  # NaN or inf would give NaN frequencies
    k = torch.arange(0, dim, 2, dtype=torch.float64, device=device)
    return torch.exp(-math.log(base) * k / dim)


def sinusoid_table(
    positions: Tensor, dim: int, base: float = 10000.0, *, scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Interleaved sinusoid table: ``PE[..., p, 2k] = sin(p * scale * omega_k)``, ``PE[..., p, 2k+1] = cos(...)``.

    Args:
        positions: ``[...]`` integer or float positions, finite (NaN or inf is a ValueError, read
            unless ``torch.compile`` traces; integer positions are never read).
        dim: table width (even).
        scale: multiplies the angles (tAPE uses ``d / L``).
        dtype: of the result; the angles are computed in float64 (exact for large positions).

    Returns:
        ``[..., dim]``.
    """
    check_positions("positions", positions)
    check_int("dim", dim, minimum=2)
    check_number("scale", scale)
    check_dtype("dtype", dtype)
    omega = sinusoid_frequencies(dim, base, device=positions.device)
    angles = positions.to(torch.float64)[..., None] * (omega * scale)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(dtype)
