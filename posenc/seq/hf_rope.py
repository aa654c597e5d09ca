"""Hugging Face rope configs, read as transformers 5.24 reads them.

:func:`rope_from_hf_config` builds the :class:`~.rope.RotaryEncoding` a Hugging Face model config
describes (a ``config.json`` dict, or a transformers config object). It follows transformers' own
code, field by field, zero and missing values included: ``RotaryEmbeddingConfigMixin``
(``convert_rope_params_to_dict``, ``standardize_rope_params``) for where each field comes from,
and ``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` for what each ``rope_type`` computes from it.

Both schemas:

* transformers 4: ``rope_scaling`` (``rope_type``, or the older ``type``) beside a top-level
  ``rope_theta`` and ``partial_rotary_factor``;
* transformers 5: ``rope_parameters`` holding ``rope_theta`` and the rest, either flat or nested by
  layer type (``{"full_attention": {...}, "sliding_attention": {...}}``, the keys named by the
  config's ``layer_types``): pass ``layer_type=`` to read one.

Where a field comes from, as transformers standardizes it: a non-empty ``rope_scaling`` wins over
``rope_parameters``; ``rope_theta`` and ``partial_rotary_factor`` from the rope dict, else the top
level, else 10000 and 1; ``original_max_position_embeddings`` (llama3, yarn, longrope) from the
top level of a flat config when it states one (Phi-3 keeps it there), else the rope dict, else
``max_position_embeddings`` (a nested dict ignores the top level). A dict is read as the generic
mixin reads it: a config class's own defaults (its ``default_theta``, Phi-3's top-level 4096)
apply when the config object is passed.

What each type reads is its entry of :data:`HF_ROPE_TYPES` (``rope_type`` -> builder); the rules
that differ from "use the stated value":

* ``yarn``: ``factor`` null (or absent) is ``max_position_embeddings / L0``; ``beta_fast`` and
  ``beta_slow`` of 0 or null are 32 and 1 (``or``); ``mscale`` / ``mscale_all_dim`` count only when
  both are nonzero; ``truncate`` is read from the top rope dict (for a nested config, the outer
  one, as transformers does), its truth value taken.
* ``longrope``: a stated ``factor`` is used for the attention factor, the ratio
  ``max_position_embeddings / L0`` only when it is null or absent; a factor <= 1 gives attention
  factor 1.
* ``dynamic``: ``L0`` is ``max_position_embeddings`` (transformers ignores a stated original
  length; ``dynamic_length_from`` picks it instead).
* ``proportional`` (Gemma 4's full-attention layers): the whole head, ``partial_rotary_factor``
  choosing the pairs that turn (:class:`~.rope_scaling.ProportionalScaling`); ``factor`` absent is 1.
* M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: ``rope_type`` ``default``, or transformers 4's ``mrope``):
  an :class:`~.mrope.MRoPE` with ``mrope_section``, interleaved when ``mrope_interleaved`` says so;
  a Qwen-VL text config without them (``model_type`` ``qwen2_vl*``, ``qwen2_5_vl*``, ``qwen3_vl*``)
  gets the model's own fallback, (16, 24, 24) in sections or Qwen3-VL's (24, 20, 20) interleaved.
  Per-layer readings (Gemma's layer types, Llama 4's and SmolLM3's NoPE layers) are
  :mod:`.hf_layers`'.
* the rotary width is ``int(head_dim * partial_rotary_factor)``; an odd width ``w`` rotates ``w + 1``
  features with frequencies ``base^(-2k/w)`` as transformers does (expressed here as base
  ``base^((w+1)/w)`` over ``w + 1``; default, linear, llama3), refused for dynamic, yarn and
  longrope, whose formulas or factor lists transformers cannot apply to it either.

Refused, in one line naming the field: a value transformers' formula cannot use (a zero, negative
or null factor, length or ``rope_theta``; a zero attention factor; a string ``rope_scaling``), a
field a type needs and the config lacks, and what posenc's scalings do not take (a factor below 1,
where transformers only warns). A new ``rope_type`` is one entry of :data:`HF_ROPE_TYPES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..common.checks import check_choice, is_real
from ..common.encoding import PositionEncoding
from .mrope import QWEN2_VL_SECTIONS, QWEN3_VL_SECTIONS, MRoPE
from .rope import RotaryEncoding
from .rope_scaling import ProportionalScaling, RopeScaling, rope_scaling_config

#: Where :func:`rope_from_hf_config` reads a ``dynamic`` config's original length ``L0`` from.
DYNAMIC_LENGTH_SOURCES = ("max_position_embeddings", "original_max_position_embeddings")
DEFAULT_THETA = 10000.0  # transformers' default_theta for the models without their own


def _field(config: Mapping[str, Any] | Any, key: str) -> Any:
    """A top-level field of a config dict or object (None when absent)."""
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _positive_length(name: str, value: Any) -> int:
    """A length field as a positive int (an integral float, as JSON may hold it, is taken)."""
    if isinstance(value, bool) or not is_real(value) or not math.isfinite(value) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return int(value)


@dataclass(frozen=True)
class HFRopeFields:
    """One rope config (one layer type's) as transformers standardizes it: what a builder of
    :data:`HF_ROPE_TYPES` reads.

    ``rope``: this layer type's rope dict; ``outer``: the whole rope dict (the same for a flat
    config); ``config``: the config as given, for fields outside the rope dict."""

    config: Any
    rope: Mapping[str, Any]
    outer: Mapping[str, Any]
    nested: bool
    rope_type: str
    head_dim: int
    pairing: str
    dynamic_length_from: str

    def get(self, key: str) -> Any:
        """A field of the rope dict (None when absent or null)."""
        return self.rope.get(key)

    def required(self, key: str) -> Any:
        """A field the type cannot do without (transformers reads it as ``dict[key]``)."""
        value = self.rope.get(key)
        if value is None:
            raise ValueError(f"{key} is required by this rope type; got {'null' if key in self.rope else 'none'}")
        return value

    def factor(self) -> float:
        """A stated ``factor``: a number (posenc's scalings take it >= 1, checked by them)."""
        value = self.required("factor")
        if isinstance(value, bool) or not is_real(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"factor must be a positive number; got {value!r}")
        return float(value)

    @property
    def base(self) -> float:
        theta = self.rope.get("rope_theta")
        if theta is None:
            theta = _field(self.config, "rope_theta")
        return DEFAULT_THETA if theta is None else theta

    def max_position_embeddings(self) -> int:
        return _positive_length("max_position_embeddings", _field(self.config, "max_position_embeddings"))

    def original_length(self) -> int:
        """``L0`` as transformers standardizes it for llama3, yarn and longrope."""
        top = None if self.nested else _field(self.config, "original_max_position_embeddings")
        value = top if top is not None else self.rope.get("original_max_position_embeddings")
        if value is None:
            return self.max_position_embeddings()
        return _positive_length("original_max_position_embeddings", value)

    def stated_original_length(self) -> int | None:
        """The original length a config states (rope dict first, then top level), or None."""
        value = self.rope.get("original_max_position_embeddings") or _field(self.config,
                                                                             "original_max_position_embeddings")
        return None if value is None else _positive_length("original_max_position_embeddings", value)

    def width(self, *, odd: bool = True) -> tuple[int, float]:
        """``(rotary_dim, base)`` for :class:`RotaryEncoding`: ``int(head_dim * partial)``; an odd
        width ``w`` as ``w + 1`` features over base ``base^((w+1)/w)`` (transformers rotates ``w + 1``
        features at ``base^(-2k/w)``), refused when ``odd`` is False."""
        partial = self.rope.get("partial_rotary_factor")
        if partial is None:
            partial = _field(self.config, "partial_rotary_factor")
        partial = 1.0 if partial is None else partial
        if isinstance(partial, bool) or not is_real(partial) or not 0 < partial <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1]; got {partial!r}")
        base = self.base
        if isinstance(base, bool) or not is_real(base) or not math.isfinite(base) or base <= 1:
            raise ValueError(f"rope_theta must be a finite number > 1; got {base!r}")
        width = int(self.head_dim * partial)
        if width < 1:
            raise ValueError(f"partial_rotary_factor={partial!r} of head_dim {self.head_dim} rotates no feature")
        if width % 2 == 0:
            return width, float(base)
        if not odd:
            raise ValueError(f"an odd rotary width ({self.head_dim} x {partial!r} = {width}) is not taken by "
                             f"{self.rope_type}, whose formula reads the width (transformers' own fails or differs)")
        if width + 1 > self.head_dim:
            raise ValueError(f"head_dim {self.head_dim} is odd and fully rotated; transformers refuses it too")
        return width + 1, float(base) ** ((width + 1) / width)

    def encoding(self, scaling: RopeScaling | None = None, *, odd: bool = True) -> RotaryEncoding:
        rotary_dim, base = self.width(odd=odd)
        return RotaryEncoding(self.head_dim, base=base, rotary_dim=rotary_dim, pairing=self.pairing, scaling=scaling)


