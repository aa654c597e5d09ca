"""The attention kernel paths. :func:`posenc.common.planning.decide` chooses among them and
:func:`posenc.common.attention.run` runs the chosen one.

``sdpa``   ``scaled_dot_product_attention``: nothing touches the scores (masks only).
``dense``  a score bias handed to a fused kernel chunk by chunk of query rows, inside a custom
           autograd function that recomputes each bias chunk in the backward pass, so no
           ``T x T`` tensor is kept; with causal masks each chunk stops at its last visible key.
           On CPU each chunk runs SDPA's flash kernel (forward and, for a constant bias,
           backward); a bias that needs a gradient gets an explicit chunked backward that also
           yields its gradient. Off CPU each chunk is computed explicitly.
``flex``   FlexAttention with the bias as ``score_mod`` and the mask as a ``BlockMask``
           (compiled on CUDA; eager elsewhere, forward only on CPU).
``math``   explicit ``softmax(QK^T * scale + bias) V``, row chunk by row chunk, each chunk
           recomputed and differentiated alone in the backward pass: the only path that exposes
           the scores and probabilities, for encodings with a score transform or a value term,
           and still no ``T x T`` tensor alive at once.

The chunks of ``dense`` (on CPU) and ``math`` run on a pool of single-threaded workers
(:mod:`.chunk_pool`), so that a busy core elsewhere does not stall every small operation.

Every path returns zeros for a query row whose keys are all masked, and no NaN in gradients.
Padded keys and values (``key_valid`` False) are zeroed before any path runs
(:meth:`~posenc.common.masks.AttentionMask.zero_padding`, in :func:`posenc.common.attention.attend`):
a masked score becomes ``-inf`` only after ``q.k`` is formed and ``0 * NaN`` is NaN in ``P V``, so
without it a NaN in padding would reach every real row. (A NaN in a real token hidden by the
causal or segment mask is not isolated: it already makes that token's own row NaN.)
Shapes: ``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]``; a ``block`` is a bias or mask over
``[B or 1, Hq or 1, rows, keys]``.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from . import chunk_pool
from .amp import autocast_off
from .checks import check_tensor
from .masks import AttentionMask
from .pairwise import (
    KeyLinearPart,
    PairwiseBias,
    offset_window,
    offset_window_grad,
    shared_run_offset,
)

# Default chunking (the plan may choose otherwise): query rows such that one [B, H, rows, Tk]
# block holds about this many elements, and at least _MIN_CHUNK_ROWS rows. Small enough to stay
# in cache-friendly sizes, large enough to keep the per-chunk overhead (and the number of
# parallel regions, which cost most when another process holds a core) small.
_CHUNK_ELEMENTS = 1 << 20
_MIN_CHUNK_ROWS = 16
# The math path's chunks for a transform that works in tiles of its own (``tiled_transform``:
# CAPE) hold this many times that: fewer, taller chunks mean fewer passes of the chunk machinery
# and larger products (B=4 H=8 T=1024: 64-row chunks, CAPE 525 -> 496 and 569 -> 552 ms a
# training step against 32-row ones, alternate rounds; 128 rows slower again). CoPE's transform
# keeps several blocks of its own per chunk: the same taller chunks left its time unchanged
# (477 -> 479 ms) for 35 MB more peak memory, so it keeps the default.
_MATH_CHUNK_FACTOR = 2
_MIN_TALL_CHUNKS = 4
# The explicit backward of a learned bias goes through a chunk's batch and heads in groups of
# about this many score elements (it keeps two such buffers, P and dS): half the chunk budget,
# so that they stay closer to cache (T5 at T=1024: 128-row chunks with 4-head groups, fewer
# dk, dv parts to add than 64-row chunks, the same buffers).
_BACKWARD_GROUP_ELEMENTS = 1 << 19
# Query rows per banded product of the offset value term (its work grows with rows + K per row).
_OFFSET_CHUNK_ROWS = 128


# --- private aten kernels: every call to them goes through these two functions ---------------
# tests/test_kernels_aten.py compares the schemas below with the installed torch, so a change of
# signature fails loudly there instead of silently here.

CPU_FLASH_FORWARD_SCHEMA = (
    "aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, "
    "float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) "
    "-> (Tensor output, Tensor logsumexp)"
)
CPU_FLASH_BACKWARD_SCHEMA = (
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, "
    "Tensor key, Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, "
    "Tensor? attn_mask=None, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)"
)


def cpu_flash_forward(q: Tensor, k: Tensor, v: Tensor, block: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """SDPA's CPU flash kernel with an additive float ``block`` ``[B or 1, H or 1, Tq, Tk]``.

    ``q [B, H, Tq, D]``, ``k, v [B, H, Tk, D]`` -> ``out [B, H, Tq, D]``, ``lse [B, H, Tq]``
    (float32 for float32 and half inputs, float64 for float64)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=block, scale=scale)


def cpu_flash_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, block: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of :func:`cpu_flash_forward` for a constant ``block``: ``(dq, dk, dv)``."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out.contiguous(), q, k, v, out, lse.contiguous(), 0.0, False, attn_mask=block, scale=scale
    )


def chunk_rows(batch_rows: int, heads: int, kv_len: int, q_len: int, elements: int | None = None) -> int:
    """Query rows per chunk so that a ``[batch_rows, heads, rows, kv_len]`` block holds about
    ``elements`` elements (default ``_CHUNK_ELEMENTS``; at least ``_MIN_CHUNK_ROWS``, at most ``q_len``)."""
    rows = (_CHUNK_ELEMENTS if elements is None else elements) // max(1, batch_rows * heads * kv_len)
    return max(1, min(max(q_len, 1), max(_MIN_CHUNK_ROWS, rows)))


