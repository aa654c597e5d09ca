"""CAPE / DAPE, context-adaptive positional encoding (Zheng et al. 2024, https://arxiv.org/abs/2405.14722).

``A = QK^T + B + f([QK^T; B])``: ``B`` is a static positional bias (ALiBi, KERPLE or FIRE, built
by name through the registry), and ``f`` an MLP applied at every pair ``(i, j)`` across the head
axis, ``2H -> hidden -> H`` (LeakyReLU, as in the authors' code), so the bias adapts to the
attention scores. ``QK^T`` here is the scaled score ``q.k / sqrt(d)``.

It needs the whole score matrix: the encoding sets ``needs_scores`` and implements
``transform_scores``, which only the math path serves (``backend="auto"`` picks it; another
backend is a clear error). Which form of ``f`` runs is the plan's choice: on CPU, with a
static bias shared by the batch, ``f`` runs over tiles of pairs with its backward written out
(:meth:`CAPE.transform_scores_tiled`, :class:`TiledAdaptiveBias`): its hidden layer lives a
tile at a time, in cache, and is evaluated again in the backward pass rather than stored (less
memory and time: results/bench-2026-12-06/special-paths), and the math path's backward takes its
own pass over tiles of rows (:meth:`CAPE.transform_softmax_backward`: transform, softmax and
gradients from one evaluation of the hidden layer). A decoding step reads the static bias from a
table by distance (:meth:`CAPE.decode_transform_scores`). Elsewhere (CUDA, a per-sequence bias,
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

from ..common.checks import check_choice, check_int, check_transform_backward_inputs
from ..common.decoding_state import LayerDecodingState
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import shared_run_offset
from ..common.registry import ModelDims, build, register
from ..primitives.derived import DerivedTensors, doubling_length
from .cape_tiles import TiledAdaptiveBias, fused_softmax_backward

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
        first = self.mlp[0]
        # f in the head-major layout of the scores, as batched products of its small weights
        # with the [B, H, Tq * Tk] block (no channel-last copies of the scores, their gradient
        # or the result): [hidden, H] x [H, pairs] per batch row. The first layer splits into a
        # part on the scores and a part on the static bias, made once when the batch shares the
        # bias and added by the product itself.
        static = self._static_block(q, k, q_pos, kv_pos, scores)  # [B or 1, H, Tq, Tk]
        flat_static = static.reshape(static.shape[0], h, tq * tk).to(first.weight.dtype)  # [B or 1, H, pairs]
        w_static = first.weight[:, h:]  # [hidden, H]
        if flat_static.shape[0] == 1:
            on_static = torch.addmm(first.bias[:, None], w_static, flat_static[0]).expand(b, -1, -1)
        else:
            on_static = torch.baddbmm(first.bias[:, None], w_static.expand(b, -1, -1), flat_static)
        out = self._adapt(scores.reshape(b, h, tq * tk), static.reshape(static.shape[0], h, tq * tk), on_static)
        return out.view(b, h, tq, tk)

    def transform_scores_tiled(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None
    ) -> Tensor | None:
        """:meth:`transform_scores` over tiles of pairs with its backward written out
        (:class:`TiledAdaptiveBias`), for a static bias shared by the batch and weights in the
        scores' dtype; None otherwise. The plan asks for it on CPU (``Plan.tiled_transform``)."""
        b, h, tq, tk = scores.shape
        first, act, second = self.mlp
        if first.weight.dtype != scores.dtype:
            return None
        static = self._static_block(q, k, q_pos, kv_pos, scores)  # [B or 1, H, Tq, Tk]
        if static.shape[0] != 1:
            return None
        out = TiledAdaptiveBias.apply(scores.reshape(b, h, tq * tk), static.reshape(1, h, tq * tk), first.weight,
                                       first.bias, second.weight, second.bias, act.negative_slope)
        return out.view(b, h, tq, tk)

    def decode_transform_scores(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None,
        state: LayerDecodingState | None = None,
    ) -> Tensor:
        """The decoding hook: a few query rows over the cache, no gradient. Over a base of the
        distance alone, with every key at or before every query row of one run of positions and
        weights in the scores' dtype, each row's static bias and its first-layer part
        (``W_static B + b_1``) are views of a table by distance kept between steps
        (:meth:`_distance_tables`): a step evaluates neither the base bias nor that product.
        Otherwise :meth:`transform_scores`."""
        tables = self._distance_tables(scores, q, k, q_pos, kv_pos)
        if tables is None:
            return self.transform_scores(scores, q, k, q_pos, kv_pos, allowed)
        static, on_static, first_column = tables  # [H, n], [hidden, n], row 0's first key
        b, h, tq, tk = scores.shape
        out = torch.empty_like(scores)  # [B, H, Tq, Tk]
        for i in range(tq):  # row i's keys: one slice of the tables, one distance farther than row i - 1's
            c = first_column - i
            out[:, :, i] = self._adapt(scores[:, :, i], static[None, :, c: c + tk],
                                       on_static[:, c: c + tk].expand(b, -1, -1))
        return out

    def _adapt(self, scores: Tensor, static: Tensor, on_static: Tensor) -> Tensor:
        """``scores + static + f([scores; static])`` from the first layer's static part:
        ``scores [B, H, P]``, ``static [B or 1, H, P]``, ``on_static [B, hidden, P]``
        (``W_static static + b_1``) -> ``[B, H, P]`` in the scores' dtype."""
        b, h = scores.shape[:2]
        first, act, second = self.mlp
        dtype = first.weight.dtype
        hidden = torch.baddbmm(on_static, first.weight[:, :h].expand(b, -1, -1), scores.to(dtype))  # [B, hidden, P]
        hidden = F.leaky_relu(hidden, act.negative_slope, inplace=True)
        w_out = second.weight.expand(b, -1, -1)  # [B, H, hidden]
        if dtype == scores.dtype:  # the second layer's product adds onto scores + static
            return torch.baddbmm(torch.add(scores, static).add_(second.bias[:, None]), w_out, hidden)
        adapt = torch.baddbmm(second.bias[:, None], w_out, hidden).to(scores.dtype)  # [B, H, P]
        return (scores + static).add_(adapt)

    def transform_softmax_backward(
        self, scores: Tensor, centered_grad: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
        allowed: Tensor | None,
    ) -> tuple[Tensor, Tensor, tuple[tuple[Tensor, Tensor], ...]] | None:
        """With a static bias shared by the batch and weights in the scores' dtype: the math
        path's backward of a block in tiles of whole rows (:func:`fused_softmax_backward`), each
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
            probs, d_scores, d_w1, d_b1, d_w2, d_b2, d_static = fused_softmax_backward(
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

    def _distance_tables(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor
    ) -> tuple[Tensor, Tensor, int] | None:
        """For query rows of one run of positions at or after every key of another: the static
        bias ``[H, n]`` and its part of ``f``'s first layer ``[hidden, n]`` (``W_static B + b_1``)
        by distance, column ``m`` distance ``n - 1 - m``, kept between calls
        (:class:`~posenc.primitives.derived.DerivedTensors`, one per doubling of the context), and
        the column of row 0's first key. Only for a base that is a function of the distance alone
        (ALiBi, KERPLE; FIRE's depends on the query's own position too), weights in the scores'
        dtype, no gradient wanted. None where this does not apply."""
        first = self.mlp[0]
        tq, tk = scores.shape[2], scores.shape[3]
        if self.base_name not in _DISTANCE_ONLY_BASES or first.weight.dtype != scores.dtype:
            return None
        sources = (first.weight, first.bias, *self.base.parameters(), *self.base.buffers())
        offset = shared_run_offset(q_pos, kv_pos)  # kv_pos[j] - q_pos[i] = offset + j - i
        if offset is None or offset + tk - 1 > 0 or not DerivedTensors.keeps(sources):
            return None  # (row 0's last key is the nearest pair: at distance 0 or more)
        distance = tq - 1 - offset  # of the farthest pair: row tq - 1, key 0
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
        return *tables, n - 1 + offset  # row 0, key 0: distance -offset
