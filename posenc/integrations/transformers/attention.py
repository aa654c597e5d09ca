"""The attention function registered as ``"posenc"`` in transformers' ``AttentionInterface``.

How a call maps onto posenc (Hugging Face has already projected q/k/v, applied its own RoPE -- an
identity after a swap -- and written the new keys into its cache, whatever its class):

* where the keys sit: :func:`~.masks.cache_layout` gives the index of the first query and of the
  first key slot, as the cache told transformers when the mask was made. Key slots past the last
  query's own hold nothing yet (a static cache's empty slots) and are cut off before anything
  runs, so causality is aligned with the last query, as transformers aligns it. A mask that
  records no layout (built inside ``torch.compile``, or by a caller) says itself where each row's
  last query sits (:func:`~.masks.last_query_slots`); nothing is cut then, the mask hides the
  empty slots.
* positions: the queries' from the ``position_ids`` the model passes (Llama, Qwen2, Mistral,
  GPT-2, ...; row 0 of Qwen's ``[4, B, T]``), else their indices in the sequence; a cached key's
  position is its index in the sequence shifted as the last query's (each row keeps its left
  padding's shift; padded keys are masked whatever their position). So a swapped RoPE's q/k
  transform runs on every key at each step (the cache holds keys before the transform), each at
  its own position, as in Hugging Face. (Llama 4's decoder layers pass no ``position_ids``: its
  layers get the indices, which its NoPE temperature reads in transformers too.)
* M-RoPE (an attached :class:`~posenc.seq.mrope.MRoPE`): ``(t, h, w)`` positions ``[B, T, 3]``,
  from ``position_ids`` of ``[3 or 4, B, T]`` when passed, else from the swapped model's rotary
  (the only module transformers gives them to); the cached keys' from those kept for the cache,
  else counted back on each axis (:mod:`.axes`).
* masks: Hugging Face's boolean 4D mask (or None) is read back by :func:`~.masks.hf_mask_to_posenc`.
* ``scaling`` is the score scale; ``dropout`` (training) takes :func:`attend_with_weights`;
  grouped-query keys (``Hkv < Hq``) go to the core as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...common.attention import attend, attend_with_weights
from ...common.encoding import Hook
from ...seq.mrope import MRoPE
from .axes import AXES_ATTR, as_axes, key_axes, query_axes
from .families import ATTACHED
from .masks import cache_layout, hf_mask_to_posenc, last_query_slots

_REFUSED_KWARGS = ("softcap", "s_aux")


def _query_positions(position_ids: Tensor | None, batch: int, q_len: int, first: int,
                     device) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The queries' positions: ``(positions [B or 1, Tq], text [B or 1, Tq] or None, axes [B, Tq, 3]
    or None)``. ``positions``: the text positions the model passed (``[B or 1, Tq]``, or row 0 of
    Qwen's ``[4, B, Tq]``), else the queries' indices in the sequence from ``first``; ``text`` the
    same when passed (it marks packed documents in the mask); ``axes`` M-RoPE's ``(t, h, w)`` when
    passed (``[3, B, Tq]`` or rows 1-3 of ``[4, B, Tq]``)."""
    text = axes = None
    if position_ids is not None:
        if not isinstance(position_ids, Tensor) or position_ids.dim() not in (1, 2, 3):
            got = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
            raise ValueError(f"posenc attention: position_ids must be [batch or 1, {q_len}], or M-RoPE's [3 or 4, "
                             f"batch, {q_len}]; got {got}")
        if position_ids.dim() == 3:
            if position_ids.shape[0] not in (3, 4) or position_ids.shape[1] not in (1, batch) \
                    or position_ids.shape[2] != q_len:
                raise ValueError(f"posenc attention: 3D position_ids must be M-RoPE's [3 (t, h, w) or 4 (text, t, h, "
                                 f"w), batch={batch} or 1, {q_len}]; got {tuple(position_ids.shape)}")
            axes = as_axes(position_ids[-3:].to(device))
            text = position_ids[0].to(device) if position_ids.shape[0] == 4 else None
        else:
            text = position_ids.unsqueeze(0) if position_ids.dim() == 1 else position_ids
            if text.shape[-1] != q_len or text.shape[0] not in (1, batch):
                raise ValueError(f"posenc attention: position_ids must be [batch={batch} or 1, {q_len}] for {q_len} "
                                 f"queries; got {tuple(position_ids.shape)}")
            text = text.to(device)
    positions = torch.arange(first, first + q_len, device=device).unsqueeze(0) if text is None else text
    return positions, text, axes


def _steps(count: int, like: Tensor) -> Tensor:
    """``0 .. count - 1`` along the token axis of positions ``like`` (``[B, T]`` or ``[B, T, axes]``)."""
    steps = torch.arange(count, device=like.device)
    return steps if like.dim() == 2 else steps.unsqueeze(-1)


def _key_positions(q_pos: Tensor, q_len: int, kv_len: int) -> Tensor:
    """``[B or 1, Tk]`` (``[B, Tk, 3]`` for M-RoPE's ``[B, Tq, 3]``, each axis alike) for keys whose
    last ``Tq`` slots are the queries' own: the queries' positions there, and before them
    consecutive positions ending right before the first query, counted back from the last query
    (in a left-padded row the last query is a real token; clamped at 0, the position Hugging Face
    gives padding, when the queries have no negative position)."""
    if kv_len == q_len:
        return q_pos
    if kv_len < q_len:  # fewer keys than queries: keys from elsewhere, at their own indices
        return _steps(kv_len, q_pos).unsqueeze(0).expand(1, kv_len, *q_pos.shape[2:])
    past = kv_len - q_len
    start = q_pos[:, -1:] - (q_len - 1) - past
    before = start + _steps(past, q_pos)
    if not q_pos.is_floating_point() and bool((q_pos >= 0).all()):
        before = before.clamp(min=0)
    return torch.cat([before.to(q_pos.dtype), q_pos], dim=1)


