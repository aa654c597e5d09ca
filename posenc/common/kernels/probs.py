"""The probabilities: a masked softmax for encodings that form them, and an after-softmax bias
term ``(B * allowed) V`` added beside whichever kernel ran (eRPE, ``+prob_bias``)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_tensor
from ..masks import AttentionMask, allowed_of, causal_of, per_batch_of
from ..pairwise import PairwiseBias
from .chunking import chunk_rows, frontier, indices, repeat_kv, row_chunked, row_chunks


def masked_softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
    """``P [B, H, rows, keys]``: the softmax of ``scores`` over the keys ``allowed`` marks
    (``[B or 1, 1, rows, keys]``; the entries outside it are zero, and so is a row that sees no
    key). ``scores`` is not written. The masked scores in one pass (``torch.where``, not a copy
    then a fill); on CPU a block whose every row sees a key (causal self-attention) skips the
    pass that zeroes the others. ``torch.softmax`` rather than ``exp(S - lse)``: on CPU its
    exponential stays fast where ``exp_`` and ``logsumexp`` slow down many times on scores far
    below the row's maximum (denormal results, as an ALiBi bias of -500 gives). Checks the shapes
    and dtypes, not the values."""
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


def prob_bias_term(
    v: Tensor, heads: int, mask: AttentionMask | None, prob_bias: PairwiseBias, q_len: int, chunk: int | None = None,
    one_pass: bool = False,
) -> Tensor:
    """``(B ⊙ allowed) V`` for an after-softmax bias, added to a fused kernel's ``A V``, ``chunk``
    query rows at a time (each recomputed and differentiated alone in the backward pass), or as
    plain operations with the plan's ``one_pass``.
    ``v [B, Hkv, Tk, D]`` -> ``[B, heads, q_len, D]``."""
    v = repeat_kv(v, heads // v.shape[1])  # [B, H, Tk, D]
    b, _, tk, d = v.shape
    idx = indices(max(q_len, tk), v.device)
    if chunk is None:
        chunk = chunk_rows(1 if not (prob_bias.per_batch or per_batch_of(mask)) else b, heads, tk, q_len)

    def rows_term(s: int, e: int, kv_end: int, rows: list[Tensor], keys: list[Tensor]) -> Tensor:
        (v,) = keys  # [B, H, kv_end, D]
        q_idx, kv_idx = idx[s:e], idx[:kv_end]
        extra = prob_bias.dense(b, heads, q_idx, kv_idx, dtype=v.dtype)  # [B or 1, H, rows, keys]
        allowed = allowed_of(mask, b, q_idx, kv_idx, q_len, tk)
        if allowed is not None:
            extra = torch.where(allowed, extra, 0.0)
        if extra.shape[0] == 1 and b > 1:
            # One bias for the whole batch: fold the batch into the columns of V instead of letting
            # matmul expand the [H, rows, keys] bias B times (and its gradient with it).
            cols = v.permute(1, 2, 0, 3).reshape(heads, kv_end, b * d)  # [H, keys, B * D]
            return torch.matmul(extra[0], cols).view(heads, e - s, b, d).permute(2, 0, 1, 3)
        return torch.matmul(extra, v)

    causal = causal_of(mask)
    chunks = list(row_chunks(q_len, tk, chunk, causal))
    return row_chunked(rows_term, chunks, [], [v], frontier(prob_bias.learned), one_pass=one_pass)
