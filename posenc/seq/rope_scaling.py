"""Context extensions of RoPE: one registry entry per scaling -- a pure function and its checks.

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

One entry per scaling. :func:`register_rope_scaling` decorates the function that computes the
frequencies and names its dimension-free checks (the style of Hugging Face's rope utilities: a
``compute`` and a ``validate`` per rope type). Everything else is made from that entry:

* the typed config (:class:`LinearScaling`, ..., :class:`LongRoPEScaling`): a frozen dataclass
  whose fields are the function's keyword parameters, checked on construction;
* the registered encoding (``rope_linear``, ...; :mod:`.rope` builds those classes);
* the names, aliases and options that :func:`posenc.seq.extend_context`, the ``posenc extend``
  command line and :func:`posenc.seq.rope_from_hf_config` accept.

A new scaling is one decorated function (and its checks); :data:`ROPE_SCALINGS` maps each name to
its function, :func:`rope_scaling_entry` to the whole entry. Every parameter is checked; a bad
one is a ``ValueError`` naming it, its value and the valid range.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Sequence

import torch
from torch import Tensor

from ..common.checks import check_bool, check_int, check_number

SeqLen = float | Tensor | None
Frequencies = tuple[Tensor, float]


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


def _is_real(value: Any) -> bool:
    """A real number, NumPy's included (a list read from a checkpoint or an array), never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _factor_list(name: str, values: Sequence[float]) -> Tensor:
    """``values`` (a list or tuple of numbers, or a 1-D tensor or array) as a float64 vector of
    finite positive numbers. Anything else (a bare number, ``True``, a string, bool items) is a
    TypeError naming ``name``; an empty list or a value that is not finite and positive a ValueError."""
    items = values.tolist() if not isinstance(values, (list, tuple)) and hasattr(values, "tolist") else values
    if not isinstance(items, (list, tuple)) or not all(_is_real(v) for v in items):
        raise TypeError(f"{name} must be a sequence of numbers; got {values!r} ({type(values).__name__})")
    t = torch.tensor([float(v) for v in items], dtype=torch.float64)
    if t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty flat sequence of numbers, got {values!r}")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise ValueError(f"{name} must be finite and positive; got {values!r}")
    return t


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
    _check_number("seq_len", seq_len, minimum=0.0, strict=True)