# --- one builder per rope type --------------------------------------------------------------------


def _default(f: HFRopeFields) -> PositionEncoding:
    if f.get("mrope_section") is not None or _qwen_vl(f) is not None:
        return _mrope(f)  # Qwen2-VL's configs say "default" (transformers renames their "mrope")
    return f.encoding()


def _qwen_vl(f: HFRopeFields) -> str | None:
    """"qwen2" or "qwen3" for a Qwen-VL text config (whose rotary falls back to its own sections)."""
    model_type = str(_field(f.config, "model_type") or "")
    for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        if model_type.startswith(family):
            return "qwen3" if family == "qwen3_vl" else "qwen2"
    return None


def _mrope(f: HFRopeFields) -> PositionEncoding:
    """M-RoPE (Qwen2-VL, Qwen2.5-VL: sections; Qwen3-VL: interleaved): ``mrope_section``, else the
    model's own default (Qwen2-VL's (16, 24, 24), Qwen3-VL's (24, 20, 20), as their rotary falls back)."""
    family = _qwen_vl(f)
    interleaved = f.get("mrope_interleaved")
    interleaved = family == "qwen3" if interleaved is None else bool(interleaved)
    sections = f.get("mrope_section")
    if sections is None:
        sections = QWEN3_VL_SECTIONS if interleaved else QWEN2_VL_SECTIONS
    rotary_dim, base = f.width(odd=False)
    return MRoPE(f.head_dim, sections=tuple(sections), layout="interleaved" if interleaved else "sections",
                 base=base, rotary_dim=rotary_dim, pairing=f.pairing)


