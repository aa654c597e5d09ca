"""Shaw's value term over clipped offsets, read from the fused kernel's log-sum-exp and a few
diagonals of the scores, without the probability matrix (the ``dense+offset_values`` plan)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..pairwise import PairwiseBias
from .chunking import frontier, indices, repeat_kv, row_chunked

# Query rows per banded product of the offset value term (its work grows with rows + K per row).
_OFFSET_CHUNK_ROWS = 128


def offset_value_term(
    q: Tensor, k: Tensor, bias: PairwiseBias, lse: Tensor, table: Tensor, scale: float, one_pass: bool = False,
) -> Tensor:
    """``z_i = sum_j P_ij table[clip(pos_j - pos_i, -K, K) + K]`` (Shaw's value term) without the
    probability matrix, for causal attention over consecutive positions
    (:attr:`~posenc.common.planning.PlanInputs.consecutive_causal`).

    Under the causal mask the offsets are ``<= 0``: the keys ``K - 1`` or fewer places back sit on
    ``K`` diagonals, and every other visible key shares the clipped slot 0. As each visible row's
    probabilities sum to one, ``z_i = W_0 + sum_t P_(i, i' - K + 1 + t) (W_(t+1) - W_0)``, where
    ``i' = i + Tk - Tq`` and ``P_ij = exp(S_ij - lse_i)`` needs only the scores on those diagonals
    (a banded product per chunk of rows, on the worker pool like the other chunked terms). Exact,
    and differentiable in ``q, k``, the bias's ``learned``, ``lse`` and ``table``.
    ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]``, ``lse [B, H, Tq]``, ``table [2K + 1, Dv]`` ->
    ``[B, H, Tq, Dv]``. ``one_pass``: the plan's (no gradient): the rows as plain operations,
    and one row reads its diagonals as its last keys.
    """
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q = q.to(work).contiguous()  # [B, H, Tq, D]
    # (not copied: a chunk reads a window of keys, and a KV cache's keys are a view of its buffer)
    k = repeat_kv(k.to(work), q.shape[1] // k.shape[1])  # [B, H, Tk, D]
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    kmax = (table.shape[0] - 1) // 2
    offset = tk - tq
    idx = indices(max(tq, tk), q.device)
    if one_pass and tq == 1:
        # One row: its diagonals are its last n keys, in order, with no index arithmetic.
        n = min(kmax, tk)
        w = table.to(work)
        window = k[:, :, tk - n:]  # [B, H, n, D]
        scores = torch.matmul(q, window.transpose(-1, -2)) * scale  # [B, H, 1, n]
        last = (bias.table[..., tk - n:] if bias.table is not None  # (a dense bias: a slice of it)
                else bias.dense(b, h, idx[:1], idx[tk - n: tk]))
        probs = torch.exp(scores + last.to(work) - lse.to(work)[..., None])
        return (torch.matmul(probs, w[kmax - n + 1: kmax + 1] - w[0]) + w[0]).to(dtype)
    slots = indices(kmax, q.device)

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
    out = row_chunked(rows_term, chunks, [q, lse], [k], frontier(bias.learned, (table,)), one_pass=one_pass)
    return out.to(dtype)
