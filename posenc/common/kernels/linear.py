"""The linear-attention path: ``phi(Q) (phi(K)^T V)`` normalised by ``phi(Q) sum phi(K)``.

Causal attention (bottom-right aligned, as in the softmax core) runs over chunks of rows: inside a
chunk an explicit ``[B, H, C, C]`` block, across chunks a running state ``S = sum phi(k) v^T``
(``[B, H, m, D]``) and normaliser ``z = sum phi(k)``. Key padding zeroes the padded keys' features
and values, whatever they held. Packed sequences (each segment one contiguous run) carry the state
of the run that crosses a chunk boundary only; non-causal packing adds a second, backward scan for
the keys after the chunk. A sliding window, or segments that are not contiguous runs, have no
linear form (:func:`posenc.common.linear_attention.check_linear_mask`). Rows that see no key give
zeros, as in the softmax core."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..masks import AttentionMask
from ..pairwise import matvec

# Query rows per block of the causal / packed scan: the explicit block is [B, H, C, C].
LINEAR_CHUNK_ROWS = 64

FeatureFn = Callable[[Tensor, bool], Tensor]  # (x, is_query) -> features [..., m]


def linear_path(q: Tensor, k: Tensor, v: Tensor, feature_map: FeatureFn, mask: AttentionMask | None, chunk: int) -> Tensor:
    """Linear attention with ``feature_map(x, is_query)`` once the arguments are checked (by the
    plan, or by :func:`posenc.common.linear_attention.linear_attention`), in blocks of ``chunk``
    query rows where a mask needs the scan."""
    hq = q.shape[1]
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    phi_q = feature_map(q, True).to(work)  # [B, H, Tq, m]
    phi_k = feature_map(k, False).to(work)  # [B, Hkv, Tk, m] (SPE has expanded its keys to H heads)
    vw = v.to(work)
    if phi_k.shape[1] != hq:
        phi_k = phi_k.repeat_interleave(hq // phi_k.shape[1], dim=1)
    if vw.shape[1] != hq:
        vw = vw.repeat_interleave(hq // vw.shape[1], dim=1)
    if mask is not None:  # padded keys: zero features and values (NaN there must not reach a real row)
        phi_k, vw = mask.zero_padding(phi_k, vw)
    causal = mask is not None and mask.causal
    segments = None if mask is None else mask.q_segments
    if not causal and segments is None:
        state = torch.matmul(phi_k.transpose(-1, -2), vw)  # [B, H, m, D]
        norm = phi_k.sum(2)  # [B, H, m]
        num = torch.matmul(phi_q, state)
        den = matvec(phi_q, norm).unsqueeze(-1)  # [B, H, Tq, 1]
        return _divide(num, den).to(dtype)
    num, den = _scan(phi_q, phi_k, vw, causal, segments, chunk, forward=True)
    if not causal:  # packed, bidirectional: the keys after each block too
        num_after, den_after = _scan(phi_q, phi_k, vw, False, segments, chunk, forward=False)
        num, den = num + num_after, den + den_after
    return _divide(num, den).to(dtype)


def _divide(num: Tensor, den: Tensor) -> Tensor:
    # den == 0 only where a row sees no key (features are positive): zeros there, as in the core.
    seen = den > 0
    return torch.where(seen, num / torch.where(seen, den, torch.ones_like(den)), torch.zeros_like(num))


def _scan(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, causal: bool, segments: Tensor | None, chunk: int, forward: bool
) -> tuple[Tensor, Tensor]:
    """Numerator ``[B, H, Tq, D]`` and normaliser ``[B, H, Tq, 1]`` by blocks of ``chunk`` rows.

    ``forward``: each block sees the keys before it through the running state, and its own keys
    (causally masked when ``causal``, same-segment when packed) explicitly. Backward (non-causal
    packed only): the keys after each block through the state, and nothing of its own (the
    forward scan has counted those)."""
    bsz, h, tq, _ = phi_q.shape
    tk = phi_k.shape[2]
    offset = tk - tq  # bottom-right aligned causal mask: query i sees keys j <= i + offset
    dv = v.shape[-1]
    state = phi_q.new_zeros(bsz, h, phi_q.shape[-1], dv)  # S = sum phi(k) v^T over the run in the state
    norm = phi_q.new_zeros(bsz, h, phi_q.shape[-1])
    nums, dens = [], []
    starts = list(range(0, tq, chunk))
    # Blocks as pieces of one split, not slices: autograd then joins their gradients once
    # instead of adding a full-size zero tensor per block (quadratic in T). Key block i is the
    # keys of query block i, [s + offset, e + offset) clipped at 0, after a prefix of the keys
    # every query sees (a cache's).
    q_blocks = phi_q.split(chunk, dim=2)
    key_sizes = [max(offset, 0)] + [max(min(tq, s + chunk) + offset, 0) - max(s + offset, 0) for s in starts]
    k_parts, v_parts = phi_k.split(key_sizes, dim=2), v.split(key_sizes, dim=2)
    order = list(range(len(starts)))
    if not forward:
        order.reverse()
    carried = None  # segment id of the run held in the state, per batch row [B]
    if forward and offset > 0:
        state = torch.matmul(k_parts[0].transpose(-1, -2), v_parts[0])
        norm = k_parts[0].sum(2)
    for i in order:
        s = starts[i]
        e = min(tq, s + chunk)
        ks, ke = s + offset, e + offset  # this block's own keys (self-attention layout)
        qb = q_blocks[i]  # [B, H, C, m]
        kb, vb = k_parts[i + 1], v_parts[i + 1]  # [B, H, keys, m], [B, H, keys, D]
        seg_q = None if segments is None else segments[:, s:e]  # [B, C]
        # From the state: the keys outside the block (before it going forward, after it going
        # back); packed, only for the queries of the run the state holds.
        num = torch.matmul(qb, state)  # [B, H, C, D]
        den = matvec(qb, norm).unsqueeze(-1)  # [B, H, C, 1]
        if carried is not None:
            gate = (seg_q == carried[:, None]).to(qb.dtype)[:, None, :, None]  # [B, 1, C, 1]
            num, den = num * gate, den * gate
        lo, hi = max(ks, 0), max(ke, 0)
        if forward and hi > lo:  # going back, the forward scan has counted the block's own keys
            scores = torch.matmul(qb, kb.transpose(-1, -2))  # [B, H, C, keys]: this block only
            allowed = None
            if causal:
                q_idx = torch.arange(s, e, device=qb.device)[:, None] + offset
                allowed = (torch.arange(lo, hi, device=qb.device)[None, :] <= q_idx).to(qb.dtype)  # [C, keys]
            if segments is not None:
                same = (seg_q[:, :, None] == segments[:, lo - offset : hi - offset][:, None, :]).to(qb.dtype)
                allowed = same[:, None] if allowed is None else allowed * same[:, None]
            if allowed is not None:
                scores = scores * allowed
            num = num + torch.matmul(scores, vb)
            den = den + scores.sum(-1, keepdim=True)
        nums.append(num)
        dens.append(den)
        # the state after this block: every key so far, or, packed, the run at its far edge
        if segments is None:
            state = state + torch.matmul(kb.transpose(-1, -2), vb)
            norm = norm + kb.sum(2)
            continue
        seg_k = segments[:, lo - offset : hi - offset]  # [B, C] (self-attention: keys = queries)
        edge = seg_k[:, -1] if forward else seg_k[:, 0]  # the run at the block's far edge
        in_run = (seg_k == edge[:, None]).to(kb.dtype)[:, None, :, None]  # [B, 1, C, 1]
        block_state = torch.matmul((kb * in_run).transpose(-1, -2), vb)
        block_norm = (kb * in_run).sum(2)
        keep = torch.zeros_like(edge, dtype=kb.dtype) if carried is None else (carried == edge).to(kb.dtype)
        state = state * keep[:, None, None, None] + block_state
        norm = norm * keep[:, None, None] + block_norm
        carried = edge
    if not forward:
        nums.reverse()
        dens.reverse()
    return torch.cat(nums, dim=2), torch.cat(dens, dim=2)