def _key_positions_by_slot(q_pos: Tensor, last_slot: Tensor, kv_len: int) -> Tensor:
    """``[B, Tk]`` (or ``[B, Tk, 3]``) when the mask alone says where each row's last query sits
    (``last_slot [B or 1]``): key slot ``j`` is ``last_slot - j`` tokens before it (slots after it
    are masked)."""
    slots = _steps(kv_len, q_pos)
    last = last_slot.to(q_pos.device)[:, None] if q_pos.dim() == 2 else last_slot.to(q_pos.device)[:, None, None]
    kv_pos = q_pos[:, -1:] - (last - slots)
    if not q_pos.is_floating_point() and bool((q_pos >= 0).all()):
        kv_pos = kv_pos.clamp(min=0)
    return kv_pos.to(q_pos.dtype)


def _check_tensors(query: Any, key: Any, value: Any) -> None:
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 4:
            got = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
            raise ValueError(f"posenc attention: {name} must be [batch, heads, tokens, head_dim] (4D, as transformers "
                             f"passes it); got {got}")
    if key.shape[:3] != value.shape[:3] or key.shape[0] != query.shape[0] or key.shape[-1] != query.shape[-1]:
        raise ValueError(f"posenc attention: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} must share batch and head_dim, key and value their tokens")


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

    The encoding attached to ``module`` by :func:`~.swap.swap_position_encoding` (none: plain
    attention) is applied by posenc's core. The keyword arguments read: ``position_ids`` (the
    queries' positions: ``[B or 1, Tq]``, or M-RoPE's ``[3 or 4, B, Tq]``), ``sliding_window``, ``position_bias`` (an additive bias, T5-style models)
    and ``output_attentions`` (the weights are returned); ``softcap`` and attention sinks (``s_aux``)
    are refused; the rest (cache bookkeeping, flash-attention lengths) do not change the result.
    """
    for name in _REFUSED_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"posenc attention does not support {name}; use attn_implementation='eager'")
    _check_tensors(query, key, value)
    encoding = getattr(module, ATTACHED, None)
    if encoding is not None and not (encoding.hooks - {Hook.INPUT}):
        encoding = None
    batch, _, q_len, _ = query.shape
    slots = key.shape[2]
    layout = cache_layout(attention_mask, q_len, slots)
    # the slots after the last query's own hold nothing yet
    kv_len = slots if layout is None else min(layout.filled(q_len), slots)
    position_bias = kwargs.get("position_bias")
    if kv_len < slots:
        key, value = key[:, :, :kv_len], value[:, :, :kv_len]
        if isinstance(attention_mask, Tensor) and attention_mask.dim() == 4 and attention_mask.shape[-1] == slots:
            attention_mask = attention_mask[..., :kv_len]
        if isinstance(position_bias, Tensor) and position_bias.shape[-1] == slots:
            position_bias = position_bias[..., :kv_len]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    first = max(slots - q_len, 0) if layout is None else layout.q_offset
    q_pos, text_pos, given_axes = _query_positions(kwargs.get("position_ids"), batch, q_len, first, query.device)
    last_slot = last_query_slots(attention_mask) if layout is None and slots > q_len else None
    kv_pos = None
    if isinstance(encoding, MRoPE):  # (t, h, w) positions: the cached keys' from the positions kept for the cache
        axes = getattr(module, AXES_ATTR, None)
        q_pos = query_axes(axes, given_axes, q_pos, q_len)
        kv_pos = key_axes(axes, q_pos, layout, kv_len)
    if kv_pos is None:  # counted back from the last query; without a recorded layout, from the mask's own slots
        kv_pos = (_key_positions(q_pos, q_len, kv_len) if last_slot is None
                  else _key_positions_by_slot(q_pos, last_slot, kv_len))
    if encoding is not None and kv_len > q_len and not encoding.supports_kv_cache:
        raise ValueError(f"{type(encoding).__name__} does not support a KV cache; call generate(..., use_cache=False)")
    window = kwargs.get("sliding_window")
    mask, bias = hf_mask_to_posenc(attention_mask, causal=causal, batch=batch, q_len=q_len, kv_len=kv_len,
                                   dtype=query.dtype, position_ids=text_pos,
                                   window=window)
    if position_bias is not None:
        bias = position_bias.to(query.dtype) if bias is None else bias + position_bias.to(query.dtype)
    want_weights = bool(kwargs.get("output_attentions", False))
    if dropout or want_weights:
        out, weights = attend_with_weights(query, key, value, q_pos=q_pos, kv_pos=kv_pos, encoding=encoding,
                                           mask=mask, scale=scaling, attn_bias=bias, dropout_p=float(dropout))
        if want_weights and kv_len < slots:  # the weights cover every slot, as transformers' own
            weights = torch.nn.functional.pad(weights, (0, slots - kv_len))
    else:
        out = attend(query, key, value, q_pos=q_pos, kv_pos=kv_pos, encoding=encoding, mask=mask, scale=scaling,
                     attn_bias=bias)
        weights = None
    return out.transpose(1, 2).contiguous(), weights if want_weights else None
