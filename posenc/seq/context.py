"""Extending a trained RoPE model's context after training, and Hugging Face rope configs.

:func:`extend_context` switches every rotary layer of a posenc model (``CausalLM``,
``SequenceEncoder``, any module holding :class:`~.rope.RotaryEncoding` instances) to a context
extension in place, keeping every weight: position interpolation (Chen et al. 2023,
https://arxiv.org/abs/2306.15595), NTK-aware and dynamic NTK scaling (bloc97 2023, emozilla 2023),
YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071), Llama 3.1's banded scaling and LongRoPE
(Ding et al. 2024, https://arxiv.org/abs/2402.13753). ``method="none"`` restores plain RoPE. The
formulas are :mod:`.rope_scaling`'s; :meth:`~.rope.RotaryEncoding.frequencies` reads what a layer
uses at a given length.

:func:`rope_from_hf_config` (from :mod:`.hf_rope`, named here too) builds the encoding a Hugging
Face config describes, read as transformers reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .hf_rope import DYNAMIC_LENGTH_SOURCES, rope_from_hf_config  # noqa: F401  (named here as before)
from .rope import RotaryEncoding
from .rope_scaling import (
    RopeScaling,
    rope_scaling_entries,
    rope_scaling_entry,
    rope_scaling_from_dict,
)

# Everything below is read from the table of scalings (:data:`.rope_scaling.ROPE_SCALING_ENTRIES`):
# a scaling in it is a method here, with its options.
METHODS = ("none", *(entry.name for entry in rope_scaling_entries()))
# Other names users know the methods by.
METHOD_ALIASES = {"default": "none", **{alias: e.name for e in rope_scaling_entries() for alias in e.aliases}}
# The methods whose formula needs the length the model was trained at.
NEEDS_ORIGINAL_LENGTH = tuple(e.name for e in rope_scaling_entries() if e.needs_original_length)
# The options each method takes besides factor and original_max_len.
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {"none": (), **{e.name: e.options for e in rope_scaling_entries()}}


def canonical_method(method: str) -> str:
    """``method`` or its alias resolved to ``"none"`` or a registered scaling; else a ValueError."""
    if method in ("none", "default"):
        return "none"
    try:
        return rope_scaling_entry(method).name
    except ValueError:
        entries = rope_scaling_entries()
        names = ", ".join(["none", *(e.name for e in entries)]) + " (aliases: " + ", ".join(
            ["default=none", *(f"{a}={e.name}" for e in entries for a in e.aliases)]) + ")"
        raise ValueError(f"method must be one of {names}; got {method!r}") from None


def make_scaling(
    method: str, *, rotary_dim: int, factor: float = 1.0, original_max_len: int | None = None, **options: Any
) -> RopeScaling | None:
    """The :class:`~.rope_scaling.RopeScaling` for ``method`` (None for ``"none"``), checked.

    Args:
        rotary_dim: the rotated width (defaults that depend on it, such as LongRoPE's factor
            lists, are filled from it).
        factor: the context scale ``s >= 1``.
        original_max_len: the length the model was trained at; required by the methods that read
            it (:data:`NEEDS_ORIGINAL_LENGTH`), ignored by the others (linear, NTK).
        options: the method's own parameters (:data:`METHOD_OPTIONS`).
    """
    method = canonical_method(method)
    if method == "none":
        if options:
            raise ValueError(f"none: unknown option(s) {', '.join(sorted(options))}; it takes none")
        if factor != 1.0:
            raise ValueError(f"method='none' restores plain RoPE and takes no factor; got factor={factor!r}")
        return None
    entry = rope_scaling_entry(method)
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise ValueError(f"{method}: unknown option(s) {', '.join(unknown)}; it takes {', '.join(entry.options) or 'none'}")
    if entry.needs_original_length and original_max_len is None:
        raise ValueError(f"{method} needs original_max_len: the length the model was trained at")
    params: dict[str, Any] = dict(options)
    taken = entry.parameter_names
    if "factor" in taken:
        params["factor"] = factor
    if "original_max_len" in taken:
        params["original_max_len"] = original_max_len
    for name in entry.required:  # a field without a default that the caller left out: a width default
        params.setdefault(name, None)
    return entry.config(**entry.with_defaults(rotary_dim, params))


def rotary_layers(model: nn.Module) -> list[RotaryEncoding]:
    """The distinct :class:`~.rope.RotaryEncoding` instances inside ``model`` (or ``model`` itself)."""
    seen: dict[int, RotaryEncoding] = {}
    for module in model.modules():
        if isinstance(module, RotaryEncoding):
            seen.setdefault(id(module), module)
    return list(seen.values())


def extend_context(
    model: nn.Module, method: str, *, factor: float = 1.0, original_max_len: int | None = None, **options: Any
) -> list[RotaryEncoding]:
    """Switch every rotary layer of ``model`` to ``method`` in place, keeping the weights.

    Args:
        model: a trained posenc model (or any module holding rotary encodings).
        method: one of :data:`METHODS` (``"pi"`` is ``"linear"``); ``"none"`` restores plain RoPE.
        factor: the context scale ``s >= 1`` (target length / ``original_max_len``).
        original_max_len: the length the model was trained at (needed by dynamic NTK, YaRN,
            Llama 3 and LongRoPE).
        options: the method's parameters (YaRN's ``beta_fast``, LongRoPE's factor lists, ...).

    Returns the layers switched. Every scaling is built and checked before any layer changes, so
    a refused call leaves the model as it was. A length-dependent scaling (dynamic NTK, LongRoPE
    by length) makes the model refuse a KV cache, as when it is built with one.
    """
    planned = plan_extension(model, method, factor=factor, original_max_len=original_max_len, **options)
    for layer, scaling in planned:
        layer.set_scaling(scaling)
    return [layer for layer, _ in planned]


def plan_extension(
    model: nn.Module, method: str, *, factor: float = 1.0, original_max_len: int | None = None, **options: Any
) -> list[tuple[RotaryEncoding, RopeScaling | None]]:
    """The ``(layer, scaling)`` pairs :func:`extend_context` would apply, each scaling built and
    checked against its layer's width and base; nothing changes. A command line calls it to
    refuse bad arguments before any work."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch module; got {type(model).__name__}")
    layers = rotary_layers(model)
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no rotary layer (RotaryEncoding): extend_context applies to RoPE models"
        )
    planned = []
    for layer in layers:
        scaling = make_scaling(method, rotary_dim=layer.rotary_dim, factor=factor, original_max_len=original_max_len,
                               **options)
        if scaling is not None:
            scaling.compute(layer.rotary_dim, layer.base)
        planned.append((layer, scaling))
    return planned