def _proportional(f: HFRopeFields) -> PositionEncoding:
    """Proportional RoPE (Gemma 4's full-attention layers): over the whole head, whatever
    ``partial_rotary_factor`` says (it picks the pairs that turn); ``factor`` absent is 1."""
    partial = f.get("partial_rotary_factor")
    if partial is None:
        partial = _field(f.config, "partial_rotary_factor")
    factor = 1.0 if "factor" not in f.rope else f.factor()
    scaling = ProportionalScaling(factor=factor, partial_rotary_factor=1.0 if partial is None else partial)
    return RotaryEncoding(f.head_dim, base=float(f.base), pairing=f.pairing, scaling=scaling)


def _linear(f: HFRopeFields) -> PositionEncoding:
    return f.encoding(rope_scaling_config("linear", factor=f.factor()))


def _dynamic(f: HFRopeFields) -> PositionEncoding:
    factor = f.factor()
    if f.dynamic_length_from == "max_position_embeddings":
        original = f.max_position_embeddings()  # transformers: the stated original length is ignored
    else:
        original = f.stated_original_length() or f.max_position_embeddings()
    return f.encoding(rope_scaling_config("dynamic_ntk", factor=factor, original_max_len=original), odd=False)


def _nonzero(value: Any) -> Any:
    """transformers tests these fields by truth value: 0 reads as absent."""
    return value if value else None


