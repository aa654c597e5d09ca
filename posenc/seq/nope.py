"""NoPE, no position encoding (Kazemnejad et al. 2023, The Impact of Positional Encoding on Length
Generalization in Transformers, https://arxiv.org/abs/2305.19466).

No position signal at all: a causal decoder still knows order through the causal mask alone.
Nothing touches q, k or the scores, so attention takes the plain SDPA path (``is_causal``).

It declares no hooks: models add nothing to the input, and attention layers see no encoding
at all (:func:`posenc.common.encoding.attention_part` returns None).
"""

from __future__ import annotations

from ..common.encoding import PositionEncoding
from ..common.registry import register


@register(
    "nope",
    modality="seq",
    paper="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization, "
    "https://arxiv.org/abs/2305.19466",
    summary="no position signal; the causal mask alone",
)
class NoPE(PositionEncoding):
    """No arguments and no hooks: the model runs exactly as with ``encoding=None``."""

    hooks = frozenset()
