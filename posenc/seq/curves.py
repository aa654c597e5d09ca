"""Random smooth planar curves, made in code: the synthetic 2D data of the Spline-based
Transformer experiments (:mod:`posenc.seq.spline`), small.

Curve ``n`` is ``c(t) = o + v t + sum_{f=1..F} (a_f / f) * sin(pi f t + phi_f)`` for ``t in [0, 1]``,
per coordinate, with ``o ~ N(0, 0.5^2)``, ``v ~ N(0, 1)``, ``a_f ~ N(0, 1)`` and
``phi_f ~ U[0, 2 pi)`` drawn from a generator seeded by ``seed``. Half-period frequencies
(``pi f``, not ``2 pi f``) keep the curves open: their two ends differ, so a sequence and its
reverse are different sequences. The coefficients, not the samples, define a curve, so the same
curves can be sampled at any number of points ``L``: ``t_i = i / (L - 1)``, the times the spline
decoder uses (:func:`posenc.seq.spline.uniform_times`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.data import Dataset


class SmoothCurves(Dataset):
    """``num_curves`` random curves sampled at ``length`` points (items ``[length, 2]`` float32).

    Args:
        num_curves: how many curves.
        length: points per curve in the items (``>= 1``); :meth:`points` samples other lengths.
        num_freqs: sinusoid terms ``F`` per coordinate (``>= 1``).
        seed: the curves are a function of ``(seed, num_curves, num_freqs)`` only.
    """

    def __init__(self, num_curves: int, length: int, *, num_freqs: int = 4, seed: int = 0) -> None:
        for name, v in (("num_curves", num_curves), ("length", length), ("num_freqs", num_freqs)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        self.num_curves, self.length, self.num_freqs, self.seed = num_curves, length, num_freqs, seed
        g = torch.Generator().manual_seed(seed)
        self.offset = 0.5 * torch.randn(num_curves, 1, 2, generator=g, dtype=torch.float64)
        self.drift = torch.randn(num_curves, 1, 2, generator=g, dtype=torch.float64)
        freqs = torch.arange(1, num_freqs + 1, dtype=torch.float64)
        self.amplitude = torch.randn(num_curves, num_freqs, 2, generator=g, dtype=torch.float64) / freqs[:, None]
        self.phase = 2 * math.pi * torch.rand(num_curves, num_freqs, 2, generator=g, dtype=torch.float64)
        self.data = self.points(length)

    def points(self, length: int, times: Tensor | None = None) -> Tensor:
        """All curves at ``length`` evenly spaced times (or at ``times [length]`` in ``[0, 1]``):
        ``[num_curves, length, 2]`` float32."""
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"length must be a positive int; got {length!r}")
        t = torch.linspace(0.0, 1.0, length, dtype=torch.float64) if times is None else times.to(torch.float64)
        if t.shape != (length,):
            raise ValueError(f"times must be [length={length}]; got shape {tuple(t.shape)}")
        freqs = torch.arange(1, self.num_freqs + 1, dtype=torch.float64)
        angle = math.pi * freqs[None, :, None, None] * t[None, None, :, None] + self.phase[:, :, None, :]  # [n, F, L, 2]
        wiggle = (self.amplitude[:, :, None, :] * torch.sin(angle)).sum(1)  # [n, L, 2]
        return (self.offset + self.drift * t[None, :, None] + wiggle).to(torch.float32)

    def __len__(self) -> int:
        return self.num_curves

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]


__all__ = ["SmoothCurves"]
