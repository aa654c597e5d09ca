"""The ``sdpa`` path: nothing touches the scores, the mask goes to SDPA's fused kernels.

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
