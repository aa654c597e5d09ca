"""Stochastic positional encoding (SPE): what its 1D and 2D variants share.

Liutkus, Cifka, Wu, Simsekli, Yang, Richard 2021, Relative Positional Encoding for Transformers
with Linear Complexity (ICML), https://arxiv.org/abs/2105.08399; the idea, the gating and the
noise policy are in README.md ("Stochastic positional encodings"). Per head::

    qhat_m = R^(-1/2) sum_d q_{m,d} Qbar_{m,d,:}        khat_n = R^(-1/2) sum_d k_{n,d} Kbar_{n,d,:}
    E[qhat_m . khat_n] = sum_d q_{m,d} k_{n,d} P_d(m - n)

``Qbar``, ``Kbar`` (``[positions, H, D, R]``) are Gaussian processes with cross-covariance
``P_d(m - n)`` (:meth:`StochasticPositionalEncoding.kernel`), independent over ``d`` and ``r``.
The gate mixes in position-free noise ``eps`` that queries and keys share, ``Qbar' = sqrt(1 - g)
Qbar + sqrt(g) eps`` (kernel ``(1 - g) P_d + g``); prefix tokens get ``eps`` alone.

All noise is a function of the seed and the absolute position (:func:`positional_noise`), so the
codes are computed in chunks of tokens and recomputed in the backward pass. CUDA draws the noise
on the device (its own stream, the same distribution): outputs differ from the CPU's by one draw.
Keys of grouped-query attention are expanded to the query heads (the codes are per query head).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..common.checks import check_bool, check_int, check_positions
from ..common.encoding import Hook, PositionEncoding

# Tokens per chunk of the code computation (codes are [B', chunk, H, D, R] at a time).
SPE_CHUNK_TOKENS = 128
# Side of the position blocks the noise is drawn in (each block from its own seeded generator).
NOISE_BLOCK = 64
_MASK63 = (1 << 63) - 1


def _block_seed(seed: int, block: tuple[int, ...]) -> int:
    """A seed for one noise block, from the encoding's seed and the block's index (splitmix-style
    mixing, so neighbouring blocks and seeds give unrelated streams)."""
    h = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK63
    for i in block:
        h = ((h ^ (i & 0xFFFFFFFF)) * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK63
        h ^= h >> 31
    return h


def seeded_normal(shape: Sequence[int], seed: int, device: torch.device) -> Tensor:
    """Float32 standard normal noise of ``shape`` from a generator seeded with ``seed``, drawn on
    ``device``: the same values on every CPU; CUDA draws its own stream (same distribution), so
    the noise is never generated on the host and copied over."""
    device = torch.device(device)
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device=device if device.type == "cuda" else "cpu")


def positional_noise(seed: int, start: Sequence[int], stop: Sequence[int], channels: tuple[int, ...],
                     device: torch.device, dtype: torch.dtype) -> Tensor:
    """Standard normal noise on the integer box ``[start, stop)`` of a 1D or 2D grid, shape
    ``[*channels, *extent]``. The value at a grid point depends on ``(seed, point)`` only, never
    on the box asked for, so chunks of a sequence (and a recomputation) see the same noise."""
    if len(start) != len(stop) or len(start) not in (1, 2):
        raise ValueError(f"positional_noise takes a 1D or 2D box; got start={start}, stop={stop}")
    nb = NOISE_BLOCK
    lo_blocks = [s // nb for s in start]
    hi_blocks = [(e - 1) // nb for e in stop]
    if len(start) == 1:
        parts = []
        for b in range(lo_blocks[0], hi_blocks[0] + 1):
            parts.append(seeded_normal((*channels, nb), _block_seed(seed, (b,)), device))
        full = torch.cat(parts, dim=-1)
        first = lo_blocks[0] * nb
        out = full[..., start[0] - first: stop[0] - first]
    else:
        rows = []
        for bi in range(lo_blocks[0], hi_blocks[0] + 1):
            row = []
            for bj in range(lo_blocks[1], hi_blocks[1] + 1):
                row.append(seeded_normal((*channels, nb, nb), _block_seed(seed, (bi, bj)), device))
            rows.append(torch.cat(row, dim=-1))
        full = torch.cat(rows, dim=-2)
        r0, c0 = lo_blocks[0] * nb, lo_blocks[1] * nb
        out = full[..., start[0] - r0: stop[0] - r0, start[1] - c0: stop[1] - c0]
    return out.to(device=device, dtype=dtype)


def inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


class StochasticPositionalEncoding(PositionEncoding):
    """Base class of the SPE variants (see the module docstring).

    Args:
        num_heads: query heads ``H`` (the parameters are per head and dimension).
        head_dim: per-head width ``D`` of the queries and keys it receives.
        num_realizations: ``R``, the width of the encoded queries and keys.
        gated: mix in position-free noise with a learned gate per head and dimension.
        seed: the noise seed used in evaluation mode.
        num_prefix_tokens: leading tokens that get the position-free code only.

    Subclasses implement :meth:`_codes` (the positional codes at some positions) and
    :meth:`kernel` (``P_d``), and check their positions in :meth:`_check_positions`.
    """

    hooks = frozenset({Hook.QK})
    linear_only: ClassVar[bool] = True
    supports_kv_cache: ClassVar[bool] = False
    per_layer: ClassVar[bool] = True  # the authors' models hold one SPE per attention layer
    coords: ClassVar[int] = 1  # position coordinates per token (1: [B, T]; 2: [B, T, 2])

    def __init__(self, num_heads: int, head_dim: int, num_realizations: int, gated: bool, seed: int,
                 num_prefix_tokens: int = 0) -> None:
        super().__init__()
        for name, value in (("num_heads", num_heads), ("head_dim", head_dim), ("num_realizations", num_realizations)):
            check_int(name, value, minimum=1)
        check_bool("gated", gated)
        check_int("seed", seed)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        self.num_heads, self.head_dim, self.num_realizations = num_heads, head_dim, num_realizations
        self.gated, self.seed, self.num_prefix_tokens = gated, seed, num_prefix_tokens
        # the gate w, g = sigmoid(w); w ~ N(0, 1) at start as in the authors' code
        self.gate = nn.Parameter(torch.randn(num_heads, head_dim)) if gated else None

    def qk_width(self, head_dim: int) -> int:
        return self.num_realizations

    # -- what a variant defines -------------------------------------------------------------
    def _draw(self, seed: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        """Noise of one draw that does not depend on position (None if the variant has none)."""
        return None

    def _codes(self, positions: Tensor, seed: int, noise: Tensor | None, is_query: bool, scale: Tensor | None,
               dtype: torch.dtype) -> Tensor:
        """Positional codes ``[B', H, C, D, R]`` at ``positions [B', C(, 2)]``, times ``scale
        [H, D]`` (the gate's ``sqrt(1 - g)``; None: 1), which a variant folds into its cheapest
        factor; ``noise`` is what :meth:`_draw` returned for ``seed``."""
        raise NotImplementedError

    def kernel(self, offsets: Tensor) -> Tensor:
        """The positional kernel ``P_d`` at relative offsets ``m - n``: ``offsets [*S(, 2)]`` ->
        ``[H, D, *S]`` (without the gate; see :meth:`gated_kernel`)."""
        raise NotImplementedError

    def _check_positions(self, positions: Tensor, name: str) -> None:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------
    def gated_kernel(self, offsets: Tensor) -> Tensor:
        """``(1 - g) P_d + g`` (``P_d`` when not gated): ``[H, D, *S]``, the kernel of
        ``E[qhat . khat] = sum_d q_d k_d K_d(m - n)``."""
        kern = self.kernel(offsets)
        if self.gate is None:
            return kern
        g = torch.sigmoid(self.gate.to(kern.dtype)).reshape(*self.gate.shape, *([1] * (kern.dim() - 2)))
        return (1 - g) * kern + g

    def shared_noise(self, seed: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The position-free noise ``eps [H, D, R]`` of one draw."""
        eps = seeded_normal((self.num_heads, self.head_dim, self.num_realizations), _block_seed(seed, (-1, -1, -1)), device)
        return eps.to(dtype)

    def draw_seed(self) -> int:
        """The noise seed of one call: fresh from torch's generator in training, ``seed`` in eval."""
        if self.training:
            return int(torch.randint(0, 2**62, (1,)).item())
        return self.seed

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, num_realizations={self.num_realizations}, "
                f"gated={self.gated}, num_prefix_tokens={self.num_prefix_tokens}")

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]`` -> ``(qhat [B, H, Tq, R], khat [B, H, Tk, R])``."""
        name = type(self).__name__
        if q.shape[1] != self.num_heads or q.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} was built for num_heads={self.num_heads}, head_dim={self.head_dim}; got queries "
                f"{tuple(q.shape)}"
            )
        if k.shape[1] != q.shape[1]:  # grouped-query keys: the codes are per query head
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        self._check_positions(q_pos, "q_pos")
        self._check_positions(kv_pos, "kv_pos")
        seed = self.draw_seed()
        return self.encode(q, q_pos, seed, True), self.encode(k, kv_pos, seed, False)

    def encode(self, x: Tensor, positions: Tensor, seed: int, is_query: bool) -> Tensor:
        """``x [B, H, T, D]`` at ``positions [B or 1, T(, 2)]`` -> ``[B, H, T, R]`` for one draw
        (``seed``); the same seed gives the queries' and the keys' codes of one realisation."""
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        eps = self.shared_noise(seed, work, x.device)
        noise = self._draw(seed, work, x.device)
        p = min(self.num_prefix_tokens, x.shape[2])
        parts = []
        if p:
            parts.append(torch.einsum("bhtd,hdr->bhtr", x[:, :, :p].to(work), eps))
        rest, pos = x[:, :, p:], positions[:, p:]
        grad = torch.is_grad_enabled() and (rest.requires_grad or any(t.requires_grad for t in self.parameters()))
        # chunks as pieces of one split, not slices: autograd then joins their gradients once
        # instead of adding a full-size zero tensor per chunk (quadratic in T)
        for xc, pc in zip(rest.split(SPE_CHUNK_TOKENS, dim=2), pos.split(SPE_CHUNK_TOKENS, dim=1)):
            if xc.shape[2] == 0:  # splitting an empty sequence gives one empty piece
                continue
            if grad:  # recomputed in the backward pass: the chunk's codes are never stored
                parts.append(checkpoint(self._encode_chunk, xc, pc, eps, noise, seed, is_query,
                                        use_reentrant=False))
            else:
                parts.append(self._encode_chunk(xc, pc, eps, noise, seed, is_query))
        out = torch.cat(parts, dim=2) if parts else x.new_zeros(*x.shape[:3], self.num_realizations)
        return (out * self.num_realizations ** -0.5).to(x.dtype)

    def _encode_chunk(self, x: Tensor, positions: Tensor, eps: Tensor, noise: Tensor | None, seed: int,
                      is_query: bool) -> Tensor:
        work = eps.dtype
        g = None if self.gate is None else torch.sigmoid(self.gate.to(work))  # [H, D]
        codes = self._codes(positions, seed, noise, is_query, None if g is None else torch.sqrt(1 - g), work)
        if g is not None:  # codes [B', H, C, D, R]
            codes = codes + (torch.sqrt(g)[..., None] * eps)[:, None]
        if codes.shape[0] == 1:  # positions shared by the batch: one set of codes, no copy per sequence
            return torch.einsum("bhcd,hcdr->bhcr", x.to(work), codes[0])
        return torch.einsum("bhcd,bhcdr->bhcr", x.to(work), codes)


def conv_cross_correlation(filter_q: Tensor, filter_k: Tensor) -> Tensor:
    """``c[tau] = sum_l filter_q[l] filter_k[l + tau]`` for every offset: ``[C, L] -> [C, 2L - 1]``
    (1D; index ``tau + L - 1``) or ``[C, Lh, Lw] -> [C, 2Lh - 1, 2Lw - 1]`` (2D)."""
    channels = filter_q.shape[0]
    if filter_q.dim() == 2:
        length = filter_q.shape[1]
        padded = F.pad(filter_k, (length - 1, length - 1)).unsqueeze(0)  # [1, C, 3L - 2]
        return F.conv1d(padded, filter_q.unsqueeze(1), groups=channels).squeeze(0)
    lh, lw = filter_q.shape[1:]
    padded = F.pad(filter_k, (lw - 1, lw - 1, lh - 1, lh - 1)).unsqueeze(0)
    return F.conv2d(padded, filter_q.unsqueeze(1), groups=channels).squeeze(0)


def check_integer_positions(positions: Tensor, coords: int, name: str, what: str) -> None:
    """Integer positions ``[B or 1, T]`` (``coords == 1``) or ``[B or 1, T, 2]``; else a ValueError."""
    want = "[B or 1, T]" if coords == 1 else "[B or 1, T, 2] (row, col)"
    ok_shape = positions.dim() == 2 if coords == 1 else (positions.dim() == 3 and positions.shape[-1] == 2)
    if not ok_shape:
        raise ValueError(f"{what} takes {name} of shape {want}; got {tuple(positions.shape)}")
    check_positions(name, positions)  # a tensor of real, finite numbers (never bool)
    if positions.is_floating_point() and not bool((positions == positions.round()).all()):
        raise ValueError(f"{what} is defined on the integer grid; {name} holds non-integer values")
