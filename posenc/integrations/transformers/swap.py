"""The one-call encoding swap: a Hugging Face model's own positions replaced by a posenc encoding.

:func:`swap_position_encoding` removes the model's position mechanism (:mod:`.families`) and
attaches a posenc encoding to every self-attention layer, or, for an input encoding, puts it where
the model added its position table. ``encoding="identity"`` is the model's own encoding expressed
in posenc: for the rope families, layer by layer as :func:`posenc.seq.hf_layer_encodings` reads the
config (RoPE with Hugging Face's half-split pairing and the config's scaling; Gemma 3's local and
global bases; Llama 4's interleaved pairs, its NoPE layers with their temperature; SmolLM3's NoPE
layers without; M-RoPE with the config's ``mrope_section`` for Qwen2-VL, Qwen2.5-VL and Qwen3-VL);
the learned table copied for GPT-2 and BERT. A named encoding goes to every layer, a model's NoPE
layers included. One encoding instance per layer (T5's bucket table, shared across layers in its
paper, is per layer here).

The swap is recorded in ``model.config.posenc`` (``{"format", "encoding", "options"}``), and
``model.config.attn_implementation`` names an attention implementation only :func:`register`
provides (:data:`LOAD_GUARD`); ``save_pretrained`` writes both to ``config.json``, so loading the
checkpoint in a process that has not called :func:`register` fails in transformers itself, in one
line that says to call it, instead of loading the plain model (:mod:`.loading`).
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ...common.encoding import Hook, PositionEncoding
from ...common.registry import ModelDims, build, get
from ...seq.hf_layers import hf_layer_encodings, text_config
from ...seq.learned import LearnedEncoding
from .axes import AXES_ATTR, AxisPositions, AxisRotary, begin_forward, finish_forward
from .families import (
    ATTACHED,
    IMPLEMENTATION,
    INPUT_ATTACHED,
    Family,
    NoComplexRotary,
    NoRotary,
    PositionInput,
    add_input_term,
    family_of,
    require_posenc,
    sizes,
)

CONFIG_KEY = "posenc"  # model.config.posenc records the swap
RECORD_FORMAT = 1
IDENTITY = "identity"  # the model's own encoding, expressed in posenc
# The attention implementation a saved swap names: registered only by register(), so transformers
# alone refuses the checkpoint, and its message (which quotes the name) says what to do.
LOAD_GUARD = "posenc (a posenc swap: call posenc.integrations.transformers.register() before loading)"
# Sizes the model fixes: an encoding built for others would fail at the first call, or be wrong.
MODEL_SIZES = ("dim", "num_heads", "head_dim")


def check_encoding_name(encoding: Any, where: str = "encoding") -> str:
    """``encoding`` as a name a swap takes: ``"identity"`` or a registered sequence encoding."""
    if not isinstance(encoding, str):
        raise TypeError(f"{where} must be a registered sequence encoding name or 'identity'; got "
                        f"{type(encoding).__name__}")
    if encoding != IDENTITY:
        try:
            info = get(encoding)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        if info.modality != "seq":
            raise ValueError(f"{where} {encoding!r} is a {info.modality} encoding; a Hugging Face language model takes "
                             "a sequence encoding (posenc.available('seq'))")
    return encoding


def check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a mapping of constructor arguments for posenc.build; got {type(options).__name__}")
    bad = [k for k in options if not isinstance(k, str)]
    if bad:
        raise TypeError(f"options keys must be argument names (str); got {bad[0]!r}")
    fixed = [k for k in MODEL_SIZES if k in options]
    if fixed:
        raise ValueError(f"options: {fixed[0]} comes from the model's config and cannot be set; got {fixed[0]}="
                         f"{options[fixed[0]]!r}")
    for key, value in options.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):  # json's own message names neither the key nor the value
            raise ValueError(f"options[{key!r}] must be one of the plain JSON values options hold (saved in "
                             f"model.config.{CONFIG_KEY}: finite numbers, strings, bools, lists, dicts); got {value!r}"
                             ) from None
    return dict(options)


def _build_one(name: str, options: dict[str, Any], config, family: Family, causal: bool) -> PositionEncoding:
    """One encoding for one layer: ``name`` built with the model's sizes filled in."""
    hidden, heads, head_dim, max_len = sizes(config)
    if name == IDENTITY:
        _check_identity_options(options)
        return LearnedEncoding(hidden, max_len)  # the rope families' identity is per layer: _identity_layers
    info = get(name)
    args = dict(options)
    params = inspect.signature(info.cls.__init__).parameters
    if "head_dim" in params and "head_dim" not in args:
        args["head_dim"] = head_dim
    if "bidirectional" in params and "bidirectional" not in args:
        args["bidirectional"] = not causal  # T5 buckets: both directions in a bidirectional model
    if name == "peg1d" or info.cls.between_blocks:
        raise ValueError(f"{name!r} sits between blocks; swap_position_encoding places input encodings where the "
                         "model adds its position table, and attention encodings in every layer")
    try:
        return build(name, dims=ModelDims(dim=hidden, num_heads=heads, max_len=max_len), **args)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def _check_identity_options(options: dict[str, Any]) -> None:
    if options:
        raise ValueError(f"encoding='identity' is the model's own encoding and takes no options; got "
                         f"{', '.join(sorted(options))}")


