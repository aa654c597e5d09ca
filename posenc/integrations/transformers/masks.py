"""Hugging Face attention masks read back as posenc masks, and where a call's queries and keys sit.

:func:`hf_mask_to_posenc` turns the 4D mask a transformers model passes to its attention function
into a structured :class:`~posenc.common.masks.AttentionMask` (causal, bidirectional, key padding,
packed documents, sliding window), or an additive bias when it is none of these.

:func:`posenc_mask` is the mask function registered as ``"posenc"`` (transformers'
``AttentionMaskInterface``): Hugging Face's boolean SDPA mask, which also records what the cache
told transformers when the mask was made (:class:`CacheLayout`: the index of the first query and
of the first key slot in the sequence). The attention function reads it back with
:func:`cache_layout`, so the keys' positions and the causal alignment come from the cache itself,
whatever its layout (a static cache's empty slots, a sliding window's kept keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformers.masking_utils import sdpa_mask

from ...common.masks import AttentionMask

_LAYOUT = "_posenc_cache_layout"  # the attribute of a mask tensor that carries its CacheLayout


@dataclass(frozen=True)
class CacheLayout:
    """Where one attention call's queries and keys sit in the sequence, as the cache told
    transformers (``cache.get_query_offset`` and ``cache.get_mask_sizes``) when the mask was made.

    ``q_offset``: the index of the first query (the number of tokens cached before this call);
    ``kv_offset``: the index of the key in slot 0 (0 except for a sliding window that dropped keys).
    Key slot ``j`` holds token ``kv_offset + j``; slots from ``q_offset + Tq - kv_offset`` on hold
    nothing yet (a static cache's empty slots)."""

    q_offset: int
    kv_offset: int

    def filled(self, q_len: int) -> int:
        """How many key slots hold a token: up to and including the last query's own."""
        return self.q_offset + q_len - self.kv_offset


def posenc_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int | Tensor = 0,
                kv_offset: int | Tensor = 0, **kwargs) -> Tensor | None:
    """transformers' ``sdpa_mask`` (a boolean ``[B, 1, Tq, Tk]`` mask, or None where SDPA's causal
    mode would do), carrying the call's :class:`CacheLayout`. The offsets are read now: a static
    cache's offset is a tensor that its layers advance before attention runs."""
    mask = sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, **kwargs)
    if mask is not None and not torch.compiler.is_compiling():
        setattr(mask, _LAYOUT, CacheLayout(int(q_offset), int(kv_offset)))
    return mask


def cache_layout(attention_mask: Tensor | None, q_len: int, kv_len: int) -> CacheLayout | None:
    """The layout of a call: the one its mask carries (made by :func:`posenc_mask`), else what
    transformers' attention contract says when there is no mask:

    * several queries: SDPA's causal mode, which aligns the first query with key slot 0 (a prefill
      into an empty static cache passes its empty slots and no mask);
    * one query: every key slot is visible, the query last.

    None for a mask that carries none (made inside ``torch.compile``, where the mask function
    records nothing, or by a caller), and for any mask while ``torch.compile`` traces (a layout
    read then would be a constant of the graph, one step's offsets, and each step would compile
    again): the mask itself then says where each row's last query sits (:func:`last_query_slots`).
    """
    if attention_mask is None:
        return CacheLayout(0, 0) if q_len > 1 else CacheLayout(max(kv_len - 1, 0), 0)
    if torch.compiler.is_compiling():
        return None
    layout = getattr(attention_mask, _LAYOUT, None)
    if layout is not None and q_len <= layout.filled(q_len) <= kv_len:
        return layout
    return None


def last_query_slots(attention_mask: Tensor) -> Tensor | None:
    """``[B or 1]``: the last key slot the last query may see, per batch row -- its own slot, in a
    causal or sliding-window mask whose last query is a real token (as in generation). Tensor
    operations only (no host read), so it serves inside ``torch.compile``. None for a mask that is
    not ``[B or 1, 1, Tq or 1, Tk]``."""
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        return None
    row = attention_mask[:, 0, -1, :]  # [B or 1, Tk]
    if row.dtype != torch.bool:
        if not row.is_floating_point():
            return None
        row = row > torch.finfo(row.dtype).min / 2
    slots = torch.arange(row.shape[-1], device=row.device)
    return torch.where(row, slots, -1).amax(-1)


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


def _check_dtype(dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (torch.float32, ...) for the additive bias; got "
                        f"{dtype!r}")


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
        causal: the module attends causally (the last query aligned with the last key).
        dtype: of the additive bias, when one is needed (a floating ``torch.dtype``).
        position_ids: ``[B or 1, Tq]``, to read a packed (block-diagonal) mask.
        window: the sliding window (Mistral, Qwen2), or None.

    A mask that is exactly causal/windowed/full with key padding, or block-diagonal over packed
    positions, becomes a structured :class:`AttentionMask` (the fused kernels serve it); anything
    else becomes ``attn_bias`` (``finfo.min`` where a boolean mask says no, so a row masked whole
    stays finite, as in Hugging Face's eager path), over a causal mask when it allows nothing
    above the diagonal.
    """
    _check_dtype(dtype)
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
