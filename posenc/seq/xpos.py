"""xPos, extrapolatable position embedding (Sun et al. 2022, A Length-Extrapolatable
Transformer, https://arxiv.org/abs/2212.10554).

RoPE plus a per-pair exponential scale: pair ``k`` of the query at position ``n`` is multiplied by
``zeta_k^(n/B)`` and of the key by ``zeta_k^(-n/B)``, ``zeta_k = (2k + 0.4 r)/(1.4 r)``,
``B = scale_base`` (512). In ``q_i . k_j`` the scales meet as ``zeta_k^((i-j)/B)``, so scores
still depend only on ``i - j``, and keys far in the past are damped (``zeta_k < 1``). Causal only.

Centring: ``zeta^(n/B)`` alone overflows float32 near ``|n| = 36,000`` (``ln 3.5 * n/512 > 88``)
and float16 near 4,500. The reference implementations (torchscale, rotary-embedding-torch) use
``n = p - T//2`` for positions ``p = 0 .. T-1``: the exponents are centred on the middle of the
sequence. Since the same ``n`` enters q and k, the centre cancels in every score; it only keeps
the factors in range. ``center="length"`` does exactly that per call (``T`` = max position + 1
of each batch row); the centre then moves as a sequence grows, so cached keys would carry the
wrong scale and ``supports_kv_cache`` is False. The default centre is fixed, ``max_len // 2``
(which is the reference's centre for a sequence of ``max_len`` tokens, and equal to it in exact
arithmetic at every length), so cached decoding equals the full forward and a cache is allowed.

Range: the factors ``zeta_k^(+-n/B)`` are exact (to the rounding of the q/k dtype) only while they
stay inside that dtype's range, and ``max_k |ln zeta_k| = ln 3.5`` for every ``r``. The encoding
keeps them within ``[1/M, M]``, ``M = sqrt(finfo(dtype).max)``, so that q and k entries up to
``M`` in size neither overflow nor sink into subnormals: ``|p - centre| <= B ln M / ln 3.5``,
about 18,100 positions either side of the centre in float32 and bfloat16 with ``B = 512`` (2,270
in float16, 145,000 in float64). Beyond it the scores would silently change (or turn NaN) when
the same sequence is shifted, so a position outside the range is a ``ValueError`` naming it and
the range (:meth:`XPos.position_limit`); exactness cannot be had by computing relatively here,
since q and k are scaled separately for the fused kernels. Move the centre to the positions
(``center=``), use a larger ``scale_base``, or compute in float64.

Hook: q/k transform. Kernel: SDPA (flash).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from ..common.checks import check_choice, check_int, check_number, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.rotary import apply_rotary, rotary_angles
from .rope import PAIRINGS, Pairing, check_rotary_dims, current_length, rope_inv_freq

# max_k |ln zeta_k| = ln(1.4 r / 0.4 r): the steepest pair decays like 3.5^(-n/B), for every r.
_LOG_ZETA_MAX = math.log(3.5)


def xpos_zeta(rotary_dim: int) -> Tensor:
    """``zeta_k = (2k + 0.4 r) / (1.4 r)`` for ``k < r/2`` (float64)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    k = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return (2 * k + 0.4 * rotary_dim) / (1.4 * rotary_dim)