def _identity_layers(config, count: int) -> list[PositionEncoding | None]:
    """A rope family's own encoding, layer by layer (:func:`posenc.seq.hf_layer_encodings`: Gemma 3's
    local and global bases, Llama 4's and SmolLM3's NoPE layers, M-RoPE), one instance a layer."""
    layers = hf_layer_encodings(config)
    if len(layers) != count:
        raise ValueError(f"the config describes {len(layers)} layers (num_hidden_layers) and the model has {count} "
                         "attention layers")
    seen: set[int] = set()
    own = []
    for enc in layers:
        own.append(copy.deepcopy(enc) if enc is not None and id(enc) in seen else enc)
        seen.add(id(enc))
    return own


def _replace_rotary(family: Family, owner: nn.Module, head_dim: int, attention_modules: list[nn.Module]) -> None:
    """The text model's rotary embedding replaced (see :mod:`.families`); for M-RoPE, the positions
    kept between calls (:mod:`.axes`)."""
    if family.rotary == "axes":
        axes = AxisPositions()
        owner.rotary_emb = AxisRotary(head_dim, axes)
        owner.register_forward_pre_hook(begin_forward, with_kwargs=True)
        owner.register_forward_hook(finish_forward, with_kwargs=True)
        for module in attention_modules:
            setattr(module, AXES_ATTR, axes)
    else:
        owner.rotary_emb = NoComplexRotary(head_dim) if family.rotary == "complex" else NoRotary(head_dim)
    for module in attention_modules:
        for attr, value in family.switches:
            setattr(module, attr, value)


def _checked_encoding(enc: PositionEncoding, name: str, config, causal: bool) -> PositionEncoding:
    hidden = sizes(config)[0]
    needs = enc.attention_needs()
    label = f"encoding {name!r}"
    if needs.linear_only:
        raise ValueError(f"{label} is defined for linear attention only; Hugging Face models use softmax attention")
    if enc.causal_only and not causal:
        raise ValueError(f"{label} is defined for causal attention only; {config.model_type} attends bidirectionally "
                         "here (alibi and kerple take symmetric=True)")
    if Hook.INPUT in enc.hooks and enc.hooks - {Hook.INPUT}:
        raise ValueError(f"{label} has an input hook and attention hooks; swap_position_encoding takes one or the other")
    if Hook.INPUT in enc.hooks:
        probe = enc.encode_input(torch.zeros(1, 1, hidden), torch.zeros(1, 1, dtype=torch.long))
        if probe.shape[-1] != hidden:
            raise ValueError(f"{label} changes the width ({hidden} -> {probe.shape[-1]}); the model needs {hidden}")
    return enc


def _snapshot_buffers(module: nn.Module) -> None:
    """Keep a copy of every non-persistent buffer of the posenc modules under ``module``: transformers
    replaces those buffers with empty ones while loading a checkpoint, and :func:`~.loading.register`'s
    ``_initialize_weights`` wrapper puts these values back (:func:`restore_buffers`)."""
    for sub in module.modules():
        names = getattr(sub, "_non_persistent_buffers_set", set())
        saved = {n: b.detach().clone() for n, b in sub._buffers.items() if n in names and b is not None}
        if saved and not any(b.is_meta for b in saved.values()):
            object.__setattr__(sub, "_posenc_buffers", saved)


