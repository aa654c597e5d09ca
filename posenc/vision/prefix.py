"""Keeping prefix tokens (class token, registers) out of a 1D sequence encoding.

A ViT may use any registered sequence encoding over the flattened patch order (positions
``0 .. N-1`` in raster order). :class:`PatchTokensOnly` wraps such an encoding so that it acts on
the patch tokens only: the first ``num_prefix_tokens`` tokens get no input encoding, are not
rotated, and every score (or probability) bias involving them is zero. The wrapped encoding sees
only the patch tokens and their positions, as if the prefix tokens were not there.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..common.encoding import PositionEncoding
from ..common.pairwise import PairwiseBias


def _without_prefix(bias: PairwiseBias, num_prefix: int) -> PairwiseBias:
    """``bias`` over patch indices, shifted by ``num_prefix`` and zero where a prefix token is involved."""
    fn = bias.fn

    def shifted(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        keep = (q_idx >= num_prefix) & (kv_idx >= num_prefix)
        value = fn(b, h, (q_idx - num_prefix).clamp(min=0), (kv_idx - num_prefix).clamp(min=0))
        return torch.where(keep, value, torch.zeros_like(value))

    return PairwiseBias(shifted, per_batch=bias.per_batch, learned=bias.learned, name=f"{bias.name} (patch tokens only)",
                        pointwise=bias.pointwise)


class PatchTokensOnly(PositionEncoding):
    """Applies ``encoding`` to the tokens after the first ``num_prefix_tokens``.

    Args:
        encoding: any :class:`PositionEncoding` (typically a registered sequence encoding).
        num_prefix_tokens: leading tokens the encoding does not see.

    Positions are those of the whole token sequence ``[B or 1, T(, coords)]``; the prefix entries
    are ignored. Hooks, causal-only flag and head count are the wrapped encoding's. Not for KV
    caches (the prefix offset applies to full sequences).
    """

    supports_kv_cache = False

    def __init__(self, encoding: PositionEncoding, num_prefix_tokens: int) -> None:
        super().__init__()
        if not isinstance(encoding, PositionEncoding):
            raise TypeError(f"encoding must be a PositionEncoding; got {type(encoding).__name__}")
        if num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens must be >= 0; got {num_prefix_tokens}")
        self.inner = encoding
        self.num_prefix_tokens = num_prefix_tokens
        # Instance attributes shadow the class defaults: this wrapper has the inner encoding's hooks.
        self.hooks = encoding.hooks
        self.causal_only = encoding.causal_only
        self.needs_probs = encoding.needs_probs

    def extra_repr(self) -> str:
        return f"num_prefix_tokens={self.num_prefix_tokens}"

    @property
    def num_heads(self) -> int | None:
        return self.inner.num_heads

    @property
    def has_prob_bias(self) -> bool:
        return self.inner.has_prob_bias

    def math_parameters(self):
        return self.inner.math_parameters()

    def _check(self, length: int) -> None:
        if length < self.num_prefix_tokens:
            raise ValueError(f"got {length} tokens; this encoding skips {self.num_prefix_tokens} prefix tokens")

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        p = self.num_prefix_tokens
        self._check(x.shape[1])
        patches = self.inner.encode_input(x[:, p:], positions[:, p:])
        if patches.shape[-1] != x.shape[-1]:
            raise ValueError(
                f"{type(self.inner).__name__} changes the feature width ({x.shape[-1]} -> {patches.shape[-1]}); "
                "prefix tokens cannot be kept apart from it"
            )
        return torch.cat((x[:, :p], patches), dim=1)

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        p = self.num_prefix_tokens
        self._check(min(q.shape[2], k.shape[2]))
        q2, k2 = self.inner.transform_qk(q[:, :, p:], k[:, :, p:], q_pos[:, p:], kv_pos[:, p:])
        if q2.shape[-1] != q.shape[-1]:
            raise ValueError(
                f"{type(self.inner).__name__} changes the query width ({q.shape[-1]} -> {q2.shape[-1]}); prefix tokens "
                "cannot be kept apart from it here (build it with num_prefix_tokens instead)"
            )
        return torch.cat((q[:, :, :p], q2), dim=2), torch.cat((k[:, :, :p], k2), dim=2)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        p = self.num_prefix_tokens
        self._check(min(q.shape[2], k.shape[2]))
        inner = self.inner.score_bias(q[:, :, p:], k[:, :, p:], q_pos[:, p:], kv_pos[:, p:])
        return _without_prefix(inner, p)

    def prob_bias(self, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        p = self.num_prefix_tokens
        return _without_prefix(self.inner.prob_bias(q_pos[:, p:], kv_pos[:, p:]), p)

    def value_term(self, probs: Tensor, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        p = self.num_prefix_tokens
        out = self.inner.value_term(probs[:, :, p:, p:], q_pos[:, p:], kv_pos[:, p:])
        return torch.cat((out.new_zeros(*out.shape[:2], p, out.shape[-1]), out), dim=2)
