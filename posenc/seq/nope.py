"""NoPE, no position encoding (Kazemnejad et al. 2023, The Impact of Positional Encoding on Length
Generalization in Transformers, https://arxiv.org/abs/2305.19466).

No position signal at all: a causal decoder still knows order through the causal mask alone.
Nothing touches q, k or the scores, so attention takes the plain SDPA path (``is_causal``).

The registry refuses a class without hooks, so NoPE declares the input hook and leaves ``x``
unchanged; having no attention hooks, attention layers see no encoding at all
(:func:`posenc.common.encoding.attention_part` returns None).
"""

from __future__ import annotations

from torch import Tensor

from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register


@register(
    "nope",
    modality="seq",
    paper="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization, "
    "https://arxiv.org/abs/2305.19466",
    summary="no position signal; the causal mask alone",
)
class NoPE(PositionEncoding):
    """No arguments. Shapes: ``x [B, T, C]``, ``positions [B or 1, T]`` -> ``x`` unchanged."""

    hooks = frozenset({Hook.INPUT})

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        if positions.dim() not in (2, 3) or positions.shape[1] != x.shape[1]:
            raise ValueError(f"positions must be [batch or 1, {x.shape[1]}]; got {tuple(positions.shape)}")
        return x
