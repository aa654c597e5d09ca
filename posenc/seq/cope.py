"""CoPE, contextual position encoding (Golovneva et al. 2024, https://arxiv.org/abs/2405.18719).

Gates ``g_ij = sigmoid(q_i.k_j / sqrt(d))`` on the visible keys (zero on masked ones), positions
``p_ij = sum_{t = j..i} g_it`` (a reverse cumulative sum along the keys), clamped to
``npos_max - 1``, and the score gains ``q_i.e(p_ij) / sqrt(d)`` where ``e`` interpolates linearly
between learned integer position embeddings ``e[0 .. npos_max - 1]`` (``[npos_max, d]``, shared
by the heads, zero-initialised): ``q.e(p) = w * q.e[ceil p] + (1 - w) * q.e[floor p]``,
``w = p - floor p``.
This follows the authors' code: the gate logits are the scaled scores, the mask multiplies the
gates, the clamp keeps ``p`` inside the table, and the positional logits are scaled with the
scores. Causal only.

It needs ``q.k`` at every pair, so it uses the score-matrix capability (``needs_scores``; the
math path): ``O(B H T^2)`` memory is inherent to CoPE (the positions differ for every pair).
``q.e`` is computed once per query as ``[B, H, Tq, npos_max]`` and gathered at ``floor p`` and
``ceil p``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_int
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register


@register(
    "cope",
    modality="seq",
    paper="Golovneva et al. 2024, Contextual Position Encoding, https://arxiv.org/abs/2405.18719",
    summary="positions counted by sigmoid gates of q.k, interpolated learned embeddings; causal",
)
class CoPE(PositionEncoding):
    """Args:
        head_dim: ``d``.
        max_len: training length; the default table has ``max_len + 1`` positions (0 .. max_len).
        npos_max: table size, overriding that default (the paper's ``npos``).

    Parameters: ``pos_emb [npos_max, d]``.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    needs_scores = True
    causal_only = True

    def __init__(self, head_dim: int, max_len: int, npos_max: int | None = None) -> None:
        super().__init__()
        check_int("head_dim", head_dim, minimum=1)
        check_int("max_len", max_len, minimum=1)
        npos_max = max_len + 1 if npos_max is None else check_int("npos_max", npos_max, minimum=2)
        self.head_dim, self.npos_max = head_dim, npos_max
        self.pos_emb = nn.Parameter(torch.zeros(npos_max, head_dim))

    def transform_scores(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None
    ) -> Tensor:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"CoPE was built for head_dim={self.head_dim}; q has {q.shape[-1]}")
        gates = torch.sigmoid(scores)  # [B, H, Tq, Tk]
        if allowed is not None:
            gates = gates.masked_fill(~allowed, 0.0)
        # sum_{t >= j} g_t as the row total minus the running sum before j: one cumsum instead of
        # a cumsum between two flipped copies (the hidden keys' gates are zero, so their
        # positions are exactly 0 as before). The lower clamp: rounding can take the difference a
        # hair below 0 where a gate is tiny beside the row total.
        # A position counts at most the keys in view, so a table row past their number is never
        # read: the positional logits need only min(npos_max, keys + 1) rows (with causal row
        # chunks, about half the table on average, the size of the chunk's scores).
        npos = min(self.npos_max, scores.shape[-1] + 1)
        running = gates.cumsum(-1)
        pos = torch.sub(running[..., -1:], running).add_(gates).clamp_(0, npos - 1)
        floor = pos.detach().floor()
        ceil_w = pos - floor  # differentiable: the gradient reaches the gates through it
        # the positional logits scaled like the scores, on the small [B, H, Tq, npos] table
        logits = torch.matmul(q, self.pos_emb[:npos].to(q.dtype).t()) * self.head_dim ** -0.5  # [B, H, Tq, npos]
        at_floor = logits.gather(-1, floor.long())
        at_ceil = logits.gather(-1, pos.detach().ceil().long())
        return torch.lerp(at_floor, at_ceil, ceil_w).add_(scores)