def _yarn(f: HFRopeFields) -> PositionEncoding:
    original = f.original_length()
    factor = f.factor() if f.get("factor") is not None else f.max_position_embeddings() / original
    truncate = (f.outer if f.nested else f.rope).get("truncate", True)  # transformers reads the outer dict
    scaling = rope_scaling_config(
        "yarn", factor=factor, original_max_len=original, beta_fast=f.get("beta_fast") or 32.0,
        beta_slow=f.get("beta_slow") or 1.0, attention_factor=f.get("attention_factor"),
        mscale=_nonzero(f.get("mscale")), mscale_all_dim=_nonzero(f.get("mscale_all_dim")), truncate=bool(truncate))
    return f.encoding(scaling, odd=False)


def _longrope(f: HFRopeFields) -> PositionEncoding:
    short, long = f.required("short_factor"), f.required("long_factor")
    original = f.original_length()
    factor = f.get("factor")
    if factor is None:
        factor = f.max_position_embeddings() / original
    elif isinstance(factor, bool) or not is_real(factor) or not math.isfinite(factor):
        raise ValueError(f"factor must be a number; got {factor!r}")
    factor = max(float(factor), 1.0)  # it only sets the attention factor: 1 for a factor <= 1, zero included
    attention_factor = f.get("attention_factor")
    if attention_factor is None and factor > 1 and original == 1:
        raise ValueError("original_max_position_embeddings 1 leaves the attention factor undefined (log 1 = 0)")
    scaling = rope_scaling_config("longrope", short_factor=short, long_factor=long, original_max_len=original,
                                  factor=factor, attention_factor=attention_factor)
    return f.encoding(scaling, odd=False)  # transformers' factor lists cannot match an odd width either


def _llama3(f: HFRopeFields) -> PositionEncoding:
    scaling = rope_scaling_config(
        "llama3", factor=f.factor(), low_freq_factor=f.required("low_freq_factor"),
        high_freq_factor=f.required("high_freq_factor"), original_max_len=f.original_length())
    return f.encoding(scaling)


#: Every Hugging Face ``rope_type`` read, with its builder ``(HFRopeFields) -> encoding``: a new type
#: is one entry. ``su`` is older transformers' name for ``longrope``.
HF_ROPE_TYPES: dict[str, Callable[[HFRopeFields], PositionEncoding]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "su": _longrope,
    "llama3": _llama3,
    "proportional": _proportional,
    "mrope": _mrope,  # transformers 4's name in Qwen2-VL configs
}


# --- the reader ---------------------------------------------------------------------------------


