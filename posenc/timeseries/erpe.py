"""eRPE, efficient relative position encoding (Foumani et al. 2023, ConvTran,
https://arxiv.org/abs/2305.16642).

A learned scalar per head and offset, ``w [H, 2L - 1]`` (zero-initialised), added AFTER the
softmax: ``A = softmax(Q K^T * scale) + B``, ``B_ij = w[h, i - j + L - 1]``, ``out = A V``.
Hook: after-softmax bias. Kernel: ``softmax(QK^T)V`` stays in SDPA's fused kernel and ``B V`` is
added beside it (``(A + B) V = A V + B V``); masked keys get no bias. Any head count works (the
public snippets that hard-code 8 heads in the index repeat do not).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_int
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, gather, take
from ..common.registry import register
from ..primitives.budget import check_allocation


@register(
    "erpe",
    modality="timeseries",
    paper="Foumani et al. 2023, Improving position encoding of transformers for multivariate time series "
    "classification (ConvTran), https://arxiv.org/abs/2305.16642",
    summary="learned scalar per head and offset, added after the softmax",
)
class ERPE(PositionEncoding):
    """Args:
        num_heads: heads ``H``.
        max_len: the longest series ``L``; offsets ``|i - j| <= L - 1``.

    Positions ``[B or 1, T]``, integer.
    """

    hooks = frozenset({Hook.POST_SOFTMAX})

    def __init__(self, num_heads: int, max_len: int) -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        check_int("max_len", max_len, minimum=1)
        self.num_heads, self.max_len = num_heads, max_len
        check_allocation(f"erpe(max_len={max_len}, num_heads={num_heads}): the table [H, 2 max_len - 1]",
                         (num_heads, 2 * max_len - 1), torch.float32)
        self.weight = nn.Parameter(torch.zeros(num_heads, 2 * max_len - 1))

    def prob_bias(self, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        for name, p in (("q_pos", q_pos), ("kv_pos", kv_pos)):
            if p.dim() != 2 or p.dtype.is_floating_point:
                raise ValueError(f"eRPE needs integer positions [batch or 1, tokens]; {name} is {p.dtype} {tuple(p.shape)}")
        if not torch.compiler.is_compiling() and q_pos.numel() and kv_pos.numel():
            # The largest |i - j| within any one sequence (a host sync: the price of a clear error).
            farthest = torch.maximum(
                q_pos.amax(1) - kv_pos.amin(1), kv_pos.amax(1) - q_pos.amin(1)
            ).max().item()
            if farthest > self.max_len - 1:
                raise ValueError(
                    f"eRPE was built for max_len={self.max_len} (offsets up to {self.max_len - 1}); "
                    f"these positions are {farthest} apart"
                )
        weight, centre = self.weight, self.max_len - 1

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return gather(weight, h, take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx) + centre)

        per_batch = max(q_pos.shape[0], kv_pos.shape[0]) > 1
        return PairwiseBias(bias, per_batch=per_batch, learned=(weight,), name="eRPE")