def math_chunk_rows(batch_rows: int, heads: int, kv_len: int, q_len: int) -> int:
    """Query rows per chunk of the math path for a ``tiled_transform``: :func:`chunk_rows` with
    ``_MATH_CHUNK_FACTOR`` times its budget (a constant that does not grow with the length), but
    never fewer than ``_MIN_TALL_CHUNKS`` chunks where the default gives that many: the chunks
    run on the pool's workers, and one chunk leaves a worker idle (CAPE in the models bench's LM,
    B=8 T=256: 490 -> 635 ms a step with one 256-row chunk against two of 128 rows)."""
    rows = chunk_rows(batch_rows, heads, kv_len, q_len)
    tall = chunk_rows(batch_rows, heads, kv_len, q_len, _MATH_CHUNK_FACTOR * _CHUNK_ELEMENTS)
    return tall if -(-q_len // tall) >= _MIN_TALL_CHUNKS else max(rows, -(-q_len // _MIN_TALL_CHUNKS))


def dense_chunk_rows(batch: int, heads: int, kv_len: int, q_len: int, per_batch: bool) -> int:
    """Query rows per chunk of the dense path. A bias and mask that differ along the batch are a
    ``[B, H, rows, Tk]`` block per chunk; one shared by the batch is ``[1, H, rows, Tk]``, learned
    or not: the fused kernel reads it broadcast, and the explicit backward of a learned bias goes
    through the batch in groups of that size. Taller chunks mean fewer ``dk, dv`` parts to add
    up and larger matmuls (T5 at B=4, T=1024: 1.36x -> 1.27x bare SDPA)."""
    return chunk_rows(batch if per_batch else 1, heads, kv_len, q_len)


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _indices(n: int, device) -> Tensor:
    return torch.arange(n, device=device)


_MAX_PACKED_RUNS = 4096  # more runs than this: one masked call beats that many small ones


def _packed_runs(mask: AttentionMask, batch: int, q_len: int, kv_len: int) -> list[tuple[int, int]] | None:
    """``[(start, stop), ...]``: the runs of one packed batch row whose segments are contiguous
    (a PyG batch: each graph's nodes together), when the mask is those segments alone over the
    same queries and keys; None otherwise (the dense mask). Each run then attends only to itself,
    so the ``T x T`` mask and the work on pairs across runs are never made (a host sync, so not
    under ``torch.compile``)."""
    if (mask.q_segments is None or mask.kv_segments is not mask.q_segments or mask.causal or mask.window is not None
            or mask.key_valid is not None or batch != 1 or q_len != kv_len or q_len == 0
            or torch.compiler.is_compiling()):
        return None
    ids, counts = torch.unique_consecutive(mask.q_segments[0], return_counts=True)
    if ids.numel() > _MAX_PACKED_RUNS or (ids.numel() > 1 and torch.unique(ids).numel() != ids.numel()):
        return None  # too many runs, or a segment id in two places: not contiguous runs
    stops = torch.cumsum(counts, 0).tolist()
    return list(zip([0, *stops[:-1]], stops))


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
    runs = _packed_runs(mask, q.shape[0], tq, tk)
    if runs is not None:
        return _sdpa_per_run(q, k, v, runs, scale, gqa)
    if mask.only_key_padding:
        allowed = mask.key_valid[:, None, None, :]  # [B, 1, 1, Tk]: no T x T tensor
    else:
        allowed = mask.dense(q.shape[0], _indices(tq, q.device), _indices(tk, q.device), tq, tk)
    row_any = allowed.any(dim=-1, keepdim=True)
    # A fully masked row attends everywhere inside the kernel (no NaN), and is zeroed after it.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~row_any, scale=scale, enable_gqa=gqa)
    return out.masked_fill(~row_any, 0.0)


def _allowed(
    mask: AttentionMask | None, batch: int, q_idx: Tensor, kv_idx: Tensor, q_len: int, kv_len: int
) -> Tensor | None:
    """The mask's ``allowed [B or 1, 1, rows, keys]`` at these indices, or None where nothing is
    hidden (no mask, or a cached decoding step's causal row, which sees every key: no mask tensor,
    no masked softmax)."""
    if mask is None or mask.hides_nothing(q_len):
        return None
    return mask.dense(batch, q_idx, kv_idx, q_len, kv_len)


def _bias_block(
    bias: PairwiseBias,
    mask: AttentionMask | None,
    batch: int,
    heads: int,
    q_idx: Tensor,
    kv_idx: Tensor,
    q_len: int,
    kv_len: int,
    dtype: torch.dtype,
    block: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Float bias for the given rows with masked entries at -inf, and a ``[B, 1, rows, 1]`` marker
    of the rows that see some key (None without a mask). No data-dependent branch: torch.compile
    traces it whole. ``block``: the bias already evaluated at these rows, if the caller has it."""
    # Half-precision inputs still get a float32 bias: a bf16 bias of -500 is off by 2 (fused
    # kernels accept a float32 mask beside bf16/fp16 q, k, v).
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    block = bias.dense(batch, heads, q_idx, kv_idx, dtype=dtype) if block is None else block.to(dtype)
    allowed = _allowed(mask, batch, q_idx, kv_idx, q_len, kv_len)
    if allowed is None:
        return block, None
    if mask.only_causal(q_len, kv_len):  # every row sees its first key: no marker, nothing to zero after
        return torch.where(allowed, block, float("-inf")), None
    row_any = allowed.any(dim=-1, keepdim=True)
    # A row that sees no key attends everywhere inside the kernel (no NaN) and is zeroed after it.
    return torch.where(allowed | ~row_any, block, float("-inf")), row_any


def _row_chunks(q_len: int, kv_len: int, chunk: int, causal: bool):
    """``(start, end, kv_end)`` per chunk of query rows; with a causal mask a chunk stops at its
    last visible key."""
    offset = kv_len - q_len
    for s in range(0, q_len, chunk):
        e = min(q_len, s + chunk)
        yield s, e, (max(1, min(kv_len, e + offset)) if causal else kv_len)


def _largest_first(chunks) -> list[tuple[int, int, int]]:
    """``(start, end, kv_end)`` chunks ordered by their pairs ``(end - start) * kv_end``, largest
    first (ties in the given order). The workers take chunks in this order, and with a causal
    mask the last rows' chunk holds several times the first's pairs: started last, it ran alone
    while the other worker idled (in row order a chunked forward took 10% longer on 2 cores)."""
    return sorted(chunks, key=lambda c: -(c[1] - c[0]) * c[2])


def _chunk_backward_with_bias_grad(
    learned: list[Tensor],
    block: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    scale: float,
    live: Tensor | None,
    grad_lse: Tensor | None = None,
    score_grad_shape: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor | None]]:
    """Attention backward for one chunk of query rows, written out so that the score gradient
    ``dS`` is at hand: it is also the gradient of the bias, passed on to the tensors it was built
    from. ``P = exp(S - lse)``, ``dS = P * (dO V^T - rowsum(dO * O) + dlse)``. ``block`` is the masked
    bias of the chunk; ``live`` the same bias unmasked, still attached to ``learned`` (None when
    nothing is learned); ``grad_lse`` the gradient of the chunk's log-sum-exp, if it is used.
    ``score_grad_shape``: instead of gradients of ``learned``, return ``[dS summed to this shape]``
    (the caller takes the bias gradient from there).

    A bias shared by the batch (``block [1, H or 1, rows, keys]``) is chunked for one batch
    element (see :func:`dense_chunk_rows`); the chunk then goes through the batch and heads in
    groups (:func:`_backward_groups`) whose buffers keep to ``_BACKWARD_GROUP_ELEMENTS``, and
    ``dS`` is summed over the batch. Each buffer is written once by the operation that makes it:
    the bias minus the log-sum-exp, then ``scale * Q K^T`` added by the matmul itself
    (``baddbmm``), exponentiated in place; ``dO V^T`` minus ``delta`` the same way, times ``P`` in
    place; ``dq, dk, dv`` straight from the matmuls."""
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q, k, v, out, grad_out = (t.to(work) for t in (q, k, v, out, grad_out))
    block = block.to(work)
    b, h, rows, d = q.shape
    keys = k.shape[2]
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # [B, H, rows, 1]
    if grad_lse is not None:  # d lse_i / d S_ij = P_ij
        delta = delta - grad_lse.to(work).unsqueeze(-1)
    lse = lse.to(work).unsqueeze(-1)  # [B, H, rows, 1]
    shared, one_head = block.shape[0] == 1, block.shape[1] == 1
    wants_score_grad = score_grad_shape is not None or bool(learned)
    gq, gk, gv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous: written by bmm
    score_grad = None
    for b0, b1, h0, h1 in _backward_groups(b, h, rows * keys, shared):
        n = (b1 - b0) * (h1 - h0)
        # [n, rows or keys, D]: views where the slices are contiguous in (batch, head)
        q3, k3, v3, do3 = (t[b0:b1, h0:h1].reshape(n, -1, d) for t in (q, k, v, grad_out))
        bias = block if one_head else block[:, h0:h1]
        probs = q.new_empty((b1 - b0, h1 - h0, rows, keys))
        torch.sub(bias if shared else bias[b0:b1], lse[b0:b1, h0:h1], out=probs)
        p3 = probs.view(n, rows, keys).baddbmm_(q3, k3.transpose(1, 2), alpha=scale).exp_()
        # dS in the dO V^T buffer: [n, rows, keys]
        ds3 = torch.baddbmm(delta[b0:b1, h0:h1].reshape(n, rows, 1), do3, v3.transpose(1, 2), beta=-1).mul_(p3)
        torch.bmm(ds3, k3, out=gq[b0:b1, h0:h1].view(n, rows, d)).mul_(scale)
        torch.bmm(ds3.transpose(1, 2), q3, out=gk[b0:b1, h0:h1].view(n, keys, d)).mul_(scale)
        torch.bmm(p3.transpose(1, 2), do3, out=gv[b0:b1, h0:h1].view(n, keys, d))
        del probs, p3
        if wants_score_grad:
            part = ds3.view(b1 - b0, h1 - h0, rows, keys)
            if not shared:  # one group: the whole chunk
                score_grad = part
            else:
                part = part.sum(0, keepdim=True) if b1 - b0 > 1 else part
                if one_head:
                    part = part.sum(1, keepdim=True)
                    score_grad = part if score_grad is None else score_grad.add_(part)
                else:
                    if score_grad is None:
                        score_grad = q.new_empty((1, h, rows, keys))
                    if b0 == 0:  # the first batch element of these heads: written, not added
                        score_grad[:, h0:h1] = part
                    else:
                        score_grad[:, h0:h1] += part
        del ds3
    grads: tuple = ()
    if score_grad is not None:
        target = score_grad_shape if score_grad_shape is not None else live.shape
        score_grad = score_grad.sum_to_size(target)
        if score_grad_shape is not None:
            grads = (score_grad,)
        else:
            grads = torch.autograd.grad(live, learned, score_grad.to(live.dtype), allow_unused=True)
    return gq, gk, gv, list(grads)


def _backward_groups(batch: int, heads: int, pairs: int, shared: bool) -> list[tuple[int, int, int, int]]:
    """``(b0, b1, h0, h1)`` ranges that cover a chunk's ``batch x heads`` in the explicit
    backward, each with at most ``_BACKWARD_GROUP_ELEMENTS`` score elements (``pairs`` per
    head), or one when ``rows x keys`` alone is more. Several batch elements per group only with
    every head, so each group is contiguous in ``[B, H, ...]``; the batch and heads in order, so
    the score gradient's first write of each head comes from batch element 0. A bias that
    differs along the batch (``shared`` False) is a block of the whole batch already: one group."""
    if not shared:
        return [(0, batch, 0, heads)]
    per_group = max(1, _BACKWARD_GROUP_ELEMENTS // max(1, pairs))  # (batch, head) pairs per group
    if per_group >= heads:
        step = min(batch, per_group // heads)
        return [(b0, min(batch, b0 + step), 0, heads) for b0 in range(0, batch, step)]
    step = per_group
    return [(b0, b0 + 1, h0, min(heads, h0 + step)) for b0 in range(batch) for h0 in range(0, heads, step)]


def _chunk_forward(q: Tensor, k: Tensor, v: Tensor, block: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """One chunk of rows with its bias block: ``(out [B, H, rows, D], lse [B, H, rows])``. The CPU
    flash kernel on CPU; elsewhere explicit (``[B, H, rows, keys]`` scores live for the chunk only)."""
    if q.device.type == "cpu":
        return cpu_flash_forward(q, k, v, block, scale)
    return _explicit_forward(q, k, v, block, scale)


def _explicit_forward(q: Tensor, k: Tensor, v: Tensor, block: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """``(softmax(scale Q K^T + block) V, lse)`` as plain differentiable operations, the scores
    ``[B, H, rows, keys]`` in float32 for half-precision inputs: ``(out [B, H, rows, D], lse [B, H, rows])``."""
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)) * scale + block.to(work)  # [B, H, rows, keys]
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, rows]
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.to(work))  # [B, H, rows, D]
    return out.to(q.dtype), lse


def _key_linear_forward(
    q: Tensor, k: Tensor, v: Tensor, part: KeyLinearPart, allowed: Tensor | None, scale: float, with_lse: bool,
) -> tuple[Tensor, Tensor | None]:
    """A few rows without gradients whose bias has a part linear in the keys (:class:`~posenc.
    common.pairwise.KeyLinearPart`): the bias's weights go through the product with the keys as
    extra query rows, ``[s q; w] k^T``, so the keys are read once for the content scores and the
    bias (DeBERTa's decoding step: its separate product over the keys beyond the span and the
    fused kernel's own pass read them twice), then softmax and the values explicitly, the scores
    in float32 for half-precision inputs. Rows that see no key are zero, with ``lse`` -inf.
    ``q [B, H, R, D]``, ``k, v [B, H, Tk, D]``, ``allowed [B or 1, 1, R, Tk]`` or None ->
    ``(out [B, H, R, Dv], lse [B, H, R] or None without with_lse)``.

    Where the linear term reaches every key (``stop == Tk``), nothing is masked and ``q`` is
    float32 or float64 on CPU, ``s q.k + w.k = s (q + w / s).k``: the query moves by the weights
    and SDPA's fused kernel takes the rest as its float mask, reading the keys once and the
    values once with no scores tensor (DeBERTa's decoding step, batch 8, context 512, steps
    alternated in one process: 0.71-0.73 -> 0.73-0.78x RoPE's in three runs). Half-precision
    queries keep the explicit form: the moved query would be rounded to their precision."""
    if part.stop == k.shape[2] and allowed is None and q.device.type == "cpu" and q.dtype in (torch.float32,
                                                                                            torch.float64):
        moved = q + part.weights.to(q.dtype) / scale  # [B, H, R, D]
        out, lse = cpu_flash_forward(moved, k, v, part.rest.to(q.dtype), scale)
        return out, (lse if with_lse else None)
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    b, h, r, _ = q.shape
    rows = torch.cat((q.to(work) * scale, part.weights.to(work).expand(b, h, r, -1)), dim=2)  # [B, H, 2R, D]
    products = torch.matmul(rows, k.to(work).transpose(-1, -2))  # [B, H, 2R, Tk]
    scores = products[:, :, :r] + part.rest.to(work)  # [B, H, R, Tk], a new tensor
    if part.stop:
        scores[..., : part.stop] += products[:, :, r:, : part.stop]
    lse = None
    if with_lse:
        lse = torch.logsumexp(scores if allowed is None else torch.where(allowed, scores, float("-inf")), dim=-1)
    out = torch.matmul(masked_softmax(scores, allowed), v.to(work))  # [B, H, R, Dv]
    return out.to(q.dtype), lse


def consecutive_offset(
    bias: PairwiseBias | None, mask: AttentionMask | None, q_pos: Tensor, kv_pos: Tensor, q_len: int, kv_len: int
) -> int | None:
    """``kv_pos[0] - q_pos[0]`` when ``bias`` can be laid out on diagonals (see
    :class:`_OffsetBias`): it has ``by_offset``, the positions are integer runs of consecutive
    values shared by the batch, and the mask is none or causal only with every query seeing a
    key. None otherwise (the general per-element path)."""
    if bias is None or bias.by_offset is None or bias.per_batch or torch.compiler.is_compiling():
        return None
    if mask is not None and (mask.key_valid is not None or mask.q_segments is not None or mask.window is not None
                             or (mask.causal and q_len > kv_len)):
        return None
    if q_len == 0 or kv_len == 0:
        return None
    return shared_run_offset(q_pos, kv_pos)


class _OffsetBias:
    """A bias of the offset alone over consecutive positions, as one row of values per head.

    ``values [H or 1, Tq + Tk - 1]``: column ``m`` is the bias where ``j - i = m - (Tq - 1)``
    (query index ``i``, key index ``j``), a causal mask folded in as ``-inf``. The block of query
    rows ``s:e`` and keys ``:kv_end`` is a window of it (:func:`~posenc.common.pairwise.
    offset_window`: one copy; no index tensor, no per-element gather, no mask tensor). Its
    gradient goes back along the diagonals to ``values`` and from there, once per call, to the
    tensors ``by_offset`` read.
    """

    def __init__(self, bias: PairwiseBias, start: int, q_len: int, kv_len: int, causal: bool, device) -> None:
        self.bias, self.q_len, self.kv_len, self.causal = bias, q_len, kv_len, causal
        self.offsets = torch.arange(start - q_len + 1, start + kv_len, device=device)  # [Tq + Tk - 1]

    def values(self, dtype: torch.dtype) -> Tensor:
        if dtype in (torch.float16, torch.bfloat16):  # a float32 bias beside half inputs (see _bias_block)
            dtype = torch.float32
        values = self.bias.by_offset(self.offsets).to(dtype)  # [H or 1, Tq + Tk - 1]
        if self.causal and self.q_len > 1:  # key j visible from query i when j - i <= Tk - Tq, i.e. column m <= Tk - 1
            hidden = _indices(values.shape[-1], values.device) > self.kv_len - 1
            values = values.masked_fill(hidden, float("-inf"))
        return values

    def block(self, values: Tensor, s: int, e: int, kv_end: int) -> Tensor:
        """``[1, H or 1, e - s, kv_end]``: the bias of query rows ``s:e`` over keys ``:kv_end``."""
        return offset_window(values, self.q_len, s, e, kv_end).unsqueeze(0)

    def values_grad(self, grad_block: Tensor, width: int, s: int, e: int) -> Tensor:
        """The gradient of ``values [H or 1, width]`` from the gradient of one block
        ``[1, H or 1, rows, kv_end]``: the sum along each diagonal."""
        return offset_window_grad(grad_block[0], width, self.q_len, s, e)


def _forward_rows(
    q: Tensor, k: Tensor, v: Tensor, bias: PairwiseBias, mask: AttentionMask | None, offsets: "_OffsetBias | None",
    values: Tensor | None, idx: Tensor, s: int, e: int, kv_end: int, scale: float,
) -> tuple[Tensor, Tensor]:
    """Query rows ``s:e`` against keys ``:kv_end`` with their bias block (cut from ``values`` of
    ``offsets``, or evaluated): ``(out [B, H, rows, D], lse [B, H, rows])``, rows that see no key
    zeroed."""
    b, h, tq, _ = q.shape
    if values is not None:  # every row sees a key (consecutive_offset checked it)
        block, row_any = offsets.block(values, s, e, kv_end), None  # [1, H or 1, rows, kv_end]
    else:  # [B or 1, H, rows, kv_end] (masked entries -inf), row_any [B or 1, 1, rows, 1]
        # the whole call's block of a dense table is the table itself
        whole = bias.table if s == 0 and e == tq and kv_end == k.shape[2] else None
        block, row_any = _bias_block(bias, mask, b, h, idx[s:e], idx[:kv_end], tq, k.shape[2], q.dtype, whole)
    o, lse = _chunk_forward(q[:, :, s:e], k[:, :, :kv_end], v[:, :, :kv_end], block, scale)
    return (o if row_any is None else o.masked_fill(~row_any, 0.0)), lse


class _ChunkedBiasAttention(torch.autograd.Function):
    """Fused attention over chunks of query rows, with the bias recomputed per chunk.

    Only ``q, k, v``, the output and the log-sum-exp are saved; each bias chunk lives only while
    its kernel runs, in the forward and again in the backward pass. A constant bias goes through
    the flash kernel's backward on CPU; a bias that needs a gradient (T5 tables, learned slopes,
    content-dependent tables), or any bias off CPU, gets the chunked explicit backward, which also
    yields the bias gradient, so it too keeps no ``T x T`` tensor. ``learned`` are the tensors the
    bias reads that may need a gradient.

    Returns ``(out [B, H, Tq, D], lse [B, H, Tq])``; the log-sum-exp of each query row is
    differentiable too (an encoding's fused value term reads probabilities as ``exp(S - lse)``),
    its gradient folded into ``dS``.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale, chunk, offsets, *learned):
        ctx.set_materialize_grads(False)
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = mask is not None and mask.causal
        out = q.new_empty(q.shape)  # [B, H, Tq, D]
        lse = q.new_empty((b, h, tq), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
        idx = _indices(max(tq, tk), q.device)
        values = None if offsets is None else offsets.values(q.dtype)  # [H or 1, Tq + Tk - 1]

        def run(chunk_rows: tuple[int, int, int]) -> None:
            s, e, kv_end = chunk_rows
            o, chunk_lse = _forward_rows(q, k, v, bias, mask, offsets, values, idx, s, e, kv_end, scale)
            out[:, :, s:e] = o  # chunks own disjoint rows
            lse[:, :, s:e] = chunk_lse

        for _ in chunk_pool.ordered_map(run, _largest_first(_row_chunks(tq, tk, chunk, causal))):
            pass
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.bias, ctx.mask, ctx.scale, ctx.chunk, ctx.learned = bias, mask, scale, chunk, learned
        ctx.offsets = offsets
        return out, lse

    @staticmethod
    @autocast_off
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        bias, mask, scale, chunk = ctx.bias, ctx.mask, ctx.scale, ctx.chunk
        wanted = [i for i, need in enumerate(ctx.needs_input_grad[8:]) if need]
        learned = [ctx.learned[i] for i in wanted]
        learned_grads: list[Tensor | None] = [None] * len(ctx.learned)
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = mask is not None and mask.causal
        fused_backward = q.device.type == "cpu"
        dq = torch.empty_like(q)
        idx = _indices(max(tq, tk), q.device)
        offsets, values, values_live = ctx.offsets, None, None
        if offsets is not None:
            if learned:  # the values once, attached; the chunks give the gradient of a detached copy
                with torch.enable_grad():
                    values_live = offsets.values(q.dtype)  # [H or 1, Tq + Tk - 1]
                values = values_live.detach()
            else:
                values = offsets.values(q.dtype)

        def run(chunk_rows: tuple[int, int, int]):
            """One chunk's gradients: writes its rows of dq, returns ``(kv_end, dk part, dv part, learned grads)``."""
            s, e, kv_end = chunk_rows
            live = None
            chunk_grad_lse = None if grad_lse is None else grad_lse[:, :, s:e]
            if values is not None:
                block, row_any = offsets.block(values, s, e, kv_end), None  # [1, H or 1, rows, kv_end]
            else:
                if learned:  # evaluate the bias once, attached to the tensors that need its gradient
                    with torch.enable_grad():
                        live = bias.dense(b, h, idx[s:e], idx[:kv_end])  # [B or 1, H, rows, kv_end]
                block, row_any = _bias_block(
                    bias, mask, b, h, idx[s:e], idx[:kv_end], tq, tk, q.dtype,
                    block=None if live is None else live.detach(),
                )
            g = grad_out[:, :, s:e]  # [B, H, rows, D]
            if row_any is not None:
                g = g.masked_fill(~row_any, 0.0)
            grads: list[Tensor | None] = []
            if learned or chunk_grad_lse is not None or not fused_backward:
                gq, gk, gv, grads = _chunk_backward_with_bias_grad(
                    learned if values_live is None else [], block, q[:, :, s:e], k[:, :, :kv_end], v[:, :, :kv_end],
                    out[:, :, s:e], lse[:, :, s:e], g, scale, live, chunk_grad_lse,
                    score_grad_shape=None if values_live is None else block.shape,
                )
                if values_live is not None:
                    grads = [offsets.values_grad(grads[0].to(values.dtype), values.shape[-1], s, e)]
            else:
                gq, gk, gv = cpu_flash_backward(
                    g, q[:, :, s:e], k[:, :, :kv_end], v[:, :, :kv_end], out[:, :, s:e], lse[:, :, s:e], block, scale,
                )
            dq[:, :, s:e] = gq  # chunks own disjoint rows
            return kv_end, gk, gv, grads

        # Last chunk first: with a causal mask it spans every key, so its gradients become dk, dv
        # without a zero-filled buffer beside them. Parts are added in this fixed order.
        dk = dv = None
        grad_values = None
        for kv_end, gk, gv, grads in chunk_pool.ordered_map(run, reversed(list(_row_chunks(tq, tk, chunk, causal)))):
            if values_live is not None:
                if grads and grads[0] is not None:
                    grad_values = grads[0] if grad_values is None else grad_values + grads[0]
            else:
                for i, grad in zip(wanted, grads):
                    if grad is not None:
                        learned_grads[i] = grad if learned_grads[i] is None else learned_grads[i] + grad
            if dk is None and kv_end == tk:
                dk, dv = gk.to(k.dtype), gv.to(v.dtype)
                continue
            if dk is None:
                dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            dk[:, :, :kv_end] += gk
            dv[:, :, :kv_end] += gv
            del gk, gv
        if values_live is not None and grad_values is not None:
            for i, grad in zip(wanted, torch.autograd.grad(values_live, learned, grad_values, allow_unused=True)):
                learned_grads[i] = grad
        return (dq, dk, dv, None, None, None, None, None, *learned_grads)


def dense_path(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, bias: PairwiseBias, scale: float,
    chunk: int | None = None, return_lse: bool = False, offset_start: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """A score bias handed to a fused kernel, ``chunk`` query rows at a time (default: the
    :func:`chunk_rows` budget). ``return_lse``: also the differentiable log-sum-exp ``[B, H, Tq]``
    of each query row's scores. ``offset_start``: :func:`consecutive_offset` of the call, when not
    None the bias blocks are cut from its ``by_offset`` values. ``q [B, Hq, Tq, D]``,
    ``k, v [B, Hkv, Tk, D]`` -> ``[B, Hq, Tq, D]``."""
    groups = q.shape[1] // k.shape[1]
    b, h, tq, _ = q.shape
    learned = bias.learned if bias.requires_grad else ()
    if torch.compiler.is_compiling() and learned:
        # Traced, with a bias that needs gradients: the whole bias as one block under plain
        # autograd, which the compiler differentiates and fuses (the chunked Function's backward
        # asks torch.autograd.grad for the bias gradient, which dynamo does not trace: a graph
        # break per layer). Its scores are [B, H, Tq, Tk]. A constant bias keeps the chunked
        # Function, whose fused kernels trace.
        return _traced_dense(q, _repeat_kv(k, groups), _repeat_kv(v, groups), mask, bias, scale, return_lse)
    if chunk is None:
        chunk = dense_chunk_rows(b, h, k.shape[2], tq, bias.per_batch or (mask is not None and mask.per_batch))
    # Compact once when the tensors are read more than once (saved for the backward, whose chunk
    # matmuls would each copy the views again, or read by several chunks): q, k, v usually arrive
    # as transposed views of the projections. A single chunk without gradients (a cached decoding
    # step) reads the views as they are: its keys are a slice of the KV cache's longer buffer, and
    # a copy would cost every step the whole cache in every layer.
    if tq > chunk or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        q = q.contiguous()  # [B, Hq, Tq, D]
        k, v = _repeat_kv(k, groups).contiguous(), _repeat_kv(v, groups).contiguous()  # [B, Hq, Tk, D]
    else:
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    offsets = None
    tk = k.shape[2]
    if offset_start is not None:
        offsets = _OffsetBias(bias, offset_start, tq, tk, mask is not None and mask.causal, q.device)
    if tq <= chunk and not learned and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        # One chunk, no gradients (a cached decoding step, inference): the kernel on the whole
        # call, without the autograd node and the chunk machinery around it.
        idx = _indices(max(tq, tk), q.device)
        if bias.key_linear is not None and offsets is None:
            allowed = _allowed(mask, b, idx[:tq], idx[:tk], tq, tk)
            out, lse = _key_linear_forward(q, k, v, bias.key_linear, allowed, scale, return_lse)
        else:
            values = None if offsets is None else offsets.values(q.dtype)
            out, lse = _forward_rows(q, k, v, bias, mask, offsets, values, idx, 0, tq, tk, scale)
    else:
        out, lse = _ChunkedBiasAttention.apply(q, k, v, bias, mask, scale, chunk, offsets, *learned)
    return (out, lse) if return_lse else out


def _traced_dense(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, bias: PairwiseBias, scale: float, return_lse: bool,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`dense_path`'s result written as plain differentiable operations for a traced call:
    ``softmax(scale Q K^T + bias)`` with masked entries out and rows that see no key zeroed.
    ``q [B, H, Tq, D]``, ``k, v [B, H, Tk, D]`` (key heads repeated)."""
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    idx = _indices(max(tq, tk), q.device)
    block, row_any = _bias_block(bias, mask, b, h, idx[:tq], idx[:tk], tq, tk, q.dtype)  # [B or 1, H, Tq, Tk]
    out, lse = _explicit_forward(q, k, v, block, scale)
    if row_any is not None:
        out = out.masked_fill(~row_any, 0.0)
    return (out, lse) if return_lse else out


def contiguous_causal(mask: AttentionMask | None, q_pos: Tensor, kv_pos: Tensor, q_len: int, kv_len: int) -> bool:
    """True when the mask is causal only and the positions are one run of consecutive integers
    shared by the batch, the queries being the last ``Tq`` of it (self-attention, a KV cache):
    then ``pos_j - pos_i = j - (i + Tk - Tq)`` and each relative offset is one diagonal."""
    if mask is None or not mask.causal or mask.key_valid is not None or mask.q_segments is not None:
        return False
    if mask.window is not None or q_pos.dim() != 2 or kv_pos.dim() != 2 or q_pos.shape[0] != 1 or kv_pos.shape[0] != 1:
        return False
    if q_pos.dtype.is_floating_point or kv_pos.dtype.is_floating_point or torch.compiler.is_compiling():
        return False  # (traced: the check reads the positions, a graph break; the general path serves)
    start = kv_pos[0, 0]
    return bool(
        torch.equal(kv_pos[0], start + _indices(kv_len, kv_pos.device))
        and torch.equal(q_pos[0], start + (kv_len - q_len) + _indices(q_len, q_pos.device))
    )


def offset_value_term(
    q: Tensor, k: Tensor, bias: PairwiseBias, lse: Tensor, table: Tensor, scale: float
) -> Tensor:
    """``z_i = sum_j P_ij table[clip(pos_j - pos_i, -K, K) + K]`` (Shaw's value term) without the
    probability matrix, for causal attention over consecutive positions (:func:`contiguous_causal`).

    Under the causal mask the offsets are ``<= 0``: the keys ``K - 1`` or fewer places back sit on
    ``K`` diagonals, and every other visible key shares the clipped slot 0. As each visible row's
    probabilities sum to one, ``z_i = W_0 + sum_t P_(i, i' - K + 1 + t) (W_(t+1) - W_0)``, where
    ``i' = i + Tk - Tq`` and ``P_ij = exp(S_ij - lse_i)`` needs only the scores on those diagonals
    (a banded product per chunk of rows, on the worker pool like the other chunked terms). Exact,
    and differentiable in ``q, k``, the bias's ``learned``, ``lse`` and ``table``.
    ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]``, ``lse [B, H, Tq]``, ``table [2K + 1, Dv]`` ->
    ``[B, H, Tq, Dv]``.
    """
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q = q.to(work).contiguous()  # [B, H, Tq, D]
    # (not copied: a chunk reads a window of keys, and a KV cache's keys are a view of its buffer)
    k = _repeat_kv(k.to(work), q.shape[1] // k.shape[1])  # [B, H, Tk, D]
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    kmax = (table.shape[0] - 1) // 2
    offset = tk - tq
    idx = _indices(max(tq, tk), q.device)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, lse, table, *bias.learned))
    if tq == 1 and tk >= kmax and not grad:
        # One row seeing at least K keys, without gradients (a cached decoding step): its K
        # diagonals are its last K keys, in order; a few operations instead of the chunk's
        # index arithmetic, which cost several times the products here.
        w = table.to(work)
        window = k[:, :, tk - kmax:]  # [B, H, K, D]
        scores = torch.matmul(q, window.transpose(-1, -2)) * scale  # [B, H, 1, K]
        last = (bias.table[..., tk - kmax:] if bias.table is not None  # (a dense bias: a slice of it)
                else bias.dense(b, h, idx[:1], idx[tk - kmax: tk]))
        scores = scores + last.to(work)
        probs = torch.exp(scores - lse.to(work)[..., None])
        return (torch.matmul(probs, w[1: kmax + 1] - w[0]) + w[0]).to(dtype)
    slots = _indices(kmax, q.device)

    def rows_term(s: int, e: int, kv_end: int, rows: list[Tensor], keys: list[Tensor]) -> Tensor:
        (q_rows, lse_rows), (k_seen,) = rows, keys  # [B, H, rows, D], [B, H, rows], [B, H, kv_end, D]
        start = max(0, s + offset - (kmax - 1))  # first key on any of the chunk's diagonals
        window = k_seen[:, :, start:kv_end]  # [B, H, W, D]
        scores = torch.matmul(q_rows, window.transpose(-1, -2)) * scale  # [B, H, rows, W]
        scores = scores + bias.dense(b, h, idx[s:e], idx[start:kv_end], dtype=work)
        kv_idx = idx[s:e, None] + offset - (kmax - 1) + slots  # [rows, K]: key of each (row, diagonal)
        col = (kv_idx - start).clamp(0, window.shape[2] - 1)
        diag = scores.gather(-1, col.expand(b, h, -1, -1))  # [B, H, rows, K]
        probs = torch.exp(diag - lse_rows.to(work)[..., None]) * (kv_idx >= 0)
        w = table.to(work)  # [2K + 1, Dv]
        seen = (idx[s:e] + offset >= 0).to(work)[:, None]  # [rows, 1]: rows with some visible key
        return torch.matmul(probs, w[1 : kmax + 1] - w[0]) + seen * w[0]  # [B, H, rows, Dv]

    chunks = [
        (s, min(tq, s + _OFFSET_CHUNK_ROWS), max(1, min(tk, min(tq, s + _OFFSET_CHUNK_ROWS) + offset)))
        for s in range(0, tq, _OFFSET_CHUNK_ROWS)
    ]
    out = _row_chunked(rows_term, chunks, [q, lse], [k], _frontier(bias.learned, (table,)))
    return out.to(dtype)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # Default dynamism: a fixed training length compiles once; a length that changes (cached
    # decoding) recompiles once with dynamic shapes instead of once per length.
    return torch.compile(flex_attention)


# Each encoding's score_mod, each mask_mod and each prefill/decode shape is an entry in the one
# compiled flex_attention's cache. Past dynamo's default limit (8) torch runs the unfused flex
# instead, which materializes every score (seen on an H200: ALiBi's prefill of 512 tokens took
# 4.6 s after the bench had compiled a few other encodings).
FLEX_RECOMPILE_LIMIT = 64


def run_compiled_flex(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """The compiled flex_attention with room for :data:`FLEX_RECOMPILE_LIMIT` cache entries
    while it runs (dynamo reads the limit when a call misses the cache); inside a caller's own
    ``torch.compile`` the call is traced into their graph and their settings apply."""
    import torch._dynamo.config as dynamo_config

    before = dynamo_config.recompile_limit
    if torch.compiler.is_compiling() or before >= FLEX_RECOMPILE_LIMIT:
        return _compiled_flex()(q, k, v, **kwargs)
    # set and restored by hand: config.patch costs 26 us a call, four layers of every decoding step
    dynamo_config.recompile_limit = FLEX_RECOMPILE_LIMIT
    try:
        return _compiled_flex()(q, k, v, **kwargs)
    finally:
        dynamo_config.recompile_limit = before


def flex_path(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, bias: PairwiseBias | None, scale: float
) -> Tensor:
    """FlexAttention: the bias as ``score_mod``, the mask as a ``BlockMask``."""
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = None
    # (a causal mask over one query, a cached decoding step, hides nothing: no BlockMask to build
    # at every step for a key count that changes at every step)
    if mask is not None and not mask.hides_nothing(q.shape[2]):
        block_mask = mask.block_mask(q.shape[0], q.shape[2], k.shape[2], q.device)
    score_mod = None
    if bias is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias(b, h, q_idx, kv_idx).to(score.dtype)

    kwargs = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if q.device.type == "cuda":
        return run_compiled_flex(q, k, v, **kwargs)
    if not torch.is_grad_enabled():
        # torch refuses CPU flex for inputs that merely *could* need a gradient.
        q, k, v = q.detach(), k.detach(), v.detach()
    with warnings.catch_warnings():
        # Eager flex is the unfused reference implementation; fine off CUDA, where it is only asked for.
        warnings.simplefilter("ignore")
        return flex_attention(q, k, v, **kwargs)


ScoreTransform = Callable[[Tensor, Tensor, Tensor, slice, slice, "Tensor | None"], Tensor]
# (scores, centered_grad, q_rows, k_keys, rows, keys, allowed) -> (probs, d_scores, ((tensor, grad), ...)) or None
TransformSoftmaxBackward = Callable[
    [Tensor, Tensor, Tensor, Tensor, slice, slice, "Tensor | None"],
    "tuple[Tensor, Tensor, tuple[tuple[Tensor, Tensor], ...]] | None",
]
ValueTerm = Callable[[Tensor, slice, slice], Tensor]


@dataclass(frozen=True)
class EncodingTerms:
    """What an encoding adds to one call's scores and probabilities, as the kernels take it.

    Attributes:
        bias: the score bias (the encoding's and a caller's ``attn_bias``, summed).
        prob_bias: an after-softmax bias (eRPE).
        score_transform: ``(scores, q_rows, k_keys, rows, keys, allowed) -> scores`` over whole
            score blocks ``[B, H, rows, keys]`` (CAPE, CoPE).
        value_term: ``(probs, rows, keys) -> [B, H, rows, Dv]`` added to ``P V`` (Shaw values).
        transform_softmax_backward: the encoding's
            :meth:`~posenc.common.encoding.PositionEncoding.transform_softmax_backward` over whole
            blocks ``(scores, centered_grad, q_rows, k_keys, rows, keys, allowed)``, or None.
        transform_inputs: the tensors ``score_transform`` and ``value_term`` read that may need a
            gradient (the encoding's :meth:`~posenc.common.encoding.PositionEncoding.math_parameters`).
    """

    bias: PairwiseBias | None = None
    prob_bias: PairwiseBias | None = None
    score_transform: ScoreTransform | None = None
    value_term: ValueTerm | None = None
    transform_inputs: tuple[Tensor, ...] = ()
    transform_softmax_backward: TransformSoftmaxBackward | None = None


NO_TERMS = EncodingTerms()


def _call_rows(rows_fn, chunk: tuple[int, int, int], rows_in, keys_in) -> Tensor:
    """``rows_fn`` on one chunk: the row inputs sliced to its rows, the key inputs to its keys."""
    s, e, kv_end = chunk
    return rows_fn(s, e, kv_end, [t[:, :, s:e] for t in rows_in], [t[:, :, :kv_end] for t in keys_in])


class _RowChunks(torch.autograd.Function):
    """``rows_fn(s, e, kv_end, rows, keys) -> [B, H, e - s, Dout]`` for each chunk of query rows,
    concatenated, with the chunks on the worker pool in both passes and nothing but the inputs
    kept between them: each chunk is recomputed in the backward pass and differentiated alone.

    Inputs: ``n_rows`` tensors sliced to the chunk's rows (``[..., s:e, :]``), ``n_keys`` tensors
    sliced to its visible keys (``[..., :kv_end, :]``), then ``others``: the tensors ``rows_fn``
    reads by closure that may need a gradient (a bias's ``learned``, an encoding's parameters).
    They must not depend on one another, or a gradient would be counted twice. Gradients are
    added up in chunk order (bitwise reproducible)."""

    @staticmethod
    def forward(ctx, rows_fn, chunks, n_rows, n_keys, *tensors):
        ctx.set_materialize_grads(False)
        rows_in, keys_in = tensors[:n_rows], tensors[n_rows : n_rows + n_keys]
        order = _largest_first(chunks)
        done = dict(zip(order, chunk_pool.ordered_map(lambda c: _call_rows(rows_fn, c, rows_in, keys_in), order)))
        parts = [done[chunk] for chunk in chunks]  # back in row order for the concatenation
        ctx.rows_fn, ctx.chunks, ctx.n_rows, ctx.n_keys = rows_fn, chunks, n_rows, n_keys
        ctx.others = tensors[n_rows + n_keys :]  # the captured objects themselves: autograd.grad targets
        ctx.save_for_backward(*tensors[: n_rows + n_keys])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    @staticmethod
    @autocast_off
    def backward(ctx, grad_out):
        if grad_out is None:
            return (None,) * (4 + ctx.n_rows + ctx.n_keys + len(ctx.others))
        saved = ctx.saved_tensors
        rows_in, keys_in = saved[: ctx.n_rows], saved[ctx.n_rows :]
        needs = ctx.needs_input_grad[4:]
        others = ctx.others

        def run(chunk):
            s, e, kv_end = chunk
            with torch.enable_grad():
                rows = [t[:, :, s:e].detach().requires_grad_(need) for t, need in zip(rows_in, needs)]
                keys = [t[:, :, :kv_end].detach().requires_grad_(need) for t, need in zip(keys_in, needs[ctx.n_rows :])]
                out = ctx.rows_fn(s, e, kv_end, rows, keys)
                targets = [t for t in (*rows, *keys) if t.requires_grad]
                targets += [t for t, need in zip(others, needs[ctx.n_rows + ctx.n_keys :]) if need]
                if not targets or not out.requires_grad:
                    return s, e, kv_end, [None] * (len(rows) + len(keys) + len(others))
                found = iter(torch.autograd.grad(out, targets, grad_out[:, :, s:e], allow_unused=True))
            grads = [next(found) if t.requires_grad else None for t in (*rows, *keys)]
            grads += [next(found) if need else None for need in needs[ctx.n_rows + ctx.n_keys :]]
            return s, e, kv_end, grads

        total: list[Tensor | None] = [None] * len(needs)
        for s, e, kv_end, grads in chunk_pool.ordered_map(run, _largest_first(ctx.chunks)):
            for i, g in enumerate(grads):
                if g is None:
                    continue
                if i < ctx.n_rows + ctx.n_keys:
                    source = saved[i]
                    if total[i] is None:
                        total[i] = torch.zeros_like(source)
                    if i < ctx.n_rows:
                        total[i][:, :, s:e] = g
                    else:
                        total[i][:, :, :kv_end] += g
                else:
                    total[i] = g if total[i] is None else total[i] + g
        return (None, None, None, None, *total)


def _row_chunked(rows_fn, chunks, rows_in: list[Tensor], keys_in: list[Tensor], others: list[Tensor]) -> Tensor:
    """:class:`_RowChunks`, or the same chunks as plain operations while ``torch.compile``
    traces (which plans memory itself) and for one chunk without gradients (a decoding step,
    where the pool and the autograd function cost more than the chunk)."""
    one = len(chunks) == 1 and not (torch.is_grad_enabled()
                                    and any(t.requires_grad for t in (*rows_in, *keys_in, *others)))
    if torch.compiler.is_compiling() or one:  # (one chunk without gradients: a decoding step)
        parts = [_call_rows(rows_fn, chunk, rows_in, keys_in) for chunk in chunks]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return _RowChunks.apply(rows_fn, chunks, len(rows_in), len(keys_in), *rows_in, *keys_in, *others)


def _frontier(*groups) -> list[Tensor]:
    """The tensors of ``groups`` that may need a gradient, each once."""
    seen, out = set(), []
    for group in groups:
        for t in group:
            if isinstance(t, Tensor) and t.requires_grad and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def _math_block(
    q_rows: Tensor,
    k: Tensor,
    v: Tensor,
    q_idx: Tensor,
    kv_idx: Tensor,
    rows: slice,
    keys: slice,
    q_len: int,
    kv_len: int,
    mask: AttentionMask | None,
    terms: EncodingTerms,
    scale: float,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """One block of query rows of the explicit path: ``(out [B, H, rows, D], weights [B, H, rows,
    keys])``, ``weights`` being the matrix applied to ``V``: the probabilities after dropout (with
    probability ``dropout_p``, kept entries scaled by ``1 / (1 - p)``) plus the after-softmax
    bias. ``q_rows``, ``k``, ``v`` are in the working dtype with the key heads repeated."""
    prob_bias, value_term = terms.prob_bias, terms.value_term
    b, h = q_rows.shape[:2]
    scores, allowed = _transformed_scores(q_rows, k, q_idx, kv_idx, rows, keys, q_len, kv_len, mask, terms, scale)
    if allowed is not None:
        row_any = allowed.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~row_any, 0.0)
    probs = torch.softmax(scores, dim=-1)  # [B, H, rows, keys]
    if allowed is not None:
        probs = probs.masked_fill(~allowed, 0.0)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    if prob_bias is not None:
        extra = prob_bias.dense(b, h, q_idx, kv_idx, dtype=probs.dtype)
        probs = probs + (extra if allowed is None else extra.masked_fill(~allowed, 0.0))
    out = torch.matmul(probs, v)  # [B, H, rows, D]
    if value_term is not None:
        out = out + value_term(probs, rows, keys)
    return out, probs


class _ChunkedTransformAttention(torch.autograd.Function):
    """The math path of a score transform (CAPE, CoPE) without value term or after-softmax bias,
    with the attention written out as the dense path's explicit backward writes it: only ``q, k,
    v`` and the output are kept between the passes. Per chunk of query
    rows the backward recomputes ``S = scale * Q K^T (+ bias)`` and the transform ``A = f(S)``
    under autograd (the transform alone is recorded), forms ``P = softmax(mask(A))`` again and
    ``dA = P * (dO V^T - rowsum(dO * O))`` directly, and asks autograd for the transform's
    vector-Jacobian product at ``dA``: ``dS`` and the gradients of whatever the transform and the
    bias read (``q``, ``k``, the encoding's parameters, the bias's ``learned``). The generic
    chunks (:class:`_RowChunks`) differentiate the masking, softmax and both matmuls through
    autograd as well: fewer, larger kernels here (CAPE at B=4 H=8 T=1024 on 2 cores, against
    bare SDPA: about the same quiet, 2.85x -> 2.15x with a busy process beside it). An encoding
    with its own backward of transform and softmax (``terms.transform_softmax_backward``, CAPE and
    CoPE on CPU) takes each chunk's ``S`` and ``dO V^T - rowsum(dO * O)`` and returns ``P``, ``dS`` and its
    tensors' gradients instead (CAPE at B=4 H=8 T=1024, attention alone on 2 cores, alternate
    steps: 0.92-0.93x the time, 455 -> 416 ms).

    ``others``: the tensors the transform and the bias read by closure that may need a
    gradient; they must not depend on one another. Returns ``[B, H, Tq, D]`` in the working
    dtype; ``q, k, v`` arrive compact in that dtype with the key heads repeated."""

    @staticmethod
    def forward(ctx, q, k, v, mask, terms, scale, chunk, *others):
        ctx.set_materialize_grads(False)
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = mask is not None and mask.causal
        out = q.new_empty(q.shape)  # [B, H, Tq, D]
        idx = _indices(max(tq, tk), q.device)

        def run(rows: tuple[int, int, int]) -> None:
            s, e, _ = rows
            out[:, :, s:e] = _transform_chunk(q, k, v, rows, idx, mask, terms, scale)  # chunks own disjoint rows

        for _ in chunk_pool.ordered_map(run, _largest_first(_row_chunks(tq, tk, chunk, causal))):
            pass
        ctx.save_for_backward(q, k, v, out)
        ctx.mask, ctx.terms, ctx.scale, ctx.chunk, ctx.others = mask, terms, scale, chunk, others
        return out

    @staticmethod
    @autocast_off
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        if grad_out is None:
            return (None,) * (7 + len(ctx.others))
        mask, terms, scale, others = ctx.mask, ctx.terms, ctx.scale, ctx.others
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        wanted = [t for t, need in zip(others, ctx.needs_input_grad[7:]) if need]
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = mask is not None and mask.causal
        idx = _indices(max(tq, tk), q.device)
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # [B, H, Tq, 1]
        dq = torch.empty_like(q)
        # the encoding's own backward of transform and softmax, where it has one (only the
        # transform's own terms: a score bias beside it goes through autograd with the transform)
        fused = terms.transform_softmax_backward is not None and terms.bias is None

        def qk_grads(d_raw: Tensor, rows: tuple[int, int, int], k_c: Tensor, q_scaled: Tensor,
                     extra_q: Tensor | None, extra_k: Tensor | None) -> Tensor | None:
            """A chunk's ``dq`` rows (written) and ``dk`` part (returned) from ``d_raw``, the gradient
            of ``scale q.k``, plus what the transform sent to ``q`` and ``k`` directly."""
            s, e, _ = rows
            if need_q:
                gq = torch.matmul(d_raw, k_c).mul_(scale)  # [B, H, rows, D]
                if extra_q is not None:
                    gq += extra_q
                dq[:, :, s:e] = gq  # chunks own disjoint rows
            if not need_k:
                return None
            gk = torch.matmul(d_raw.transpose(-1, -2), q_scaled)  # [B, H, keys, D]
            return gk if extra_k is None else gk.add_(extra_k)

        def fused_run(rows: tuple[int, int, int], q_scaled: Tensor, raw: Tensor, centered: Tensor):
            """The chunk through the encoding's own backward of transform and softmax, or None."""
            s, e, kv_end = rows
            q_c, k_c, g = q[:, :, s:e], k[:, :, :kv_end], grad_out[:, :, s:e]
            allowed = _allowed(mask, b, idx[s:e], idx[:kv_end], tq, tk)
            done = terms.transform_softmax_backward(raw, centered, q_c, k_c, slice(s, e), slice(0, kv_end), allowed)
            if done is None:
                return None
            probs, d_raw, pairs = done
            gv = torch.matmul(probs.transpose(-1, -2), g) if need_v else None  # [B, H, keys, D]
            del probs
            by_id = {id(t): grad for t, grad in pairs}  # q_c and k_c too, for a transform that reads them
            gk = qk_grads(d_raw, rows, k_c, q_scaled, by_id.get(id(q_c)), by_id.get(id(k_c)))
            return kv_end, gk, gv, [by_id.get(id(t)) for t in wanted]

        def run(rows: tuple[int, int, int]):
            s, e, kv_end = rows
            q_c, k_c, v_c, g = q[:, :, s:e], k[:, :, :kv_end], v[:, :, :kv_end], grad_out[:, :, s:e]
            q_scaled = q_c * scale  # [B, H, rows, D]: scaled here, not the [rows, keys] block
            raw = torch.matmul(q_scaled, k_c.transpose(-1, -2))  # [B, H, rows, keys]
            centered = None  # dO V^T - delta, made before the transform's backward only where a fused one reads it
            if fused:
                centered = torch.matmul(g, v_c.transpose(-1, -2)).sub_(delta[:, :, s:e])
                done = fused_run(rows, q_scaled, raw, centered)
                if done is not None:
                    return done
            with torch.enable_grad():
                q_leaf = q_c.detach().requires_grad_(need_q)
                k_leaf = k_c.detach().requires_grad_(need_k)
                raw.requires_grad_()
                scores, allowed = _transformed_scores(q_leaf, k_leaf, idx[s:e], idx[:kv_end], slice(s, e),
                                                      slice(0, kv_end), tq, tk, mask, terms, scale, raw=raw)
            with torch.no_grad():
                probs = masked_softmax(scores.detach(), allowed)  # [B, H, rows, keys], as in the forward
                gv = torch.matmul(probs.transpose(-1, -2), g) if need_v else None  # [B, H, keys, D]
                if centered is None:
                    centered = torch.matmul(g, v_c.transpose(-1, -2)).sub_(delta[:, :, s:e])
                d_scores = centered.mul_(probs)
                del probs
            targets = [raw, *(t for t in (q_leaf, k_leaf) if t.requires_grad), *wanted]
            found = list(torch.autograd.grad(scores, targets, d_scores, allow_unused=True))
            d_raw = found.pop(0)  # d(scale q.k) for the chunk: [B, H, rows, keys]
            d_raw = torch.zeros_like(raw) if d_raw is None else d_raw  # None: a transform that drops the scores
            gq_extra = found.pop(0) if q_leaf.requires_grad else None
            gk_extra = found.pop(0) if k_leaf.requires_grad else None
            return kv_end, qk_grads(d_raw, rows, k_c, q_scaled, gq_extra, gk_extra), gv, found

        # Last chunk first: with a causal mask it spans every key (see _ChunkedBiasAttention).
        dk = dv = None
        grads: list[Tensor | None] = [None] * len(wanted)
        for kv_end, gk, gv, found in chunk_pool.ordered_map(run, reversed(list(_row_chunks(tq, tk, ctx.chunk, causal)))):
            for i, grad in enumerate(found):
                if grad is not None:
                    grads[i] = grad if grads[i] is None else grads[i] + grad
            for name, part in (("k", gk), ("v", gv)):
                if part is None:
                    continue
                total = dk if name == "k" else dv
                if total is None and kv_end == tk:
                    total = part
                else:
                    if total is None:
                        total = torch.zeros_like(k)
                    total[:, :, :kv_end] += part
                if name == "k":
                    dk = total
                else:
                    dv = total
        found = iter(grads)
        others_grads = [next(found) if need else None for need in ctx.needs_input_grad[7:]]
        return (dq if need_q else None, dk, dv, None, None, None, None, *others_grads)


def _transform_chunk(
    q: Tensor, k: Tensor, v: Tensor, rows: tuple[int, int, int], idx: Tensor, mask: AttentionMask | None,
    terms: EncodingTerms, scale: float,
) -> Tensor:
    """The forward of one chunk ``rows = (start, end, kv_end)`` of a score transform without value
    term or after-softmax bias: ``softmax(mask(transform(scale Q K^T + bias))) V`` for query rows
    ``start:end`` against keys ``:kv_end``, ``[B, H, end - start, D]``. ``q [B, H, Tq, D]``,
    ``k, v [B, H, Tk, D]`` in the working dtype with the key heads repeated."""
    s, e, kv_end = rows
    scores, allowed = _transformed_scores(q[:, :, s:e], k[:, :, :kv_end], idx[s:e], idx[:kv_end], slice(s, e),
                                          slice(0, kv_end), q.shape[2], k.shape[2], mask, terms, scale)
    return torch.matmul(masked_softmax(scores, allowed), v[:, :, :kv_end])


def _transformed_scores(
    q_rows: Tensor, k: Tensor, q_idx: Tensor, kv_idx: Tensor, rows: slice, keys: slice, q_len: int, kv_len: int,
    mask: AttentionMask | None, terms: EncodingTerms, scale: float, raw: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``transform(scale * Q K^T + bias)`` for the query rows ``rows`` (indices ``q_idx``) and the
    keys ``keys`` (``kv_idx``) (``raw``: ``scale * Q K^T`` already made), and the mask's ``allowed
    [B or 1, 1, rows, keys]`` (None without a mask). ``q_rows``, ``k`` in the working dtype with
    the key heads repeated."""
    b, h = q_rows.shape[:2]
    if raw is None:
        raw = torch.matmul(q_rows * scale, k.transpose(-1, -2))  # [B, H, rows, keys] (the small side scaled)
    scores = raw
    if terms.bias is not None:
        scores = scores + terms.bias.dense(b, h, q_idx, kv_idx, dtype=raw.dtype)
    allowed = _allowed(mask, b, q_idx, kv_idx, q_len, kv_len)
    if terms.score_transform is not None:
        scores = terms.score_transform(scores, q_rows, k, rows, keys, allowed)
    return scores, allowed


def masked_softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
    """``P [B, H, rows, keys]``: the softmax of ``scores`` over the keys ``allowed`` marks
    (``[B or 1, 1, rows, keys]``; the entries outside it are zero, and so is a row that sees no
    key). ``scores`` is not written. The masked scores in one pass (``torch.where``, not a copy
    then a fill); on CPU a block whose every row sees a key (causal self-attention) skips the
    pass that zeroes the others (CAPE and CoPE at B=4, T=1024: 5-8% of the step).
    ``torch.softmax`` rather than ``exp(S - lse)``: on CPU its exponential stays fast where
    ``exp_`` and ``logsumexp`` slow down 10-50x on scores far below the row's maximum (denormal
    and underflowing results, as an ALiBi bias of -500 gives). Checks the shapes and dtypes, not
    the values."""
    check_tensor("scores", scores, floating=True, min_ndim=1)
    if allowed is not None:
        check_tensor("allowed", allowed)
        if allowed.dtype != torch.bool or allowed.dim() != scores.dim() or any(
                a not in (1, s) for a, s in zip(allowed.shape, scores.shape)):
            raise ValueError(f"allowed must be None or a bool mask that broadcasts to scores {tuple(scores.shape)} "
                             f"without growing them; got {allowed.dtype} {tuple(allowed.shape)}")
    if allowed is None:
        return torch.softmax(scores, dim=-1)
    probs = torch.softmax(torch.where(allowed, scores, float("-inf")), dim=-1)
    row_any = allowed.any(dim=-1, keepdim=True)
    # a data-dependent check: on CPU only, where it costs no synchronisation, and not traced
    if probs.device.type != "cpu" or torch.compiler.is_compiling() or not bool(row_any.all()):
        probs = probs.masked_fill_(~row_any, 0.0)
    return probs


def _math_inputs(q: Tensor, k: Tensor, v: Tensor, compact: bool = True) -> tuple[Tensor, Tensor, Tensor, torch.dtype]:
    """q, k, v in the working dtype (float32 for half precision), key heads repeated, and compact
    unless ``compact`` is False."""
    groups = q.shape[1] // k.shape[1]
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q, k, v = q.to(work), _repeat_kv(k.to(work), groups), _repeat_kv(v.to(work), groups)  # [B, Hq, T, D]
    if compact:
        # Compact once: q, k, v usually arrive as transposed views of the projections, and every
        # chunk's matmuls (forward, recompute, backward) would otherwise copy them again.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return q, k, v, work


def math_path(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: AttentionMask | None,
    terms: EncodingTerms,
    scale: float,
    chunk: int | None = None,
) -> Tensor:
    """Explicit ``P = softmax(mask(transform(QK^T * scale + bias)))``,
    ``out = (P + prob_bias) V + value_term(P)`` with the :class:`EncodingTerms` ``terms``,
    ``chunk`` query rows at a time (default: the :func:`chunk_rows` budget), each chunk recomputed
    in the backward pass.

    ``terms.score_transform`` sees the finite scores ``[B, H, rows, keys]`` of query rows ``rows``
    (a slice) and keys ``keys`` at every pair; the mask is applied to its result. With a causal
    mask a chunk's keys stop at its last visible key (the rest are masked anyway).
    ``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]`` -> ``[B, Hq, Tq, D]``."""
    dtype = q.dtype
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    if chunk is None:
        chunk = chunk_rows(b, h, tk, tq)
    # A single chunk without gradients (a cached decoding step) reads q, k, v once: its keys are a
    # slice of the KV cache's longer buffer, and compacting them would copy the whole cache in
    # every layer at every step (CoPE, CAPE, batch 1, contexts 512 and 2048: 3-8% of a step).
    qkv_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    once = tq <= chunk and not qkv_grad
    q, k, v, _ = _math_inputs(q, k, v, compact=not once)  # [B, H, Tq, D], [B, H, Tk, D] x2 (key heads repeated)
    idx = _indices(max(tq, tk), q.device)

    def rows_out(s: int, e: int, kv_end: int, rows: list[Tensor], keys: list[Tensor]) -> Tensor:
        (q_rows,), (k, v) = rows, keys  # [B, H, rows, D], [B, H, kv_end, D] x2
        out, _ = _math_block(q_rows, k, v, idx[s:e], idx[:kv_end], slice(s, e), slice(0, kv_end), tq, tk, mask,
                             terms, scale)
        return out.to(dtype)  # [B, H, rows, D]

    causal = mask is not None and mask.causal
    chunks = list(_row_chunks(tq, tk, chunk, causal))
    bias, prob_bias = terms.bias, terms.prob_bias
    others = _frontier(
        bias.learned if bias is not None else (), prob_bias.learned if prob_bias is not None else (),
        terms.transform_inputs,
    )
    if prob_bias is None and terms.value_term is None and not torch.compiler.is_compiling():
        if once and len(chunks) == 1 and not (others and torch.is_grad_enabled()):
            # One chunk and no gradient (a cached decoding step): the chunk alone, without the
            # autograd Function, its output buffer and the chunk pool around it (CoPE and CAPE at
            # batch 1, dim 256, context 512: 3-8% of a step, alternate rounds in one process).
            return _transform_chunk(q, k, v, chunks[0], idx, mask, terms, scale).to(dtype)
        # A transform (and bias) alone: the explicit attention backward around the transform's own.
        return _ChunkedTransformAttention.apply(q, k, v, mask, terms, scale, chunk, *others).to(dtype)
    return _row_chunked(rows_out, chunks, [q], [k, v], others)


def weights_path(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: AttentionMask | None,
    terms: EncodingTerms,
    scale: float,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The math path in one block under plain autograd, returning the attention weights too:
    ``(out [B, Hq, Tq, D], weights [B, Hq, Tq, Tk])`` (see :func:`_math_block`). It keeps the whole
    ``[B, H, Tq, Tk]`` matrix, as returning it requires, and is the one path with attention
    dropout (``dropout_p``; the caller passes 0 outside training)."""
    dtype = q.dtype
    q, k, v, _ = _math_inputs(q, k, v)  # [B, H, Tq, D], [B, H, Tk, D] x2 (key heads repeated)
    tq, tk = q.shape[2], k.shape[2]
    idx = _indices(max(tq, tk), q.device)
    out, weights = _math_block(q, k, v, idx[:tq], idx[:tk], slice(0, tq), slice(0, tk), tq, tk, mask, terms, scale,
                               dropout_p)  # [B, H, Tq, D], [B, H, Tq, Tk]
    return out.to(dtype), weights.to(dtype)


def prob_bias_term(
    v: Tensor, heads: int, mask: AttentionMask | None, prob_bias: PairwiseBias, q_len: int, chunk: int | None = None
) -> Tensor:
    """``(B ⊙ allowed) V`` for an after-softmax bias, added to a fused kernel's ``A V``, ``chunk``
    query rows at a time (each recomputed and differentiated alone in the backward pass).
    ``v [B, Hkv, Tk, D]`` -> ``[B, heads, q_len, D]``."""
    v = _repeat_kv(v, heads // v.shape[1])  # [B, H, Tk, D]
    b, _, tk, d = v.shape
    idx = _indices(max(q_len, tk), v.device)
    if chunk is None:
        chunk = chunk_rows(1 if not (prob_bias.per_batch or (mask is not None and mask.per_batch)) else b, heads, tk, q_len)

    def rows_term(s: int, e: int, kv_end: int, rows: list[Tensor], keys: list[Tensor]) -> Tensor:
        (v,) = keys  # [B, H, kv_end, D]
        q_idx, kv_idx = idx[s:e], idx[:kv_end]
        extra = prob_bias.dense(b, heads, q_idx, kv_idx, dtype=v.dtype)  # [B or 1, H, rows, keys]
        allowed = _allowed(mask, b, q_idx, kv_idx, q_len, tk)
        if allowed is not None:
            extra = torch.where(allowed, extra, 0.0)
        if extra.shape[0] == 1 and b > 1:
            # One bias for the whole batch: fold the batch into the columns of V instead of letting
            # matmul expand the [H, rows, keys] bias B times (and its gradient with it).
            cols = v.permute(1, 2, 0, 3).reshape(heads, kv_end, b * d)  # [H, keys, B * D]
            return torch.matmul(extra[0], cols).view(heads, e - s, b, d).permute(2, 0, 1, 3)
        return torch.matmul(extra, v)

    causal = mask is not None and mask.causal
    chunks = list(_row_chunks(q_len, tk, chunk, causal))
    return _row_chunked(rows_term, chunks, [], [v], _frontier(prob_bias.learned))
