"""What an encoding adds to one call, as the kernels take it: :class:`EncodingTerms`.

:func:`posenc.common.attention.prepare` builds them from the encoding's hooks; every kernel path
reads them and nothing else of the encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor

from ..pairwise import PairwiseBias

ScoreTransform = Callable[[Tensor, Tensor, Tensor, slice, slice, "Tensor | None"], Tensor]


# (scores, centered_grad, q_rows, k_keys, rows, keys, allowed) -> (probs, d_scores, ((tensor, grad), ...)) or None
TransformSoftmaxBackward = Callable[
    [Tensor, Tensor, Tensor, Tensor, slice, slice, "Tensor | None"],
    "tuple[Tensor, Tensor, tuple[tuple[Tensor, Tensor], ...]] | None",
]


ValueTerm = Callable[[Tensor, slice, slice], Tensor]


@dataclass(frozen=True)
class EncodingTerms:
    """What an encoding adds to one call's scores and probabilities, as the kernels take it.

    Attributes:
        bias: the score bias (the encoding's and a caller's ``attn_bias``, summed).
        prob_bias: an after-softmax bias (eRPE).
        score_transform: ``(scores, q_rows, k_keys, rows, keys, allowed) -> scores`` over whole
            score blocks ``[B, H, rows, keys]`` (CAPE, CoPE).
        value_term: ``(probs, rows, keys) -> [B, H, rows, Dv]`` added to ``P V`` (Shaw values).
        transform_softmax_backward: the encoding's
            :meth:`~posenc.common.encoding.PositionEncoding.transform_softmax_backward` over whole
            blocks ``(scores, centered_grad, q_rows, k_keys, rows, keys, allowed)``, or None.
        transform_inputs: the tensors ``score_transform`` and ``value_term`` read that may need a
            gradient (the encoding's :meth:`~posenc.common.encoding.PositionEncoding.math_parameters`).
    """

    bias: PairwiseBias | None = None
    prob_bias: PairwiseBias | None = None
    score_transform: ScoreTransform | None = None
    value_term: ValueTerm | None = None
    transform_inputs: tuple[Tensor, ...] = ()
    transform_softmax_backward: TransformSoftmaxBackward | None = None


NO_TERMS = EncodingTerms()
