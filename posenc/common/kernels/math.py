"""The ``math`` path: explicit ``softmax(mask(transform(scale Q K^T + bias))) V`` row chunk by
row chunk, each chunk recomputed and differentiated alone in the backward pass: the only path
that exposes the scores and probabilities, for encodings with a score transform (CAPE, CoPE) or
a value term (Shaw's values), and still no ``T x T`` tensor alive at once. Also the weights path
(:func:`weights_path`), which returns the whole matrix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import chunk_pool
from ..amp import autocast_off
from ..masks import AttentionMask, allowed_of, causal_of
from .chunking import (Form, MathBackward, add_key_part, chunk_rows, frontier, indices, largest_first, repeat_kv,
                       row_chunked, row_chunks)
from .probs import masked_softmax
from .terms import EncodingTerms


def math_block(
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
    scores, allowed = transformed_scores(q_rows, k, q_idx, kv_idx, rows, keys, q_len, kv_len, mask, terms, scale)
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
    autograd as well: fewer, larger kernels here, which hold up better beside a busy process. Where
    the plan says ``math_backward="encoding"``, the encoding's own backward of transform and softmax
    (``terms.transform_softmax_backward``, CAPE on CPU) takes each chunk's ``S`` and ``dO V^T -
    rowsum(dO * O)`` and returns ``P``, ``dS`` and its tensors' gradients instead (or None for an
    input it cannot take, which goes the explicit way).

    ``others``: the tensors the transform and the bias read by closure that may need a
    gradient; they must not depend on one another. Returns ``[B, H, Tq, D]`` in the working
    dtype; ``q, k, v`` arrive compact in that dtype with the key heads repeated."""

    @staticmethod
    def forward(ctx, q, k, v, mask, terms, scale, chunk, own_backward, *others):
        ctx.set_materialize_grads(False)
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = causal_of(mask)
        out = q.new_empty(q.shape)  # [B, H, Tq, D]
        idx = indices(max(tq, tk), q.device)

        def run(rows: tuple[int, int, int]) -> None:
            s, e, _ = rows
            out[:, :, s:e] = _transform_chunk(q, k, v, rows, idx, mask, terms, scale)  # chunks own disjoint rows

        for _ in chunk_pool.ordered_map(run, largest_first(row_chunks(tq, tk, chunk, causal))):
            pass
        ctx.save_for_backward(q, k, v, out)
        ctx.mask, ctx.terms, ctx.scale, ctx.chunk, ctx.others = mask, terms, scale, chunk, others
        ctx.own_backward = own_backward
        return out

    @staticmethod
    @autocast_off
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        if grad_out is None:
            return (None,) * (8 + len(ctx.others))
        mask, terms, scale, others = ctx.mask, ctx.terms, ctx.scale, ctx.others
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        wanted = [t for t, need in zip(others, ctx.needs_input_grad[8:]) if need]
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        causal = causal_of(mask)
        idx = indices(max(tq, tk), q.device)
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # [B, H, Tq, 1]
        dq = torch.empty_like(q)
        fused = ctx.own_backward  # the plan's math_backward="encoding"

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
            allowed = allowed_of(mask, b, idx[s:e], idx[:kv_end], tq, tk)
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
                scores, allowed = transformed_scores(q_leaf, k_leaf, idx[s:e], idx[:kv_end], slice(s, e),
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

        # Last chunk first (add_key_part).
        dk = dv = None
        grads: list[Tensor | None] = [None] * len(wanted)
        for kv_end, gk, gv, found in chunk_pool.ordered_map(run, reversed(list(row_chunks(tq, tk, ctx.chunk, causal)))):
            for i, grad in enumerate(found):
                if grad is not None:
                    grads[i] = grad if grads[i] is None else grads[i] + grad
            dk, dv = add_key_part(dk, gk, kv_end, k), add_key_part(dv, gv, kv_end, v)
        found = iter(grads)
        others_grads = [next(found) if need else None for need in ctx.needs_input_grad[8:]]
        return (dq if need_q else None, dk, dv, None, None, None, None, None, *others_grads)


def _transform_chunk(
    q: Tensor, k: Tensor, v: Tensor, rows: tuple[int, int, int], idx: Tensor, mask: AttentionMask | None,
    terms: EncodingTerms, scale: float,
) -> Tensor:
    """The forward of one chunk ``rows = (start, end, kv_end)`` of a score transform without value
    term or after-softmax bias: ``softmax(mask(transform(scale Q K^T + bias))) V`` for query rows
    ``start:end`` against keys ``:kv_end``, ``[B, H, end - start, D]``. ``q [B, H, Tq, D]``,
    ``k, v [B, H, Tk, D]`` in the working dtype with the key heads repeated."""
    s, e, kv_end = rows
    scores, allowed = transformed_scores(q[:, :, s:e], k[:, :, :kv_end], idx[s:e], idx[:kv_end], slice(s, e),
                                          slice(0, kv_end), q.shape[2], k.shape[2], mask, terms, scale)
    return torch.matmul(masked_softmax(scores, allowed), v[:, :, :kv_end])


def transformed_scores(
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
    allowed = allowed_of(mask, b, q_idx, kv_idx, q_len, kv_len)
    if terms.score_transform is not None:
        scores = terms.score_transform(scores, q_rows, k, rows, keys, allowed)
    return scores, allowed


def math_inputs(q: Tensor, k: Tensor, v: Tensor, compact: bool = True) -> tuple[Tensor, Tensor, Tensor, torch.dtype]:
    """q, k, v in the working dtype (float32 for half precision), key heads repeated, and compact
    unless ``compact`` is False."""
    groups = q.shape[1] // k.shape[1]
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q, k, v = q.to(work), repeat_kv(k.to(work), groups), repeat_kv(v.to(work), groups)  # [B, Hq, T, D]
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
    form: Form = "chunked",
    backward: MathBackward | None = None,
) -> Tensor:
    """Explicit ``P = softmax(mask(transform(QK^T * scale + bias)))``,
    ``out = (P + prob_bias) V + value_term(P)`` with the :class:`EncodingTerms` ``terms``,
    ``chunk`` query rows at a time (default: the :func:`chunk_rows` budget), each chunk recomputed
    in the backward pass; with the plan's ``form="one_pass"`` (no gradient) every row at once as
    plain operations, the keys read as they lie (a KV cache's keys are a view of its buffer).

    ``terms.score_transform`` sees the finite scores ``[B, H, rows, keys]`` of query rows ``rows``
    (a slice) and keys ``keys`` at every pair; the mask is applied to its result. With a causal
    mask a chunk's keys stop at its last visible key (the rest are masked anyway). ``backward``:
    the plan's :attr:`~posenc.common.planning.Plan.math_backward` for the chunked form (None:
    ``"autograd"``, which serves every term).
    ``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]`` -> ``[B, Hq, Tq, D]``."""
    if backward not in (None, "encoding", "explicit", "autograd"):
        raise ValueError(f"backward must be 'encoding', 'explicit', 'autograd' or None; got {backward!r}")
    written = backward in ("explicit", "encoding")
    if written and (terms.prob_bias is not None or terms.value_term is not None):
        raise ValueError(f"backward={backward!r} cannot serve an after-softmax term; the plan gives 'autograd' there")
    if backward == "encoding" and terms.transform_softmax_backward is None:
        raise ValueError("backward='encoding' needs the encoding's transform_softmax_backward; it has none")
    dtype = q.dtype
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    one_pass = form == "one_pass"
    chunk = tq if one_pass else chunk_rows(b, h, tk, tq) if chunk is None else chunk
    q, k, v, _ = math_inputs(q, k, v, compact=not one_pass)  # [B, H, Tq, D], [B, H, Tk, D] x2 (key heads repeated)
    idx = indices(max(tq, tk), q.device)
    chunks = list(row_chunks(tq, tk, chunk, causal_of(mask)))
    if one_pass and terms.prob_bias is None and terms.value_term is None:
        return _transform_chunk(q, k, v, chunks[0], idx, mask, terms, scale).to(dtype)

    def rows_out(s: int, e: int, kv_end: int, rows: list[Tensor], keys: list[Tensor]) -> Tensor:
        (q_rows,), (k, v) = rows, keys  # [B, H, rows, D], [B, H, kv_end, D] x2
        out, _ = math_block(q_rows, k, v, idx[s:e], idx[:kv_end], slice(s, e), slice(0, kv_end), tq, tk, mask,
                            terms, scale)
        return out.to(dtype)  # [B, H, rows, D]

    bias, prob_bias = terms.bias, terms.prob_bias
    others = frontier(
        bias.learned if bias is not None else (), prob_bias.learned if prob_bias is not None else (),
        terms.transform_inputs,
    )
    if written and not one_pass:
        # A transform (and bias) alone: the explicit attention backward around the transform's own.
        return _ChunkedTransformAttention.apply(q, k, v, mask, terms, scale, chunk, backward == "encoding",
                                                *others).to(dtype)
    return row_chunked(rows_out, chunks, [q], [k, v], others, one_pass=one_pass)


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
    ``(out [B, Hq, Tq, D], weights [B, Hq, Tq, Tk])`` (see :func:`math_block`). It keeps the whole
    ``[B, H, Tq, Tk]`` matrix, as returning it requires, and is the one path with attention
    dropout (``dropout_p``; the caller passes 0 outside training)."""
    dtype = q.dtype
    q, k, v, _ = math_inputs(q, k, v)  # [B, H, Tq, D], [B, H, Tk, D] x2 (key heads repeated)
    tq, tk = q.shape[2], k.shape[2]
    idx = indices(max(tq, tk), q.device)
    out, weights = math_block(q, k, v, idx[:tq], idx[:tk], slice(0, tq), slice(0, tk), tq, tk, mask, terms, scale,
                               dropout_p)  # [B, H, Tq, D], [B, H, Tq, Tk]
    return out.to(dtype), weights.to(dtype)
