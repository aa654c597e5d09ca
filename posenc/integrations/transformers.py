"""posenc inside Hugging Face transformers models: an attention function and a one-call encoding swap.

Two pieces (extra ``hf``):

* :func:`register` adds :func:`posenc_attention` to ``transformers.AttentionInterface`` under
  ``"posenc"`` (a model picks it with ``attn_implementation="posenc"``), with Hugging Face's boolean
  SDPA mask builder under the same name. The function runs posenc's attention core
  (:func:`posenc.common.attention.attend`: SDPA, FlexAttention or the chunked dense kernel, as the
  plan decides) with the encoding attached to the Hugging Face attention module, if any.
* :func:`swap_position_encoding` removes a model's own position mechanism and attaches a posenc
  encoding to every self-attention layer (or, for an input encoding, puts it where the model added
  its position table). ``encoding="identity"`` is the model's own encoding expressed in posenc:
  RoPE with Hugging Face's half-split pairing and the config's scaling
  (:func:`posenc.seq.rope_from_hf_config`) for the Llama family, the learned table copied for GPT-2
  and BERT.

How a call maps onto posenc (Hugging Face has already projected q/k/v, applied its own RoPE --
an identity after a swap -- and appended the new keys to its ``DynamicCache``):

* positions are explicit: the queries' from the ``position_ids`` the model passes to its attention
  (Llama, Qwen2, Mistral, GPT-2), else ``Tk - Tq .. Tk - 1``; the cached keys continue right
  before the first query (consecutive positions, as in any cache of one sequence per row; padded
  keys are masked whatever their position). So the q/k transform of a swapped RoPE runs on every
  key at each step (the cache holds keys before the transform), and each key sees the rotation of
  its own position, as in Hugging Face.
* masks: Hugging Face's boolean 4D mask (or None with ``is_causal``) is read back into a posenc
  :class:`~posenc.common.masks.AttentionMask` when it is causal or bidirectional with key padding,
  block-diagonal from packed ``position_ids``, or a sliding window; any other mask (and a float
  one) becomes an additive ``attn_bias`` over the causal or full pattern.
* ``scaling`` is the score scale; ``dropout`` (training) takes :func:`attend_with_weights`;
  grouped-query keys (``Hkv < Hq``) go to the core as they are.

Saving: the swap is recorded in ``model.config.posenc`` (``{"format", "encoding", "options"}``),
which ``save_pretrained`` writes to ``config.json``. After :func:`register`, constructing a model
from such a config (``from_pretrained`` included) performs the same swap before the weights are
loaded, so the encoding's parameters load by name and the outputs are identical. ``register``
does this by wrapping ``PreTrainedModel.post_init`` (the end of every model's constructor) and,
because transformers replaces non-persistent buffers while it loads, ``_initialize_weights`` (which
then restores those of the posenc modules). Both wrappers do nothing for a config without the key.

Supported architectures: Llama, Qwen2, Mistral (RoPE), GPT-2 (learned absolute ``wpe``) and BERT
(learned absolute ``position_embeddings``; bidirectional unless ``is_decoder``). One encoding
instance per layer (T5's bucket table, shared across layers in its paper, is per layer here).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..common.attention import attend, attend_with_weights
from ..common.encoding import Hook, PositionEncoding
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, build, get
from ..training.report import optional
from ..seq.context import rope_from_hf_config
from ..seq.learned import LearnedEncoding

transformers = optional("transformers", "posenc.integrations.transformers")
from transformers import PreTrainedModel  # noqa: E402  (after the guarded import)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

IMPLEMENTATION = "posenc"  # the attn_implementation name
CONFIG_KEY = "posenc"  # model.config.posenc records the swap
RECORD_FORMAT = 1
IDENTITY = "identity"  # the model's own encoding, expressed in posenc
ATTACHED = "position_encoding"  # the submodule name on each Hugging Face attention module
INPUT_ATTACHED = "position_input"  # Llama family: the input encoding, on the first decoder layer

__all__ = [
    "IMPLEMENTATION", "IDENTITY", "CONFIG_KEY", "SUPPORTED_MODEL_TYPES", "register", "is_registered",
    "posenc_attention", "swap_position_encoding", "swapped_encoding", "hf_mask_to_posenc", "NoRotary",
    "PositionInput",
]


# --- the attention function ------------------------------------------------------------------------


def _query_positions(position_ids: Tensor | None, batch: int, q_len: int, kv_len: int, device) -> Tensor:
    """``[B or 1, Tq]`` integer positions of the queries (see the module docstring)."""
    if position_ids is None:
        return torch.arange(max(kv_len - q_len, 0), max(kv_len - q_len, 0) + q_len, device=device).unsqueeze(0)
    if not isinstance(position_ids, Tensor) or position_ids.dim() not in (1, 2):
        got = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
        raise ValueError(f"posenc attention: position_ids must be [batch or 1, {q_len}]; got {got} (multimodal "
                         "3D position ids are not supported)")
    pos = position_ids.unsqueeze(0) if position_ids.dim() == 1 else position_ids
    if pos.shape[-1] != q_len or pos.shape[0] not in (1, batch):
        raise ValueError(f"posenc attention: position_ids must be [batch={batch} or 1, {q_len}] for {q_len} queries; "
                         f"got {tuple(position_ids.shape)}")
    return pos.to(device)


def _key_positions(q_pos: Tensor, q_len: int, kv_len: int) -> Tensor:
    """``[B or 1, Tk]``: the queries' own positions for self-attention without a cache; with cached
    keys before them, consecutive positions ending right before the first query (clamped at 0, the
    position Hugging Face gives padding, when the queries have no negative position)."""
    if kv_len == q_len:
        return q_pos
    if kv_len < q_len:  # keys cropped or from elsewhere: their own indices
        return torch.arange(kv_len, device=q_pos.device).unsqueeze(0)
    past = kv_len - q_len
    before = q_pos[:, :1] - past + torch.arange(past, device=q_pos.device)
    if not q_pos.is_floating_point() and bool((q_pos >= 0).all()):
        before = before.clamp(min=0)
    return torch.cat([before.to(q_pos.dtype), q_pos], dim=1)


def _segments(position_ids: Tensor) -> Tensor:
    """Packed sequences: a new segment wherever the position does not step by one (Hugging Face's
    reading of packed ``position_ids``)."""
    step = torch.diff(position_ids, dim=-1, prepend=position_ids[:, :1] - 1)
    return (step != 1).cumsum(-1)


def _base_pattern(q_len: int, kv_len: int, causal: bool, window: int | None, device) -> Tensor | None:
    """The causal / windowed pattern, bottom-right aligned, ``[Tq, Tk]`` bool (None: all pairs)."""
    if not causal and window is None:
        return None
    q_idx = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)
    k_idx = torch.arange(kv_len, device=device).unsqueeze(0)
    ok = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        ok = ok & (k_idx <= q_idx)
    if window is not None:
        dist = q_idx - k_idx
        ok = ok & (dist < window) & (dist > -window)
    return ok


def hf_mask_to_posenc(
    attention_mask: Tensor | None,
    *,
    causal: bool,
    batch: int,
    q_len: int,
    kv_len: int,
    dtype: torch.dtype,
    position_ids: Tensor | None = None,
    window: int | None = None,
) -> tuple[AttentionMask | None, Tensor | None]:
    """A Hugging Face attention mask as posenc takes it: ``(mask, attn_bias)``.

    Args:
        attention_mask: None (then ``causal`` and ``window`` say it all), a boolean
            ``[B or 1, 1, Tq or 1, Tk]`` mask (True = attend), or a float additive one.
        causal: the module attends causally.
        dtype: of the additive bias, when one is needed.
        position_ids: ``[B or 1, Tq]``, to read a packed (block-diagonal) mask.
        window: the sliding window (Mistral, Qwen2), or None.

    A mask that is exactly causal/windowed/full with key padding, or block-diagonal over packed
    positions, becomes a structured :class:`AttentionMask` (the fused kernels serve it); anything
    else becomes ``attn_bias`` (``finfo.min`` where a boolean mask says no, so a row masked whole
    stays finite, as in Hugging Face's eager path), over a causal mask when it allows nothing
    above the diagonal.
    """
    if attention_mask is None:
        return (AttentionMask(causal=causal, window=window) if causal or window is not None else None), None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"posenc attention takes the attention mask as a tensor (sdpa-style); got "
                        f"{type(attention_mask).__name__} (a FlexAttention BlockMask is built for attn_implementation="
                        "'flex_attention')")
    device = attention_mask.device
    shape = tuple(attention_mask.shape)
    if (attention_mask.dim() != 4 or shape[0] not in (1, batch) or shape[2] not in (1, q_len)
            or shape[3] != kv_len):
        raise ValueError(f"posenc attention: the attention mask must be [batch={batch} or 1, heads or 1, {q_len} or 1, "
                         f"{kv_len}]; got {shape}")
    bias = None
    if attention_mask.dtype == torch.bool:
        allowed = attention_mask
    elif attention_mask.is_floating_point():
        low = torch.finfo(attention_mask.dtype).min / 2
        removed = attention_mask <= low
        if bool(((attention_mask == 0) | removed).all()):
            allowed = ~removed
        else:  # a real additive bias: keep its values
            allowed, bias = ~removed, attention_mask.to(dtype)
    else:
        raise TypeError(f"posenc attention: the attention mask must be bool or float; got {attention_mask.dtype}")
    base = _base_pattern(q_len, kv_len, causal, window, device)
    full = allowed.expand(shape[0], shape[1], q_len, kv_len)
    if bias is None and shape[1] == 1:
        key_valid = full.any(dim=2)[:, 0]  # [B or 1, Tk]
        candidate = key_valid[:, None, None, :] if base is None else base & key_valid[:, None, None, :]
        valid = None if bool(key_valid.all()) else key_valid
        if torch.equal(candidate.expand_as(full), full):
            return AttentionMask(causal=causal, key_valid=valid, window=window), None
        if position_ids is not None and q_len == kv_len and position_ids.shape[-1] == q_len:
            seg = _segments(position_ids.expand(shape[0], -1).to(device))
            same = seg[:, None, :, None] == seg[:, None, None, :]
            if torch.equal((candidate & same).expand_as(full), full):
                return AttentionMask(causal=causal, key_valid=valid, q_segments=seg, kv_segments=seg,
                                     window=window), None
    if bias is None:
        zero = torch.zeros((), dtype=dtype, device=device)
        bias = torch.where(allowed, zero, torch.finfo(dtype).min)
    structural = None
    if base is not None and not bool((full & ~base).any()):
        structural = AttentionMask(causal=causal, window=window)
    return structural, bias


_REFUSED_KWARGS = ("softcap", "s_aux")


def posenc_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The attention function registered as ``"posenc"`` (Hugging Face's ``AttentionInterface``
    contract): ``query [B, Hq, Tq, D]``, ``key, value [B, Hkv, Tk, D]`` -> ``(out [B, Tq, Hq, D],
    weights [B, Hq, Tq, Tk] or None)``.

    The encoding attached to ``module`` by :func:`swap_position_encoding` (none: plain attention)
    is applied by posenc's core. The keyword arguments read: ``position_ids`` (the queries'
    positions), ``sliding_window``, ``position_bias`` (an additive bias, T5-style models) and
    ``output_attentions`` (the weights are returned); ``softcap`` and attention sinks (``s_aux``)
    are refused; the rest (cache bookkeeping, flash-attention lengths) do not change the result.
    """
    for name in _REFUSED_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"posenc attention does not support {name}; use attn_implementation='eager'")
    encoding = getattr(module, ATTACHED, None)
    if encoding is not None and not (encoding.hooks - {Hook.INPUT}):
        encoding = None
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    position_ids = kwargs.get("position_ids")
    q_pos = _query_positions(position_ids, batch, q_len, kv_len, query.device)
    kv_pos = _key_positions(q_pos, q_len, kv_len)
    if encoding is not None and kv_len > q_len and not encoding.supports_kv_cache:
        raise ValueError(f"{type(encoding).__name__} does not support a KV cache; call generate(..., use_cache=False)")
    window = kwargs.get("sliding_window")
    mask, bias = hf_mask_to_posenc(attention_mask, causal=causal, batch=batch, q_len=q_len, kv_len=kv_len,
                                   dtype=query.dtype, position_ids=q_pos if position_ids is not None else None,
                                   window=window)
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:
        bias = position_bias.to(query.dtype) if bias is None else bias + position_bias.to(query.dtype)
    want_weights = bool(kwargs.get("output_attentions", False))
    if dropout or want_weights:
        out, weights = attend_with_weights(query, key, value, q_pos=q_pos, kv_pos=kv_pos, encoding=encoding,
                                           mask=mask, scale=scaling, attn_bias=bias, dropout_p=float(dropout))
    else:
        out = attend(query, key, value, q_pos=q_pos, kv_pos=kv_pos, encoding=encoding, mask=mask, scale=scaling,
                     attn_bias=bias)
        weights = None
    return out.transpose(1, 2).contiguous(), weights if want_weights else None


