"""Stochastic positional encoding for sequences: ``sine_spe`` and ``conv_spe``.

Liutkus et al. 2021, Relative Positional Encoding for Transformers with Linear Complexity (ICML),
https://arxiv.org/abs/2105.08399; authors' code: aliutkus/spe. The shared machinery (gating,
chunked codes, the ``1 / sqrt(R)`` estimate, noise as a function of position) is
:mod:`posenc.primitives.spe`; this module defines the two 1D kernels.

* ``sine_spe``: ``P_d(tau) = sum_k lambda_{dk}^2 cos(2 pi f_{dk} tau + theta_{dk})`` with
  learned frequencies ``f = sigmoid(w) / 2`` (cycles per position, in ``(0, 1/2)``), phases
  ``theta`` and gains ``lambda = softplus(.)`` per head and dimension. Drawn as
  ``Qbar_m = sum_k lambda_k [cos(2 pi f_k m + theta_k) Z_k + sin(2 pi f_k m + theta_k) Z'_k]``
  and ``Kbar_n`` likewise without ``theta``, with ``Z, Z' ~ N(0, 1)``: the cross-covariance is
  ``P_d(m - n)``. Positions may be any real numbers.
* ``conv_spe``: ``Qbar = phi^Q * Z``, ``Kbar = phi^K * Z`` (white noise ``Z`` over positions
  through learned filters of ``kernel_size`` taps, ``Qbar_m = sum_l phi^Q_l Z_{m + l}``):
  ``P_d(tau) = sum_l phi^Q_l phi^K_{l + tau}``, the filters' cross-correlation, zero for
  ``|tau| >= kernel_size``. Positions are integers.

Initialisation follows the authors' code (frequencies ``sigmoid(N(0,1) - 4) / 2``, i.e. long
periods; phases ``N(0, 1)``; filters ``U[0, 1) / sqrt(L / 2)``), except the sine gains, set so
that ``sum_k lambda_k^2 = 1``. Defaults: ``num_realizations = 64`` (the authors' code: 256) and
``kernel_size = 64`` (200) keep CPU training affordable; both are options.

Hook: q/k transform to width ``R``; linear attention only (``feature_map=`` on the attention).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_int, check_positions
from ..common.registry import register
from ..primitives.spe import (
    StochasticPositionalEncoding,
    _block_seed,
    check_integer_positions,
    conv_cross_correlation,
    inverse_softplus,
    positional_noise,
    seeded_normal,
)


@register(
    "sine_spe",
    modality="seq",
    paper="Liutkus et al. 2021, Relative Positional Encoding for Transformers with Linear Complexity, "
    "https://arxiv.org/abs/2105.08399",
    summary="stochastic PE for linear attention: a learned sum of sinusoids as relative kernel, R realizations",
)
class SineSPE(StochasticPositionalEncoding):
    """Args:
        num_heads: query heads ``H``.
        head_dim: per-head width ``D``.
        num_sines: sinusoids ``K`` per head and dimension.
        num_realizations: ``R``, the width of the encoded queries and keys.
        gated: mix in position-free noise with a learned gate (the paper's gating).
        seed: noise seed in evaluation mode.
        num_prefix_tokens: leading tokens that get the position-free code only.

    Shapes: ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T]`` (real) ->
    ``[B, H, Tq, R]``, ``[B, H, Tk, R]``.
    """

    def __init__(self, num_heads: int, head_dim: int, num_sines: int = 5, num_realizations: int = 64,
                 gated: bool = True, seed: int = 0, num_prefix_tokens: int = 0) -> None:
        super().__init__(num_heads, head_dim, num_realizations, gated, seed, num_prefix_tokens)
        check_int("num_sines", num_sines, minimum=1)
        self.num_sines = num_sines
        shape = (num_heads, head_dim, num_sines)
        self.freq_logits = nn.Parameter(torch.randn(shape) - 4.0)
        self.phases = nn.Parameter(torch.randn(shape))
        self.gain_logits = nn.Parameter(torch.full(shape, inverse_softplus(num_sines ** -0.5)))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_sines={self.num_sines}"

    def frequencies(self) -> Tensor:
        """``f [H, D, K]`` in cycles per position, in ``(0, 1/2)``."""
        return torch.sigmoid(self.freq_logits) / 2

    def gains(self) -> Tensor:
        """``lambda [H, D, K]`` (non-negative)."""
        return F.softplus(self.gain_logits)

    def kernel(self, offsets: Tensor) -> Tensor:
        tau = offsets.to(torch.float64)
        f, theta, lam = (t.to(torch.float64) for t in (self.frequencies(), self.phases, self.gains()))
        extra = [1] * tau.dim()
        angle = 2 * math.pi * f.reshape(*f.shape[:2], *extra, -1) * tau[..., None] + theta.reshape(*f.shape[:2], *extra, -1)
        return ((lam ** 2).reshape(*f.shape[:2], *extra, -1) * torch.cos(angle)).sum(-1)

    def _check_positions(self, positions: Tensor, name: str) -> None:
        if positions.dim() != 2:
            raise ValueError(f"sine_spe takes real {name} of shape [B or 1, T]; got {tuple(positions.shape)}")
        check_positions(name, positions)  # real and finite (never bool)

    def _draw(self, seed: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        shape = (self.num_heads, self.head_dim, 2 * self.num_sines, self.num_realizations)
        return seeded_normal(shape, _block_seed(seed, (-2,)), device).to(dtype)

    def _codes(self, positions: Tensor, seed: int, noise: Tensor | None, is_query: bool, scale: Tensor | None,
               dtype: torch.dtype) -> Tensor:
        # angles in float64: 2 pi f m must keep its phase at large m (shift invariance)
        f = self.frequencies().to(torch.float64)[:, None]  # [H, 1, D, K]
        angle = 2 * math.pi * f * positions.to(torch.float64)[:, None, :, None, None]  # [B', H, C, D, K]
        if is_query:
            angle = angle + self.phases.to(torch.float64)[:, None]
        lam = self.gains().to(dtype)
        if scale is not None:
            lam = lam * scale[..., None]
        lam = lam[:, None]  # [H, 1, D, K]
        basis = torch.stack((torch.cos(angle).to(dtype) * lam, torch.sin(angle).to(dtype) * lam), dim=-1)
        basis = basis.flatten(-2)  # [B', H, C, D, 2K]: (cos, sin) of each sine
        return torch.einsum("bhcdj,hdjr->bhcdr", basis, noise)


@register(
    "conv_spe",
    modality="seq",
    paper="Liutkus et al. 2021, Relative Positional Encoding for Transformers with Linear Complexity, "
    "https://arxiv.org/abs/2105.08399",
    summary="stochastic PE for linear attention: white noise through learned filters, kernel = their cross-correlation",
)
class ConvSPE(StochasticPositionalEncoding):
    """Args:
        num_heads: query heads ``H``.
        head_dim: per-head width ``D``.
        kernel_size: filter taps ``L``; the kernel is zero for offsets ``|m - n| >= L``.
        num_realizations: ``R``, the width of the encoded queries and keys.
        gated: mix in position-free noise with a learned gate (the paper's gating).
        seed: noise seed in evaluation mode.
        num_prefix_tokens: leading tokens that get the position-free code only.

    Shapes: ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T]`` (integers) ->
    ``[B, H, Tq, R]``, ``[B, H, Tk, R]``.
    """

    def __init__(self, num_heads: int, head_dim: int, kernel_size: int = 64, num_realizations: int = 64,
                 gated: bool = True, seed: int = 0, num_prefix_tokens: int = 0) -> None:
        super().__init__(num_heads, head_dim, num_realizations, gated, seed, num_prefix_tokens)
        check_int("kernel_size", kernel_size, minimum=1)
        self.kernel_size = kernel_size
        scale = math.sqrt(kernel_size / 2)
        self.filter_q = nn.Parameter(torch.rand(num_heads, head_dim, kernel_size) / scale)
        self.filter_k = nn.Parameter(torch.rand(num_heads, head_dim, kernel_size) / scale)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", kernel_size={self.kernel_size}"

    def kernel(self, offsets: Tensor) -> Tensor:
        length = self.kernel_size
        h, d = self.num_heads, self.head_dim
        xcorr = conv_cross_correlation(self.filter_q.reshape(h * d, length).to(torch.float64),
                                       self.filter_k.reshape(h * d, length).to(torch.float64))  # [HD, 2L - 1]
        tau = offsets.to(torch.long)
        inside = tau.abs() < length
        values = xcorr[:, (tau.clamp(-(length - 1), length - 1) + length - 1).reshape(-1)]
        values = values * inside.reshape(-1).to(values.dtype)
        return values.reshape(h, d, *tau.shape)

    def _check_positions(self, positions: Tensor, name: str) -> None:
        check_integer_positions(positions, 1, name, "conv_spe")

    def _codes(self, positions: Tensor, seed: int, noise: Tensor | None, is_query: bool, scale: Tensor | None,
               dtype: torch.dtype) -> Tensor:
        h, d, r, length = self.num_heads, self.head_dim, self.num_realizations, self.kernel_size
        pos = positions.to(torch.long)
        # The code at m needs the noise at m .. m + L - 1. Filter the noise over runs of the
        # positions present (a new run where they jump by more than L), so packed or shifted
        # positions cost what consecutive ones do.
        uniq = torch.unique(pos).tolist()
        runs, lo = [], uniq[0]
        for prev, cur in itertools.pairwise(uniq):
            if cur - prev > length:
                runs.append((lo, prev))
                lo = cur
        runs.append((lo, uniq[-1]))
        weight = (self.filter_q if is_query else self.filter_k).to(dtype)
        if scale is not None:
            weight = weight * scale[..., None]
        weight = weight.reshape(h * d, 1, length)
        fields, starts, offset = [], [], 0
        for a, b in runs:
            z = positional_noise(seed, (a,), (b + length,), (r, h * d), pos.device, dtype)  # [R, HD, n + L - 1]
            fields.append(F.conv1d(z, weight, groups=h * d))  # [R, HD, n]: codes at a .. b
            starts.append(offset - a)
            offset += b - a + 1
        field = fields[0] if len(fields) == 1 else torch.cat(fields, dim=-1)
        bsz, c = pos.shape
        if bsz == 1 and len(runs) == 1 and field.shape[-1] == c and bool((pos[0, 1:] > pos[0, :-1]).all()):
            codes = field  # consecutive positions (the usual case): the field is the codes, in order
        else:
            run_lo = torch.tensor([a for a, _ in runs], device=pos.device)
            which = torch.searchsorted(run_lo, pos, right=True) - 1
            index = pos + torch.tensor(starts, device=pos.device)[which]  # [B', C] into the field
            codes = field[:, :, index.reshape(-1)]  # [R, HD, B'C]
        # one copy into [B', H, C, D, R], the layout the contraction with q reads without another
        return codes.reshape(r, h, d, bsz, c).permute(3, 1, 4, 2, 0).contiguous()
