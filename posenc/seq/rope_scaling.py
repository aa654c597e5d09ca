"""Context extensions of RoPE, the table: each scaling's dataclass and function
(:mod:`.rope_scaling_formulas`, whose names this module also exports) joined in one row by name,
the shape of Hugging Face's ``ROPE_INIT_FUNCTIONS``.

:data:`ROPE_SCALING_ENTRIES` maps each name to its :class:`RopeScalingEntry` (dataclass, function,
registered encoding, aliases, Hugging Face ``rope_type`` values); :func:`posenc.seq.extend_context`,
``posenc extend``, :func:`posenc.seq.rope_from_hf_config` and the encodings of :mod:`.rope_scaled`
read it. :data:`ROPE_SCALINGS` is its ``{name: function}`` view. A new scaling is a dataclass, a
function and a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .rope_scaling_formulas import (  # noqa: F401  (re-exported: the formulas are read from here too)
    ROPE_SCALING_ENTRIES,
    DynamicNTKScaling,
    Frequencies,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    NTKScaling,
    ProportionalScaling,
    RopeScaling,
    SeqLen,
    YaRNScaling,
    _longrope_width_defaults,
    check_base,
    check_rotary_dim,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    linear_inv_freq,
    llama3_inv_freq,
    longrope_inv_freq,
    ntk_inv_freq,
    ntk_long_factors,
    proportional_inv_freq,
    yarn_inv_freq,
)

# --- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeScalingEntry:
    """One row of :data:`ROPE_SCALING_ENTRIES`.

    ``config``: the frozen dataclass of the parameters; ``inv_freq``: the pure function
    ``(params, rotary_dim, base, seq_len) -> (inv_freq, attention_factor)``; ``encoding``: the
    name of its registered encoding (``posenc.build``); ``aliases``: other names users know it by;
    ``hf_types``: Hugging Face ``rope_type`` values. ``width_defaults(r, params)``: the parameters
    with those that depend on the rotary width filled in when None (LongRoPE's factor lists), for
    the callers that know the width (:func:`posenc.seq.make_scaling`).
    """

    config: type[RopeScaling]
    inv_freq: Callable[[Any, int, float, SeqLen], Frequencies]
    encoding: str
    summary: str
    paper: str
    aliases: tuple[str, ...] = ()
    hf_types: tuple[str, ...] = ()
    width_defaults: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None

    # read from the dataclass: its name, its fields in order, those without a default, whether the
    # formula reads L0, and the fields besides factor and original_max_len (a method's "options")
    @property
    def name(self) -> str:
        return self.config.name

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.config))

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.config) if f.default is dataclasses.MISSING)

    @property
    def needs_original_length(self) -> bool:
        return "original_max_len" in self.parameter_names

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(n for n in self.parameter_names if n not in ("factor", "original_max_len"))

    def with_defaults(self, rotary_dim: int, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the width-dependent defaults filled in (parameters left None)."""
        params = dict(params)
        return self.width_defaults(rotary_dim, params) if self.width_defaults is not None else params


#: Every RoPE scaling, by name, in a fixed order: the one table the rest of posenc reads (the dict
#: the formulas' module holds, filled here).
ROPE_SCALING_ENTRIES.update({entry.name: entry for entry in (
    RopeScalingEntry(
        LinearScaling, linear_inv_freq, encoding="rope_linear", aliases=("pi",), hf_types=("linear",),
        summary="RoPE with positions interpolated: theta / factor",
        paper="Chen et al. 2023, Extending Context Window via Positional Interpolation, "
              "https://arxiv.org/abs/2306.15595",
    ),
    RopeScalingEntry(
        NTKScaling, ntk_inv_freq, encoding="rope_ntk",
        summary="RoPE with the NTK-aware base: base * factor^(r/(r-2))",
        paper="bloc97 2023, NTK-Aware Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/",
    ),
    RopeScalingEntry(
        DynamicNTKScaling, dynamic_ntk_inv_freq, encoding="rope_dynamic_ntk", aliases=("dynamic",),
        hf_types=("dynamic",),
        summary="RoPE with an NTK-aware base grown from the current length beyond original_max_len",
        paper="emozilla 2023, Dynamically Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/",
    ),
    RopeScalingEntry(
        YaRNScaling, yarn_inv_freq, encoding="rope_yarn", hf_types=("yarn",),
        summary="RoPE with YaRN's ramp between interpolated and original frequencies, and 0.1 ln(s) + 1 attention "
                "factor",
        paper="Peng et al. 2023, YaRN, https://arxiv.org/abs/2309.00071",
    ),
    RopeScalingEntry(
        Llama3Scaling, llama3_inv_freq, encoding="rope_llama3", hf_types=("llama3",),
        summary="RoPE with Llama 3.1's wavelength-banded frequency scaling",
        paper="Llama Team 2024, The Llama 3 Herd of Models, https://arxiv.org/abs/2407.21783",
    ),
    RopeScalingEntry(
        LongRoPEScaling, longrope_inv_freq, encoding="rope_longrope", hf_types=("longrope", "su"),
        width_defaults=_longrope_width_defaults,
        summary="RoPE with per-pair short/long rescale factors, switched beyond original_max_len",
        paper="Ding et al. 2024, LongRoPE, https://arxiv.org/abs/2402.13753",
    ),
    RopeScalingEntry(
        ProportionalScaling, proportional_inv_freq, encoding="rope_proportional", hf_types=("proportional",),
        summary="RoPE with exponents over the whole head and only the fastest partial_rotary_factor of the pairs "
                "turning (Gemma 4)",
        paper="Barbero et al. 2025, Round and Round We Go! What makes Rotary Positional Encodings useful?, "
              "https://arxiv.org/abs/2410.06205",
    ),
)})


class _Functions(Mapping):
    """``{name: entry.inv_freq}``, read live from :data:`ROPE_SCALING_ENTRIES` (read-only)."""

    def __getitem__(self, name: str) -> Callable[..., Frequencies]:
        return ROPE_SCALING_ENTRIES[name].inv_freq

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
    """The dataclass of scaling ``method`` (a name or alias) with ``params``, checked; an unknown
    or missing parameter is a ValueError naming the ones it takes."""
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