# --- the model's own position mechanism, replaced ----------------------------------------------------


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


def _add_input_term(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
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


def _require_posenc(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a swapped attention module: its encoding runs only in posenc's attention."""
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", IMPLEMENTATION)
    if implementation != IMPLEMENTATION:
        raise RuntimeError(
            f"this model's position encoding was swapped to posenc, which runs only with attn_implementation="
            f"'{IMPLEMENTATION}'; got {implementation!r} (model.set_attn_implementation('{IMPLEMENTATION}'))"
        )


# --- architectures -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
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


_FAMILIES = {"llama": _Family("llama", "rope"), "qwen2": _Family("llama", "rope"), "mistral": _Family("llama", "rope"),
             "gpt2": _Family("gpt2", "table"), "bert": _Family("bert", "table")}
SUPPORTED_MODEL_TYPES = tuple(_FAMILIES)


def _family_of(model: nn.Module) -> tuple[_Family, nn.Module]:
    """The family and base model (the one holding the layers) of a Hugging Face model, or a
    ValueError naming what is supported."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a Hugging Face transformers PreTrainedModel; got {type(model).__name__}")
    model_type = getattr(model.config, "model_type", None)
    if model_type not in _FAMILIES:
        raise ValueError(f"swap_position_encoding supports model types {', '.join(SUPPORTED_MODEL_TYPES)}; "
                         f"got {type(model).__name__} (model_type {model_type!r})")
    family = _FAMILIES[model_type]
    base = model.base_model
    needed = {"llama": ("layers",), "gpt2": ("h", "wpe"), "bert": ("encoder", "embeddings")}[family.name]
    if not all(hasattr(base, attr) for attr in needed):
        raise ValueError(f"{type(model).__name__} ({model_type}) has no {' and '.join(needed)} on its base model: "
                         "swap_position_encoding needs the standard transformers layout")
    return family, base


def _sizes(config) -> tuple[int, int, int, int]:
    """``(hidden, heads, head_dim, max_len)`` from a config."""
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return hidden, heads, int(head_dim), int(config.max_position_embeddings)


# --- building the encodings --------------------------------------------------------------------------


# Sizes the model fixes: an encoding built for others would fail at the first call, or be wrong.
MODEL_SIZES = ("dim", "num_heads", "head_dim")


def _check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
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
    try:
        json.dumps(dict(options), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"options must be plain JSON values (they are saved in model.config.{CONFIG_KEY}); {exc}") from None
    return dict(options)


def _build_one(name: str, options: dict[str, Any], config, family: _Family, causal: bool) -> PositionEncoding:
    """One encoding for one layer: ``name`` built with the model's sizes filled in."""
    hidden, heads, head_dim, max_len = _sizes(config)
    if name == IDENTITY:
        if options:
            raise ValueError(f"encoding='identity' is the model's own encoding and takes no options; got "
                             f"{', '.join(sorted(options))}")
        if family.position == "rope":
            return rope_from_hf_config(config, head_dim=head_dim)
        return LearnedEncoding(hidden, max_len)
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


def _checked_encoding(enc: PositionEncoding, name: str, config, family: _Family, causal: bool) -> PositionEncoding:
    hidden = _sizes(config)[0]
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
    replaces those buffers with empty ones while loading a checkpoint, and :func:`register`'s
    ``_initialize_weights`` wrapper puts these values back."""
    for sub in module.modules():
        names = getattr(sub, "_non_persistent_buffers_set", set())
        saved = {n: b.detach().clone() for n, b in sub._buffers.items() if n in names and b is not None}
        if saved and not any(b.is_meta for b in saved.values()):
            object.__setattr__(sub, "_posenc_buffers", saved)


def _restore_buffers(module: nn.Module) -> None:
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


def _install(model: nn.Module, name: str, options: dict[str, Any], copy_tables: bool) -> None:
    """Build every encoding and put it in place; nothing changes if a build is refused."""
    family, base = _family_of(model)
    config = model.config
    causal = family.causal(config)
    attention_modules = family.attention_modules(base)
    hidden, heads, head_dim, _ = _sizes(config)
    # Built on the CPU even inside transformers' meta-device construction, so the buffers are real.
    with torch.device("cpu"):
        first = _checked_encoding(_build_one(name, options, config, family, causal), name, config, family, causal)
        is_input = Hook.INPUT in first.hooks
        attends = bool(first.hooks - {Hook.INPUT})
        layer_encodings = [first] + [_build_one(name, options, config, family, causal)
                                     for _ in attention_modules[1:]] if attends else []
    for enc in layer_encodings:
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
        reference = next(iter(base.parameters()))
        base.rotary_emb = NoRotary(head_dim)
        if is_input:
            input_term.to(device=reference.device, dtype=reference.dtype)
            layer0 = base.layers[0]
            setattr(layer0, INPUT_ATTACHED, input_term)
            layer0.register_forward_pre_hook(_add_input_term, with_kwargs=True)
    for module, enc in zip(attention_modules, layer_encodings):
        reference = next(iter(module.parameters()))
        enc.to(device=reference.device)
        for param in enc.parameters():  # parameters follow the model; buffers keep their precision (float64 RoPE tables)
            if param.is_floating_point():
                param.data = param.data.to(reference.dtype)
        setattr(module, ATTACHED, enc)
    for module in attention_modules:
        module.register_forward_pre_hook(_require_posenc, with_kwargs=True)
    register()
    model.set_attn_implementation(IMPLEMENTATION)


def swap_position_encoding(model: nn.Module, encoding: str, *, options: Mapping[str, Any] | None = None) -> nn.Module:
    """Replace ``model``'s own position mechanism by a posenc encoding in every layer, in place.

    Args:
        model: a Hugging Face ``PreTrainedModel`` of a supported type
            (:data:`SUPPORTED_MODEL_TYPES`: Llama, Qwen2, Mistral, GPT-2, BERT), any head.
        encoding: a registered sequence encoding (``posenc.available("seq")``) or ``"identity"``
            (the model's own encoding in posenc: RoPE from the config for the Llama family, the
            learned table copied for GPT-2 and BERT).
        options: constructor arguments for :func:`posenc.build` (the sizes ``dim``, ``num_heads``,
            ``head_dim`` and ``max_len`` come from the config). Plain JSON values: they are saved
            in ``model.config.posenc``. T5's ``bidirectional`` defaults to the model's attention.

    Returns ``model``, now with ``attn_implementation="posenc"``. The rest of the weights are kept.
    Refused (one line, nothing changed): an unsupported architecture, an encoding of another
    modality, a causal-only encoding in a bidirectional model, a linear-attention-only or
    between-blocks encoding, a model already swapped.
    """
    family, base = _family_of(model)
    if not isinstance(encoding, str):
        raise TypeError(f"encoding must be a registered sequence encoding name or 'identity'; got {type(encoding).__name__}")
    if encoding != IDENTITY:
        try:
            info = get(encoding)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        if info.modality != "seq":
            raise ValueError(f"encoding {encoding!r} is a {info.modality} encoding; a Hugging Face language model takes a "
                             "sequence encoding (posenc.available('seq'))")
    opts = _check_options(options)
    if family.is_swapped(base) or getattr(model.config, CONFIG_KEY, None) is not None:
        raise ValueError(f"this model already carries a posenc swap (config.{CONFIG_KEY}="
                         f"{getattr(model.config, CONFIG_KEY, None)!r}); swap the original model")
    _install(model, encoding, opts, copy_tables=True)
    setattr(model.config, CONFIG_KEY, {"format": RECORD_FORMAT, "encoding": encoding, "options": opts})
    return model


def swapped_encoding(model: nn.Module) -> dict[str, Any] | None:
    """The swap recorded in ``model.config`` (``{"format", "encoding", "options"}``), or None."""
    record = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    return None if record is None else dict(record)


def _check_record(record: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(record, Mapping) or set(record) != {"format", "encoding", "options"}:
        raise ValueError(f"config.{CONFIG_KEY} must be {{'format', 'encoding', 'options'}} as swap_position_encoding "
                         f"writes it; got {record!r}")
    if record["format"] != RECORD_FORMAT:
        raise ValueError(f"config.{CONFIG_KEY} has format {record['format']!r}; this posenc reads format {RECORD_FORMAT}")
    if not isinstance(record["encoding"], str):
        raise ValueError(f"config.{CONFIG_KEY}['encoding'] must be a name; got {record['encoding']!r}")
    return record["encoding"], _check_options(record["options"])


# --- registration --------------------------------------------------------------------------------------

_ORIGINALS: dict[str, Callable] = {}


def _post_init(self) -> None:
    _ORIGINALS["post_init"](self)
    record = getattr(self.config, CONFIG_KEY, None)
    if record is None or getattr(self.config, "model_type", None) not in _FAMILIES:
        return
    family, base = _family_of(self)
    if not family.is_swapped(base):
        name, options = _check_record(record)
        _install(self, name, options, copy_tables=False)


def _initialize_weights(self, module, *args, **kwargs):
    _restore_buffers(module)
    return _ORIGINALS["_initialize_weights"](self, module, *args, **kwargs)


def is_registered() -> bool:
    """Whether :func:`register` has run in this process."""
    return "post_init" in _ORIGINALS


def register() -> None:
    """Make ``attn_implementation="posenc"`` available to every transformers model, and let models
    built from a config that records a swap (``from_pretrained`` included) carry it. Idempotent."""
    AttentionInterface.register(IMPLEMENTATION, posenc_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    if is_registered():
        return
    _ORIGINALS["post_init"] = PreTrainedModel.post_init
    _ORIGINALS["_initialize_weights"] = PreTrainedModel._initialize_weights
    PreTrainedModel.post_init = _post_init
    PreTrainedModel._initialize_weights = _initialize_weights

