"""Context extensions of RoPE, the formulas: per scaling, a frozen dataclass of its parameters and a
pure ``inv_freq`` function (the table that joins them by name is :mod:`.rope_scaling`, which
imports this module, never the reverse; Hugging Face's ``modeling_rope_utils`` is the de-facto
reference, and the conventions here follow it).

A dataclass (:class:`LinearScaling`, ..., :class:`ProportionalScaling`) checks its fields on
construction; it is what an encoding holds and what a model saves. Its function,
``(params, rotary_dim r, base, seq_len T) -> (inv_freq, attention_factor)``, computes: ``inv_freq``
float64 ``[r/2]`` (``[B, r/2]`` when ``T`` is a ``[B]`` tensor), ``attention_factor`` a float that
multiplies both ``cos`` and ``sin`` (the scores by its square). ``params.compute(r, base, T)``
checks the width, base and length, then calls it through the scaling's row of the table. In the
formulas ``theta_k = base^(-2k/r)``, ``k < r/2``, ``s`` is the factor and ``L0`` the original
context.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from ..common.checks import check_bool, check_int, check_number, is_number, is_real

SeqLen = float | Tensor | None
Frequencies = tuple[Tensor, float]

#: Every scaling's row, by name: :data:`posenc.seq.rope_scaling.ROPE_SCALING_ENTRIES`, this same
#: dict, which that module fills when it builds the table (so a scaling reads its own row here
#: without importing the table's module).
ROPE_SCALING_ENTRIES: dict[str, Any] = {}


# --- shared checks ------------------------------------------------------------------------------


def check_rotary_dim(rotary_dim: int) -> None:
    check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")


def check_base(base: float) -> None:
    check_number("base", base, minimum=1.0, strict=True)


def _check_seq_len(seq_len: SeqLen) -> None:
    if isinstance(seq_len, Tensor):
        if seq_len.dim() > 1:
            raise ValueError(f"seq_len must be a number or a [B] tensor, got shape {tuple(seq_len.shape)}")
    elif seq_len is not None:
        check_number("seq_len", seq_len, minimum=0.0, strict=True)


def _check_ntk_width(rotary_dim: int, name: str) -> None:
    if rotary_dim < 4:
        raise ValueError(f"{name} scaling needs rotary_dim >= 4 (the exponent r/(r-2)), got {rotary_dim}")


def _factor_list(name: str, values: Sequence[float], rotary_dim: int | None = None) -> Tensor:
    """``values`` (a list or tuple of numbers, or a 1-D tensor or array) as a float64 vector of
    finite positive numbers, ``rotary_dim / 2`` long when the width is given. Anything else (a bare
    number, ``True``, a string, bool items) is a TypeError naming ``name``; an empty list, a wrong
    length or a value that is not finite and positive a ValueError."""
    items = values.tolist() if not isinstance(values, (list, tuple)) and hasattr(values, "tolist") else values
    if not isinstance(items, (list, tuple)) or not all(is_real(v) for v in items):
        raise TypeError(f"{name} must be a sequence of numbers; got {values!r} ({type(values).__name__})")
    floats = [float(v) for v in items]
    if not floats:
        raise ValueError(f"{name} must be a non-empty flat sequence of numbers, got {values!r}")
    # checked as Python numbers: a check of a tensor's values would break a torch.compile graph
    # (LongRoPE's lists are checked at every call)
    if not all(math.isfinite(v) and v > 0 for v in floats):
        raise ValueError(f"{name} must be finite and positive; got {values!r}")
    if rotary_dim is not None and len(floats) != rotary_dim // 2:
        raise ValueError(f"{name} must hold rotary_dim/2 = {rotary_dim // 2} numbers, got {len(floats)}")
    return torch.tensor(floats, dtype=torch.float64)


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """``base^(-2k/r)`` for ``k = 0 .. r/2 - 1`` (float64 ``[r/2]``): plain RoPE."""
    check_rotary_dim(rotary_dim)
    check_base(base)
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return base ** (-k / rotary_dim)


# --- the base of the parameter dataclasses ----------------------------------------------------------


@dataclass(frozen=True)
class RopeScaling:
    """A scaling's parameters: the base of the frozen dataclasses (:class:`LinearScaling`, ...).

    A subclass names its scaling (``name``, the key of its table row), has one field per
    parameter and checks its own in ``__post_init__`` after this one's, which checks the fields
    that mean the same in every scaling: ``factor`` (``s >= 1``), ``original_max_len`` (``L0``, the
    length the model was trained at) and ``attention_factor`` (an explicit factor on cos and sin,
    > 0, or None for the scaling's default). ``dynamic``: the frequencies depend on the length.
    """

    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        params = self.params()
        if "factor" in params:
            check_number("factor", self.factor, minimum=1.0)
        if "original_max_len" in params:
            check_int("original_max_len", self.original_max_len, minimum=1)
        if params.get("attention_factor") is not None:
            check_number("attention_factor", self.attention_factor, minimum=0.0, strict=True)

    @property
    def entry(self) -> Any:
        """This scaling's row of :data:`ROPE_SCALING_ENTRIES`."""
        return ROPE_SCALING_ENTRIES[self.name]

    @property
    def dynamic(self) -> bool:
        return False

    def params(self) -> dict[str, Any]:
        """The fields, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        """``(inv_freq, attention_factor)`` for this width and base: the table's function, after
        checking its arguments (``seq_len``, the current length, is read by the length-dependent
        scalings only)."""
        check_rotary_dim(rotary_dim)
        check_base(base)
        _check_seq_len(seq_len)
        return self.entry.inv_freq(self, rotary_dim, base, seq_len)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready): ``{"method": name, **params}``; :func:`rope_scaling_from_dict`
        inverts it."""
        return {"method": self.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in self.params().items()}}