@register(
    "xpos",
    modality="seq",
    paper="Sun et al. 2022, A Length-Extrapolatable Transformer, https://arxiv.org/abs/2212.10554",
    summary="RoPE with per-pair exponential decay zeta^((i-j)/512); causal",
)
class XPos(PositionEncoding):
    """Args:
        head_dim: per-head width ``D``.
        max_len: sets the default centre ``max_len // 2`` (0 when None).
        base: RoPE frequency base (10000).
        rotary_dim: features rotated and scaled, even, ``<= head_dim``; default all.
        pairing: "half_split" or "interleaved" (torchscale's xPos uses interleaved pairs).
        scale_base: ``B`` in ``zeta^(n/B)`` (512).
        center: the position subtracted before scaling: an int, "length" (per call, as the
            reference implementations; no KV cache) or None (``max_len // 2``).

    Shapes: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T]`` (integer or float).
    """

    hooks = frozenset({Hook.QK})
    causal_only = True

    def __init__(
        self,
        head_dim: int,
        max_len: int | None = None,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
        scale_base: float = 512.0,
        center: int | Literal["length"] | None = None,
    ) -> None:
        super().__init__()
        rotary_dim = check_rotary_dims(head_dim, rotary_dim)
        check_choice("pairing", pairing, PAIRINGS)
        check_number("base", base, minimum=1.0, strict=True)
        check_number("scale_base", scale_base, minimum=0.0, strict=True)
        if max_len is not None:
            check_int("max_len", max_len, minimum=1)
        if center is None:
            center = 0 if max_len is None else max_len // 2
        if center != "length" and (isinstance(center, bool) or not isinstance(center, int)):
            raise TypeError(f"center must be an int, 'length' or None; got {center!r}")
        self.head_dim, self.rotary_dim, self.base, self.pairing = head_dim, rotary_dim, base, pairing
        self.scale_base, self.center = float(scale_base), center
        if center == "length":
            self.supports_kv_cache = False
        self.register_buffer("inv_freq", rope_inv_freq(rotary_dim, base), persistent=False)
        self.register_buffer("log_zeta", xpos_zeta(rotary_dim).log(), persistent=False)

    def _tables(self, positions: Tensor, centre: Tensor, sign: float) -> tuple[Tensor, Tensor]:
        """``cos, sin [B, 1, T, r/2]`` (float64) times ``zeta^(sign * (p - centre) / B)``."""
        inv_freq, log_zeta = self.inv_freq, self.log_zeta
        if inv_freq.dtype != torch.float64:  # the module was cast: recompute exactly
            inv_freq = rope_inv_freq(self.rotary_dim, self.base).to(positions.device)
            log_zeta = xpos_zeta(self.rotary_dim).log().to(positions.device)
        p = positions.to(torch.float64)
        angles = rotary_angles(p, inv_freq)
        power = (sign / self.scale_base) * (p - centre.unsqueeze(-1))
        scale = torch.exp(power.unsqueeze(-1) * log_zeta)
        return (angles.cos() * scale).unsqueeze(1), (angles.sin() * scale).unsqueeze(1)

    def position_limit(self, dtype: torch.dtype = torch.float32) -> int:
        """The largest ``|p - centre|`` at which the scale factors of q and k of ``dtype`` are exact
        (see the module docstring): ``floor(scale_base * ln M / ln 3.5)``, ``M = sqrt(finfo.max)``."""
        work = dtype if dtype.is_floating_point else torch.float32
        return int(self.scale_base * 0.5 * math.log(torch.finfo(work).max) / _LOG_ZETA_MAX)

    def _check_range(self, name: str, positions: Tensor, centre: Tensor, dtype: torch.dtype) -> None:
        """Positions within ``centre +- position_limit(dtype)``, or a ValueError saying where and why."""
        if positions.numel() == 0 or torch.compiler.is_compiling():
            return
        offset = (positions.to(torch.float64) - centre.unsqueeze(-1)).abs()  # [B, T]
        limit = self.position_limit(dtype)
        if bool((offset > limit).any()):
            where = int(offset.flatten().argmax())
            p = positions.expand_as(offset).flatten()[where].item()
            c = centre.unsqueeze(-1).expand_as(offset).flatten()[where].item()
            raise ValueError(
                f"{name} holds position {p}, {abs(p - c):.0f} from xPos's centre {c:.0f}; xPos is exact only within "
                f"centre +- {limit} for {dtype} (scale_base={self.scale_base:g}: beyond it zeta^(n/scale_base) leaves the "
                f"dtype's range); pass a centre near the positions (center=), a larger scale_base, or float64"
            )

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        check_positions("q_pos", q_pos, ndim=(2,))
        check_positions("kv_pos", kv_pos, ndim=(2,))
        if self.center == "length":
            centre = torch.floor(current_length(q_pos, kv_pos) / 2)  # [B]: T // 2, as the reference
        else:
            centre = torch.full((1,), float(self.center), dtype=torch.float64, device=q_pos.device)
        self._check_range("q_pos", q_pos, centre, q.dtype)
        self._check_range("kv_pos", kv_pos, centre, k.dtype)
        interleaved = self.pairing == "interleaved"
        cos, sin = self._tables(q_pos, centre, 1.0)
        q = apply_rotary(q, cos, sin, interleaved=interleaved)
        if k.shape[2] > 0:
            cos, sin = self._tables(kv_pos, centre, -1.0)
            k = apply_rotary(k, cos, sin, interleaved=interleaved)
        return q, k
