"""CoPE, contextual position encoding (Golovneva et al. 2024, https://arxiv.org/abs/2405.18719).

Gates ``g_ij = sigmoid(q_i.k_j / sqrt(d))`` on the visible keys (zero on masked ones), positions
``p_ij = sum_{t = j..i} g_it`` (a reverse cumulative sum along the keys), clamped to
``npos_max - 1``, and the score gains ``q_i.e(p_ij) / sqrt(d)`` where ``e`` interpolates linearly
between learned integer position embeddings ``e[0 .. npos_max - 1]`` (``[npos_max, d]``, shared
by the heads, zero-initialised): ``q.e(p) = w * q.e[ceil p] + (1 - w) * q.e[floor p]``,
``w = p - floor p``.
This follows the authors' code: the gate logits are the scaled scores, the mask multiplies the
gates, the clamp keeps ``p`` inside the table, and the positional logits are scaled with the
scores. Causal only.

It needs ``q.k`` at every pair, so it uses the score-matrix capability (``needs_scores``; the
math path): ``O(B H T^2)`` memory is inherent to CoPE (the positions differ for every pair).
``q.e`` is computed once per query as ``[B, H, Tq, npos]`` (``npos``: the rows a position can
reach) and read at ``floor p`` as ``q.e(p) = L[floor p] + w * (L[floor p + 1] - L[floor p])``
(:class:`_PositionalScores`, with its backward written out: the gates' gradient is a forward
cumulative sum of the positions', and no float copy of the indices is kept). The math path's
chunk backward writes out the softmax's and asks autograd for this transform's: a backward of the
two written out together gained 4-6% of a training step on CPU (results/bench-2026-12-07/cope-fold),
short of the 10% a special path must earn.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.amp import autocast_off
from ..common.checks import check_int
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register


@register(
    "cope",
    modality="seq",
    paper="Golovneva et al. 2024, Contextual Position Encoding, https://arxiv.org/abs/2405.18719",
    summary="positions counted by sigmoid gates of q.k, interpolated learned embeddings; causal",
)
class CoPE(PositionEncoding):
    """Args:
        head_dim: ``d``.
        max_len: training length; the default table has ``max_len + 1`` positions (0 .. max_len).
        npos_max: table size, overriding that default (the paper's ``npos``).

    Parameters: ``pos_emb [npos_max, d]``.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    needs_scores = True
    causal_only = True

    def __init__(self, head_dim: int, max_len: int, npos_max: int | None = None) -> None:
        super().__init__()
        check_int("head_dim", head_dim, minimum=1)
        check_int("max_len", max_len, minimum=1)
        npos_max = max_len + 1 if npos_max is None else check_int("npos_max", npos_max, minimum=2)
        self.head_dim, self.npos_max = head_dim, npos_max
        self.pos_emb = nn.Parameter(torch.zeros(npos_max, head_dim))

    def transform_scores(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None
    ) -> Tensor:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"CoPE was built for head_dim={self.head_dim}; q has {q.shape[-1]}")
        scale = self.head_dim ** -0.5
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in (scores, q, self.pos_emb))):
            # no gradient (a cached decoding step, inference): the forward alone, without the
            # autograd Function's context and the tensors it keeps for a backward
            return _positional_forward(scores, q, self.pos_emb, allowed, scale)[0]
        return _PositionalScores.apply(scores, q, self.pos_emb, allowed, scale)


def _reachable_rows(gates_total: Tensor, npos_max: int, keys: int) -> int:
    """Rows of the table a position can read: ``p`` is at most its row's total of gates (and the
    number of keys), so ``floor p + 1`` stays below ``floor(max total) + 2``; one row of margin
    for the rounding of ``total - running + g``. The largest total is read on CPU only (free
    there; a synchronisation on an accelerator) and not while ``torch.compile`` traces; a NaN
    total (NaN scores) keeps every row."""
    npos = min(npos_max, keys + 1)
    if gates_total.device.type == "cpu" and not torch.compiler.is_compiling() and gates_total.numel():
        top = float(gates_total.max())
        if not math.isnan(top):
            npos = min(npos, int(top) + 3)
    return npos


