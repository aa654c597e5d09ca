"""The Hugging Face architectures a swap supports, and the modules that replace their own positions.

The Llama family (Llama, Qwen2, Mistral, SmolLM3, Gemma 3, Llama 4, and the text models of
Qwen2-VL, Qwen2.5-VL and Qwen3-VL) keeps a rotary embedding on its text model, replaced by
:class:`NoRotary` (cos = 1, sin = 0) or its variants: :class:`NoComplexRotary` for Llama 4, whose
rotary is a complex product, and :class:`~.axes.AxisRotary` for the Qwen-VL models, whose rotary
is the only place that sees M-RoPE's ``(t, h, w)`` positions. GPT-2 (``wpe``) and BERT
(``position_embeddings``) keep a learned table (replaced by :class:`PositionInput`). Each swapped
attention module carries its posenc encoding as the submodule :data:`ATTACHED`, run only by the
``"posenc"`` attention function. A multimodal model's text model is its ``language_model`` (or, for
Llama 4's, the ``model`` of that causal LM); its vision tower keeps its own positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformers import PreTrainedModel

from ...common.encoding import PositionEncoding

IMPLEMENTATION = "posenc"  # the attn_implementation name
ATTACHED = "position_encoding"  # the submodule name on each Hugging Face attention module
INPUT_ATTACHED = "position_input"  # Llama family: the input encoding, on the first decoder layer


class NoRotary(nn.Module):
    """Stands in for a Llama-family rotary embedding after a swap: ``cos = 1`` and ``sin = 0`` (as
    broadcast views, nothing allocated), so the model's own ``apply_rotary_pos_emb`` returns q
    and k unchanged and posenc's encoding does the positions.

    Shapes: ``forward(x [B, T, C], position_ids [B or 1, T], *rest)`` -> ``(cos, sin)``, each
    ``[B or 1, T, head_dim]`` in ``x``'s dtype. ``position_ids`` may also be ``[T]`` or M-RoPE's
    ``[3 or 1, B, T]``; ``rest`` (Gemma 3's layer type) changes nothing."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    @staticmethod
    def _rows(position_ids: Tensor) -> tuple[int, int]:
        """``(B or 1, T)`` of positions given as ``[T]``, ``[B, T]`` or ``[axes, B, T]``."""
        if position_ids.dim() == 1:
            return 1, position_ids.shape[0]
        return position_ids.shape[-2], position_ids.shape[-1]

    def forward(self, x: Tensor, position_ids: Tensor, *rest) -> tuple[Tensor, Tensor]:
        shape = (*self._rows(position_ids), self.head_dim)
        one = torch.ones((), dtype=x.dtype, device=x.device).expand(shape)
        zero = torch.zeros((), dtype=x.dtype, device=x.device).expand(shape)
        return one, zero

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}"


