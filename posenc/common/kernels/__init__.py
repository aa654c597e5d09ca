"""The attention kernel paths, one module a path. :func:`posenc.common.planning.decide` chooses
among them and :func:`posenc.common.attention.run` runs the chosen one, as the plan says; the
kernels execute, they do not choose.

``sdpa``     (:mod:`.sdpa`) ``scaled_dot_product_attention``: nothing touches the scores, or a bias
             of the key alone rides as one more key column (:func:`key_column_path`).
``dense``    (:mod:`.dense`, :mod:`.dense_blocks`) a score bias handed to a fused kernel chunk by
             chunk of query rows, each bias chunk recomputed in the backward pass.
``flex``     (:mod:`.flex`) FlexAttention with the bias as ``score_mod``, the mask as a ``BlockMask``.
``math``     (:mod:`.math`) explicit ``softmax(QK^T * scale + bias) V`` in row chunks, for a score
             transform or a value term; :func:`weights_path` returns the weights too.
``linear``   (:mod:`.linear`) ``phi(Q) (phi(K)^T V)`` with a running state for causal and packed masks
             (the feature maps: :mod:`posenc.common.linear_attention`).

Beside them: the chunking and its autograd function (:mod:`.chunking`), SDPA's private CPU
kernels (:mod:`.aten`), the masked softmax and the after-softmax term (:mod:`.probs`), Shaw's
value term over offsets (:mod:`.offset_values`) and the encoding's terms (:mod:`.terms`).

Every path returns zeros for a query row whose keys are all masked, and no NaN in gradients.
Padded keys and values (``key_valid`` False) are zeroed before any path runs
(:meth:`~posenc.common.masks.AttentionMask.zero_padding`, in :func:`posenc.common.attention.prepare`):
a masked score becomes ``-inf`` only after ``q.k`` is formed and ``0 * NaN`` is NaN in ``P V``, so
without it a NaN in padding would reach every real row. Shapes: ``q [B, Hq, Tq, D]``,
``k, v [B, Hkv, Tk, D]``.
"""

from .aten import CPU_FLASH_BACKWARD_SCHEMA, CPU_FLASH_FORWARD_SCHEMA, cpu_flash_backward, cpu_flash_forward
from .chunking import Form, chunk_rows, dense_chunk_rows, math_chunk_rows
from .dense import dense_path
from .flex import FLEX_RECOMPILE_LIMIT, flex_path, run_compiled_flex
from .linear import LINEAR_CHUNK_ROWS, linear_path
from .math import math_path, weights_path
from .offset_values import offset_value_term
from .probs import masked_softmax, prob_bias_term
from .sdpa import KEY_COLUMN_ALIGN, key_column_path, sdpa_path
from .terms import NO_TERMS, EncodingTerms, ScoreTransform, TransformSoftmaxBackward, ValueTerm

__all__ = [
    "CPU_FLASH_BACKWARD_SCHEMA", "CPU_FLASH_FORWARD_SCHEMA", "FLEX_RECOMPILE_LIMIT", "KEY_COLUMN_ALIGN", "LINEAR_CHUNK_ROWS", "NO_TERMS", "EncodingTerms", "Form",
    "ScoreTransform", "TransformSoftmaxBackward", "ValueTerm", "chunk_rows", "cpu_flash_backward", "cpu_flash_forward",
    "dense_chunk_rows", "dense_path", "flex_path", "key_column_path", "linear_path", "masked_softmax", "math_chunk_rows", "math_path",
    "offset_value_term", "prob_bias_term", "run_compiled_flex", "sdpa_path", "weights_path",
]
