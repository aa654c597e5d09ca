"""The ``dense`` path: a score bias handed to a fused kernel chunk by chunk of query rows, each
bias chunk recomputed in the backward pass, so that no ``T x T`` tensor is kept (with a causal
mask each chunk stops at its last visible key). On CPU each chunk runs SDPA's flash kernel
forward and the backward the plan names (``bias_backward``); off CPU each chunk is explicit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import chunk_pool
from ..amp import autocast_off
from ..masks import AttentionMask, allowed_of, causal_of, per_batch_of
from ..pairwise import PairwiseBias

from .aten import cpu_flash_backward
from .chunking import Form, add_key_part, dense_chunk_rows, indices, largest_first, repeat_kv, row_chunks
from .dense_blocks import (
    OffsetBias,
    bias_block,
    chunk_backward_with_bias_grad,
    explicit_forward,
    forward_rows,
    key_linear_forward,
)


class _ChunkedBiasAttention(torch.autograd.Function):
    """Fused attention over chunks of query rows, with the bias recomputed per chunk.

    Only ``q, k, v``, the output and the log-sum-exp are saved between the passes. The backward is
    the flash kernel's where the plan chose it, else the chunked explicit one, which also yields
    the gradient of ``learned``, the tensors the bias reads that may need one.

    Returns ``(out [B, H, Tq, D], lse [B, H, Tq])``; the log-sum-exp of each query row is
    differentiable too (an encoding's fused value term reads probabilities as ``exp(S - lse)``),
    its gradient folded into ``dS``.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale, chunk, offsets, explicit_backward, *learned):
        ctx.set_materialize_grads(False)
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = causal_of(mask)
        out = q.new_empty(q.shape)  # [B, H, Tq, D]
        lse = q.new_empty((b, h, tq), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
        idx = indices(max(tq, tk), q.device)
        values = None if offsets is None else offsets.values(q.dtype)  # [H or 1, Tq + Tk - 1]

        def run(chunk_rows: tuple[int, int, int]) -> None:
            s, e, kv_end = chunk_rows
            o, chunk_lse = forward_rows(q, k, v, bias, mask, offsets, values, idx, s, e, kv_end, scale)
            out[:, :, s:e] = o  # chunks own disjoint rows
            lse[:, :, s:e] = chunk_lse

        for _ in chunk_pool.ordered_map(run, largest_first(row_chunks(tq, tk, chunk, causal))):
            pass
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.bias, ctx.mask, ctx.scale, ctx.chunk, ctx.learned = bias, mask, scale, chunk, learned
        ctx.offsets, ctx.explicit_backward = offsets, explicit_backward
        return out, lse

    @staticmethod
    @autocast_off
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        bias, mask, scale, chunk = ctx.bias, ctx.mask, ctx.scale, ctx.chunk
        wanted = [i for i, need in enumerate(ctx.needs_input_grad[9:]) if need]
        learned = [ctx.learned[i] for i in wanted]
        learned_grads: list[Tensor | None] = [None] * len(ctx.learned)
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = causal_of(mask)
        explicit_backward = ctx.explicit_backward
        dq = torch.empty_like(q)
        idx = indices(max(tq, tk), q.device)
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
                block, row_any = bias_block(
                    bias, mask, b, h, idx[s:e], idx[:kv_end], tq, tk, q.dtype,
                    block=None if live is None else live.detach(),
                )
            g = grad_out[:, :, s:e]  # [B, H, rows, D]
            if row_any is not None:
                g = g.masked_fill(~row_any, 0.0)
            grads: list[Tensor | None] = []
            # the plan's choice; a gradient of the bias or the log-sum-exp has only the written-out form
            if learned or chunk_grad_lse is not None or explicit_backward:
                gq, gk, gv, grads = chunk_backward_with_bias_grad(
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

        # Last chunk first (add_key_part); parts are added in this fixed order.
        dk = dv = None
        grad_values = None
        for kv_end, gk, gv, grads in chunk_pool.ordered_map(run, reversed(list(row_chunks(tq, tk, chunk, causal)))):
            if values_live is not None:
                if grads and grads[0] is not None:
                    grad_values = grads[0] if grad_values is None else grad_values + grads[0]
            else:
                for i, grad in zip(wanted, grads):
                    if grad is not None:
                        learned_grads[i] = grad if learned_grads[i] is None else learned_grads[i] + grad
            dk, dv = add_key_part(dk, gk, kv_end, k), add_key_part(dv, gv, kv_end, v)
            del gk, gv
        if values_live is not None and grad_values is not None:
            for i, grad in zip(wanted, torch.autograd.grad(values_live, learned, grad_values, allow_unused=True)):
                learned_grads[i] = grad
        return (dq, dk, dv, None, None, None, None, None, None, *learned_grads)


def dense_path(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, bias: PairwiseBias, scale: float,
    chunk: int | None = None, return_lse: bool = False, offset_start: int | None = None, form: Form = "chunked",
    bias_backward: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """A score bias handed to a fused kernel, as the plan says (:class:`~posenc.common.planning.Plan`).

    ``form``: ``"chunked"``, ``chunk`` query rows at a time (default: the :func:`chunk_rows`
    budget) under one autograd node that recomputes each bias block in the backward pass;
    ``"one_pass"`` (no gradient: a decoding step, or inference that fits one chunk), every row in
    one kernel call with no autograd node, the keys read as they lie (a KV cache's keys are a view
    of its longer buffer: a copy would cost every step the whole cache in every layer);
    ``"whole"`` (traced with a learned bias), one block under plain autograd, which the compiler
    differentiates. ``return_lse``: also the log-sum-exp ``[B, H, Tq]`` of each query row's
    scores (differentiable). ``offset_start``: the plan's, when not None the bias blocks are cut
    from its ``by_offset`` values along the diagonals. ``bias_backward``: the plan's
    (``"flash"`` or ``"explicit"``; None: explicit off CPU, flash on it).
    ``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]`` -> ``[B, Hq, Tq, D]``."""
    groups = q.shape[1] // k.shape[1]
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    if form == "whole":
        return _traced_dense(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, bias, scale, return_lse)
    offsets = None if offset_start is None else OffsetBias(bias, offset_start, tq, tk, causal_of(mask), q.device)
    if form == "one_pass":
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # [B, Hq, Tk, D], views where Hq == Hkv
        idx = indices(max(tq, tk), q.device)
        if bias.key_linear is not None and offsets is None:
            allowed = allowed_of(mask, b, idx[:tq], idx[:tk], tq, tk)
            out, lse = key_linear_forward(q, k, v, bias.key_linear, allowed, scale, return_lse)
        else:
            values = None if offsets is None else offsets.values(q.dtype)
            out, lse = forward_rows(q, k, v, bias, mask, offsets, values, idx, 0, tq, tk, scale)
        return (out, lse) if return_lse else out
    if chunk is None:
        chunk = dense_chunk_rows(b, h, tk, tq, bias.per_batch or per_batch_of(mask))
    # Compact once: the tensors are read more than once (by several chunks, and again in the
    # backward, whose matmuls would each copy transposed views of the projections).
    q = q.contiguous()  # [B, Hq, Tq, D]
    k, v = repeat_kv(k, groups).contiguous(), repeat_kv(v, groups).contiguous()  # [B, Hq, Tk, D]
    learned = bias.learned if bias.requires_grad else ()
    explicit = bias_backward == "explicit" or (bias_backward is None and q.device.type != "cpu")
    out, lse = _ChunkedBiasAttention.apply(q, k, v, bias, mask, scale, chunk, offsets, explicit, *learned)
    return (out, lse) if return_lse else out


def _traced_dense(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, bias: PairwiseBias, scale: float, return_lse: bool,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`dense_path`'s result written as plain differentiable operations for a traced call:
    ``softmax(scale Q K^T + bias)`` with masked entries out and rows that see no key zeroed.
    ``q [B, H, Tq, D]``, ``k, v [B, H, Tk, D]`` (key heads repeated)."""
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    idx = indices(max(tq, tk), q.device)
    block, row_any = bias_block(bias, mask, b, h, idx[:tq], idx[:tk], tq, tk, q.dtype)  # [B or 1, H, Tq, Tk]
    out, lse = explicit_forward(q, k, v, block, scale)
    if row_any is not None:
        out = out.masked_fill(~row_any, 0.0)
    return (out, lse) if return_lse else out
