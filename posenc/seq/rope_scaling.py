"""Context extensions of RoPE: a registry of pure functions with validated parameters.

Each scaling maps ``(rotary_dim r, base, its parameters[, current length T])`` to
``(inv_freq, attention_factor)``: ``inv_freq`` is float64 ``[r/2]`` (``[B, r/2]`` when ``T`` is a
``[B]`` tensor), ``attention_factor`` a float that multiplies both ``cos`` and ``sin`` (so q and k
are each scaled by it and the scores by its square, as in Hugging Face transformers). Hugging Face
``modeling_rope_utils`` is the de-facto reference; the conventions followed are named below.
``theta_k = base^(-2k/r)``, ``k < r/2``, ``s`` the scaling factor, ``L0`` the original context.

``linear``        position interpolation (Chen et al. 2023, https://arxiv.org/abs/2306.15595):
                  ``theta_k / s``.
``ntk``           NTK-aware base (bloc97 2023): ``base' = base * s^(r/(r-2))``.
``dynamic_ntk``   NTK-aware base from the current length ``T``: for ``T > L0``,
                  ``base' = base * (s*T/L0 - (s-1))^(r/(r-2))``; ``T <= L0`` keeps ``base``.
``yarn``          YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071): the correction
                  dim ``dim(b) = r*ln(L0/(2*pi*b)) / (2*ln base)`` (``r`` = the rotary dim, as
                  in HF), ``low = floor(dim(beta_fast))``, ``high = ceil(dim(beta_slow))``
                  clamped to ``[0, r-1]`` (``truncate=False`` skips the floor/ceil, as HF's
                  ``truncate`` option); ``ramp_k = clamp((k-low)/(high-low), 0, 1)`` (``high``
                  gets +0.001 when equal to ``low``); ``inv_freq = theta/s * ramp +
                  theta * (1 - ramp)``; attention factor ``0.1*ln(s) + 1``, or with DeepSeek's
                  ``mscale``/``mscale_all_dim`` knobs ``m(s, mscale) / m(s, mscale_all_dim)``,
                  ``m(s, a) = 0.1*a*ln(s) + 1`` (1 when ``s <= 1``), or an explicit value.
``llama3``        Llama 3.1 (factor 8, low 1, high 4, ``L0`` 8192): wavelength
                  ``w = 2*pi/theta``; ``w < L0/high`` keeps ``theta``, ``w > L0/low`` uses
                  ``theta/s``, between them ``(1-g)*theta/s + g*theta``,
                  ``g = (L0/w - low)/(high - low)``.
``longrope``      LongRoPE (Ding et al. 2024, https://arxiv.org/abs/2402.13753; Phi-3):
                  ``theta_k = 1/(f_k * base^(2k/r))`` with per-pair factors ``f``: the short list
                  while ``T <= L0``, the long list beyond; attention factor
                  ``sqrt(1 + ln s / ln L0)`` (1 when ``s <= 1``) in both regimes, as in HF.

Every parameter is checked; a bad one is a ``ValueError`` naming it, its value and the valid range.
The typed configs (:class:`LinearScaling`, ...) hold the parameters for :class:`~.rope.RotaryEncoding`;
:data:`ROPE_SCALINGS` maps each name to its function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Literal, Sequence

import torch
from torch import Tensor

from ..common.checks import check_bool, check_int, check_number

SeqLen = float | Tensor | None


# --- validation ------------------------------------------------------------------------------


def check_rotary_dim(rotary_dim: int) -> None:
    check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")


def check_base(base: float) -> None:
    check_number("base", base, minimum=1.0, strict=True)


def _check_number(name: str, value, *, minimum: float | None = None, strict: bool = False) -> None:
    check_number(name, value, minimum=minimum, strict=strict)


def _check_factor(factor: float) -> None:
    _check_number("factor", factor, minimum=1.0)


def _check_original_max_len(original_max_len: int) -> None:
    check_int("original_max_len", original_max_len, minimum=1)


def _check_factor_list(name: str, values: Sequence[float], rotary_dim: int) -> Tensor:
    try:
        t = torch.as_tensor(list(values), dtype=torch.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a sequence of numbers, got {values!r}") from exc
    if t.dim() != 1 or t.numel() != rotary_dim // 2:
        raise ValueError(f"{name} must hold rotary_dim/2 = {rotary_dim // 2} numbers, got {t.numel()}")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise ValueError(f"{name} must be finite and positive; got {values!r}")
    return t


def _check_seq_len(seq_len: SeqLen) -> None:
    if seq_len is None:
        return
    if isinstance(seq_len, Tensor):
        if seq_len.dim() > 1:
            raise ValueError(f"seq_len must be a number or a [B] tensor, got shape {tuple(seq_len.shape)}")
        return
    _check_number("seq_len", seq_len, minimum=0.0, strict=True)


# --- the functions ---------------------------------------------------------------------------


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """``base^(-2k/r)`` for ``k = 0 .. r/2 - 1`` (float64)."""
    check_rotary_dim(rotary_dim)
    check_base(base)
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return base ** (-k / rotary_dim)


def linear_scaling(rotary_dim: int, base: float, *, factor: float) -> tuple[Tensor, float]:
    """Position interpolation: ``theta_k / s``."""
    _check_factor(factor)
    return default_inv_freq(rotary_dim, base) / factor, 1.0


def ntk_scaling(rotary_dim: int, base: float, *, factor: float) -> tuple[Tensor, float]:
    """NTK-aware base: ``base * s^(r/(r-2))``."""
    _check_factor(factor)
    check_rotary_dim(rotary_dim)
    check_base(base)
    if rotary_dim < 4:
        raise ValueError(f"ntk scaling needs rotary_dim >= 4 (the exponent r/(r-2)), got {rotary_dim}")
    return default_inv_freq(rotary_dim, base * factor ** (rotary_dim / (rotary_dim - 2))), 1.0


def dynamic_ntk_scaling(
    rotary_dim: int, base: float, *, factor: float, original_max_len: int, seq_len: SeqLen = None
) -> tuple[Tensor, float]:
    """NTK-aware base from the current length ``seq_len`` (a number, or ``[B]`` for one per row).

    ``seq_len <= L0`` (or None) keeps ``base``; beyond it ``base * (s*T/L0 - (s-1))^(r/(r-2))``.
    """
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    _check_seq_len(seq_len)
    check_rotary_dim(rotary_dim)
    if rotary_dim < 4:
        raise ValueError(f"dynamic_ntk scaling needs rotary_dim >= 4 (the exponent r/(r-2)), got {rotary_dim}")
    check_base(base)
    if seq_len is None:
        return default_inv_freq(rotary_dim, base), 1.0
    t = torch.as_tensor(seq_len, dtype=torch.float64)
    t = torch.clamp(t, min=float(original_max_len))  # below L0: the original base
    new_base = base * (factor * t / original_max_len - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=t.device)
    return new_base.unsqueeze(-1) ** (-k / rotary_dim), 1.0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """``0.1 * mscale * ln(s) + 1`` for ``s > 1``, else 1 (YaRN's attention temperature)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_correction_dim(rotary_dim: int, base: float, original_max_len: int, rotations: float) -> float:
    """The (fractional) pair index whose wavelength fits ``rotations`` times into ``L0``:
    ``r * ln(L0 / (2*pi*rotations)) / (2 * ln base)``."""
    return rotary_dim * math.log(original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_scaling(
    rotary_dim: int,
    base: float,
    *,
    factor: float,
    original_max_len: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    truncate: bool = True,
) -> tuple[Tensor, float]:
    """YaRN: a ramp between interpolated (``theta/s``) and original frequencies, plus an
    attention factor (see the module docstring)."""
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    check_bool("truncate", truncate)
    _check_number("beta_fast", beta_fast, minimum=0.0, strict=True)
    _check_number("beta_slow", beta_slow, minimum=0.0, strict=True)
    if beta_fast <= beta_slow:
        raise ValueError(f"beta_fast must be greater than beta_slow, got beta_fast={beta_fast}, beta_slow={beta_slow}")
    if attention_factor is not None:
        _check_number("attention_factor", attention_factor, minimum=0.0, strict=True)
    for name, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None:
            _check_number(name, value, minimum=0.0)
    theta = default_inv_freq(rotary_dim, base)
    if attention_factor is None:
        if mscale is not None and mscale_all_dim is not None:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    low = yarn_correction_dim(rotary_dim, base, original_max_len, beta_fast)
    high = yarn_correction_dim(rotary_dim, base, original_max_len, beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no singularity
    k = torch.arange(rotary_dim // 2, dtype=torch.float64)
    ramp = ((k - low) / (high - low)).clamp(0.0, 1.0)  # 0: keep theta (fast pairs), 1: interpolate
    return theta / factor * ramp + theta * (1 - ramp), float(attention_factor)


def llama3_scaling(
    rotary_dim: int,
    base: float,
    *,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_len: int = 8192,
) -> tuple[Tensor, float]:
    """Llama 3.1: keep short wavelengths, divide long ones by ``s``, blend in between."""
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    _check_number("low_freq_factor", low_freq_factor, minimum=0.0, strict=True)
    _check_number("high_freq_factor", high_freq_factor, minimum=0.0, strict=True)
    if low_freq_factor >= high_freq_factor:
        raise ValueError(
            f"low_freq_factor must be smaller than high_freq_factor, got {low_freq_factor} and {high_freq_factor}"
        )
    theta = default_inv_freq(rotary_dim, base)
    wavelen = 2 * math.pi / theta
    smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * theta / factor + smooth * theta
    out = torch.where(wavelen > original_max_len / low_freq_factor, theta / factor, blended)
    out = torch.where(wavelen < original_max_len / high_freq_factor, theta, out)
    return out, 1.0


def longrope_attention_factor(factor: float, original_max_len: int) -> float:
    """``sqrt(1 + ln s / ln L0)``, 1 when ``s <= 1`` (or ``L0 = 1``, where it is undefined)."""
    if factor <= 1 or original_max_len <= 1:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_len))


def longrope_scaling(
    rotary_dim: int,
    base: float,
    *,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    factor: float,
    original_max_len: int,
    attention_factor: float | None = None,
    seq_len: SeqLen = None,
) -> tuple[Tensor, float]:
    """LongRoPE: per-pair factors, short up to ``L0`` and long beyond it (``seq_len`` None: long,
    the extended-context regime; a ``[B]`` tensor: one choice per row)."""
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    _check_seq_len(seq_len)
    short = _check_factor_list("short_factor", short_factor, rotary_dim)
    long = _check_factor_list("long_factor", long_factor, rotary_dim)
    if attention_factor is not None:
        _check_number("attention_factor", attention_factor, minimum=0.0, strict=True)
    else:
        attention_factor = longrope_attention_factor(factor, original_max_len)
    theta = default_inv_freq(rotary_dim, base)
    short_freq, long_freq = theta / short, theta / long
    if seq_len is None:
        return long_freq, float(attention_factor)
    t = torch.as_tensor(seq_len, dtype=torch.float64)
    use_long = (t > original_max_len).unsqueeze(-1)
    return torch.where(use_long, long_freq.to(t.device), short_freq.to(t.device)), float(attention_factor)


def ntk_long_factors(rotary_dim: int, factor: float) -> tuple[float, ...]:
    """``s^(2k/(r-2))``: the per-pair factors that reproduce the NTK-aware base; the default long
    list of :class:`LongRoPEScaling` when no searched list is given (1 for the fastest pair, ``s``
    for the slowest)."""
    check_rotary_dim(rotary_dim)
    _check_factor(factor)
    half = rotary_dim // 2
    if half == 1:
        return (float(factor),)
    return tuple(float(factor) ** (2 * k / (rotary_dim - 2)) for k in range(half))


ROPE_SCALINGS: dict[str, Callable[..., tuple[Tensor, float]]] = {
    "linear": linear_scaling,
    "ntk": ntk_scaling,
    "dynamic_ntk": dynamic_ntk_scaling,
    "yarn": yarn_scaling,
    "llama3": llama3_scaling,
    "longrope": longrope_scaling,
}


# --- typed configs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeScaling:
    """A scaling and its parameters. ``dynamic``: the frequencies depend on the current length."""

    name: ClassVar[str] = ""
    dynamic: ClassVar[bool] = False

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> tuple[Tensor, float]:
        raise NotImplementedError


@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    factor: float = 4.0
    name: ClassVar[str] = "linear"

    def __post_init__(self) -> None:
        _check_factor(self.factor)

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> tuple[Tensor, float]:
        return linear_scaling(rotary_dim, base, factor=self.factor)


@dataclass(frozen=True)
class NTKScaling(RopeScaling):
    factor: float = 4.0
    name: ClassVar[str] = "ntk"

    def __post_init__(self) -> None:
        _check_factor(self.factor)

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> tuple[Tensor, float]:
        return ntk_scaling(rotary_dim, base, factor=self.factor)


@dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    original_max_len: int
    factor: float = 4.0
    name: ClassVar[str] = "dynamic_ntk"
    dynamic: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_factor(self.factor)
        _check_original_max_len(self.original_max_len)

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> tuple[Tensor, float]:
        return dynamic_ntk_scaling(
            rotary_dim, base, factor=self.factor, original_max_len=self.original_max_len, seq_len=seq_len
        )


@dataclass(frozen=True)
class YaRNScaling(RopeScaling):
    original_max_len: int
    factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    name: ClassVar[str] = "yarn"

    def __post_init__(self) -> None:
        self.compute(2, 10000.0)  # every parameter check; the dimension is checked at use

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> tuple[Tensor, float]:
        return yarn_scaling(
            rotary_dim, base, factor=self.factor, original_max_len=self.original_max_len,
            beta_fast=self.beta_fast, beta_slow=self.beta_slow, attention_factor=self.attention_factor,
            mscale=self.mscale, mscale_all_dim=self.mscale_all_dim, truncate=self.truncate,
        )


@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192
    name: ClassVar[str] = "llama3"

    def __post_init__(self) -> None:
        self.compute(2, 10000.0)

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> tuple[Tensor, float]:
        return llama3_scaling(
            rotary_dim, base, factor=self.factor, low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor, original_max_len=self.original_max_len,
        )


LongRoPESelect = Literal["by_length", "short", "long"]


@dataclass(frozen=True)
class LongRoPEScaling(RopeScaling):
    """``select``: "by_length" switches to the long factors when the current length exceeds
    ``L0`` (Phi-3 in HF; the frequencies then depend on the length); "short" or "long" fixes one
    list."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_len: int
    factor: float = 4.0
    attention_factor: float | None = None
    select: LongRoPESelect = "by_length"
    name: ClassVar[str] = "longrope"

    def __post_init__(self) -> None:
        if self.select not in ("by_length", "short", "long"):
            raise ValueError(f"select must be 'by_length', 'short' or 'long', got {self.select!r}")
        object.__setattr__(self, "short_factor", tuple(float(f) for f in self.short_factor))
        object.__setattr__(self, "long_factor", tuple(float(f) for f in self.long_factor))
        self.compute(2 * len(self.short_factor), 10000.0)

    @property
    def dynamic(self) -> bool:  # type: ignore[override]
        return self.select == "by_length"

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> tuple[Tensor, float]:
        if self.select == "short":
            seq_len = float(self.original_max_len)  # a length inside L0
        elif self.select == "long":
            seq_len = None
        return longrope_scaling(
            rotary_dim, base, short_factor=self.short_factor, long_factor=self.long_factor, factor=self.factor,
            original_max_len=self.original_max_len, attention_factor=self.attention_factor, seq_len=seq_len,
        )