# --- the scalings: a dataclass and a function each -----------------------------------------------


@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation (Chen et al. 2023, https://arxiv.org/abs/2306.15595): ``theta_k / s``."""

    name: ClassVar[str] = "linear"
    factor: float = 4.0


def linear_inv_freq(p: LinearScaling, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
    return default_inv_freq(rotary_dim, base) / p.factor, 1.0


@dataclass(frozen=True)
class NTKScaling(RopeScaling):
    """The NTK-aware base (bloc97 2023): ``base * s^(r/(r-2))``, ``r >= 4``."""

    name: ClassVar[str] = "ntk"
    factor: float = 4.0


def ntk_inv_freq(p: NTKScaling, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
    _check_ntk_width(rotary_dim, "ntk")
    return default_inv_freq(rotary_dim, base * p.factor ** (rotary_dim / (rotary_dim - 2))), 1.0


@dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    """The NTK-aware base grown from the current length ``T`` (emozilla 2023): for ``T > L0``
    ``base * (s*T/L0 - (s-1))^(r/(r-2))``; ``T <= L0`` (or None) keeps ``base``. ``T`` is a number,
    or ``[B]`` for one per row."""

    name: ClassVar[str] = "dynamic_ntk"
    original_max_len: int
    factor: float = 4.0

    @property
    def dynamic(self) -> bool:
        return True


def dynamic_ntk_inv_freq(p: DynamicNTKScaling, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
    _check_ntk_width(rotary_dim, "dynamic_ntk")
    if seq_len is None:
        return default_inv_freq(rotary_dim, base), 1.0
    t = torch.as_tensor(seq_len, dtype=torch.float64)
    t = torch.clamp(t, min=float(p.original_max_len))  # below L0: the original base
    new_base = base * (p.factor * t / p.original_max_len - (p.factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=t.device)
    return new_base.unsqueeze(-1) ** (-k / rotary_dim), 1.0


@dataclass(frozen=True)
class YaRNScaling(RopeScaling):
    """YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071): a ramp between interpolated and
    original frequencies, ``inv_freq = theta/s * ramp + theta * (1 - ramp)``.

    The correction dim ``dim(b) = r*ln(L0/(2*pi*b)) / (2*ln base)`` (``r`` the rotary dim, as in
    HF) gives ``low = floor(dim(beta_fast))`` and ``high = ceil(dim(beta_slow))`` clamped to
    ``[0, r-1]`` (``truncate=False`` skips the floor and ceil, HF's ``truncate``); ``ramp_k =
    clamp((k-low)/(high-low), 0, 1)``, ``high`` + 0.001 when equal to ``low``. ``beta_fast >
    beta_slow > 0`` are rotations in ``L0``. The attention factor is ``0.1*ln(s) + 1``, or with
    DeepSeek's ``mscale`` and ``mscale_all_dim`` (both given and nonzero: transformers reads a 0 as
    absent) ``m(s, mscale) / m(s, mscale_all_dim)``, ``m(s, a) = 0.1*a*ln(s) + 1`` (1 when ``s <= 1``),
    or ``attention_factor``.
    """

    name: ClassVar[str] = "yarn"
    original_max_len: int
    factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("truncate", self.truncate)
        check_number("beta_fast", self.beta_fast, minimum=0.0, strict=True)
        check_number("beta_slow", self.beta_slow, minimum=0.0, strict=True)
        if self.beta_fast <= self.beta_slow:
            raise ValueError(f"beta_fast must be greater than beta_slow, got beta_fast={self.beta_fast}, "
                             f"beta_slow={self.beta_slow}")
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), minimum=0.0)


def yarn_inv_freq(p: YaRNScaling, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
    def m(scale: float) -> float:  # YaRN's attention temperature
        return 1.0 if p.factor <= 1 else 0.1 * scale * math.log(p.factor) + 1.0

    def correction_dim(rotations: float) -> float:  # the pair whose wavelength fits `rotations` times into L0
        return rotary_dim * math.log(p.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    attention_factor = p.attention_factor
    if attention_factor is None:
        both = bool(p.mscale) and bool(p.mscale_all_dim)  # as transformers: a 0 reads as absent
        attention_factor = m(p.mscale) / m(p.mscale_all_dim) if both else m(1.0)
    low, high = correction_dim(p.beta_fast), correction_dim(p.beta_slow)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no singularity
    theta = default_inv_freq(rotary_dim, base)
    k = torch.arange(rotary_dim // 2, dtype=torch.float64)
    ramp = ((k - low) / (high - low)).clamp(0.0, 1.0)  # 0: keep theta (fast pairs), 1: interpolate
    return theta / p.factor * ramp + theta * (1 - ramp), float(attention_factor)


@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1 (https://arxiv.org/abs/2407.21783; factor 8, low 1, high 4, ``L0`` 8192): with the
    wavelength ``w = 2*pi/theta``, ``w < L0/high`` keeps ``theta``, ``w > L0/low`` uses ``theta/s``,
    between them ``(1-g)*theta/s + g*theta``, ``g = (L0/w - low)/(high - low)`` (``low < high``)."""

    name: ClassVar[str] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("low_freq_factor", self.low_freq_factor, minimum=0.0, strict=True)
        check_number("high_freq_factor", self.high_freq_factor, minimum=0.0, strict=True)
        if self.low_freq_factor >= self.high_freq_factor:
            raise ValueError(f"low_freq_factor must be smaller than high_freq_factor, got {self.low_freq_factor} "
                             f"and {self.high_freq_factor}")


def llama3_inv_freq(p: Llama3Scaling, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
    low, high, l0 = p.low_freq_factor, p.high_freq_factor, p.original_max_len
    theta = default_inv_freq(rotary_dim, base)
    wavelen = 2 * math.pi / theta
    smooth = (l0 / wavelen - low) / (high - low)
    blended = (1 - smooth) * theta / p.factor + smooth * theta
    out = torch.where(wavelen > l0 / low, theta / p.factor, blended)
    return torch.where(wavelen < l0 / high, theta, out), 1.0


LongRoPESelect = Literal["by_length", "short", "long"]


@dataclass(frozen=True)
class LongRoPEScaling(RopeScaling):
    """LongRoPE (Ding et al. 2024, https://arxiv.org/abs/2402.13753; Phi-3): ``theta_k / f_k`` with
    per-pair factors ``f``, the ``r/2`` finite positive numbers of ``short_factor`` while the length
    is at most ``L0`` and of ``long_factor`` beyond (their length is checked against the width at
    use; lists are stored as tuples of floats). ``select``: "by_length" (None: long, the extended
    regime, as Phi-3 in HF; length-dependent), "short" or "long" (one list). The attention factor
    is ``sqrt(1 + ln s / ln L0)`` (1 when ``s <= 1``) in both regimes, as in HF, with ``s`` the
    stated ``factor`` (a Hugging Face config without one gives the ratio of its two lengths:
    :func:`posenc.seq.rope_from_hf_config`)."""

    name: ClassVar[str] = "longrope"
    short_factor: Sequence[float]
    long_factor: Sequence[float]
    original_max_len: int
    factor: float = 4.0
    attention_factor: float | None = None
    select: LongRoPESelect = "by_length"

    def __post_init__(self) -> None:
        for field in ("short_factor", "long_factor"):
            value = getattr(self, field)
            if isinstance(value, (list, tuple)):  # hashable, and equal after a JSON round trip
                object.__setattr__(self, field, tuple(float(v) if is_number(v) else v for v in value))
        if self.select not in ("by_length", "short", "long"):
            raise ValueError(f"select must be 'by_length', 'short' or 'long', got {self.select!r}")
        super().__post_init__()
        _factor_list("short_factor", self.short_factor)
        _factor_list("long_factor", self.long_factor)

    @property
    def dynamic(self) -> bool:
        return self.select == "by_length"


def longrope_inv_freq(p: LongRoPEScaling, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
    short = _factor_list("short_factor", p.short_factor, rotary_dim)
    long = _factor_list("long_factor", p.long_factor, rotary_dim)
    attention_factor = p.attention_factor
    if attention_factor is None:  # 1 also for L0 = 1, where the formula is undefined
        s, l0 = p.factor, p.original_max_len
        attention_factor = 1.0 if s <= 1 or l0 <= 1 else math.sqrt(1 + math.log(s) / math.log(l0))
    theta = default_inv_freq(rotary_dim, base)
    short_freq, long_freq = theta / short, theta / long
    if p.select == "short":
        return short_freq, float(attention_factor)
    if p.select == "long" or seq_len is None:
        return long_freq, float(attention_factor)
    t = torch.as_tensor(seq_len, dtype=torch.float64)
    use_long = (t > p.original_max_len).unsqueeze(-1)
    return torch.where(use_long, long_freq.to(t.device), short_freq.to(t.device)), float(attention_factor)


@dataclass(frozen=True)
class ProportionalScaling(RopeScaling):
    """Proportional RoPE (Gemma 4's full-attention layers; the construction of Barbero et al. 2025,
    https://arxiv.org/abs/2410.06205): the exponents span the whole rotated width ``r``, ``theta_k =
    base^(-2k/r) / s``, and only the ``n = int(partial_rotary_factor * r // 2)`` fastest pairs turn;
    the slower ``r/2 - n`` get frequency 0 (they pass through). Partial rotary (``rotary_dim``)
    differs: it rotates the first features with exponents over that width alone. ``factor`` ``s``
    divides every frequency (1: none), as Hugging Face's ``ROPE_INIT_FUNCTIONS["proportional"]``."""

    name: ClassVar[str] = "proportional"
    factor: float = 1.0
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("partial_rotary_factor", self.partial_rotary_factor, minimum=0.0, maximum=1.0)


def proportional_inv_freq(p: ProportionalScaling, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
    turning = int(p.partial_rotary_factor * rotary_dim // 2)  # Hugging Face's rounding, floor of p * r / 2
    theta = default_inv_freq(rotary_dim, base)
    theta[turning:] = 0.0
    return theta / p.factor, 1.0


def ntk_long_factors(rotary_dim: int, factor: float) -> tuple[float, ...]:
    """``s^(2k/(r-2))``: the per-pair factors that reproduce the NTK-aware base; LongRoPE's default
    long list when no searched list is given (1 for the fastest pair, ``s`` for the slowest)."""
    check_rotary_dim(rotary_dim)
    check_number("factor", factor, minimum=1.0)
    if rotary_dim == 2:
        return (float(factor),)
    return tuple(float(factor) ** (2 * k / (rotary_dim - 2)) for k in range(rotary_dim // 2))


def _longrope_width_defaults(rotary_dim: int, params: dict[str, Any]) -> dict[str, Any]:
    """A missing (None) list filled: all ones inside ``L0`` (plain RoPE), the NTK-aware factors beyond."""
    if params.get("short_factor") is None:
        params["short_factor"] = (1.0,) * max(rotary_dim // 2, 0)
    if params.get("long_factor") is None:
        params["long_factor"] = ntk_long_factors(rotary_dim, params.get("factor", 4.0))
    return params


__all__ = [
    "SeqLen", "Frequencies", "check_rotary_dim", "check_base", "default_inv_freq", "RopeScaling", "LinearScaling",
    "linear_inv_freq", "NTKScaling", "ntk_inv_freq", "DynamicNTKScaling", "dynamic_ntk_inv_freq", "YaRNScaling",
    "yarn_inv_freq", "Llama3Scaling", "llama3_inv_freq", "LongRoPEScaling", "longrope_inv_freq", "ProportionalScaling",
    "proportional_inv_freq", "ntk_long_factors",
]