# --- the registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeScaling:
    """A scaling and its parameters: the base of every typed config (:class:`LinearScaling`, ...).

    The subclasses are made by :func:`register_rope_scaling` from the scaling's function: one
    field per keyword parameter, checked by the entry's ``validate`` on construction (sequences
    are stored as tuples). ``dynamic``: the frequencies depend on the current length.
    """

    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, f.name, tuple(float(v) if _is_number(v) else v for v in value))
        self.entry.validate(**self.params())

    @property
    def entry(self) -> RopeScalingEntry:
        return rope_scaling_entry(self.name)

    @property
    def dynamic(self) -> bool:
        return self.entry.is_dynamic(self.params())

    def params(self) -> dict[str, Any]:
        """The parameters, as the scaling's function takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def compute(self, rotary_dim: int, base: float, seq_len: SeqLen = None) -> Frequencies:
        """``(inv_freq, attention_factor)`` for this width and base (``seq_len``: the current length,
        read only by the length-dependent scalings)."""
        return self.entry(rotary_dim, base, seq_len=seq_len, **self.params())

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready): ``{"method": name, **params}``; :func:`rope_scaling_from_dict`
        inverts it."""
        return {"method": self.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in self.params().items()}}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class RopeScalingEntry:
    """One registered scaling: its function, its checks and what is made from them.

    ``compute(rotary_dim, base, *, <parameters>[, seq_len])`` -> ``(inv_freq, attention_factor)``;
    ``validate(**parameters)``: the checks that need no rotary width (the config runs them on
    construction; ``compute`` runs them too). ``parameters``: ``compute``'s keyword parameters
    (``seq_len`` aside), which are the config's fields. ``dynamic``: whether the frequencies
    depend on the current length (a bool, or a function of the parameters). ``fill_defaults(r,
    params)``: defaults that depend on the rotary width (LongRoPE's factor lists).
    """

    name: str
    compute: Callable[..., Frequencies]
    validate: Callable[..., None]
    parameters: tuple[inspect.Parameter, ...]
    config_name: str
    encoding_name: str
    encoding_class_name: str
    paper: str
    summary: str
    aliases: tuple[str, ...] = ()
    hf_types: tuple[str, ...] = ()
    dynamic: bool | Callable[[Mapping[str, Any]], bool] = False
    fill_defaults: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None
    config: type[RopeScaling] = dataclasses.field(default=RopeScaling, compare=False)

    @property
    def takes_length(self) -> bool:
        return "seq_len" in inspect.signature(self.compute).parameters

    @property
    def needs_original_length(self) -> bool:
        """The formula needs the length the model was trained at."""
        return any(p.name == "original_max_len" for p in self.parameters)

    @property
    def options(self) -> tuple[str, ...]:
        """The parameters besides ``factor`` and ``original_max_len``."""
        return tuple(p.name for p in self.parameters if p.name not in ("factor", "original_max_len"))

    def is_dynamic(self, params: Mapping[str, Any]) -> bool:
        return self.dynamic(params) if callable(self.dynamic) else bool(self.dynamic)

    def with_defaults(self, rotary_dim: int, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the width-dependent defaults filled in (parameters left None)."""
        params = dict(params)
        return self.fill_defaults(rotary_dim, params) if self.fill_defaults is not None else params

    def __call__(self, rotary_dim: int, base: float, *, seq_len: SeqLen = None, **params: Any) -> Frequencies:
        if self.takes_length:
            return self.compute(rotary_dim, base, seq_len=seq_len, **params)
        return self.compute(rotary_dim, base, **params)


_ENTRIES: dict[str, RopeScalingEntry] = {}
_LISTENERS: list[Callable[[RopeScalingEntry], None]] = []


def register_rope_scaling(
    name: str,
    *,
    validate: Callable[..., None],
    config_name: str,
    encoding_name: str,
    encoding_class_name: str,
    paper: str,
    summary: str,
    aliases: Sequence[str] = (),
    hf_types: Sequence[str] = (),
    dynamic: bool | Callable[[Mapping[str, Any]], bool] = False,
    fill_defaults: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None,
) -> Callable[[Callable[..., Frequencies]], Callable[..., Frequencies]]:
    """Decorator registering ``compute(rotary_dim, base, *, <keyword parameters>[, seq_len])`` as the
    scaling ``name``; the function is returned unchanged. Its config class (``config_name``) is
    made from the keyword parameters (those without a default first) and the encoding
    (``encoding_name``, class ``encoding_class_name``) by :mod:`.rope` (see the module docstring).
    ``aliases``: other names users know it by; ``hf_types``: Hugging Face ``rope_type`` values."""

    def deco(compute: Callable[..., Frequencies]) -> Callable[..., Frequencies]:
        if name in _ENTRIES:
            raise ValueError(f"RoPE scaling {name!r} is already registered")
        sig = inspect.signature(compute)
        positional = [p.name for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        if positional != ["rotary_dim", "base"]:
            raise TypeError(f"{compute.__name__} must take (rotary_dim, base, *, parameters...); got {sig}")
        params = tuple(p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY and p.name != "seq_len")
        entry = RopeScalingEntry(
            name=name, compute=compute, validate=validate, parameters=params, config_name=config_name,
            encoding_name=encoding_name, encoding_class_name=encoding_class_name, paper=paper, summary=summary,
            aliases=tuple(aliases), hf_types=tuple(hf_types), dynamic=dynamic, fill_defaults=fill_defaults,
        )
        object.__setattr__(entry, "config", _make_config(entry))
        _ENTRIES[name] = entry
        for listener in list(_LISTENERS):
            listener(entry)
        return compute

    return deco


def _make_config(entry: RopeScalingEntry) -> type[RopeScaling]:
    fields: list[Any] = []
    for p in entry.parameters:
        if p.default is inspect.Parameter.empty:
            fields.append((p.name, p.annotation))
        else:
            fields.append((p.name, p.annotation, dataclasses.field(default=p.default)))
    doc = (f"{entry.summary}. The typed config of the {entry.name!r} scaling: one field per keyword parameter "
           f"of :func:`{entry.compute.__name__}`, checked on construction.")
    cls = dataclasses.make_dataclass(
        entry.config_name, fields, bases=(RopeScaling,), frozen=True,
        namespace={"name": entry.name, "__doc__": doc, "__module__": __name__},
    )
    cls.__qualname__ = entry.config_name
    return cls


def on_rope_scaling_registered(listener: Callable[[RopeScalingEntry], None]) -> None:
    """Call ``listener(entry)`` for every scaling registered so far and every one registered later
    (:mod:`.rope` makes each scaling's encoding class this way)."""
    _LISTENERS.append(listener)
    for entry in list(_ENTRIES.values()):
        listener(entry)


def rope_scaling_entries() -> list[RopeScalingEntry]:
    """Every registered scaling, in registration order."""
    return list(_ENTRIES.values())


def rope_scaling_entry(name: str) -> RopeScalingEntry:
    """The entry registered as ``name`` or under an alias of it; else a ValueError listing the names."""
    if isinstance(name, str):
        if name in _ENTRIES:
            return _ENTRIES[name]
        for entry in _ENTRIES.values():
            if name in entry.aliases:
                return entry
    known = ", ".join(_ENTRIES) + " (aliases: " + ", ".join(
        f"{a}={e.name}" for e in _ENTRIES.values() for a in e.aliases) + ")"
    raise ValueError(f"unknown RoPE scaling {name!r}; registered: {known}")


def rope_scaling_config(method: str, **params: Any) -> RopeScaling:
    """The typed config of scaling ``method`` (a name or alias) with ``params``, checked; an unknown
    parameter is a ValueError naming the ones it takes."""
    entry = rope_scaling_entry(method)
    taken = [p.name for p in entry.parameters]
    unknown = sorted(set(params) - set(taken))
    if unknown:
        raise ValueError(f"{entry.name}: unknown parameter(s) {', '.join(unknown)}; it takes {', '.join(taken)}")
    missing = [p.name for p in entry.parameters if p.default is inspect.Parameter.empty and p.name not in params]
    if missing:
        raise ValueError(f"{entry.name}: missing parameter(s) {', '.join(missing)}")
    return entry.config(**params)


def rope_scaling_from_dict(data: Mapping[str, Any]) -> RopeScaling:
    """Inverse of :meth:`RopeScaling.to_dict`: ``{"method": name, **params}``."""
    if not isinstance(data, Mapping) or "method" not in data:
        raise ValueError(f"a RoPE scaling dict needs a 'method' key; got {data!r}")
    params = dict(data)
    return rope_scaling_config(params.pop("method"), **params)


class _FunctionView(Mapping):
    """Read-only ``{name: compute function}`` over the registry."""

    def __getitem__(self, name: str) -> Callable[..., Frequencies]:
        return _ENTRIES[name].compute

    def __iter__(self) -> Iterator[str]:
        return iter(_ENTRIES)

    def __len__(self) -> int:
        return len(_ENTRIES)

    def __repr__(self) -> str:
        return f"ROPE_SCALINGS({', '.join(_ENTRIES)})"


#: Each registered scaling's function, by name (a live view of the registry).
ROPE_SCALINGS: Mapping[str, Callable[..., Frequencies]] = _FunctionView()


# --- the scalings ----------------------------------------------------------------------------


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """``base^(-2k/r)`` for ``k = 0 .. r/2 - 1`` (float64)."""
    check_rotary_dim(rotary_dim)
    check_base(base)
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return base ** (-k / rotary_dim)


def _validate_factor_only(*, factor: float) -> None:
    _check_factor(factor)


@register_rope_scaling(
    "linear", validate=_validate_factor_only, config_name="LinearScaling", encoding_name="rope_linear",
    encoding_class_name="LinearRoPE", aliases=("pi",), hf_types=("linear",),
    paper="Chen et al. 2023, Extending Context Window via Positional Interpolation, https://arxiv.org/abs/2306.15595",
    summary="RoPE with positions interpolated: theta / factor",
)
def linear_scaling(rotary_dim: int, base: float, *, factor: float = 4.0) -> Frequencies:
    """Position interpolation: ``theta_k / s``."""
    _validate_factor_only(factor=factor)
    return default_inv_freq(rotary_dim, base) / factor, 1.0


def _ntk_exponent_dim(rotary_dim: int, name: str) -> None:
    check_rotary_dim(rotary_dim)
    if rotary_dim < 4:
        raise ValueError(f"{name} scaling needs rotary_dim >= 4 (the exponent r/(r-2)), got {rotary_dim}")


@register_rope_scaling(
    "ntk", validate=_validate_factor_only, config_name="NTKScaling", encoding_name="rope_ntk",
    encoding_class_name="NTKRoPE",
    paper="bloc97 2023, NTK-Aware Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/",
    summary="RoPE with the NTK-aware base: base * factor^(r/(r-2))",
)
def ntk_scaling(rotary_dim: int, base: float, *, factor: float = 4.0) -> Frequencies:
    """NTK-aware base: ``base * s^(r/(r-2))``."""
    _validate_factor_only(factor=factor)
    check_base(base)
    _ntk_exponent_dim(rotary_dim, "ntk")
    return default_inv_freq(rotary_dim, base * factor ** (rotary_dim / (rotary_dim - 2))), 1.0


def _validate_dynamic_ntk(*, original_max_len: int, factor: float) -> None:
    _check_factor(factor)
    _check_original_max_len(original_max_len)


@register_rope_scaling(
    "dynamic_ntk", validate=_validate_dynamic_ntk, config_name="DynamicNTKScaling", encoding_name="rope_dynamic_ntk",
    encoding_class_name="DynamicNTKRoPE", aliases=("dynamic",), hf_types=("dynamic",), dynamic=True,
    paper="emozilla 2023, Dynamically Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/",
    summary="RoPE with an NTK-aware base grown from the current length beyond original_max_len",
)
def dynamic_ntk_scaling(
    rotary_dim: int, base: float, *, original_max_len: int, factor: float = 4.0, seq_len: SeqLen = None
) -> Frequencies:
    """NTK-aware base from the current length ``seq_len`` (a number, or ``[B]`` for one per row).

    ``seq_len <= L0`` (or None) keeps ``base``; beyond it ``base * (s*T/L0 - (s-1))^(r/(r-2))``.
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


def _validate_yarn(
    *, original_max_len: int, factor: float, beta_fast: float, beta_slow: float, attention_factor: float | None,
    mscale: float | None, mscale_all_dim: float | None, truncate: bool,
) -> None:
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
    if not isinstance(truncate, bool):
        raise ValueError(f"truncate must be True or False, got {truncate!r}")


@register_rope_scaling(
    "yarn", validate=_validate_yarn, config_name="YaRNScaling", encoding_name="rope_yarn",
    encoding_class_name="YaRNRoPE", hf_types=("yarn",),
    paper="Peng et al. 2023, YaRN, https://arxiv.org/abs/2309.00071",
    summary="RoPE with YaRN's ramp between interpolated and original frequencies, and 0.1 ln(s) + 1 attention factor",
)
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
    """YaRN: a ramp between interpolated (``theta/s``) and original frequencies, plus an
    attention factor (see the module docstring)."""
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


def _validate_llama3(*, factor: float, low_freq_factor: float, high_freq_factor: float, original_max_len: int) -> None:
    _check_factor(factor)
    _check_original_max_len(original_max_len)
    _check_number("low_freq_factor", low_freq_factor, minimum=0.0, strict=True)
    _check_number("high_freq_factor", high_freq_factor, minimum=0.0, strict=True)
    if low_freq_factor >= high_freq_factor:
        raise ValueError(
            f"low_freq_factor must be smaller than high_freq_factor, got {low_freq_factor} and {high_freq_factor}"
        )


@register_rope_scaling(
    "llama3", validate=_validate_llama3, config_name="Llama3Scaling", encoding_name="rope_llama3",
    encoding_class_name="Llama3RoPE", hf_types=("llama3",),
    paper="Llama Team 2024, The Llama 3 Herd of Models, https://arxiv.org/abs/2407.21783",
    summary="RoPE with Llama 3.1's wavelength-banded frequency scaling",
)
def llama3_scaling(
    rotary_dim: int,
    base: float,
    *,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_len: int = 8192,
) -> Frequencies:
    """Llama 3.1: keep short wavelengths, divide long ones by ``s``, blend in between."""
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
        _check_number("attention_factor", attention_factor, minimum=0.0, strict=True)


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


def _longrope_defaults(rotary_dim: int, params: dict[str, Any]) -> dict[str, Any]:
    """Without searched lists: all ones inside ``L0`` (plain RoPE) and the NTK-aware factors beyond."""
    if params.get("short_factor") is None:
        params["short_factor"] = (1.0,) * max(rotary_dim // 2, 0)
    if params.get("long_factor") is None:
        params["long_factor"] = ntk_long_factors(rotary_dim, params.get("factor", 4.0))
    return params


@register_rope_scaling(
    "longrope", validate=_validate_longrope, config_name="LongRoPEScaling", encoding_name="rope_longrope",
    encoding_class_name="LongRoPE", hf_types=("longrope", "su"), dynamic=lambda p: p["select"] == "by_length",
    fill_defaults=_longrope_defaults,
    paper="Ding et al. 2024, LongRoPE, https://arxiv.org/abs/2402.13753",
    summary="RoPE with per-pair short/long rescale factors, switched beyond original_max_len",
)
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
    """LongRoPE: per-pair factors, short up to ``L0`` and long beyond it. ``select="by_length"``
    picks by ``seq_len`` (None: long, the extended-context regime; a ``[B]`` tensor: one choice
    per row), as Phi-3 in Hugging Face; ``"short"`` or ``"long"`` fixes one list (the
    frequencies are then independent of the length)."""
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


# --- the typed configs, by name (made by the registry) ---------------------------------------

LinearScaling = rope_scaling_entry("linear").config
NTKScaling = rope_scaling_entry("ntk").config
DynamicNTKScaling = rope_scaling_entry("dynamic_ntk").config
YaRNScaling = rope_scaling_entry("yarn").config
Llama3Scaling = rope_scaling_entry("llama3").config
LongRoPEScaling = rope_scaling_entry("longrope").config