class NoComplexRotary(NoRotary):
    """Stands in for Llama 4's rotary embedding, whose ``freqs_cis`` multiplies q and k as complex
    numbers: ones ``[B or 1, T, head_dim / 2]`` (complex64, as Llama 4's). A swap also turns each
    attention module's own rotation off (Llama 4's applies it in float32 even in a float64 model),
    so these ones are never used; they keep the shapes the model expects."""

    def forward(self, x: Tensor, position_ids: Tensor, *rest) -> Tensor:
        shape = (*self._rows(position_ids), self.head_dim // 2)
        return torch.ones((), dtype=torch.complex64, device=x.device).expand(shape)


class PositionInput(nn.Module):
    """Stands in for a learned position table (GPT-2's ``wpe``, BERT's ``position_embeddings``): the
    additive input term of a posenc input encoding at the given positions, or zeros when the swap
    puts the positions in attention instead.

    Shapes: ``position_ids [B or 1, T]`` -> ``[B or 1, T, dim]`` (the model adds it to the token
    embeddings, where it added its table)."""

    def __init__(self, encoding: PositionEncoding | None, dim: int) -> None:
        super().__init__()
        self.encoding = encoding
        self.dim = dim
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # carries the model's dtype and device

    def forward(self, position_ids: Tensor) -> Tensor:
        pos = position_ids if position_ids.dim() == 2 else position_ids.reshape(1, -1)
        zeros = self.anchor.new_zeros(pos.shape[0], pos.shape[1], self.dim)
        return zeros if self.encoding is None else self.encoding.encode_input(zeros, pos)


def add_input_term(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of a Llama-family first decoder layer: adds the input encoding's term at
    the ``position_ids`` the model passes to its layers."""
    term_module: PositionInput = getattr(module, INPUT_ATTACHED)
    hidden = args[0] if args else kwargs["hidden_states"]
    pos = kwargs.get("position_ids")
    if pos is None:
        pos = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
    hidden = hidden + term_module(pos).to(hidden.dtype)
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def require_posenc(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a swapped attention module: its encoding runs only in posenc's attention."""
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", IMPLEMENTATION)
    if implementation != IMPLEMENTATION:
        raise RuntimeError(
            f"this model's position encoding was swapped to posenc, which runs only with attn_implementation="
            f"'{IMPLEMENTATION}'; got {implementation!r} (model.set_attn_implementation('{IMPLEMENTATION}'))"
        )


@dataclass(frozen=True)
class Family:
    """Where a family keeps its attention modules and its position mechanism.

    ``rotary``: what replaces a rope family's rotary embedding (``"cos_sin"``: :class:`NoRotary`;
    ``"complex"``: :class:`NoComplexRotary`; ``"axes"``: :class:`~.axes.AxisRotary`, which hands
    M-RoPE's positions to the attention function). ``switches``: attributes set on each attention
    module to turn the model's own position code off (Llama 4's rotation and temperature)."""

    name: str
    position: str  # "rope": a rotary embedding on the text model; "table": a learned table
    rotary: str = "cos_sin"
    switches: tuple[tuple[str, object], ...] = ()

    def text_model(self, base: nn.Module) -> nn.Module:
        """The module holding the decoder layers: the base model, a multimodal model's
        ``language_model``, or the ``model`` of a causal LM that is its own base (Llama 4's), also
        as the ``language_model`` of a multimodal model (Llama4ForConditionalGeneration's)."""
        if self.name == "llama":
            language = getattr(base, "language_model", None)
            for owner in (base, language, getattr(base, "model", None), getattr(language, "model", None)):
                if isinstance(owner, nn.Module) and hasattr(owner, "layers"):
                    return owner
        return base

    def attention_modules(self, base: nn.Module) -> list[nn.Module]:
        if self.name == "llama":
            return [layer.self_attn for layer in self.text_model(base).layers]
        if self.name == "gpt2":
            return [block.attn for block in base.h]
        return [layer.attention.self for layer in base.encoder.layer]

    def table_owner(self, base: nn.Module) -> tuple[nn.Module, str]:
        """``(module, attribute)`` of the learned position table."""
        if self.name == "gpt2":
            return base, "wpe"
        return base.embeddings, "position_embeddings"

    def is_swapped(self, base: nn.Module) -> bool:
        if self.position == "rope":
            return isinstance(getattr(self.text_model(base), "rotary_emb", None), NoRotary)
        owner, attr = self.table_owner(base)
        return isinstance(getattr(owner, attr, None), PositionInput)

    def causal(self, config) -> bool:
        if self.name == "bert":
            return bool(getattr(config, "is_decoder", False))
        return bool(getattr(config, "is_causal", True))


_LLAMA = Family("llama", "rope")
_QWEN_VL = Family("llama", "rope", rotary="axes")
_LLAMA4 = Family("llama", "rope", rotary="complex", switches=(("use_rope", False), ("attn_temperature_tuning", False)))
FAMILIES = {"llama": _LLAMA, "qwen2": _LLAMA, "mistral": _LLAMA, "smollm3": _LLAMA, "gemma3_text": _LLAMA,
            "gemma3": _LLAMA, "llama4_text": _LLAMA4, "llama4": _LLAMA4, "qwen2_vl": _QWEN_VL,
            "qwen2_vl_text": _QWEN_VL, "qwen2_5_vl": _QWEN_VL, "qwen2_5_vl_text": _QWEN_VL, "qwen3_vl": _QWEN_VL,
            "qwen3_vl_text": _QWEN_VL,
            "gpt2": Family("gpt2", "table"), "bert": Family("bert", "table")}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def family_of(model: nn.Module) -> tuple[Family, nn.Module]:
    """The family and base model of a Hugging Face model, or a ValueError naming what is supported."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a Hugging Face transformers PreTrainedModel; got {type(model).__name__}")
    model_type = getattr(model.config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"swap_position_encoding supports model types {', '.join(SUPPORTED_MODEL_TYPES)}; "
                         f"got {type(model).__name__} (model_type {model_type!r})")
    family = FAMILIES[model_type]
    base = model.base_model
    owner = family.text_model(base)
    needed = {"llama": ("layers", "rotary_emb"), "gpt2": ("h", "wpe"), "bert": ("encoder", "embeddings")}[family.name]
    if not all(hasattr(owner, attr) for attr in needed):
        raise ValueError(f"{type(model).__name__} ({model_type}) has no {' and '.join(needed)} on its "
                         f"{'text' if owner is not base else 'base'} model: swap_position_encoding needs the standard "
                         "transformers layout")
    return family, base


def sizes(config) -> tuple[int, int, int, int]:
    """``(hidden, heads, head_dim, max_len)`` from a (text) config."""
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return hidden, heads, int(head_dim), int(config.max_position_embeddings)
