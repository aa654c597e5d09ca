"""T5 relative position buckets (Raffel et al. 2020, https://arxiv.org/abs/1910.10683).

The relative position ``r = j - i`` (key minus query position) is mapped to one of
``num_buckets`` buckets and each (bucket, head) has a learned scalar added to the scores:
``bias(h, i, j) = table[bucket(j - i), h]``.

Buckets: bidirectional attention spends half of the buckets on each sign (``r > 0`` gets the
upper half); causal attention keeps only ``n = max(-r, 0)`` (future keys share bucket 0 with
the diagonal). Within a half of ``m`` buckets, distances ``n < m/2`` get their own bucket and
larger ones are log-spaced, ``m/2 + floor(ln(n / (m/2)) / ln(max_distance / (m/2)) * (m - m/2))``,
capped at the last bucket, so every ``n >= max_distance`` shares it. This is the convention of
the original T5 code and of Hugging Face ``T5Attention._relative_position_bucket``.

T5 shares one table across all layers: pass one :class:`T5Bias` instance to every layer (as
``posenc.TransformerEncoder(encoding=...)`` does). Each layer then reads the same parameter and
autograd sums the gradients of all layers into it, once per layer.

Hook: score bias, learned. Kernel: the chunked dense path on CPU (the table gets its gradient
from the chunked backward; no ``T x T`` tensor is kept), FlexAttention ``score_mod`` on CUDA;
with the table frozen (``requires_grad_(False)`` or ``torch.no_grad()``) it is a constant bias
for SDPA's fused kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..common.checks import check_bool, check_int, check_sequence_positions, check_static_positions
from ..common.encoding import Hook, PositionEncoding
from .memo import ValueMemo
from ..common.pairwise import PairwiseBias, gather, take
from ..common.registry import register


def _check_buckets(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    check_bool("bidirectional", bidirectional)
    check_int("num_buckets", num_buckets)
    check_int("max_distance", max_distance)
    half = num_buckets // 2 if bidirectional else num_buckets
    if half < 2 or (bidirectional and num_buckets % 2):
        raise ValueError(
            f"num_buckets must be an int >= 2 (an even number >= 4 when bidirectional); got {num_buckets!r}"
        )
    if max_distance <= half // 2:
        raise ValueError(
            f"max_distance must be an int larger than the exact buckets ({half // 2}); got {max_distance!r}"
        )


def t5_relative_buckets(
    relative_position: Tensor, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """Bucket index (``long``, same shape) of each relative position ``r = j - i`` (key minus
    query, integers; see the module docstring for the buckets). The convention of the original T5
    code and Hugging Face ``T5Attention._relative_position_bucket``."""
    _check_buckets(num_buckets, max_distance, bidirectional)
    check_static_positions("relative_position", relative_position, integer=True)
    return _buckets(relative_position.long(), bidirectional, num_buckets, max_distance)


def _buckets(r: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """:func:`t5_relative_buckets` of checked ``long`` relative positions (the encoding's own
    ``arange``, once per call: at every decoding step in every layer, where the checks cost more
    than the buckets)."""
    if bidirectional:
        half = num_buckets // 2
        base = (r > 0).long() * half
        n = r.abs()
    else:
        half = num_buckets
        base = torch.zeros_like(r)
        n = (-r).clamp(min=0)
    exact = half // 2
    # log of n / exact on its own scale; n < exact is taken from the exact branch, so clamp first
    # to keep the log finite there.
    ratio = n.clamp(min=exact).to(torch.float32) / exact
    log_bucket = exact + (torch.log(ratio) / math.log(max_distance / exact) * (half - exact)).long()
    log_bucket = log_bucket.clamp(max=half - 1)
    return base + torch.where(n < exact, n, log_bucket)


def _offset_buckets(bidirectional: bool, num_buckets: int, max_distance: int, device) -> Tensor:
    """The bucket of each offset ``-max_distance .. max_distance`` ``[2 max_distance + 1]``."""
    offsets = torch.arange(-max_distance, max_distance + 1, device=device)
    return _buckets(offsets, bidirectional, num_buckets, max_distance)


_OFFSET_BUCKETS = ValueMemo(_offset_buckets)  # the same table at every call of an encoding


def t5_bucket(relative_position: Tensor, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """:func:`t5_relative_buckets` with keyword-only options (its earlier name)."""
    return t5_relative_buckets(relative_position, bidirectional, num_buckets, max_distance)


def t5_bias(relative_position: Tensor, table: Tensor, *, bidirectional: bool, max_distance: int = 128) -> Tensor:
    """The T5 bias ``table[bucket(r), h]`` moved to ``[H, ...]``: ``relative_position [...]``
    (integers, ``j - i``; e.g. :func:`posenc.functional.relative_position_grid`) and ``table
    [num_buckets, H]`` (learned) -> ``[H, ...]`` (differentiable in ``table``)."""
    if table.dim() != 2:
        raise ValueError(f"table must be [num_buckets, num_heads]; got {tuple(table.shape)}")
    buckets = t5_relative_buckets(relative_position, bidirectional, table.shape[0], max_distance)
    return table[buckets].movedim(-1, 0)


@register(
    "t5",
    modality="seq",
    paper="Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5), https://arxiv.org/abs/1910.10683",
    summary="learned scalar per (log-spaced relative-position bucket, head) on the scores",
)
class T5Bias(PositionEncoding):
    """Args:
        num_heads: query heads ``H``.
        num_buckets: buckets (32 in T5).
        max_distance: distances from here on share the last bucket (128 in T5).
        bidirectional: split buckets by sign (encoders); False for causal (decoder) attention.

    Parameters: ``table [num_buckets, H]``. Positions: integer ``[B or 1, T]``.
    """

    hooks = frozenset({Hook.SCORE_BIAS})

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False) -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        _check_buckets(num_buckets, max_distance, bidirectional)
        self.num_heads, self.num_buckets, self.max_distance = num_heads, num_buckets, max_distance
        self.bidirectional = bidirectional
        self.table = nn.Parameter(torch.empty(num_buckets, num_heads))
        nn.init.normal_(self.table, std=0.02)

    def buckets(self, relative_position: Tensor) -> Tensor:
        return t5_relative_buckets(relative_position, self.bidirectional, self.num_buckets, self.max_distance)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        check_sequence_positions(q_pos, kv_pos, integer_for="T5Bias")
        # One column per relative position -max_distance .. max_distance, [H, 2 max_distance + 1],
        # built once per call: the pairwise function is then a gather (no logarithm per pair), and
        # its gradient flows back to the table through this small tensor. Every |r| >= max_distance
        # shares the bucket of +-max_distance, so farther offsets are clamped onto the end columns
        # (a decoding step at context 8192 reads 257 columns, not 8193). The columns do not depend
        # on the positions: nothing is read from them (no host read; under torch.compile, no graph
        # break, where reading their range broke the graph six times a block).
        span = self.max_distance
        buckets = _OFFSET_BUCKETS(self.bidirectional, self.num_buckets, span, self.table.device)
        rel = self.table[buckets].T  # [H, 2 span + 1]

        def column(r: Tensor) -> Tensor:  # relative positions -> columns of rel
            return r.clamp(-span, span) + span

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return gather(rel, h, column(take(kv_pos, b, kv_idx) - take(q_pos, b, q_idx)))

        def by_offset(offsets: Tensor) -> Tensor:  # offsets [R] -> [H, R]
            return rel.index_select(1, column(offsets))  # a quarter of rel[:, ...]'s time at R = 2049

        return PairwiseBias(bias, per_batch=max(q_pos.shape[0], kv_pos.shape[0]) > 1, learned=(rel,), name="T5Bias",
                            by_offset=by_offset)