def _positional_forward(
    scores: Tensor, q: Tensor, pos_emb: Tensor, allowed: Tensor | None, scale: float
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The forward of :class:`_PositionalScores`: ``scores + q.e(p) * scale`` and what its
    backward reads, ``(gates, floor, weight, step, table)``."""
    gates = torch.sigmoid(scores)  # [B, H, Tq, Tk]
    if allowed is not None:
        gates = gates.mul_(allowed)
    # sum_{t >= j} g_t as the row total minus the running sum before j: one cumsum instead of
    # a cumsum between two flipped copies (the hidden keys' gates are zero, so their
    # positions are exactly 0). The lower clamp: rounding can take the difference a hair
    # below 0 where a gate is tiny beside the row total.
    running = gates.cumsum(-1)
    total = running[..., -1:]  # [B, H, Tq, 1]
    npos = _reachable_rows(total, pos_emb.shape[0], scores.shape[-1])
    pos = torch.sub(total, running).add_(gates).clamp_(0, npos - 1)
    # a NaN score gives NaN where it lands (through the scores added below), not a NaN index
    pos = pos.nan_to_num_(nan=0.0)
    del running, total
    floor = pos.floor()
    weight = pos.sub_(floor)  # w = p - floor p, in place of p
    floor = floor.long()
    table = pos_emb[:npos].to(q.dtype)  # [npos, d]
    logits = torch.matmul(q, table.t()).mul_(scale)  # [B, H, Tq, npos]
    # D, zero at the last row: the clamp's end (or a row no position reaches)
    steps = F.pad(torch.sub(logits[..., 1:], logits[..., :-1]), (0, 1))
    step = steps.gather(-1, floor)
    del steps
    out = logits.gather(-1, floor).add_(scores).addcmul_(weight, step)
    return out, (gates, floor, weight, step, table)


class _PositionalScores(torch.autograd.Function):
    """``scores + q.e(p) * scale``: the gates, their reverse cumulative sums ``p`` (clamped to the
    table) and the interpolated positional logits, with the backward written out.
    ``scores [B, H, Tq, Tk]``; ``q [B, H, Tq, d]``; ``pos_emb [npos_max, d]``;
    ``allowed [B or 1, 1, Tq, Tk]`` bool or None.

    The logits ``L = q e^T * scale`` are made only for the rows a position can reach
    (:func:`_reachable_rows`): with gates near one half that is half the keys, and the table is
    as large as the block of scores, so this halves its product (forward, recompute and both
    gradients). ``q.e(p) = L[f] + w * D[f]`` with ``f = floor p``, ``w = p - f`` and the steps
    ``D[n] = L[n + 1] - L[n]`` (zero at the last row, where the clamp holds ``p``: no gradient
    there, as the clamp gives none). Backward, with ``G`` the gradient of the result:
    ``dp = G * D[f]``; ``p_j = sum_{t >= j} g_t`` makes ``dg_t = sum_{j <= t} dp_j``, a forward
    cumulative sum; ``dscores = G + dg * g (1 - g)`` (zero where the mask zeroed the gate);
    ``dL`` sums ``G`` at ``f`` and ``G * w`` at ``f`` for ``D``. Autograd through the
    elementwise steps made about twice the passes over the ``[B, H, Tq, Tk]`` block.
    At an exact integer ``p`` the slope taken is the one above it, where autograd through
    ``lerp(L[floor p], L[ceil p], w)`` took zero: either side is a derivative of the
    piecewise-linear interpolation; where ``p`` is 0 the gate gradient carries ``g (1 - g)``,
    which vanishes with the gates that make ``p`` 0."""

    @staticmethod
    def forward(ctx, scores: Tensor, q: Tensor, pos_emb: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
        out, (gates, floor, weight, step, table) = _positional_forward(scores, q, pos_emb, allowed, scale)
        ctx.save_for_backward(gates, floor, weight, step, q, table)
        ctx.scale, ctx.npos_max, ctx.emb_dtype = scale, pos_emb.shape[0], pos_emb.dtype
        return out

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor | None):
        if grad is None:
            return None, None, None, None, None
        gates, floor, weight, step, q, table = ctx.saved_tensors
        d_scores, d_q, d_emb = _positional_backward(
            grad, (gates, floor, weight, step, table), q, ctx.scale, ctx.npos_max, ctx.emb_dtype,
            *ctx.needs_input_grad[:3])
        return d_scores, d_q, d_emb, None, None


def _positional_backward(
    grad: Tensor, saved: tuple[Tensor, ...], q: Tensor, scale: float, npos_max: int, emb_dtype: torch.dtype,
    need_scores: bool, need_q: bool, need_emb: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The backward of :class:`_PositionalScores` (see there) from ``grad`` ``[B, H, Tq, Tk]``, the
    gradient of its result, and what :func:`_positional_forward` gave for its backward:
    ``(d_scores, d_q, d_pos_emb)``, None where not needed."""
    gates, floor, weight, step, table = saved
    d_scores = d_q = d_emb = None
    if need_scores:
        d_gates = torch.mul(grad, step).cumsum_(-1)  # dg_t = sum_{j <= t} dp_j
        d_gates.mul_(gates)
        d_scores = torch.addcmul(grad, d_gates, gates, value=-1.0).add_(d_gates)  # G + dg g (1 - g)
        del d_gates
    if need_q or need_emb:
        npos = table.shape[0]
        shape = (*grad.shape[:-1], npos)
        d_logits = grad.new_zeros(shape).scatter_add_(-1, floor, grad)  # [B, H, Tq, npos]
        d_steps = grad.new_zeros(shape).scatter_add_(-1, floor, grad * weight)
        d_logits[..., 1:] += d_steps[..., :-1]
        d_logits[..., :-1] -= d_steps[..., :-1]
        del d_steps
        d_logits.mul_(scale)
        if need_q:
            d_q = torch.matmul(d_logits, table)  # [B, H, Tq, d]
        if need_emb:
            d_emb = grad.new_zeros(npos_max, table.shape[1])
            d_emb[:npos] = d_logits.reshape(-1, npos).t() @ q.reshape(-1, q.shape[-1])
            d_emb = d_emb.to(emb_dtype)
    return d_scores, d_q, d_emb
