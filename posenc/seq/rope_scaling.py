"""Context extensions of RoPE: a pure function and a typed config per scaling, in one table.

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

Each scaling is written out twice, small: the pure function (:func:`linear_scaling`, ...,
:func:`longrope_scaling`), which checks its arguments and computes, and a frozen dataclass of its
parameters (:class:`LinearScaling`, ..., :class:`LongRoPEScaling`), checked on construction,
which is what an encoding holds and what a model saves. :data:`ROPE_SCALING_ENTRIES` is the one
table from a scaling's name to both (a :class:`RopeScalingEntry`, with the aliases and Hugging
Face ``rope_type`` values it answers to); :func:`posenc.seq.extend_context`, the ``posenc
extend`` command line and :func:`posenc.seq.rope_from_hf_config` read it. :data:`ROPE_SCALINGS`
is the plain ``{name: function}`` view of it, like Hugging Face's ``ROPE_INIT_FUNCTIONS``. The
registered encodings (``rope_linear``, ... :class:`~.rope_scaled.LinearRoPE`, ...) are written in
:mod:`.rope_scaled`. Every parameter is checked; a bad one is an error naming it, its value and
the valid range.

A new scaling is a function, its dataclass (with ``name`` and ``compute``) and a row in the
table; an encoding for ``posenc.build`` is a class in :mod:`.rope_scaled`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Sequence

import torch
from torch import Tensor

from ..common.checks import check_bool, check_int, check_number, is_number, is_real

SeqLen = float | Tensor | None
Frequencies = tuple[Tensor, float]


# --- validation ------------------------------------------------------------------------------


def check_rotary_dim(rotary_dim: int) -> None:
    check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")


def check_base(base: float) -> None:
    check_number("base", base, minimum=1.0, strict=True)


def _check_factor(factor: float) -> None:
    check_number("factor", factor, minimum=1.0)


def _check_original_max_len(original_max_len: int) -> None:
    check_int("original_max_len", original_max_len, minimum=1)


def _factor_list(name: str, values: Sequence[float]) -> Tensor:
    """``values`` (a list or tuple of numbers, or a 1-D tensor or array) as a float64 vector of
    finite positive numbers. Anything else (a bare number, ``True``, a string, bool items) is a
    TypeError naming ``name``; an empty list or a value that is not finite and positive a ValueError."""
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
    return torch.tensor(floats, dtype=torch.float64)


def _check_factor_list(name: str, values: Sequence[float], rotary_dim: int) -> Tensor:
    t = _factor_list(name, values)
    if t.numel() != rotary_dim // 2:
        raise ValueError(f"{name} must hold rotary_dim/2 = {rotary_dim // 2} numbers, got {t.numel()}")
    return t


def _check_seq_len(seq_len: SeqLen) -> None:
    if seq_len is None:
        return
    if isinstance(seq_len, Tensor):
        if seq_len.dim() > 1:
            raise ValueError(f"seq_len must be a number or a [B] tensor, got shape {tuple(seq_len.shape)}")
        return
    check_number("seq_len", seq_len, minimum=0.0, strict=True)


def _ntk_exponent_dim(rotary_dim: int, name: str) -> None:
    check_rotary_dim(rotary_dim)
    if rotary_dim < 4:
        raise ValueError(f"{name} scaling needs rotary_dim >= 4 (the exponent r/(r-2)), got {rotary_dim}")


# The checks that need no rotary width: run by each config on construction and by each function.


def _validate_factor_only(*, factor: float) -> None:
    _check_factor(factor)


def _validate_dynamic_ntk(*, original_max_len: int, factor: float) -> None:
    _check_factor(factor)
    _check_original_max_len(original_max_len)


def _validate_yarn(
    *, original_max_len: int, factor: float, beta_fast: float, beta_slow: float, attention_factor: float | None,
    mscale: float | None, mscale_all_dim: float | None, truncate: bool,
) -> None:
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    check_bool("truncate", truncate)
    check_number("beta_fast", beta_fast, minimum=0.0, strict=True)
    check_number("beta_slow", beta_slow, minimum=0.0, strict=True)
    if beta_fast <= beta_slow:
        raise ValueError(f"beta_fast must be greater than beta_slow, got beta_fast={beta_fast}, beta_slow={beta_slow}")
    if attention_factor is not None:
        check_number("attention_factor", attention_factor, minimum=0.0, strict=True)
    for name, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None:
            check_number(name, value, minimum=0.0)


def _validate_llama3(*, factor: float, low_freq_factor: float, high_freq_factor: float, original_max_len: int) -> None:
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    check_number("low_freq_factor", low_freq_factor, minimum=0.0, strict=True)
    check_number("high_freq_factor", high_freq_factor, minimum=0.0, strict=True)
    if low_freq_factor >= high_freq_factor:
        raise ValueError(
            f"low_freq_factor must be smaller than high_freq_factor, got {low_freq_factor} and {high_freq_factor}"
        )


LongRoPESelect = Literal["by_length", "short", "long"]
LONGROPE_SELECT = ("by_length", "short", "long")


def _validate_longrope(
    *, short_factor: Sequence[float], long_factor: Sequence[float], original_max_len: int, factor: float,
    attention_factor: float | None, select: str,
) -> None:
    if select not in LONGROPE_SELECT:
        raise ValueError(f"select must be 'by_length', 'short' or 'long', got {select!r}")
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    _factor_list("short_factor", short_factor)  # their length, rotary_dim/2, is checked at use
    _factor_list("long_factor", long_factor)
    if attention_factor is not None:
        check_number("attention_factor", attention_factor, minimum=0.0, strict=True)


# --- the scalings: pure functions --------------------------------------------------------------


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """``base^(-2k/r)`` for ``k = 0 .. r/2 - 1`` (float64 ``[r/2]``)."""
    check_rotary_dim(rotary_dim)
    check_base(base)
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return base ** (-k / rotary_dim)


def linear_scaling(rotary_dim: int, base: float, *, factor: float = 4.0) -> Frequencies:
    """Position interpolation (Chen et al. 2023, https://arxiv.org/abs/2306.15595): ``theta_k / s``.

    Returns float64 ``[r/2]`` inverse frequencies and attention factor 1."""
    _validate_factor_only(factor=factor)
    return default_inv_freq(rotary_dim, base) / factor, 1.0


def ntk_scaling(rotary_dim: int, base: float, *, factor: float = 4.0) -> Frequencies:
    """NTK-aware base (bloc97 2023): ``base * s^(r/(r-2))`` (``r >= 4``).

    Returns float64 ``[r/2]`` inverse frequencies and attention factor 1."""
    _validate_factor_only(factor=factor)
    check_base(base)
    _ntk_exponent_dim(rotary_dim, "ntk")
    return default_inv_freq(rotary_dim, base * factor ** (rotary_dim / (rotary_dim - 2))), 1.0


def dynamic_ntk_scaling(
    rotary_dim: int, base: float, *, original_max_len: int, factor: float = 4.0, seq_len: SeqLen = None
) -> Frequencies:
    """NTK-aware base from the current length ``seq_len`` (emozilla 2023): a number, or ``[B]``
    for one per row.

    ``seq_len <= L0`` (or None) keeps ``base``; beyond it ``base * (s*T/L0 - (s-1))^(r/(r-2))``.
    Returns inverse frequencies float64 ``[r/2]`` (``[B, r/2]`` for a ``[B]`` length) and
    attention factor 1.
    """
    _validate_dynamic_ntk(original_max_len=original_max_len, factor=factor)
    _check_seq_len(seq_len)
    _ntk_exponent_dim(rotary_dim, "dynamic_ntk")
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
    original_max_len: int,
    factor: float = 4.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    truncate: bool = True,
) -> Frequencies:
    """YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071): a ramp between interpolated
    (``theta/s``) and original frequencies, plus an attention factor (see the module docstring).

    Returns float64 ``[r/2]`` inverse frequencies and the attention factor."""
    _validate_yarn(original_max_len=original_max_len, factor=factor, beta_fast=beta_fast, beta_slow=beta_slow,
                   attention_factor=attention_factor, mscale=mscale, mscale_all_dim=mscale_all_dim, truncate=truncate)
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
) -> Frequencies:
    """Llama 3.1 (https://arxiv.org/abs/2407.21783): keep short wavelengths, divide long ones by
    ``s``, blend in between. Returns float64 ``[r/2]`` inverse frequencies and attention factor 1."""
    _validate_llama3(factor=factor, low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                     original_max_len=original_max_len)
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


def longrope_default_factors(
    rotary_dim: int, factor: float, short_factor: Sequence[float] | None, long_factor: Sequence[float] | None
) -> tuple[Sequence[float], Sequence[float]]:
    """``(short_factor, long_factor)`` with a missing (None) list filled: all ones inside ``L0``
    (plain RoPE) and the NTK-aware factors (:func:`ntk_long_factors`) beyond."""
    if short_factor is None:
        short_factor = (1.0,) * max(rotary_dim // 2, 0)
    if long_factor is None:
        long_factor = ntk_long_factors(rotary_dim, factor)
    return short_factor, long_factor


def longrope_scaling(
    rotary_dim: int,
    base: float,
    *,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_max_len: int,
    factor: float = 4.0,
    attention_factor: float | None = None,
    select: LongRoPESelect = "by_length",
    seq_len: SeqLen = None,
) -> Frequencies:
    """LongRoPE (Ding et al. 2024, https://arxiv.org/abs/2402.13753): per-pair factors, short up
    to ``L0`` and long beyond it. ``select="by_length"`` picks by ``seq_len`` (None: long, the
    extended-context regime; a ``[B]`` tensor: one choice per row), as Phi-3 in Hugging Face;
    ``"short"`` or ``"long"`` fixes one list (the frequencies are then independent of the length).

    Returns inverse frequencies float64 ``[r/2]`` (``[B, r/2]`` for a ``[B]`` length) and the
    attention factor."""
    _validate_longrope(short_factor=short_factor, long_factor=long_factor, original_max_len=original_max_len,
                       factor=factor, attention_factor=attention_factor, select=select)
    _check_seq_len(seq_len)
    short = _check_factor_list("short_factor", short_factor, rotary_dim)
    long = _check_factor_list("long_factor", long_factor, rotary_dim)
    if attention_factor is None:
        attention_factor = longrope_attention_factor(factor, original_max_len)
    theta = default_inv_freq(rotary_dim, base)
    short_freq, long_freq = theta / short, theta / long
    if select == "short":
        return short_freq, float(attention_factor)
    if select == "long" or seq_len is None:
        return long_freq, float(attention_factor)
    t = torch.as_tensor(seq_len, dtype=torch.float64)
    use_long = (t > original_max_len).unsqueeze(-1)
    return torch.where(use_long, long_freq.to(t.device), short_freq.to(t.device)), float(attention_factor)


# --- the scalings: typed configs ---------------------------------------------------------------


@dataclass(frozen=True)
class RopeScaling:
    """A scaling and its parameters: the base of the typed configs (:class:`LinearScaling`, ...).

    A subclass is a frozen dataclass with one field per keyword parameter of its function, names
    the scaling (``name``), checks its fields in ``__post_init__`` and computes in
    :meth:`compute`. ``dynamic``: the frequencies depend on the current length.
    """

    name: ClassVar[str] = ""

    @property
    def entry(self) -> RopeScalingEntry:
        """This scaling's row of :data:`ROPE_SCALING_ENTRIES`."""
        return ROPE_SCALING_ENTRIES[self.name]

    @property
    def dynamic(self) -> bool:
        return False

    def params(self) -> dict[str, Any]:
        """The parameters, as the scaling's function takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        """``(inv_freq, attention_factor)`` for this width and base (``seq_len``: the current length,
        read only by the length-dependent scalings)."""
        raise NotImplementedError(f"{type(self).__name__} must define compute")

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready): ``{"method": name, **params}``; :func:`rope_scaling_from_dict`
        inverts it."""
        return {"method": self.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in self.params().items()}}


@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation, ``theta / factor`` (:func:`linear_scaling`).

    Args:
        factor: the context scale ``s >= 1``.
    """

    name: ClassVar[str] = "linear"
    factor: float = 4.0

    def __post_init__(self) -> None:
        _validate_factor_only(factor=self.factor)

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        return linear_scaling(rotary_dim, base, factor=self.factor)


@dataclass(frozen=True)
class NTKScaling(RopeScaling):
    """The NTK-aware base, ``base * factor^(r/(r-2))`` (:func:`ntk_scaling`).

    Args:
        factor: the context scale ``s >= 1``.
    """

    name: ClassVar[str] = "ntk"
    factor: float = 4.0

    def __post_init__(self) -> None:
        _validate_factor_only(factor=self.factor)

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        return ntk_scaling(rotary_dim, base, factor=self.factor)


@dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    """The NTK-aware base grown from the current length beyond ``original_max_len``
    (:func:`dynamic_ntk_scaling`); length-dependent.

    Args:
        original_max_len: ``L0``, the length the model was trained at.
        factor: the context scale ``s >= 1``.
    """

    name: ClassVar[str] = "dynamic_ntk"
    original_max_len: int
    factor: float = 4.0

    def __post_init__(self) -> None:
        _validate_dynamic_ntk(original_max_len=self.original_max_len, factor=self.factor)

    @property
    def dynamic(self) -> bool:
        return True

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        return dynamic_ntk_scaling(rotary_dim, base, original_max_len=self.original_max_len, factor=self.factor,
                                   seq_len=seq_len)


@dataclass(frozen=True)
class YaRNScaling(RopeScaling):
    """YaRN's ramp between interpolated and original frequencies, with its attention factor
    (:func:`yarn_scaling`).

    Args:
        original_max_len: ``L0``, the length the model was trained at.
        factor: the context scale ``s >= 1``.
        beta_fast: rotations in ``L0`` that bound the ramp (``beta_fast > beta_slow > 0``).
        beta_slow: see ``beta_fast``.
        attention_factor: an explicit factor on cos and sin (default ``0.1 ln s + 1``).
        mscale: DeepSeek's knobs, used when both are given.
        mscale_all_dim: see ``mscale``.
        truncate: round the ramp's ends to whole pairs (Hugging Face's ``truncate``).
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
        _validate_yarn(**self.params())

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        return yarn_scaling(
            rotary_dim, base, original_max_len=self.original_max_len, factor=self.factor, beta_fast=self.beta_fast,
            beta_slow=self.beta_slow, attention_factor=self.attention_factor, mscale=self.mscale,
            mscale_all_dim=self.mscale_all_dim, truncate=self.truncate,
        )