def _rope_dict(config: Mapping[str, Any] | Any) -> dict[str, Any]:
    """The rope dict: a non-empty ``rope_scaling`` (transformers 4), else ``rope_parameters``."""
    found: dict[str, Any] = {}
    for key in ("rope_parameters", "rope_scaling"):  # the later wins when non-empty
        value = _field(config, key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise TypeError(f"{key} must be a dict of rope fields (rope_type, rope_theta, factor, ...) or null; got "
                            f"{value!r} ({type(value).__name__})")
        if value or not found:
            found = dict(value)
    return found


def _nested_keys(config: Mapping[str, Any] | Any, rope: Mapping[str, Any]) -> list[str]:
    """The layer types a nested rope dict is keyed by (empty for a flat one): those the config names
    (``layer_types``) as transformers reads them, else, for a dict without them, keys holding dicts."""
    labels = _field(config, "_rope_type_labels") or _field(config, "layer_types") or ()
    keys = [key for key in rope if key in labels]
    if not keys and any(isinstance(v, Mapping) for v in rope.values()):
        keys = [key for key, v in rope.items() if isinstance(v, Mapping) or v is None]
    return keys


def _head_dim(config: Mapping[str, Any] | Any) -> int:
    head_dim = _field(config, "head_dim")
    if head_dim is None:
        hidden, heads = _field(config, "hidden_size"), _field(config, "num_attention_heads")
        if hidden is None or heads is None:
            raise ValueError("the config gives neither head_dim nor hidden_size and num_attention_heads")
        if not heads:
            raise ValueError(f"num_attention_heads must be a positive int; got {heads!r}")
        head_dim = hidden // heads
    return _positive_length("head_dim", head_dim)


def hf_rope_fields(config: Mapping[str, Any] | Any, *, head_dim: int | None = None, pairing: str = "half_split",
                   dynamic_length_from: str = "max_position_embeddings",
                   layer_type: str | None = None) -> HFRopeFields:
    """The standardized rope fields of ``config`` (of ``layer_type`` for a nested rope dict)."""
    check_choice("dynamic_length_from", dynamic_length_from, DYNAMIC_LENGTH_SOURCES)
    if layer_type is not None and not isinstance(layer_type, str):
        raise TypeError(f"layer_type must be a layer type name (str) or None; got {layer_type!r}")
    outer = _rope_dict(config)
    keys = _nested_keys(config, outer)
    rope: Mapping[str, Any] = outer
    if keys:
        if layer_type is None:
            raise ValueError(f"rope_parameters holds one dict per layer type ({', '.join(keys)}): pass layer_type=")
        if layer_type not in keys:
            raise ValueError(f"layer_type must be one of {', '.join(keys)}; got {layer_type!r}")
        rope = outer[layer_type]
        if rope is None:
            raise ValueError(f"layer type {layer_type!r} has no rope (null in rope_parameters)")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in HF_ROPE_TYPES:
        raise ValueError(f"rope type {kind!r} has no posenc mapping; known: {', '.join(HF_ROPE_TYPES)}")
    head_dim = _head_dim(config) if head_dim is None else _positive_length("head_dim", head_dim)
    return HFRopeFields(config=config, rope=dict(rope), outer=outer, nested=bool(keys), rope_type=kind,
                        head_dim=head_dim, pairing=pairing, dynamic_length_from=dynamic_length_from)


def rope_from_hf_config(config: Mapping[str, Any] | Any, *, head_dim: int | None = None,
                        pairing: str = "half_split", dynamic_length_from: str = "max_position_embeddings",
                        layer_type: str | None = None) -> PositionEncoding:
    """The rotary encoding a Hugging Face model config describes (a dict, or a config object with the
    same attributes), read as transformers 5.24 reads it (see the module docstring).

    Args:
        head_dim: overrides the config's (``head_dim``, else ``hidden_size // num_attention_heads``).
        pairing: Hugging Face's ``"half_split"`` by default.
        dynamic_length_from: the length ``L0`` a ``rope_type: dynamic`` config grows its base from,
            one of :data:`DYNAMIC_LENGTH_SOURCES`. ``"max_position_embeddings"`` (default) is what
            transformers computes (it ignores ``original_max_position_embeddings``);
            ``"original_max_position_embeddings"`` takes the stated original length when the config
            gives one (the length the model was trained at, which the formula means by ``L0``).
        layer_type: for a ``rope_parameters`` nested by layer type, the one to read (a flat config
            serves every layer type).

    A config posenc cannot follow is a ValueError (TypeError for a wrong type) of one line that
    names the rope type and the field.
    """
    fields = hf_rope_fields(config, head_dim=head_dim, pairing=pairing, dynamic_length_from=dynamic_length_from,
                            layer_type=layer_type)
    try:
        return HF_ROPE_TYPES[fields.rope_type](fields)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"Hugging Face rope config (rope_type {fields.rope_type!r}): {exc}") from None
