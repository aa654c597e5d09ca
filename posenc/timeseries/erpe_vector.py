"""Vector relative position encoding: ConvTran's "Vector" alternative to eRPE (Foumani et al.
2023, https://arxiv.org/abs/2305.16642, ``Attention_Rel_Vec`` in its code), which is the relative
embedding of Shaw et al. 2018 (https://arxiv.org/abs/1803.02155) in the memory-efficient form of
Huang et al. 2018, Music Transformer (https://arxiv.org/abs/1809.04281).

A learned vector ``r_o`` of the head width per offset ``o = i - j`` (drawn from N(0, 1), as in
ConvTran), shared by every head (as in ConvTran) or one table per head, enters the scores BEFORE
the softmax through the query:

    ``S_ij = (q_i . k_j + q_i . r_{i - j}) * scale``,  ``A = softmax(S)``,  ``out = A V``.

Hook: score bias (content-dependent: ``B_ij = q_i . r_{i-j} * scale`` from the queries), so it
takes the dense path on CPU (chunked, with the bias gradient flowing back to ``q`` and ``r``) and
FlexAttention on CUDA. ``scale`` is this encoding's own (default ``head_dim ** -0.5``, the core's
default; ConvTran scales both terms by ``d_model ** -0.5``: pass ``scale`` to match a model's
attention scale; a constant factor the learned table can absorb either way).

Differences from ConvTran's code: its table holds ``L`` vectors and its "skew" trick yields the
offsets ``i >= j`` only (the upper triangle reads wrapped-around entries); here the table has all
``2L - 1`` offsets, so attention to later steps gets its own vectors.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_bool, check_int, check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, is_dense_block, rows_times_table, take
from ..common.registry import register
from ..primitives.budget import check_allocation
from ..primitives.shared_table import SharedGradTable


@register(
    "erpe_vector",
    modality="timeseries",
    paper="Foumani et al. 2023 (ConvTran, 'Vector' variant), https://arxiv.org/abs/2305.16642; "
    "Huang et al. 2018, https://arxiv.org/abs/1809.04281",
    summary="learned vector per offset, q_i . r_(i-j) added to the scores before the softmax",
)
class ERPEVector(PositionEncoding):
    """Args:
        num_heads: heads ``H``.
        head_dim: per-head width ``D``.
        max_len: the longest series ``L``; offsets ``|i - j| <= L - 1``.
        per_head: one table per head (``[H, 2L-1, D]``) instead of one shared table (``[1, 2L-1, D]``).
        scale: multiplies ``q_i . r_(i-j)``; default ``D ** -0.5``.

    Positions ``[B or 1, T]``, integer.
    """

    hooks = frozenset({Hook.SCORE_BIAS})

    def __init__(
        self, num_heads: int, head_dim: int, max_len: int, per_head: bool = False, scale: float | None = None
    ) -> None:
        super().__init__()
        for name, value in (("num_heads", num_heads), ("head_dim", head_dim), ("max_len", max_len)):
            check_int(name, value, minimum=1)
        check_bool("per_head", per_head)
        if scale is not None:
            check_number("scale", scale, minimum=0.0, strict=True)
        self.num_heads, self.head_dim, self.max_len, self.per_head = num_heads, head_dim, max_len, per_head
        self.scale = head_dim ** -0.5 if scale is None else float(scale)
        check_allocation(f"erpe_vector(max_len={max_len}, head_dim={head_dim}): the table [H, 2 max_len - 1, head_dim]",
                         (num_heads if per_head else 1, 2 * max_len - 1, head_dim), torch.float32)
        self.weight = nn.Parameter(torch.randn(num_heads if per_head else 1, 2 * max_len - 1, head_dim))

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        for name, p in (("q_pos", q_pos), ("kv_pos", kv_pos)):
            if p.dim() != 2 or p.dtype.is_floating_point:
                raise ValueError(f"vector eRPE needs integer positions [batch or 1, tokens]; {name} is {p.dtype} {tuple(p.shape)}")
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"queries have head width {q.shape[-1]}; this vector eRPE was built for head_dim={self.head_dim}")
        if not torch.compiler.is_compiling() and q_pos.numel() and kv_pos.numel():
            farthest = torch.maximum(q_pos.amax(1) - kv_pos.amin(1), kv_pos.amax(1) - q_pos.amin(1)).max().item()
            if farthest > self.max_len - 1:
                raise ValueError(
                    f"vector eRPE was built for max_len={self.max_len} (offsets up to {self.max_len - 1}); "
                    f"these positions are {farthest} apart"
                )
        # q_i . r_o, computed for each block of query rows the kernel asks for (one matmul over the
        # offsets those rows need, then a gather): never a [B, H, Tq, 2L-1] table.
        qs = q * self.scale  # [B, H, Tq, D]
        qs_rows = SharedGradTable(qs)  # read a chunk of rows at a time, one gradient buffer
        weight = self.weight.to(q.dtype)  # [1 or H, 2L-1, D]
        centre, per_head = self.max_len - 1, self.per_head
        traced = torch.compiler.is_compiling()

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            rel = take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx) + centre  # row of the table
            if is_dense_block(b, h, q_idx, kv_idx):
                # Traced, every offset of the table (no host read of the positions): 2L - 1 columns
                # a row instead of the few the block reaches.
                first, last = (0, weight.shape[1] - 1) if traced else (int(rel.min()), int(rel.max()))
                rows = qs_rows.rows(q_idx)  # [B, H, rows, D]
                table = rows_times_table(rows, weight[:, first : last + 1].transpose(-1, -2))  # [B, H, rows, R']
                return table.gather(-1, (rel - first).expand(table.shape[0], table.shape[1], -1, -1))
            return (qs[b, h, q_idx] * weight[h if per_head else h * 0, rel]).sum(-1)  # FlexAttention's score_mod

        return PairwiseBias(bias, per_batch=True, learned=(*qs_rows.learned, weight), name="vector eRPE", pointwise=False)
