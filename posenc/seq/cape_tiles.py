"""CAPE's MLP ``f`` on CPU in tiles of pairs (:class:`TiledAdaptiveBias`) and the math path's
backward of transform and softmax in tiles of rows (:func:`fused_softmax_backward`): each tile's
hidden layer lives in cache and is evaluated again rather than stored. :mod:`posenc.seq.cape`
calls them where the plan names them (``Plan.tiled_transform``, ``Plan.math_backward``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.amp import autocast_off

# Pairs per tile of the CPU form of f: its [hidden, tile] layer (1 MB at hidden 32) stays in cache
# between the products that write and read it; a flat optimum (a few thousand to tens of
# thousands of pairs time alike), so no machine's cache size is tuned in.
TILE_PAIRS = 8192


class TiledAdaptiveBias(torch.autograd.Function):
    """``scores + static + f([scores; static])`` on CPU, ``f`` over tiles of the pair axis, one
    batch row at a time, its hidden layer never stored: the forward adds each tile's second-layer
    product into the output, and the backward evaluates the tile's hidden layer again (two small
    products) instead of reading a saved ``[B, hidden, pairs]`` one, memory-bound on CPU.

    ``scores [B, H, P]``, ``static [1, H, P]`` (shared by the batch), ``w1 [hidden, 2H]`` (scores'
    columns first), ``b1 [hidden]``, ``w2 [H, hidden]``, ``b2 [H]``, LeakyReLU ``slope`` ->
    ``[B, H, P]``."""

    @staticmethod
    def forward(ctx, scores: Tensor, static: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
                slope: float) -> Tensor:
        h = scores.shape[1]
        w_scores, w_static = w1[:, :h], w1[:, h:]
        out = torch.add(scores, static + b2[:, None])  # [B, H, P]; b2 added on the batch-shared side
        on_static, hidden = _buffers(scores, w1.shape[0], 2)  # [hidden, tile] each, reused by every tile
        for p0, p1 in _tiles(scores.shape[2]):
            n = p1 - p0
            torch.addmm(b1[:, None], w_static, static[0, :, p0:p1], out=on_static[:, :n])
            for row in range(scores.shape[0]):
                torch.addmm(on_static[:, :n], w_scores, scores[row, :, p0:p1], out=hidden[:, :n])
                out[row, :, p0:p1].addmm_(w2, F.leaky_relu(hidden[:, :n], slope, inplace=True))
        ctx.save_for_backward(scores, static, w1, b1, w2)
        ctx.slope = slope
        return out

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor):
        scores, static, w1, b1, w2 = ctx.saved_tensors
        need_scores, need_static, need_w1, need_b1, need_w2, need_b2, _ = ctx.needs_input_grad
        h, slope = scores.shape[1], ctx.slope
        w_scores, w_static = w1[:, :h], w1[:, h:]
        w_scores_t = w_scores.t().contiguous()
        # d_scores is grad plus the MLP's part, written tile by tile (no copy of grad first)
        d_scores = torch.empty_like(scores) if need_scores else None
        d_static = grad.sum(0, keepdim=True) if need_static else None
        weights = _WeightGrads(w1, b1, w2, (need_w1, need_b1, need_w2, need_b2))
        on_static, pre, act, d_act, d_pre, d_pre_rows = _buffers(scores, w1.shape[0], 6)
        static_side = need_w1 or need_b1 or need_static
        for p0, p1 in _tiles(scores.shape[2]):
            n = p1 - p0
            part_static = static[0, :, p0:p1]
            torch.addmm(b1[:, None], w_static, part_static, out=on_static[:, :n])
            for row in range(scores.shape[0]):
                x, g = scores[row, :, p0:p1], grad[row, :, p0:p1]  # [H, tile] x2
                torch.addmm(on_static[:, :n], w_scores, x, out=pre[:, :n])  # [hidden, tile]
                activated = torch.ops.aten.leaky_relu.out(pre[:, :n], slope, out=act[:, :n]) if need_w2 else None
                dp = weights.add_row(g, x, pre[:, :n], activated, d_act[:, :n], d_pre[:, :n], slope)  # [hidden, tile]
                if static_side:
                    _add_row(d_pre_rows[:, :n], dp, row)
                if need_scores:
                    torch.addmm(g, w_scores_t, dp, out=d_scores[row, :, p0:p1])
            if static_side:
                dp_rows = d_pre_rows[:, :n]  # [hidden, tile], summed over the batch
                weights.add_static(part_static, dp_rows)
                if need_static:
                    d_static[0, :, p0:p1].addmm_(w_static.T, dp_rows)
        return (d_scores, d_static, *weights.result(), None)


class _WeightGrads:
    """The gradients of ``f``'s weights, gathered tile by tile by both CPU backward passes
    (:class:`TiledAdaptiveBias`, :func:`fused_softmax_backward`). The first layer's as
    ``[H, hidden]`` products ``x dp^T`` (faster than ``[hidden, H]`` ones, ``dp x^T``, over a
    tile); its static side, shared by the batch, once per tile on ``d_pre`` summed over the batch
    rows. ``needs``: which of ``(w1, b1, w2, b2)`` want a gradient."""

    def __init__(self, w1: Tensor, b1: Tensor, w2: Tensor, needs: tuple[bool, bool, bool, bool]) -> None:
        h, hidden = w2.shape
        self.need_w1, self.need_b1, self.need_w2, self.need_b2 = needs
        self.w2_t = w2.t().contiguous()  # [hidden, H]
        self.w1_scores_t, self.w1_static_t = w1.new_zeros(h, hidden), w1.new_zeros(h, hidden)
        self.b1, self.w2, self.b2 = torch.zeros_like(b1), torch.zeros_like(w2), torch.zeros_like(w2[:, 0])

    def add_row(self, g: Tensor, x: Tensor, pre: Tensor, act: Tensor | None, d_act: Tensor, d_pre: Tensor,
                slope: float) -> Tensor:
        """One batch row of a tile: ``g [H, n]`` the gradient of ``f``'s output, ``x [H, n]`` its
        scores, ``pre`` and ``act`` its hidden layer before and after the activation (``act`` read
        only for ``w2``'s gradient); ``d_act``, ``d_pre`` ``[hidden, n]`` buffers. Returns
        ``d_pre``, the gradient of ``pre``."""
        if self.need_w2:
            self.w2.addmm_(g, act.T)
        if self.need_b2:
            self.b2 += g.sum(1)  # the tile is in cache now; a pass over the gradient later would not be
        torch.mm(self.w2_t, g, out=d_act)
        torch.ops.aten.leaky_relu_backward.grad_input(d_act, pre, slope, False, grad_input=d_pre)
        if self.need_w1:
            self.w1_scores_t.addmm_(x, d_pre.T)
        return d_pre

    def add_static(self, part_static: Tensor, d_pre_rows: Tensor) -> None:
        """A tile's static side: ``part_static [H, n]``, ``d_pre_rows [hidden, n]`` summed over the batch."""
        if self.need_w1:
            self.w1_static_t.addmm_(part_static, d_pre_rows.T)
        if self.need_b1:
            self.b1 += d_pre_rows.sum(1)

    def result(self) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
        """``(dW1, db1, dW2, db2)``, None where not wanted."""
        d_w1 = torch.cat([self.w1_scores_t.t(), self.w1_static_t.t()], 1) if self.need_w1 else None
        return (d_w1, self.b1 if self.need_b1 else None, self.w2 if self.need_w2 else None,
                self.b2 if self.need_b2 else None)


def _add_row(total: Tensor, part: Tensor, row: int) -> None:
    """``total`` = the sum over batch rows of ``part``: written by row 0, added to by the others."""
    if row == 0:
        total.copy_(part)
    else:
        total.add_(part)


def fused_softmax_backward(
    scores: Tensor, centered_grad: Tensor, static: Tensor, allowed: Tensor | None, w1: Tensor, b1: Tensor, w2: Tensor,
    b2: Tensor, slope: float, static_grad: bool,
) -> tuple[Tensor, ...]:
    """The math path's backward of one block for CAPE, in tiles of whole rows, one batch row at a
    time: the tile's hidden layer ``pre = W1 [S; static] + b1`` (once), ``A = S + static + b2 +
    W2 leaky(pre)``, ``P = softmax(mask(A))`` over the tile's rows, ``dA = P * centered_grad``,
    then ``f``'s backward from the same ``pre``: ``dS = dA + W1_S^T (leaky'(pre) * W2^T dA)``.

    ``scores [B, H, R, K]`` (``S``), ``centered_grad [B, H, R, K]``, ``static [H, R * K]`` (shared
    by the batch), ``allowed [B or 1, 1, R, K]`` or None, the MLP's weights, ``static_grad``:
    whether to return the static bias's gradient. -> ``(P [B, H, R, K], dS [B, H, R, K], dW1,
    db1, dW2, db2, d_static [H, R * K] or None)``; ``P`` is zero outside ``allowed`` and on rows
    that see no key, as the generic path's softmax gives it."""
    b, h, rows, keys = scores.shape
    w_scores, w_static = w1[:, :h], w1[:, h:]
    w_scores_t = w_scores.t().contiguous()
    probs, d_scores = torch.empty_like(scores), torch.empty_like(scores)
    tile_rows = max(1, TILE_PAIRS // max(1, keys))
    on_static, pre, act, d_act, d_pre, d_pre_rows = _buffers(scores, w1.shape[0], 6, min(rows, tile_rows) * keys)
    static_b2 = static.view(h, rows, keys) + b2[:, None, None]  # [H, R, K]
    weights = _WeightGrads(w1, b1, w2, (True, True, True, True))
    d_static = torch.empty_like(static) if static_grad else None
    # rows that see no key are zeroed after the softmax (a data-dependent check, free on CPU)
    blind = allowed is not None and not bool(allowed.any(dim=-1).all())
    for r0 in range(0, rows, tile_rows):
        r1 = min(rows, r0 + tile_rows)
        n = (r1 - r0) * keys
        part_static = static[:, r0 * keys: r1 * keys]  # [H, tile]
        torch.addmm(b1[:, None], w_static, part_static, out=on_static[:, :n])
        for row in range(b):
            x = scores[row, :, r0:r1].reshape(h, n)  # [H, tile], a view
            torch.addmm(on_static[:, :n], w_scores, x, out=pre[:, :n])  # [hidden, tile]
            torch.ops.aten.leaky_relu.out(pre[:, :n], slope, out=act[:, :n])
            transformed = torch.add(x.view(h, r1 - r0, keys), static_b2[:, r0:r1])  # [H, rows, K]
            transformed.view(h, n).addmm_(w2, act[:, :n])
            if allowed is not None:
                seen = allowed[row if allowed.shape[0] > 1 else 0, 0, r0:r1]  # [rows, K]
                transformed.masked_fill_(~seen, float("-inf"))
            p = probs[row, :, r0:r1]
            p.copy_(torch.softmax(transformed, dim=-1))
            if blind:
                p.masked_fill_(~seen.any(dim=-1, keepdim=True), 0.0)
            d_a = torch.mul(p, centered_grad[row, :, r0:r1], out=d_scores[row, :, r0:r1]).view(h, n)  # dA, then dS
            dp = weights.add_row(d_a, x, pre[:, :n], act[:, :n], d_act[:, :n], d_pre[:, :n], slope)  # [hidden, tile]
            _add_row(d_pre_rows[:, :n], dp, row)
            if static_grad:
                _add_row(d_static[:, r0 * keys: r1 * keys], d_a, row)
            d_a.addmm_(w_scores_t, dp)  # dS = dA + W1_S^T dp, in place
        dp_rows = d_pre_rows[:, :n]  # summed over the batch
        weights.add_static(part_static, dp_rows)
        if static_grad:
            d_static[:, r0 * keys: r1 * keys].addmm_(w_static.T, dp_rows)
    return probs, d_scores, *weights.result(), d_static


def _buffers(like: Tensor, hidden: int, count: int, width: int | None = None) -> tuple[Tensor, ...]:
    """``count`` work buffers ``[hidden, width]`` for the tiles of one call (default width: a tile
    of ``like [B, H, P]``'s pairs): made once, not per tile (a fresh megabyte per tile and batch
    row was a page fault per 4 kB on CPU)."""
    width = min(TILE_PAIRS, like.shape[2]) if width is None else width
    return tuple(like.new_empty((hidden, width)) for _ in range(count))


def _tiles(pairs: int):
    for p0 in range(0, pairs, TILE_PAIRS):
        yield p0, min(pairs, p0 + TILE_PAIRS)
