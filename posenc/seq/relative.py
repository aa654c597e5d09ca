"""Relative positions and clipped relative indices, shared by the relative encodings.

Sign convention: ``relative = key position - query position`` (``j - i``), as T5, Shaw and
DeBERTa write it: negative for keys before the query, positive for keys after it. Distance-based
biases (ALiBi, KERPLE) use ``i - j``, its negative.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..common.checks import check_int, check_positions, check_static_positions


def relative_positions(q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """``kv_pos[..., j] - q_pos[..., i]``: ``[..., Tq]`` and ``[..., Tk]`` (leading axes broadcast)
    -> ``[..., Tq, Tk]``, in the positions' dtype (exact for integers). Positions are real and
    finite, as the modules take them (float NaN or inf is a ValueError, read unless
    ``torch.compile`` traces; integer positions are never read)."""
    check_positions("q_pos", q_pos)
    check_positions("kv_pos", kv_pos)
    return kv_pos.unsqueeze(-2) - q_pos.unsqueeze(-1)


def relative_position_grid(q_len: int, k_len: int, *, offset: int | None = None, device=None) -> Tensor:
    """``j - (i + offset)`` for ``i < q_len``, ``j < k_len`` (long ``[q_len, k_len]``).

    ``offset`` is the position of query 0 minus that of key 0; the default ``k_len - q_len`` puts
    the queries at the end of the keys (a KV cache: new tokens after the cached ones; 0 when the
    lengths are equal), the convention of posenc's causal masks."""
    for name, value in (("q_len", q_len), ("k_len", k_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if offset is None:
        offset = k_len - q_len
    elif isinstance(offset, bool) or not isinstance(offset, int):
        raise ValueError(f"offset must be an int or None, got {offset!r}")
    q_pos = torch.arange(q_len, device=device) + offset
    return relative_positions(q_pos, torch.arange(k_len, device=device))


def clipped_relative_index(relative: Tensor, max_distance: int) -> Tensor:
    """``clip(relative, -K, K) + K`` (long, same shape): the row of a ``2K + 1``-row table of
    relative embeddings (Shaw et al. 2018), where offsets beyond ``K`` share the edge rows.
    ``K >= 1``, as :class:`posenc.seq.ShawRelative`'s ``max_relative``: with ``K = 0`` every offset
    would read the one row, a table that cannot tell positions apart."""
    check_int("max_distance", max_distance, minimum=1)
    check_static_positions("relative", relative, integer=True)
    return (relative.clamp(-max_distance, max_distance) + max_distance).long()
