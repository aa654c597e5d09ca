"""The ``sdpa`` path: the mask goes to SDPA's fused kernels, and a bias of the key alone rides as one more
key column (:func:`key_column_path`).

A plain causal square is ``is_causal``; a packed row of contiguous segments runs SDPA per run
(:meth:`~posenc.common.masks.AttentionMask.packed_runs`); key padding is a ``[B, 1, 1, Tk]``
mask; anything else a dense boolean mask, with rows that see no key zeroed after the kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import AttentionMask


def _sdpa_per_run(q: Tensor, k: Tensor, v: Tensor, runs: list[tuple[int, int]], scale: float, gqa: bool) -> Tensor:
    """SDPA on each run of a packed row alone, runs of one length batched together; ``[1, H, T, D]``."""
    if len({b - a for a, b in runs}) == 1:  # runs of one length tile the row: a batch of runs, one call
        def split(t: Tensor) -> Tensor:  # [1, H, G * n, D] -> [G, H, n, D]
            return t[0].unflatten(1, (len(runs), -1)).transpose(0, 1)
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), scale=scale, enable_gqa=gqa)
        return out.transpose(0, 1).flatten(1, 2).unsqueeze(0)
    parts = [F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], scale=scale, enable_gqa=gqa)
             for a, b in runs]
    return torch.cat(parts, dim=2)


def sdpa_path(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, scale: float) -> Tensor:
    """Masks only: SDPA's fused kernels (``is_causal`` when the mask is a plain causal square)."""
    gqa = q.shape[1] != k.shape[1]
    tq, tk = q.shape[2], k.shape[2]
    if mask is None or mask.hides_nothing(tq):  # (a decoding step: no mask to build)
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    if mask.only_causal(tq, tk):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    runs = mask.packed_runs(q.shape[0], tq, tk)
    if runs is not None:
        return _sdpa_per_run(q, k, v, runs, scale, gqa)
    allowed = mask.smallest_dense(q.shape[0], tq, tk, q.device)  # [B or 1, 1, Tq or 1, Tk]
    row_any = allowed.any(dim=-1, keepdim=True)
    # A fully masked row attends everywhere inside the kernel (no NaN), and is zeroed after it.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~row_any, scale=scale, enable_gqa=gqa)
    return out.masked_fill(~row_any, 0.0)


#: The widened head dim is rounded up to a multiple of this: SDPA's CPU flash kernel runs a head
#: dim that fills whole SIMD vectors much faster than one that spills a single float over.
KEY_COLUMN_ALIGN = 8


def key_column_path(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, scale: float,
                    key_term: Tensor) -> Tensor:
    """SDPA with a bias of the key alone, ``q_i . k_j * scale + t[b, h, j]`` for ``key_term t
    [B or 1, Hq, Tk]``, written as ``[q_i, 1] . [k_j, t_j / scale] * scale``: each head widened by
    a column (and zeros up to :data:`KEY_COLUMN_ALIGN`), ``v`` by zeros, so SDPA's fused kernels
    run it and their key gradient carries the bias's. ``[B, Hq, Tq, Dv]``."""
    batch, heads, q_len, qk_dim = q.shape
    kv_len, v_dim = k.shape[2], v.shape[-1]
    if (key_term.dim() != 3 or key_term.shape[0] not in (1, batch) or key_term.shape[1] not in (1, heads)
            or key_term.shape[2] != kv_len or not key_term.is_floating_point()):
        raise ValueError(f"key_term must be a float tensor [{batch} or 1, {heads} or 1, {kv_len}] (batch, query heads, "
                         f"keys); got {tuple(key_term.shape)} {key_term.dtype}")
    if k.shape[1] != heads:  # the key term is per query head: the key heads are spread to them
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    width = -(-(max(qk_dim, v_dim) + 1) // KEY_COLUMN_ALIGN) * KEY_COLUMN_ALIGN
    term = key_term.to(k.dtype)
    # Centred per head, a constant for every row, which softmax drops: the column's largest
    # magnitude, and the rounding of the products it enters, is half the term's range.
    term = term - ((term.amax(-1, keepdim=True) + term.amin(-1, keepdim=True)) / 2).detach()
    column = (term / scale).expand(batch, heads, kv_len).unsqueeze(-1)  # [B, Hq, Tk, 1]
    q = torch.cat([q, q.new_ones(batch, heads, q_len, 1), q.new_zeros(batch, heads, q_len, width - qk_dim - 1)], -1)
    k = torch.cat([k, column, k.new_zeros(batch, heads, kv_len, width - qk_dim - 1)], -1)
    v = torch.cat([v, v.new_zeros(batch, heads, kv_len, width - v_dim)], -1)
    return sdpa_path(q, k, v, mask, scale)[..., :v_dim]
