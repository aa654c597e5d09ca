"""Each layer's position encoding from a Hugging Face config, for the models whose layers differ.

:func:`~.hf_rope.rope_from_hf_config` reads one rope config; today's models give their layers
different ones, and :func:`hf_layer_encodings` reads the list, one encoding (or None) per layer:

* Llama 4 and SmolLM3: ``no_rope_layers`` (1: RoPE, 0: none), else one NoPE layer every
  ``no_rope_layer_interval`` (4); the RoPE layers read the config's rope (Llama 4 pairs neighbours,
  ``pairing="interleaved"``, its rotary being a complex product); Llama 4's NoPE layers take
  :class:`~.nope_temperature.NoPETemperature` (``floor_scale``, ``attn_scale``) when
  ``attn_temperature_tuning`` is true (its default), SmolLM3's none.
* Gemma 3 and 4 (transformers 5): ``rope_parameters`` nested by layer type, ``layer_types``
  naming each layer's (else one ``full_attention`` every ``sliding_window_pattern``, 6); a layer
  whose head width differs (Gemma 4's global layers, ``per_layer_config``) reads its own.
* Gemma 3 in transformers 4's schema: ``rope_local_base_freq`` for the sliding layers (plain RoPE),
  ``rope_theta`` and ``rope_scaling`` for the global ones, as transformers converts it.
* every other config: one encoding for all layers.

A multimodal config's ``text_config`` is read (Qwen2-VL's, Gemma 3's). :func:`hf_layer_kinds`
names each layer's kind without building anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..common.encoding import PositionEncoding
from .hf_rope import rope_from_hf_config
from .nope_temperature import NoPETemperature
from .rope import RotaryEncoding


def _field(config: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
    return default if value is None else value


def text_config(config: Mapping[str, Any] | Any) -> Mapping[str, Any] | Any:
    """``config``'s ``text_config`` when it has one (a multimodal model), else ``config``."""
    inner = _field(config, "text_config")
    return config if inner is None else inner


def _depth(config: Mapping[str, Any] | Any) -> int:
    depth = _field(config, "num_hidden_layers")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"num_hidden_layers must be a positive int; got {depth!r}")
    return depth


def _nested(config: Mapping[str, Any] | Any) -> bool:
    rope = _field(config, "rope_parameters")
    return isinstance(rope, Mapping) and any(isinstance(v, Mapping) for v in rope.values())


def hf_layer_kinds(config: Mapping[str, Any] | Any) -> list[str]:
    """Each layer's kind: ``"rope"`` / ``"nope"`` (a config with NoPE layers), its layer type
    (``"sliding_attention"`` / ``"full_attention"``, Gemma), or ``"rope"`` for every layer."""
    config = text_config(config)
    depth = _depth(config)
    flags = _field(config, "no_rope_layers")
    if flags is not None or _field(config, "no_rope_layer_interval") is not None:
        if flags is None:
            interval = _field(config, "no_rope_layer_interval")
            flags = [int((i + 1) % interval != 0) for i in range(depth)]
        if not isinstance(flags, (list, tuple)) or len(flags) < depth or any(v not in (0, 1) for v in flags):
            raise ValueError(f"no_rope_layers must hold 0 or 1 for each of the {depth} layers; got {flags!r}")
        return ["rope" if flags[i] else "nope" for i in range(depth)]
    if _nested(config) or _field(config, "rope_local_base_freq") is not None:
        types = _field(config, "layer_types")
        if types is None:
            pattern = _field(config, "sliding_window_pattern", 6)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(depth)]
        if len(types) != depth:
            raise ValueError(f"layer_types names {len(types)} layers; the config has {depth}")
        return list(types)
    return ["rope"] * depth


def _layer_head_dim(config: Mapping[str, Any] | Any, index: int, kind: str) -> int | None:
    """A layer's own head width (Gemma 4's ``per_layer_config``), or None for the config's."""
    per_layer = _field(config, "per_layer_config")
    if per_layer is None:
        return None
    for key in (str(index), index, kind):
        try:
            entry = per_layer[key]
        except (KeyError, TypeError, IndexError, ValueError):  # a view refuses keys it does not know
            continue
        head_dim = _field(entry, "head_dim")
        if head_dim is not None:
            return head_dim
    return None


def hf_layer_encodings(config: Mapping[str, Any] | Any, *, pairing: str | None = None) -> list[PositionEncoding | None]:
    """One encoding per layer of ``config`` (None: a layer without position encoding); layers of one
    kind share an instance. ``pairing`` overrides the RoPE layers' (default: Llama 4's
    ``"interleaved"``, every other model's ``"half_split"``)."""
    config = text_config(config)
    kinds = hf_layer_kinds(config)
    if pairing is None:
        pairing = "interleaved" if str(_field(config, "model_type", "")).startswith("llama4") else "half_split"
    built: dict[tuple, PositionEncoding | None] = {}
    layers = []
    for index, kind in enumerate(kinds):
        head_dim = _layer_head_dim(config, index, kind)
        key = (kind, head_dim)
        if key not in built:
            built[key] = _one(config, kind, head_dim, pairing)
        layers.append(built[key])
    return layers


def _one(config: Mapping[str, Any] | Any, kind: str, head_dim: int | None, pairing: str) -> PositionEncoding | None:
    if kind == "nope":
        if not _field(config, "attn_temperature_tuning", False):
            return None
        return NoPETemperature(float(_field(config, "floor_scale", 8192)), float(_field(config, "attn_scale", 0.1)))
    if kind == "rope":
        return rope_from_hf_config(config, head_dim=head_dim, pairing=pairing)
    if not _nested(config):  # Gemma 3 in transformers 4's schema
        if kind == "sliding_attention":
            if head_dim is None:
                head_dim = _field(config, "head_dim") or _field(config, "hidden_size") // _field(config,
                                                                                                 "num_attention_heads")
            return RotaryEncoding(head_dim, base=float(_field(config, "rope_local_base_freq")), pairing=pairing)
        return rope_from_hf_config(config, head_dim=head_dim, pairing=pairing)
    return rope_from_hf_config(config, head_dim=head_dim, pairing=pairing, layer_type=kind)


__all__ = ["text_config", "hf_layer_kinds", "hf_layer_encodings"]
