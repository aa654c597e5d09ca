"""The attention kernel paths, one module a path: :mod:`.sdpa` (with the key column), :mod:`.dense`
(with :mod:`.dense_blocks`), :mod:`.flex`, :mod:`.math`, :mod:`.linear`; beside them the chunking,
SDPA's private CPU kernels (:mod:`.aten`), the probabilities (:mod:`.probs`), Shaw's value term
(:mod:`.offset_values`) and the encoding's terms (:mod:`.terms`). :func:`posenc.common.planning.decide`
chooses the path and :func:`posenc.common.attention.run` runs it with the plan's fields: the
kernels execute, they do not choose (docs/architecture.md, "One call through the core", step 4).

Every path returns zeros for a query row whose keys are all masked, and no NaN in gradients;
padded keys and values arrive zeroed (:meth:`~posenc.common.masks.AttentionMask.zero_padding`).
Shapes: ``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]``.
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
    "CPU_FLASH_BACKWARD_SCHEMA", "CPU_FLASH_FORWARD_SCHEMA", "FLEX_RECOMPILE_LIMIT", "KEY_COLUMN_ALIGN",
    "LINEAR_CHUNK_ROWS", "NO_TERMS", "EncodingTerms", "Form", "ScoreTransform", "TransformSoftmaxBackward",
    "ValueTerm", "chunk_rows", "cpu_flash_backward", "cpu_flash_forward", "dense_chunk_rows", "dense_path",
    "flex_path", "key_column_path", "linear_path", "masked_softmax", "math_chunk_rows", "math_path",
    "offset_value_term", "prob_bias_term", "run_compiled_flex", "sdpa_path", "weights_path",
]