def restore_buffers(module: nn.Module) -> None:
    saved = getattr(module, "_posenc_buffers", None)
    if not saved:
        return
    with torch.no_grad():
        for name, value in saved.items():
            current = module._buffers.get(name)
            if current is None or current.is_meta:
                continue
            if current.shape == value.shape:
                current.copy_(value.to(current.dtype))


def install(model: nn.Module, name: str, options: dict[str, Any], copy_tables: bool) -> None:
    """Build every encoding and put it in place; nothing changes if a build is refused. The model
    must run with the ``"posenc"`` attention function, which :func:`~.loading.register` provides."""
    family, base = family_of(model)
    config = text_config(model.config)  # a multimodal model's text model is the one swapped
    causal = family.causal(config)
    attention_modules = family.attention_modules(base)
    hidden, _, head_dim, _ = sizes(config)
    # Built on the CPU even inside transformers' meta-device construction, so the buffers are real.
    with torch.device("cpu"):
        if name == IDENTITY and family.position == "rope":
            _check_identity_options(options)
            layer_encodings = _identity_layers(config, len(attention_modules))
            first, is_input, attends = None, False, True
        else:
            first = _checked_encoding(_build_one(name, options, config, family, causal), name, config, causal)
            is_input = Hook.INPUT in first.hooks
            attends = bool(first.hooks - {Hook.INPUT})
            layer_encodings = [first] + [_build_one(name, options, config, family, causal)
                                         for _ in attention_modules[1:]] if attends else []
    for enc in layer_encodings:
        if enc is not None:
            _snapshot_buffers(enc)
    if is_input:
        _snapshot_buffers(first)
    input_term = PositionInput(first if is_input else None, hidden)
    if family.position == "table":
        owner, attr = family.table_owner(base)
        table = getattr(owner, attr)
        if copy_tables and name == IDENTITY:
            with torch.no_grad():
                first.table.copy_(table.weight.detach().to(first.table.dtype))
        if is_input or name == IDENTITY:
            first.to(device=table.weight.device, dtype=table.weight.dtype)
        input_term.to(device=table.weight.device, dtype=table.weight.dtype)
        setattr(owner, attr, input_term)
    else:
        owner = family.text_model(base)
        reference = next(iter(owner.parameters()))
        _replace_rotary(family, owner, head_dim, attention_modules)
        if is_input:
            input_term.to(device=reference.device, dtype=reference.dtype)
            layer0 = owner.layers[0]
            setattr(layer0, INPUT_ATTACHED, input_term)
            layer0.register_forward_pre_hook(add_input_term, with_kwargs=True)
    for module, enc in zip(attention_modules, layer_encodings):
        if enc is None:  # a NoPE layer of the model's own schedule
            continue
        reference = next(iter(module.parameters()))
        enc.to(device=reference.device)
        for param in enc.parameters():  # parameters follow the model; buffers keep their precision (float64 RoPE tables)
            if param.is_floating_point():
                param.data = param.data.to(reference.dtype)
        setattr(module, ATTACHED, enc)
    for module in attention_modules:
        module.register_forward_pre_hook(require_posenc, with_kwargs=True)
    model.config.attn_implementation = LOAD_GUARD  # saved in config.json: see the module docstring
    model.set_attn_implementation(IMPLEMENTATION)


def record(encoding: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "encoding": encoding, "options": options}


def swapped_encoding(model: nn.Module) -> dict[str, Any] | None:
    """The swap recorded in ``model.config`` (``{"format", "encoding", "options"}``), or None."""
    saved = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    return None if saved is None else dict(saved)


def check_record(saved: Any) -> tuple[str, dict[str, Any]]:
    """A saved ``config.posenc`` as ``(encoding, options)``, each checked as the swap checks them."""
    if not isinstance(saved, Mapping) or set(saved) != {"format", "encoding", "options"}:
        raise ValueError(f"config.{CONFIG_KEY} must be {{'format', 'encoding', 'options'}} as swap_position_encoding "
                         f"writes it; got {saved!r}")
    if saved["format"] != RECORD_FORMAT:
        raise ValueError(f"config.{CONFIG_KEY} has format {saved['format']!r}; this posenc reads format {RECORD_FORMAT}")
    name = check_encoding_name(saved["encoding"], where=f"config.{CONFIG_KEY}['encoding']")
    return name, check_options(saved["options"])