@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1's wavelength-banded scaling (:func:`llama3_scaling`).

    Args:
        factor: the context scale ``s >= 1`` (8 for Llama 3.1).
        low_freq_factor: the band edges, ``L0/low`` and ``L0/high`` in
        high_freq_factor: see ``low_freq_factor``.
            wavelength (``low < high``).
        original_max_len: ``L0`` (8192 for Llama 3.1).
    """

    name: ClassVar[str] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    def __post_init__(self) -> None:
        _validate_llama3(**self.params())

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        return llama3_scaling(rotary_dim, base, factor=self.factor, low_freq_factor=self.low_freq_factor,
                              high_freq_factor=self.high_freq_factor, original_max_len=self.original_max_len)


@dataclass(frozen=True)
class LongRoPEScaling(RopeScaling):
    """LongRoPE's per-pair short and long factors (:func:`longrope_scaling`); length-dependent when
    ``select="by_length"``. Lists and tuples of numbers are stored as tuples of floats.

    Args:
        short_factor: ``r/2`` finite positive factors each (the length is checked
            against the rotary width when the frequencies are computed).
        long_factor: see ``short_factor``.
        original_max_len: ``L0``; beyond it the long list applies.
        factor: the context scale ``s >= 1`` (read by the default attention factor).
        attention_factor: an explicit factor on cos and sin (default ``sqrt(1 + ln s / ln L0)``).
        select: "by_length", "short" or "long".
    """

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
        _validate_longrope(**self.params())

    @property
    def dynamic(self) -> bool:
        return self.select == "by_length"

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        return longrope_scaling(
            rotary_dim, base, short_factor=self.short_factor, long_factor=self.long_factor,
            original_max_len=self.original_max_len, factor=self.factor, attention_factor=self.attention_factor,
            select=self.select, seq_len=seq_len,
        )


# --- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeScalingEntry:
    """One row of :data:`ROPE_SCALING_ENTRIES`: a scaling's function and config, and the names it
    answers to.

    ``compute``: the pure function (``(rotary_dim, base, *, <parameters>[, seq_len])`` ->
    ``(inv_freq, attention_factor)``); ``config``: the frozen dataclass of its parameters;
    ``encoding``: the name of its registered encoding (``posenc.build``); ``aliases``: other names
    users know it by; ``hf_types``: Hugging Face ``rope_type`` values. ``width_defaults(r,
    params)``: the parameters with those that depend on the rotary width filled in when None
    (LongRoPE's factor lists), for the callers that know the width (:func:`posenc.seq.make_scaling`).
    """

    name: str
    compute: Callable[..., Frequencies]
    config: type[RopeScaling]
    encoding: str
    summary: str
    paper: str
    aliases: tuple[str, ...] = ()
    hf_types: tuple[str, ...] = ()
    width_defaults: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The config's fields: the function's keyword parameters (``seq_len`` aside), in order."""
        return tuple(f.name for f in dataclasses.fields(self.config))

    @property
    def required(self) -> tuple[str, ...]:
        """The parameters without a default."""
        return tuple(f.name for f in dataclasses.fields(self.config) if f.default is dataclasses.MISSING)

    @property
    def needs_original_length(self) -> bool:
        """The formula needs the length the model was trained at."""
        return "original_max_len" in self.parameter_names

    @property
    def options(self) -> tuple[str, ...]:
        """The parameters besides ``factor`` and ``original_max_len``."""
        return tuple(n for n in self.parameter_names if n not in ("factor", "original_max_len"))

    def with_defaults(self, rotary_dim: int, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the width-dependent defaults filled in (parameters left None)."""
        params = dict(params)
        return self.width_defaults(rotary_dim, params) if self.width_defaults is not None else params


def _longrope_width_defaults(rotary_dim: int, params: dict[str, Any]) -> dict[str, Any]:
    params["short_factor"], params["long_factor"] = longrope_default_factors(
        rotary_dim, params.get("factor", 4.0), params.get("short_factor"), params.get("long_factor"))
    return params


#: Every RoPE scaling, by name, in a fixed order: the one table the rest of posenc reads.
ROPE_SCALING_ENTRIES: dict[str, RopeScalingEntry] = {
    "linear": RopeScalingEntry(
        "linear", linear_scaling, LinearScaling, encoding="rope_linear", aliases=("pi",), hf_types=("linear",),
        summary="RoPE with positions interpolated: theta / factor",
        paper="Chen et al. 2023, Extending Context Window via Positional Interpolation, "
              "https://arxiv.org/abs/2306.15595",
    ),
    "ntk": RopeScalingEntry(
        "ntk", ntk_scaling, NTKScaling, encoding="rope_ntk",
        summary="RoPE with the NTK-aware base: base * factor^(r/(r-2))",
        paper="bloc97 2023, NTK-Aware Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/",
    ),
    "dynamic_ntk": RopeScalingEntry(
        "dynamic_ntk", dynamic_ntk_scaling, DynamicNTKScaling, encoding="rope_dynamic_ntk", aliases=("dynamic",),
        hf_types=("dynamic",),
        summary="RoPE with an NTK-aware base grown from the current length beyond original_max_len",
        paper="emozilla 2023, Dynamically Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/",
    ),
    "yarn": RopeScalingEntry(
        "yarn", yarn_scaling, YaRNScaling, encoding="rope_yarn", hf_types=("yarn",),
        summary="RoPE with YaRN's ramp between interpolated and original frequencies, and 0.1 ln(s) + 1 attention "
                "factor",
        paper="Peng et al. 2023, YaRN, https://arxiv.org/abs/2309.00071",
    ),
    "llama3": RopeScalingEntry(
        "llama3", llama3_scaling, Llama3Scaling, encoding="rope_llama3", hf_types=("llama3",),
        summary="RoPE with Llama 3.1's wavelength-banded frequency scaling",
        paper="Llama Team 2024, The Llama 3 Herd of Models, https://arxiv.org/abs/2407.21783",
    ),
    "longrope": RopeScalingEntry(
        "longrope", longrope_scaling, LongRoPEScaling, encoding="rope_longrope", hf_types=("longrope", "su"),
        width_defaults=_longrope_width_defaults,
        summary="RoPE with per-pair short/long rescale factors, switched beyond original_max_len",
        paper="Ding et al. 2024, LongRoPE, https://arxiv.org/abs/2402.13753",
    ),
}



class _Functions(Mapping):
    """``{name: entry.compute}``, read live from :data:`ROPE_SCALING_ENTRIES` (read-only)."""

    def __getitem__(self, name: str) -> Callable[..., Frequencies]:
        return ROPE_SCALING_ENTRIES[name].compute

    def __iter__(self) -> Iterator[str]:
        return iter(ROPE_SCALING_ENTRIES)

    def __len__(self) -> int:
        return len(ROPE_SCALING_ENTRIES)

    def __repr__(self) -> str:
        return f"ROPE_SCALINGS({', '.join(ROPE_SCALING_ENTRIES)})"


#: Each scaling's function, by name (the shape of Hugging Face's ``ROPE_INIT_FUNCTIONS``): a
#: read-only view of :data:`ROPE_SCALING_ENTRIES`, so a row added there is here too.
ROPE_SCALINGS: Mapping[str, Callable[..., Frequencies]] = _Functions()


def rope_scaling_entries() -> list[RopeScalingEntry]:
    """Every scaling's entry, in the table's order."""
    return list(ROPE_SCALING_ENTRIES.values())


def rope_scaling_entry(name: str) -> RopeScalingEntry:
    """The entry of ``name`` or of the scaling it is an alias of; else a ValueError listing the names."""
    if isinstance(name, str):
        if name in ROPE_SCALING_ENTRIES:
            return ROPE_SCALING_ENTRIES[name]
        for entry in ROPE_SCALING_ENTRIES.values():
            if name in entry.aliases:
                return entry
    entries = ROPE_SCALING_ENTRIES.values()
    known = ", ".join(ROPE_SCALING_ENTRIES) + " (aliases: " + ", ".join(
        f"{a}={e.name}" for e in entries for a in e.aliases) + ")"
    raise ValueError(f"unknown RoPE scaling {name!r}; registered: {known}")


def rope_scaling_config(method: str, **params: Any) -> RopeScaling:
    """The typed config of scaling ``method`` (a name or alias) with ``params``, checked; an unknown
    parameter is a ValueError naming the ones it takes."""
    entry = rope_scaling_entry(method)
    taken = entry.parameter_names
    unknown = sorted(set(params) - set(taken))
    if unknown:
        raise ValueError(f"{entry.name}: unknown parameter(s) {', '.join(unknown)}; it takes {', '.join(taken)}")
    missing = [name for name in entry.required if name not in params]
    if missing:
        raise ValueError(f"{entry.name}: missing parameter(s) {', '.join(missing)}")
    return entry.config(**params)


def rope_scaling_from_dict(data: Mapping[str, Any]) -> RopeScaling:
    """Inverse of :meth:`RopeScaling.to_dict`: ``{"method": name, **params}``."""
    if not isinstance(data, Mapping) or "method" not in data:
        raise ValueError(f"a RoPE scaling dict needs a 'method' key; got {data!r}")
    params = dict(data)
    return rope_scaling_config(params.pop("method"), **params)


# --- removed in the next release ----------------------------------------------------------------


def register_rope_scaling(name: str, **_: Any) -> Callable[[Callable[..., Frequencies]], Callable[..., Frequencies]]:
    """Deprecated and inert: scalings are written code now. A new one is its function, a frozen
    :class:`RopeScaling` dataclass and a row of :data:`ROPE_SCALING_ENTRIES` (see the module
    docstring); the classes this decorator used to generate are not made any more, so using the
    decorator is an error that says so."""
    how = "write the scaling's function, its RopeScaling dataclass and a ROPE_SCALING_ENTRIES row instead"
    warnings.warn(f"register_rope_scaling is deprecated: {how}", DeprecationWarning, stacklevel=2)
    raise NotImplementedError(f"register_rope_scaling({name!r}): RoPE scalings are no longer generated; {how} "
                              "(posenc.seq.rope_scaling's docstring)")


def on_rope_scaling_registered(listener: Callable[[RopeScalingEntry], None]) -> None:
    """Deprecated: calls ``listener(entry)`` once for every row of :data:`ROPE_SCALING_ENTRIES`
    (the table is fixed, so there is no later registration to hear of)."""
    warnings.warn("on_rope_scaling_registered is deprecated: read ROPE_SCALING_ENTRIES", DeprecationWarning,
                  stacklevel=2)
    for entry in rope_scaling_entries():
        listener(entry)
