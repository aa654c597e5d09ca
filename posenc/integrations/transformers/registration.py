""":func:`register`, the swap entry point, and what is checked when a swapped checkpoint loads.

:func:`register` adds :func:`~.attention.posenc_attention` to transformers' ``AttentionInterface``
under ``"posenc"`` (a model picks it with ``attn_implementation="posenc"``), with
:func:`~.masks.posenc_mask` under the same name, and lets a model built from a config that records
a swap (``from_pretrained`` included) carry it: it wraps ``PreTrainedModel.post_init`` (the end of
every model's constructor), which performs the same swap before the weights are loaded so the
encoding's parameters load by name; ``_initialize_weights``, which puts back the non-persistent
buffers of the posenc modules that transformers replaces while it loads; and ``from_pretrained``,
which refuses a swapped model whose weights hold NaN or inf. The wrappers do nothing for a
config without the record.

Loading a swapped checkpoint without :func:`register` is refused by transformers itself: the saved
config names the attention implementation :data:`~.swap.LOAD_GUARD`, which only :func:`register`
provides, and transformers' error quotes that name, which says to call it. A record that names
something a swap refuses (an encoding of another modality, an unknown format) is refused on load
with the swap's own message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch import nn

from transformers import PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

from .attention import posenc_attention
from .families import FAMILIES, IMPLEMENTATION, family_of
from .masks import posenc_mask
from .swap import (
    CONFIG_KEY,
    LOAD_GUARD,
    check_encoding_name,
    check_options,
    check_record,
    install,
    record,
    restore_buffers,
    swapped_encoding,
)

_ORIGINALS: dict[str, Callable] = {}


def swap_position_encoding(model: nn.Module, encoding: str, *, options: Mapping[str, Any] | None = None) -> nn.Module:
    """Replace ``model``'s own position mechanism by a posenc encoding in every layer, in place.

    Args:
        model: a Hugging Face ``PreTrainedModel`` of a supported type
            (:data:`~.families.SUPPORTED_MODEL_TYPES`: Llama, Qwen2, Mistral, SmolLM3, Gemma 3,
            Llama 4 (text, and multimodal), Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GPT-2, BERT), any head.
        encoding: a registered sequence encoding (``posenc.available("seq")``, in every layer) or
            ``"identity"`` (the model's own encoding in posenc, layer by layer as
            :func:`posenc.seq.hf_layer_encodings` reads the config: RoPE, local and global bases,
            NoPE layers, M-RoPE; the learned table copied for GPT-2 and BERT).
        options: constructor arguments for :func:`posenc.build` (the sizes ``dim``, ``num_heads``,
            ``head_dim`` and ``max_len`` come from the config). Plain JSON values: they are saved
            in ``model.config.posenc``. T5's ``bidirectional`` defaults to the model's attention.

    Returns ``model``, now with ``attn_implementation="posenc"`` (this calls :func:`register`). The
    rest of the weights are kept. Refused (one line, nothing changed): an unsupported architecture,
    an encoding of another modality, a causal-only encoding in a bidirectional model, a
    linear-attention-only or between-blocks encoding, a model already swapped.
    """
    family, base = family_of(model)
    check_encoding_name(encoding)
    opts = check_options(options)
    if family.is_swapped(base) or getattr(model.config, CONFIG_KEY, None) is not None:
        raise ValueError(f"this model already carries a posenc swap (config.{CONFIG_KEY}="
                         f"{getattr(model.config, CONFIG_KEY, None)!r}); swap_position_encoding needs the original, "
                         "unswapped model")
    register()
    install(model, encoding, opts, copy_tables=True)
    setattr(model.config, CONFIG_KEY, record(encoding, opts))
    return model


def check_finite_weights(model: nn.Module) -> None:
    """Refuse a swapped model whose weights hold NaN or inf (as :func:`posenc.load` refuses them):
    such weights make every output NaN."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"the weights of this posenc-swapped {type(model).__name__} hold {bad} non-finite "
                             f"value(s) (NaN or inf) in {name}; refusing to load them")


def _post_init(self) -> None:
    _ORIGINALS["post_init"](self)
    saved = getattr(self.config, CONFIG_KEY, None)
    if saved is None or getattr(self.config, "model_type", None) not in FAMILIES:
        return
    family, base = family_of(self)
    if not family.is_swapped(base):
        name, options = check_record(saved)
        install(self, name, options, copy_tables=False)


def _initialize_weights(self, module, *args, **kwargs):
    restore_buffers(module)
    return _ORIGINALS["_initialize_weights"](self, module, *args, **kwargs)


def _from_pretrained(cls, *args, **kwargs):
    loaded = _ORIGINALS["from_pretrained"](cls, *args, **kwargs)
    model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True
    if isinstance(model, nn.Module) and swapped_encoding(model) is not None:
        check_finite_weights(model)
    return loaded


def is_registered() -> bool:
    """Whether :func:`register` has run in this process."""
    return "post_init" in _ORIGINALS


def register() -> None:
    """Make ``attn_implementation="posenc"`` available to every transformers model, and let models
    built from a config that records a swap (``from_pretrained`` included) carry it. Idempotent."""
    for name in (IMPLEMENTATION, LOAD_GUARD):
        AttentionInterface.register(name, posenc_attention)
        AttentionMaskInterface.register(name, posenc_mask)
    if is_registered():
        return
    _ORIGINALS["post_init"] = PreTrainedModel.post_init
    _ORIGINALS["_initialize_weights"] = PreTrainedModel._initialize_weights
    _ORIGINALS["from_pretrained"] = PreTrainedModel.__dict__["from_pretrained"].__func__
    PreTrainedModel.post_init = _post_init
    PreTrainedModel._initialize_weights = _initialize_weights
    PreTrainedModel.from_pretrained = classmethod(_from_pretrained)
