"""``posenc bench attention --smithy``: AttentionSmithy's attention with its own method against the
same module running posenc's core (issue 22).

For each encoding the bench asks for (by default
:data:`posenc.cli.bench.attention.SMITHY_ENCODINGS`: none, rope and alibi, which AttentionSmithy
has, and t5 and fire, which it lacks) three rows time the same unit as every attention-bench row (causal
self-attention with its projections, forward + backward):

``NAME`` (impl ``posenc``)
    posenc's own :class:`posenc.MultiheadAttention` (the bench's usual row).
``attention-smithy NAME`` (impl ``attention-smithy``)
    AttentionSmithy's ``MultiheadAttention`` with its ``StandardAttentionMethod(is_causal_masking=True)``;
    positions from its own strategies (``RotaryPositionEmbedding``, ``ALiBiPositionEmbedding``) or,
    for the encodings it lacks, from posenc's (:func:`posenc.integrations.attention_smithy.strategies`).
``attention-smithy+posenc NAME`` (impl ``attention-smithy+posenc``)
    the same AttentionSmithy module with :class:`~posenc.integrations.attention_smithy.PosencAttentionMethod`
    holding the posenc encoding (rope with AttentionSmithy's interleaved pairs).

The notes give the two ratios the issue sets targets for: ``attention-smithy+posenc`` over
posenc's own module (target <= 1.2) and AttentionSmithy's method over ``attention-smithy+posenc``
(target >= 2).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Callable

from torch import Tensor, nn

from ...common.registry import ModelDims, build

SMITHY = "attention-smithy"
OWN_STRATEGIES = ("none", "rope", "alibi")  # the rows AttentionSmithy's own strategies serve
BRIDGED = "attention-smithy+posenc"


def _encoding(name: str, dim: int, heads: int, seq_len: int):
    if name == "none":
        return None
    options = {"pairing": "interleaved"} if name == "rope" else {}
    return build(name, dims=ModelDims(dim=dim, num_heads=heads, max_len=seq_len), **options)


class SmithyUnit(nn.Module):
    """AttentionSmithy's ``MultiheadAttention`` (causal) with its own method or posenc's.

    Shapes: ``x [B, T, C]`` -> ``[B, T, C]``.
    """

    def __init__(self, dim: int, num_heads: int, seq_len: int, encoding: str, bridged: bool) -> None:
        super().__init__()
        from attention_smithy.attention import StandardAttentionMethod
        from attention_smithy.components import MultiheadAttention
        from attention_smithy.numeric_embeddings import (
            ALiBiPositionEmbedding,
            NumericEmbeddingManager,
            RotaryPositionEmbedding,
        )

        from ...integrations.attention_smithy import PosencAttentionMethod, strategies

        if bridged:
            method = PosencAttentionMethod(_encoding(encoding, dim, num_heads, seq_len), is_causal_masking=True)
            self.manager = NumericEmbeddingManager([])
            self.kernel_path, self.path_reason = "posenc", "PosencAttentionMethod: posenc.attend's plan for the encoding"
        else:
            method = StandardAttentionMethod(is_causal_masking=True)
            own = {"rope": lambda: [RotaryPositionEmbedding(dim // num_heads)],
                   "alibi": lambda: [ALiBiPositionEmbedding(num_heads)], "none": lambda: []}
            assert set(own) == set(OWN_STRATEGIES)
            made = own[encoding]() if encoding in own else strategies(_encoding(encoding, dim, num_heads, seq_len))
            self.manager = NumericEmbeddingManager(made)
            self.kernel_path = "math"
            self.path_reason = "StandardAttentionMethod: scores, bias, mask and softmax as separate torch ops"
        self.attn = MultiheadAttention(dim, num_heads, method)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.attn(x, x, x, numeric_embedding_manager=self.manager, padding_and_loss_attention_mask=None)
        return out


def available() -> bool:
    return importlib.util.find_spec("attention_smithy") is not None


def smithy_can_run(name: str, dim: int, heads: int, seq_len: int) -> bool:
    """Whether AttentionSmithy's own method can run ``name``: its own strategies, or posenc's as strategies."""
    if name in OWN_STRATEGIES:
        return True
    from ...integrations.attention_smithy import expressible

    return expressible(_encoding(name, dim, heads, seq_len)) is None


def candidates(dim: int, heads: int, seq_len: int, make: Callable, encodings: tuple[str, ...]) -> list:
    """The AttentionSmithy rows for ``encodings`` (``make(name, impl, factory)`` builds the bench's
    Candidate): ``attention-smithy NAME`` where its own method can run NAME (see
    :func:`smithy_can_run`), ``attention-smithy+posenc NAME`` for every one."""
    rows = [make(f"{SMITHY} {enc}", SMITHY, functools.partial(SmithyUnit, dim, heads, seq_len, enc, False))
            for enc in encodings if smithy_can_run(enc, dim, heads, seq_len)]
    rows += [make(f"{BRIDGED} {enc}", BRIDGED, functools.partial(SmithyUnit, dim, heads, seq_len, enc, True))
             for enc in encodings]
    return rows


def summary(rows) -> list[str]:
    """Per encoding: bridged / posenc's own module and AttentionSmithy's method / bridged."""
    ms = {r.name: r.ms for r in rows if r.ms is not None}
    lines = []
    for enc in dict.fromkeys(r.name.removeprefix(f"{BRIDGED} ") for r in rows if r.impl == BRIDGED):
        own, smithy, bridged = ms.get(enc), ms.get(f"{SMITHY} {enc}"), ms.get(f"{BRIDGED} {enc}")
        if bridged is None:
            continue
        parts = [f"{enc}:"]
        if own:
            parts.append(f"PosencAttentionMethod / posenc MultiheadAttention = {bridged / own:.2f} (target <= 1.2)")
        if smithy:
            parts.append(f"StandardAttentionMethod / PosencAttentionMethod = {smithy / bridged:.2f} (target >= 2)")
        lines.append(" ".join(parts))
    return lines