# --- saving a model's scalings ---------------------------------------------------------------------


def rope_scaling_state(model: nn.Module) -> dict[str, Any]:
    """``{"rope_scalings": [scaling dict or None per rotary layer]}`` (plain values; empty for a
    model without rotary layers): what :func:`extend_context` changes, which a model's constructor
    arguments do not tell. Saved by ``save_pretrained``."""
    layers = rotary_layers(model)
    if not layers:
        return {}
    return {"rope_scalings": [None if layer.scaling is None else layer.scaling.to_dict() for layer in layers]}


def load_rope_scaling_state(model: nn.Module, state: Mapping[str, Any]) -> None:
    """Apply :func:`rope_scaling_state`'s values to ``model`` (built from the same arguments)."""
    unknown = sorted(set(state) - {"rope_scalings"})
    if unknown:
        raise ValueError(f"unknown saved state key(s) {', '.join(map(repr, unknown))}; expected 'rope_scalings'")
    if "rope_scalings" not in state:
        return
    layers, saved = rotary_layers(model), state["rope_scalings"]
    if not isinstance(saved, list) or len(saved) != len(layers):
        raise ValueError(f"rope_scalings must list one scaling (or null) per rotary layer ({len(layers)}); got {saved!r}")
    scalings = [None if d is None else rope_scaling_from_dict(d) for d in saved]  # all checked before any change
    for layer, scaling in zip(layers, scalings):
        layer.set_scaling(scaling)
