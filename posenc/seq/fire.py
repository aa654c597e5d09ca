"""FIRE, functional interpolation for relative positions (Li et al. 2024, https://arxiv.org/abs/2310.04418).

``bias(h, i, j) = f_h( psi(i - j) / psi(max(L_thr, i)) )``, ``psi(x) = ln(c * x + 1)``, with ``f``
an MLP ``1 -> 32 -> H`` (ReLU), ``c`` learned (init 0.1) and the threshold ``L_thr`` learned
(init 512). ``i`` is the query's position, so the normalised distance lies in ``[0, 1]`` for
every query past the threshold: that is what lets FIRE extrapolate.

As in the authors' public code, ``psi`` takes ``|c|`` and ``|i - j|``, ``eps = 1e-6`` is added to
the normaliser, and the threshold is learned as a multiplier of its initial value,
``L_thr = |l_mult| * 512`` (``l_mult`` init 1; the same function, with gradients on a useful scale).
Causal only.

Hook: score bias. Kernel: the chunked dense path on CPU, evaluating the bias on each chunk of
query rows (no ``T x T`` tensor kept); FlexAttention ``score_mod`` on CUDA. At inference
(``torch.no_grad()`` or frozen parameters) the bias is a constant handed to SDPA's fused kernel,
and the MLP is evaluated in its exact piecewise-linear form (:meth:`FIRE.piecewise_linear`: a
breakpoint search and one multiply-add per pair instead of a 32-wide hidden layer); in training
the chunked backward yields the gradients of ``c``, ``l_mult`` and the MLP. Over integer positions
a block reads ``psi(|i - j|)`` from a table by distance and ``1 / psi(max(L, i))`` by query, made
once per call.
Shapes: positions ``[B or 1, T]``, integer or float.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.amp import autocast_off
from ..common.checks import check_int, check_number, check_sequence_positions
from ..common.decoding_state import LayerDecodingState
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import (
    PairwiseBias,
    gather,
    is_dense_block,
    take,
)
from ..common.registry import register
from ..primitives.derived import DerivedTensors, doubling_length

_EPS = 1e-6
_PSI_TABLE_MAX = 1 << 20  # distances looked up in a table up to this span; past it, a logarithm per pair


@register(
    "fire",
    modality="seq",
    paper="Li et al. 2024, Functional Interpolation for Relative Positions, https://arxiv.org/abs/2310.04418",
    summary="MLP of the log distance normalised by the query position; learned c and threshold; causal",
)
class FIRE(PositionEncoding):
    """Args:
        num_heads: query heads ``H``.
        mlp_width: hidden width of ``f`` (32 in the paper).
        init_c: initial ``c`` (0.1).
        init_threshold: initial ``L_thr`` (512).

    Parameters: ``c []``, ``l_mult []``, ``mlp`` (``Linear(1, mlp_width)``, ReLU, ``Linear(mlp_width, H)``).
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    causal_only = True

    def __init__(self, num_heads: int, mlp_width: int = 32, init_c: float = 0.1, init_threshold: float = 512.0) -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        check_int("mlp_width", mlp_width, minimum=1)
        check_number("init_c", init_c, minimum=0.0, strict=True)
        check_number("init_threshold", init_threshold, minimum=0.0, strict=True)
        self.num_heads = num_heads
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, num_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.l_mult = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_threshold", torch.tensor(float(init_threshold)))
        self._psi_table: DerivedTensors[Tensor] = DerivedTensors()  # psi by distance, without gradients

    @property
    def threshold(self) -> Tensor:
        """``L_thr = |l_mult| * init_threshold``."""
        return (self.l_mult * self.init_threshold).abs()

    def _work_dtype(self) -> torch.dtype:
        """float64 for a float64 module, else float32 (positions are converted to it)."""
        return torch.float64 if self.c.dtype == torch.float64 else torch.float32

    def _psi(self, x: Tensor) -> Tensor:
        """``psi(x) = log(1 + |c| x)`` in ``x``'s dtype (the work dtype)."""
        return torch.log1p(self.c.abs().to(x.dtype) * x)

    def _normalizer(self, q_pos: Tensor) -> Tensor:
        """``psi(max(L_thr, i)) + eps`` per query position, in the work dtype."""
        work = self._work_dtype()
        return self._psi(torch.maximum(q_pos.to(work), self.threshold.to(work))) + _EPS

    def normalized_distance(self, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """``psi(|i - j|) / (psi(max(L_thr, i)) + eps)`` for broadcastable positions."""
        return self._psi((q_pos - kv_pos).to(self._work_dtype()).abs()) / self._normalizer(q_pos)

    def _mlp(self, x: Tensor, h: Tensor | None, every_head: bool = False, rows: bool = False) -> Tensor:
        """The MLP itself at ``x``, head ``h``; ``every_head``: a dense block of all heads in
        order (``x [B or 1, 1, rows, keys]``), returned as a view ``[B or 1, H, rows, keys]``;
        ``rows``: every head at ``x [R]``, as ``[H, R]``."""
        first, last = self.mlp[0], self.mlp[2]
        # one input feature: the first layer is a multiply-add per unit, not a K=1 matmul
        hidden = torch.addcmul(first.bias, x.unsqueeze(-1).to(first.weight.dtype), first.weight[:, 0]).relu()
        out = F.linear(hidden, last.weight, last.bias)  # [..., H]: every head at once
        if rows:
            return out.T
        if every_head:
            return out.squeeze(1).movedim(-1, 1)
        return torch.take_along_dim(out, h.long().unsqueeze(-1), dim=-1).squeeze(-1)

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
                          state: LayerDecodingState | None = None) -> PairwiseBias:
        """The decoding hook: the MLP on the step's few pairs directly, which costs less than
        building its piecewise-linear form. One query without a batch of positions has a bias that
        is a function of the key's offset, evaluated once as a row the kernel cuts its block from,
        with ``psi(|i - j|)`` read from a kept table (the same values as :meth:`normalized_distance`)."""
        check_sequence_positions(q_pos, kv_pos)
        normalized = self.normalized_distance

        def direct(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            x = normalized(take(q_pos, b, q_idx), take(kv_pos, b, kv_idx))
            every_head = is_dense_block(b, h, q_idx, kv_idx) and h.shape[1] == self.num_heads and x.shape[1] == 1
            return self._mlp(x, h, every_head)

        by_offset = None
        if q_pos.shape == (1, 1) and kv_pos.shape[0] == 1:
            def by_offset(offsets: Tensor) -> Tensor:  # offsets kv - q [R] -> [H, R]
                distance = offsets.abs()
                psi = gather(self._kept_psi(int(distance.max()), distance.device), distance)
                return self._mlp(psi / self._normalizer(q_pos[0]), None, rows=True)

        return PairwiseBias(direct, per_batch=max(q_pos.shape[0], kv_pos.shape[0]) > 1, name="FIRE",
                            by_offset=by_offset, pointwise=False)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        check_sequence_positions(q_pos, kv_pos)
        first, last = self.mlp[0], self.mlp[2]
        normalized = self.normalized_distance
        per_batch = max(q_pos.shape[0], kv_pos.shape[0]) > 1
        mlp_weights = (first.weight, first.bias, last.weight, last.bias)  # not mlp.parameters(): a module walk per call
        learned = (self.c, self.l_mult, *mlp_weights)
        mlp = self._mlp
        inference = not (torch.is_grad_enabled() and any(t.requires_grad for t in learned))
        if inference:
            # The same MLP in its exact piecewise-linear form, a lookup per pair.
            breaks, slope, offset = self.piecewise_linear()

            def lookup(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                x = normalized(take(q_pos, b, q_idx), take(kv_pos, b, kv_idx)).to(slope.dtype)
                seg = torch.searchsorted(breaks, x.reshape(-1), right=True).reshape(x.shape)
                return slope[seg, h] * x + offset[seg, h]

            return PairwiseBias(lookup, per_batch=per_batch, name="FIRE", pointwise=False)

        segments = self._segments()  # constants of this call: once, not per block of rows
        # (not while torch.compile traces: the tables' span is read from the positions, a graph break)
        tables = None if torch.compiler.is_compiling() else self._distance_tables(q_pos, kv_pos)
        if tables is not None:
            # Integer positions: psi(|i - j|) looked up by distance and 1 / psi(max(L, i)) by query,
            # both made once per call (a gather per pair instead of a logarithm and a division);
            # the chunked backward gives their gradients, and autograd takes them to c and L once.
            psi_of_distance, inverse_norm = tables

            def distance_input(b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                distance = (take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx)).abs()
                return gather(psi_of_distance, distance) * take(inverse_norm, b, q_idx)

            learned = (psi_of_distance, inverse_norm, *mlp_weights)
        else:
            def distance_input(b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return normalized(take(q_pos, b, q_idx), take(kv_pos, b, kv_idx))

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            x = distance_input(b, q_idx, kv_idx)
            if is_dense_block(b, h, q_idx, kv_idx) and h.shape[1] == self.num_heads and x.shape[1] == 1:
                # A block for every head (the CPU chunks): the MLP in its piecewise-linear form,
                # a segment lookup and a multiply-add per pair, instead of a [pairs, width] hidden
                # layer twice (forward, backward). Its slopes and offsets carry the gradients of
                # the MLP; the slope, the gradient of x (c, l_mult). Exact, as the MLP is continuous.
                breaks, slope, offset = self._piecewise_linear(segments)
                return _segment_affine(x, breaks, slope, offset)
            return mlp(x, h)

        return PairwiseBias(bias, per_batch=per_batch, learned=learned, name="FIRE", pointwise=False)

    def _distance_tables(self, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor] | None:
        """For integer positions: ``psi(n)`` for every distance ``n = 0 .. max |i - j|`` and
        ``1 / (psi(max(L_thr, i)) + eps)`` per query position ``[B or 1, Tq]``, differentiable in
        ``c`` and ``L_thr``; None for float positions or a span past ``_PSI_TABLE_MAX``."""
        if q_pos.is_floating_point() or kv_pos.is_floating_point() or q_pos.numel() == 0 or kv_pos.numel() == 0:
            return None
        span = max(int(q_pos.max()) - int(kv_pos.min()), int(kv_pos.max()) - int(q_pos.min()), 0)
        if span > _PSI_TABLE_MAX:
            return None
        psi = self._psi(torch.arange(span + 1, device=self.c.device, dtype=self._work_dtype()))  # [span + 1]
        return psi, 1 / self._normalizer(q_pos)  # [B or 1, Tq]

    def _kept_psi(self, distance: int, device: torch.device) -> Tensor:
        """``psi(n) = log(1 + |c| n)`` for ``n = 0 .. m - 1`` ``[m]``, ``m >= distance + 1`` a power
        of two (at least 256), kept between calls without gradients to ``c``
        (:class:`~posenc.primitives.derived.DerivedTensors`; comparing it costs one value): a cached
        decoding step reaches one distance further each time, so the table is built once per
        doubling of the context instead of a logarithm per key, layer and step."""
        n = doubling_length(distance)
        work = self._work_dtype()

        def build() -> Tensor:
            return self._psi(torch.arange(n, device=device, dtype=work))

        return self._psi_table.get((self.c,), build, key=(n, work, device))

    def piecewise_linear(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP ``f(x) = W2 relu(w1 x + b1) + b2`` as ``f(x) = slope[s] x + offset[s]`` on the
        segments between the sorted ReLU breakpoints ``-b1/w1``: ``breaks [M]`` (``M`` the
        hidden width; ``inf`` for a unit with ``w1 = 0``), ``slope`` and ``offset [M + 1, H]``;
        segment ``s`` = number of breakpoints ``<= x``. ReLU is
        continuous, so a breakpoint belongs to either side (exact, up to rounding)."""
        with torch.no_grad():
            return self._piecewise_linear()

    def _segments(self) -> tuple[Tensor, Tensor]:
        """``breaks [M]`` and ``active [M + 1, M]`` (which hidden units are on in each segment):
        constants of the current parameters (moving a breakpoint does not change the continuous
        function at a point away from it)."""
        with torch.no_grad():
            w, b = self.mlp[0].weight[:, 0].detach(), self.mlp[0].bias.detach()
            flat = w == 0  # a unit with w1 = 0 is the constant relu(b1): its breakpoint is never reached
            breaks = torch.where(flat, torch.inf, -b / w).sort().values  # [width], the inf ones last
            # One point inside each segment (inf past the last finite breakpoint: the same signs).
            # Fixed sizes, no boolean indexing: this runs per call, at every decoding step.
            points = torch.cat((breaks[:1] - 1, (breaks[1:] + breaks[:-1]) / 2, breaks[-1:] + 1))
            active = torch.where(flat, b > 0, points[:, None] * w + b > 0).to(w.dtype)  # [width + 1, width]
        return breaks, active

    def _piecewise_linear(self, segments: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`piecewise_linear` on ``segments`` (:meth:`_segments`; None computes them), with
        ``slope`` and ``offset`` attached to the MLP's parameters when gradients are on."""
        breaks, active = self._segments() if segments is None else segments
        w, b = self.mlp[0].weight[:, 0], self.mlp[0].bias
        w2, b2 = self.mlp[2].weight, self.mlp[2].bias
        return breaks, (active * w) @ w2.t(), (active * b) @ w2.t() + b2


def _segment_affine(x: Tensor, breaks: Tensor, slope: Tensor, offset: Tensor) -> Tensor:
    """``x [B or 1, 1, rows, keys]`` -> ``slope[s, h] * x + offset[s, h]`` as ``[B or 1, H, rows, keys]``,
    ``s`` the segment of ``x`` among ``breaks [M]`` (``slope, offset [M + 1, H]``); differentiable
    in ``x``, ``slope`` and ``offset``."""
    return _SegmentAffine.apply(x, breaks, slope, offset)


class _SegmentAffine(torch.autograd.Function):
    """:func:`_segment_affine` with its backward written out: the slope and offset gradients are
    per-segment sums, one ``index_add_`` of the ``[pairs, 2H]`` gradients into ``[M + 1, 2H]``
    (a ``bincount`` per head took four times as long: it converts the weights to float64 and
    scans them for their range; autograd's backward of the row lookup scatters into a
    zero-filled ``[pairs, 2H]`` buffer and then sums it)."""

    @staticmethod
    def forward(ctx, x: Tensor, breaks: Tensor, slope: Tensor, offset: Tensor) -> Tensor:
        heads = slope.shape[1]
        xw = x[:, 0].to(slope.dtype)  # [B or 1, rows, keys]
        seg = torch.searchsorted(breaks, xw.reshape(-1), right=True)  # [pairs]
        # Head-major: each head's slopes and offsets gathered along the pairs, so the block comes
        # out [B or 1, H, rows, keys] with the keys contiguous, as the mask and the fused kernel
        # read it (a pair-major block, heads innermost, cost a chunk 4% more there than it saved).
        picked = torch.cat((slope, offset), dim=1).T.contiguous().index_select(1, seg)  # [2H, pairs]
        out = torch.addcmul(picked[heads:], picked[:heads], xw.reshape(1, -1))  # [H, pairs]
        ctx.save_for_backward(xw, seg.view(xw.shape), slope)
        ctx.x_dtype = x.dtype
        return out.view(heads, *xw.shape).transpose(0, 1)

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor):
        xw, seg, slope = ctx.saved_tensors
        segments, heads = slope.shape
        per_pair = slope.new_empty((seg.numel(), 2 * heads))  # [pairs, 2H]: gradients of slope, offset
        per_pair[:, heads:] = grad.movedim(1, -1).reshape(-1, heads)  # the pairs' rows of heads
        g_x = g_slope = g_offset = None
        if ctx.needs_input_grad[0]:  # d out / d x: each pair's slope (looked up again: not kept, [pairs, H])
            slopes = F.embedding(seg.reshape(-1), slope)
            g_x = (per_pair[:, heads:] * slopes).sum(-1).view(xw.shape).unsqueeze(1).to(ctx.x_dtype)
        if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
            per_pair[:, :heads] = per_pair[:, heads:] * xw.reshape(-1, 1)  # (no out= into a column slice: torch.compile refuses it)
            # rows of 2H along the pairs: an add of 2H contiguous values per pair (along the heads
            # axis, the same sum took twice as long)
            sums = per_pair.new_zeros(segments, 2 * heads).index_add_(0, seg.reshape(-1), per_pair)  # [M + 1, 2H]
            g_slope, g_offset = sums[:, :heads], sums[:, heads:]
        return g_x, None, g_slope, g_offset
