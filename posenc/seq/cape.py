"""CAPE / DAPE, context-adaptive positional encoding (Zheng et al. 2024, https://arxiv.org/abs/2405.14722).

``A = QK^T + B + f([QK^T; B])``: ``B`` is a static positional bias (ALiBi, KERPLE or FIRE, built
by name through the registry), and ``f`` an MLP applied at every pair ``(i, j)`` across the head
axis, ``2H -> hidden -> H`` (LeakyReLU, as in the authors' code), so the bias adapts to the
attention scores. ``QK^T`` here is the scaled score ``q.k / sqrt(d)``.

It needs the whole score matrix: the encoding sets ``needs_scores`` and implements
``transform_scores``, which only the math path serves (``backend="auto"`` picks it; another
backend is a clear error). On CPU, with a static bias shared by the batch, ``f`` runs over tiles of
pairs with its backward written out (:class:`_TiledAdaptiveBias`): its hidden layer lives a tile at
a time, in cache, and is evaluated again in the backward pass rather than stored (less memory and
time: results/bench-2026-12-06/special-paths), and the math path's backward takes its own
pass over tiles of rows (:meth:`CAPE.transform_softmax_backward`: transform, softmax and gradients
from one evaluation of the hidden layer). Elsewhere (CUDA, a per-sequence bias,
weights in another dtype, tracing) autograd keeps the ``O(B * rows * T * hidden)`` activations of
each chunk of rows. ``f`` sees the scores of masked pairs too (they are finite there); it acts on each
pair separately, so nothing leaks from a masked pair into a visible one, and the core masks the
result afterwards: masked entries stay masked.

Shapes: ``scores [B, H, Tq, Tk]``; positions as the base bias takes them. Causal-only exactly
when the base bias is (ALiBi and KERPLE unless ``symmetric``; FIRE always).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.amp import autocast_off
from ..common.checks import check_choice, check_int, check_transform_backward_inputs
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import shared_run_offset
from ..common.registry import ModelDims, build, register
from ..primitives.derived import DerivedTensors, doubling_length

CAPE_BASES = ("alibi", "kerple", "fire")
_DISTANCE_ONLY_BASES = ("alibi", "kerple")  # a bias of the distance alone: kept by distance for decoding


@register(
    "cape",
    modality="seq",
    paper="Zheng et al. 2024, DAPE: Data-Adaptive Positional Encoding, https://arxiv.org/abs/2405.14722",
    summary="an MLP over heads of [scores; static bias] added to a static bias (ALiBi, KERPLE, FIRE)",
)
class CAPE(PositionEncoding):
    """Args:
        dim: model width (passed to the base bias, like ``num_heads`` and ``max_len``).
        base: the static bias, ``"alibi"`` (default), ``"kerple"`` or ``"fire"``.
        hidden: hidden width of ``f`` (32 in the paper).
        base_options: keyword arguments for the base bias (e.g. ``{"symmetric": True}``).

    Parameters: ``mlp`` (``Linear(2H, hidden)``, LeakyReLU, ``Linear(hidden, H)``) and the base's.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    needs_scores = True
    tiled_transform = True  # f in tiles on CPU: the math path may take taller chunks

    def __init__(
        self, dim: int, num_heads: int, max_len: int, base: str = "alibi", hidden: int = 32,
        base_options: dict | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("num_heads", num_heads), ("max_len", max_len), ("hidden", hidden)):
            check_int(name, value, minimum=1)
        check_choice("base", base, CAPE_BASES)
        if base_options is not None and not isinstance(base_options, dict):
            raise TypeError(f"base_options must be a dict of {base}'s arguments or None; got {base_options!r}")
        self.num_heads, self.base_name = num_heads, base
        self.base = build(base, dims=ModelDims(dim=dim, num_heads=num_heads, max_len=max_len), **(base_options or {}))
        self.causal_only = self.base.causal_only
        self.mlp = nn.Sequential(nn.Linear(2 * num_heads, hidden), nn.LeakyReLU(), nn.Linear(hidden, num_heads))
        # the static bias by distance and its first-layer part, kept for cached decoding
        self._static_table: DerivedTensors[tuple[Tensor, Tensor] | None] = DerivedTensors()

    def transform_scores(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None
    ) -> Tensor:
        b, h, tq, tk = scores.shape
        first, act, second = self.mlp
        dtype = first.weight.dtype
        # f in the head-major layout of the scores, as batched products of its small weights
        # with the [B, H, Tq * Tk] block (no channel-last copies of the scores, their gradient
        # or the result): [hidden, H] x [H, pairs] per batch row. The first layer splits into a
        # part on the scores and a part on the static bias, made once when the batch shares the
        # bias and added by the product itself; the activation runs in place; the second
        # layer's product adds onto scores + static (F.linear would want the pairs channel-last).
        pairs = tq * tk
        w_scores, w_static = first.weight[:, :h], first.weight[:, h:]  # [hidden, H] x2
        kept = self._kept_row(scores, q, k, q_pos, kv_pos)
        if kept is not None:  # a cached decoding step: the static bias and its first-layer part read from a table
            static, on_static = kept  # [1, H, 1, Tk], [hidden, Tk]
            on_static = on_static.expand(b, -1, -1)
        else:
            static = self._static_block(q, k, q_pos, kv_pos, scores)  # [B or 1, H, Tq, Tk]
            flat_static = static.reshape(static.shape[0], h, pairs).to(dtype)  # [B or 1, H, pairs]
            # (not for a few pairs without gradients, a cached decoding step: there the batched
            # products below are 4-5% faster a step, their hidden layer small enough for the cache)
            few = pairs <= _TILE_PAIRS and not (torch.is_grad_enabled() and first.weight.requires_grad)
            if (scores.device.type == "cpu" and dtype == scores.dtype and flat_static.shape[0] == 1 and not few
                    and not torch.compiler.is_compiling()):
                out = _TiledAdaptiveBias.apply(scores.reshape(b, h, pairs), flat_static, first.weight, first.bias,
                                               second.weight, second.bias, act.negative_slope)
                return out.view(b, h, tq, tk)
            if flat_static.shape[0] == 1:
                on_static = torch.addmm(first.bias[:, None], w_static, flat_static[0]).expand(b, -1, -1)
            else:
                on_static = torch.baddbmm(first.bias[:, None], w_static.expand(b, -1, -1), flat_static)
        hidden = torch.baddbmm(on_static, w_scores.expand(b, -1, -1), scores.reshape(b, h, pairs).to(dtype))
        hidden = F.leaky_relu(hidden, act.negative_slope, inplace=True)  # [B, hidden, pairs]
        w_out = second.weight.expand(b, -1, -1)  # [B, H, hidden]
        if dtype == scores.dtype:
            base = torch.add(scores, static).add_(second.bias[:, None, None]).reshape(b, h, pairs)
            return torch.baddbmm(base, w_out, hidden).view(b, h, tq, tk)
        adapt = torch.baddbmm(second.bias[:, None], w_out, hidden).to(scores.dtype)  # [B, H, pairs]
        return (scores + static).add_(adapt.view(b, h, tq, tk))

    def transform_softmax_backward(
        self, scores: Tensor, centered_grad: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
        allowed: Tensor | None,
    ) -> tuple[Tensor, Tensor, tuple[tuple[Tensor, Tensor], ...]] | None:
        """With a static bias shared by the batch and weights in the scores' dtype: the math
        path's backward of a block in tiles of whole rows (:func:`_fused_softmax_backward`), each
        tile's hidden layer made once and used by the transform, the softmax and the gradients
        while it is in cache; the generic backward makes it twice (the transform again under
        autograd, then its backward) and passes over the whole block between them. The plan asks
        for it on CPU (``Plan.math_backward``); None for the inputs it cannot take."""
        check_transform_backward_inputs(scores, centered_grad, allowed, heads=self.num_heads)
        first, act, second = self.mlp
        if first.weight.dtype != scores.dtype:
            return None
        h, tq, tk = scores.shape[1:]
        base_learned = [p for p in self.base.parameters() if p.requires_grad]  # (called in a backward: grad mode is off)
        with torch.enable_grad() if base_learned else torch.no_grad():
            static = self._static_block(q, k, q_pos, kv_pos, scores)
            if static.shape[0] != 1:
                return None
            static = static.reshape(h, tq * tk)  # [H, pairs], shared by the batch
        with torch.no_grad():  # its gradients are written out: nothing to record (out= products refuse it)
            probs, d_scores, d_w1, d_b1, d_w2, d_b2, d_static = _fused_softmax_backward(
                scores, centered_grad, static.detach(), allowed, first.weight, first.bias, second.weight, second.bias,
                act.negative_slope, static_grad=bool(base_learned))
        pairs = [(t, g) for t, g in zip((first.weight, first.bias, second.weight, second.bias), (d_w1, d_b1, d_w2, d_b2))
                 if t.requires_grad]
        if base_learned:
            pairs += zip(base_learned, torch.autograd.grad(static, base_learned, d_static, allow_unused=True))
        return probs, d_scores, tuple((t, g) for t, g in pairs if g is not None)

    def _static_block(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, scores: Tensor) -> Tensor:
        """The base bias ``[B or 1, H, Tq, Tk]`` at the pairs of ``scores [B, H, Tq, Tk]``, in their
        dtype: one for the batch unless the base differs between sequences."""
        b, h, tq, tk = scores.shape
        idx = torch.arange(max(tq, tk), device=scores.device)
        static = self.base.score_bias(q, k, q_pos, kv_pos).dense(b, h, idx[:tq], idx[:tk], dtype=scores.dtype)
        return static.expand(-1, h, -1, -1)

    def _kept_row(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor
    ) -> tuple[Tensor, Tensor] | None:
        """For one query row at or after every key of one run of positions (a cached decoding
        step) with no gradient wanted: the static bias ``[1, H, 1, Tk]`` and its part of ``f``'s
        first layer ``[hidden, Tk]`` (``W_static B + b_1``), as views of a table by distance kept
        between calls (:class:`~posenc.primitives.derived.DerivedTensors`, one per doubling of the
        context). A step then evaluates neither the base bias nor that product. Only for a base
        that is a function of the distance alone (ALiBi, KERPLE; FIRE's depends on the query's
        own position too). None where this does not apply."""
        first = self.mlp[0]
        tq, tk = scores.shape[2], scores.shape[3]
        if (self.base_name not in _DISTANCE_ONLY_BASES or tq != 1 or torch.compiler.is_compiling()
                or first.weight.dtype != scores.dtype):
            return None
        sources = (first.weight, first.bias, *self.base.parameters(), *self.base.buffers())
        offset = shared_run_offset(q_pos, kv_pos)  # kv_pos[j] - q_pos[0] = offset + j
        if offset is None or offset + tk - 1 > 0 or not DerivedTensors.keeps(sources):
            return None
        distance = -offset  # of key 0, the largest
        n = doubling_length(distance)  # distances 0 .. n - 1

        def build() -> tuple[Tensor, Tensor]:
            # column m is distance n - 1 - m (offset m - (n - 1)): a row's keys are one increasing slice
            offsets = torch.arange(-(n - 1), 1, device=scores.device)
            bias = self.base.score_bias(q, k, offsets[-1:].view(1, 1), offsets.view(1, -1))
            if bias.by_offset is None or bias.per_batch:
                return None
            static = bias.by_offset(offsets).to(first.weight.dtype)  # [H, n]
            h = static.shape[0]
            return static, torch.addmm(first.bias[:, None], first.weight[:, h:], static)  # [hidden, n]

        tables = self._static_table.get(sources, build, key=(n, scores.dtype, scores.device))
        if tables is None:
            return None
        static, on_static = tables
        start = n - 1 - distance
        return static[None, :, None, start: start + tk], on_static[:, start: start + tk]


# Pairs per tile of the CPU form of f: its [hidden, tile] layer (1 MB at hidden 32) stays in cache
# between the products that write and read it; a flat optimum (a few thousand to tens of
# thousands of pairs time alike), so no machine's cache size is tuned in.
_TILE_PAIRS = 8192


class _TiledAdaptiveBias(torch.autograd.Function):
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
    (:class:`_TiledAdaptiveBias`, :func:`_fused_softmax_backward`). The first layer's as
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


def _fused_softmax_backward(
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
    tile_rows = max(1, _TILE_PAIRS // max(1, keys))
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
    width = min(_TILE_PAIRS, like.shape[2]) if width is None else width
    return tuple(like.new_empty((hidden, width)) for _ in range(count))


def _tiles(pairs: int):
    for p0 in range(0, pairs, _TILE_PAIRS):
        yield p0, min(pairs, p0 + _TILE_PAIRS)
