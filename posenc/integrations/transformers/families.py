"""The Hugging Face architectures a swap supports, and the modules that replace their own positions.

Llama, Qwen2 and Mistral keep a rotary embedding on the base model (replaced by :class:`NoRotary`);
GPT-2 (``wpe``) and BERT (``position_embeddings``) a learned table (replaced by
:class:`PositionInput`). Each swapped attention module carries its posenc encoding as the submodule
:data:`ATTACHED`, run only by the ``"posenc"`` attention function.
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

    Shapes: ``forward(x [B, T, C], position_ids [B or 1, T])`` -> ``(cos, sin)``, each
    ``[B or 1, T, head_dim]`` in ``x``'s dtype."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        pos = position_ids if position_ids.dim() == 2 else position_ids.reshape(1, -1)
        shape = (pos.shape[0], pos.shape[1], self.head_dim)
        one = torch.ones((), dtype=x.dtype, device=x.device).expand(shape)
        zero = torch.zeros((), dtype=x.dtype, device=x.device).expand(shape)
        return one, zero

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}"


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
    """Where a family keeps its attention modules and its position mechanism."""

    name: str
    position: str  # "rope": a rotary embedding on the base model; "table": a learned table

    def attention_modules(self, base: nn.Module) -> list[nn.Module]:
        if self.name == "llama":
            return [layer.self_attn for layer in base.layers]
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
            return isinstance(getattr(base, "rotary_emb", None), NoRotary)
        owner, attr = self.table_owner(base)
        return isinstance(getattr(owner, attr, None), PositionInput)

    def causal(self, config) -> bool:
        if self.name == "bert":
            return bool(getattr(config, "is_decoder", False))
        return bool(getattr(config, "is_causal", True))


FAMILIES = {"llama": Family("llama", "rope"), "qwen2": Family("llama", "rope"), "mistral": Family("llama", "rope"),
            "gpt2": Family("gpt2", "table"), "bert": Family("bert", "table")}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def family_of(model: nn.Module) -> tuple[Family, nn.Module]:
    """The family and base model (the one holding the layers) of a Hugging Face model, or a
    ValueError naming what is supported."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a Hugging Face transformers PreTrainedModel; got {type(model).__name__}")
    model_type = getattr(model.config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"swap_position_encoding supports model types {', '.join(SUPPORTED_MODEL_TYPES)}; "
                         f"got {type(model).__name__} (model_type {model_type!r})")
    family = FAMILIES[model_type]
    base = model.base_model
    needed = {"llama": ("layers",), "gpt2": ("h", "wpe"), "bert": ("encoder", "embeddings")}[family.name]
    if not all(hasattr(base, attr) for attr in needed):
        raise ValueError(f"{type(model).__name__} ({model_type}) has no {' and '.join(needed)} on its base model: "
                         "swap_position_encoding needs the standard transformers layout")
    return family, base


def sizes(config) -> tuple[int, int, int, int]:
    """``(hidden, heads, head_dim, max_len)`` from a config."""
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return hidden, heads, int(head_dim), int(config.max_position_embeddings)
