"""Chunks of query rows: how many rows a chunk holds (the plan asks here), in which order the
workers take them, and the generic autograd function that recomputes each chunk alone in the
backward pass (docs/architecture.md, "CPU threads and the chunk workers")."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .. import chunk_pool
from ..amp import autocast_off

#: How a chunked kernel goes through the rows (:attr:`posenc.common.planning.Plan.form`).
Form = Literal["chunked", "one_pass", "whole"]

#: How the chunked math path's backward goes (:attr:`posenc.common.planning.Plan.math_backward`).
MathBackward = Literal["encoding", "explicit", "autograd"]

# Query rows such that one [B, H, rows, Tk] block holds about this many elements, and at least
# MIN_CHUNK_ROWS rows: small enough to stay in cache-friendly sizes, large enough to keep the
# per-chunk overhead (and the number of parallel regions, which cost most when another process
# holds a core) small.
CHUNK_ELEMENTS = 1 << 20
MIN_CHUNK_ROWS = 16


# The math path's chunks for a transform that works in tiles of its own (``tiled_transform``:
# CAPE) hold this many times that: fewer, taller chunks mean fewer passes of the chunk machinery
# and larger products. A transform that keeps several blocks of its own per chunk (CoPE) keeps
# the default: taller chunks only cost it memory.
_MATH_CHUNK_FACTOR = 2
_MIN_TALL_CHUNKS = 4


def chunk_rows(batch_rows: int, heads: int, kv_len: int, q_len: int, elements: int | None = None) -> int:
    """Query rows per chunk so that a ``[batch_rows, heads, rows, kv_len]`` block holds about
    ``elements`` elements (default ``CHUNK_ELEMENTS``; at least ``MIN_CHUNK_ROWS``, at most ``q_len``)."""
    rows = (CHUNK_ELEMENTS if elements is None else elements) // max(1, batch_rows * heads * kv_len)
    return max(1, min(max(q_len, 1), max(MIN_CHUNK_ROWS, rows)))


def math_chunk_rows(batch_rows: int, heads: int, kv_len: int, q_len: int) -> int:
    """Query rows per chunk of the math path for a ``tiled_transform``: :func:`chunk_rows` with
    ``_MATH_CHUNK_FACTOR`` times its budget (a constant that does not grow with the length), but
    never fewer than ``_MIN_TALL_CHUNKS`` chunks where the default gives that many: the chunks
    run on the pool's workers, and one chunk leaves a worker idle."""
    rows = chunk_rows(batch_rows, heads, kv_len, q_len)
    tall = chunk_rows(batch_rows, heads, kv_len, q_len, _MATH_CHUNK_FACTOR * CHUNK_ELEMENTS)
    return tall if -(-q_len // tall) >= _MIN_TALL_CHUNKS else max(rows, -(-q_len // _MIN_TALL_CHUNKS))


def dense_chunk_rows(batch: int, heads: int, kv_len: int, q_len: int, per_batch: bool) -> int:
    """Query rows per chunk of the dense path. A bias and mask that differ along the batch are a
    ``[B, H, rows, Tk]`` block per chunk; one shared by the batch is ``[1, H, rows, Tk]``, learned
    or not: the fused kernel reads it broadcast, and the explicit backward of a learned bias goes
    through the batch in groups of that size. Taller chunks mean fewer ``dk, dv`` parts to add
    up and larger matmuls."""
    return chunk_rows(batch if per_batch else 1, heads, kv_len, q_len)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def indices(n: int, device) -> Tensor:
    return torch.arange(n, device=device)


def row_chunks(q_len: int, kv_len: int, chunk: int, causal: bool):
    """``(start, end, kv_end)`` per chunk of query rows; with a causal mask a chunk stops at its
    last visible key."""
    offset = kv_len - q_len
    for s in range(0, q_len, chunk):
        e = min(q_len, s + chunk)
        yield s, e, (max(1, min(kv_len, e + offset)) if causal else kv_len)


def largest_first(chunks) -> list[tuple[int, int, int]]:
    """``(start, end, kv_end)`` chunks ordered by their pairs ``(end - start) * kv_end``, largest
    first (ties in the given order). The workers take chunks in this order, and with a causal
    mask the last rows' chunk holds several times the first's pairs: started last, it would run
    alone while the other workers idle."""
    return sorted(chunks, key=lambda c: -(c[1] - c[0]) * c[2])


def call_rows(rows_fn, chunk: tuple[int, int, int], rows_in, keys_in) -> Tensor:
    """``rows_fn`` on one chunk: the row inputs sliced to its rows, the key inputs to its keys."""
    s, e, kv_end = chunk
    return rows_fn(s, e, kv_end, [t[:, :, s:e] for t in rows_in], [t[:, :, :kv_end] for t in keys_in])


class RowChunks(torch.autograd.Function):
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
        order = largest_first(chunks)
        done = dict(zip(order, chunk_pool.ordered_map(lambda c: call_rows(rows_fn, c, rows_in, keys_in), order)))
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
        for s, e, kv_end, grads in chunk_pool.ordered_map(run, largest_first(ctx.chunks)):
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


def row_chunked(rows_fn, chunks, rows_in: list[Tensor], keys_in: list[Tensor], others: list[Tensor],
                one_pass: bool = False) -> Tensor:
    """:class:`RowChunks`, or the same chunks as plain operations for a plan that runs its rows
    in one pass (``one_pass``: no gradient, the pool and the autograd function would cost more
    than the rows) and while ``torch.compile`` traces (an autograd function over closures does
    not trace; the compiler plans memory itself)."""
    if one_pass or torch.compiler.is_compiling():
        parts = [call_rows(rows_fn, chunk, rows_in, keys_in) for chunk in chunks]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return RowChunks.apply(rows_fn, chunks, len(rows_in), len(keys_in), *rows_in, *keys_in, *others)


def add_key_part(total: Tensor | None, part: Tensor | None, kv_end: int, like: Tensor) -> Tensor | None:
    """``total`` (None before the first part) plus ``part``, a chunk's gradient of the first
    ``kv_end`` keys of ``like`` ``[B, H, Tk, D]``. A part over every key, taken first, becomes the
    total itself: with a causal mask the last rows' chunk spans every key, so no zero-filled buffer
    is made beside it."""
    if part is None:
        return total
    if total is None:
        if kv_end == like.shape[2]:
            return part.to(like.dtype)
        total = torch.zeros_like(like)
    total[:, :, :kv_end] += part
    return total


def frontier(*groups) -> list[Tensor]:
    """The tensors of ``groups`` that may need a gradient, each once."""
    seen, out = set(), []
    for group in groups:
        for t in group:
            if isinstance(t, Tensor) and t.requires_grad and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out
