"""Shaw relative position representations (Shaw et al. 2018, https://arxiv.org/abs/1803.02155).

``e_ij = q_i . (k_j + aK[clip(j - i, -k, k)]) / sqrt(d)`` and
``z_i = sum_j a_ij (v_j + aV[clip(j - i, -k, k)])``, with learned ``aK, aV [2k + 1, d]`` shared by
all heads (as in the paper). ``i, j`` are the query and key positions.

Key term: a content-dependent bias. Per call the table ``q @ aK^T / sqrt(d)`` ``[B, H, Tq, 2k+1]``
is built once; a block of query rows takes its rows and gathers them by the clipped offset (no
``[B, H, Tq, Tk]`` tensor of it). It is read through a
:class:`~posenc.primitives.shared_table.SharedGradTable`, whose handle is listed as ``learned``, so the
chunked backward adds every chunk's gradient into one buffer (and through it reaches ``q`` and
``aK``).

Value term (``values=True``): ``sum_j a_ij aV[c(i, j)] = sum_r M_ir aV[r]``, where ``M_ir`` is the
probability mass of query ``i`` on keys at clipped offset ``r``.

* On CPU, for causal attention over consecutive positions (self-attention, KV-cache decoding),
  the fused path serves it exactly (:meth:`offset_values`): the chunked dense path returns each
  row's log-sum-exp, the masses of the ``k`` unclipped offsets are probabilities on ``k``
  diagonals, ``exp(S_(i, i+r) - lse_i)``, and the clipped tail gets the rest (rows sum to one).
  No ``T x T`` tensor; gradients flow through ``lse`` too
  (:func:`posenc.common.kernels.offset_value_term`).
* Otherwise (padding, packed sequences, windows, bidirectional attention, CUDA) it takes the
  math path: an explicit softmax and a scatter-add of the probabilities into ``2k + 1`` slots.

With ``values=False`` only the key term remains and the chunked dense path (FlexAttention on
CUDA) serves it.

Shapes: ``q [B, H, Tq, d]``, integer positions ``[B or 1, T]``. ``sqrt(d)`` is the head dim's, the
default score scale of :class:`posenc.MultiheadAttention`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_bool, check_int, check_sequence_positions
from ..common.decoding_state import LayerDecodingState
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import (
    PairwiseBias,
    dense_bias,
    is_dense_block,
    take,
)
from ..common.registry import register
from ..primitives.shared_table import SharedGradTable
from .relative import clipped_relative_index, relative_positions


def clipped_offsets(q_pos: Tensor, kv_pos: Tensor, max_relative: int) -> Tensor:
    """``clip(j - i, -k, k) + k`` as ``[B or 1, 1, Tq, Tk]`` (long), the slot of each pair."""
    return clipped_relative_index(relative_positions(q_pos, kv_pos), max_relative).unsqueeze(1)


@register(
    "shaw",
    modality="seq",
    paper="Shaw et al. 2018, Self-Attention with Relative Position Representations, https://arxiv.org/abs/1803.02155",
    summary="learned clipped relative embeddings added to keys (and values)",
)
class ShawRelative(PositionEncoding):
    """Args:
        head_dim: ``d``.
        max_relative: clipping distance ``k`` (offsets beyond share the edge embedding).
        values: add the value term (math path); False keeps only the key term (fused path).

    Parameters: ``key_table aK [2k + 1, d]``, ``value_table aV [2k + 1, d]`` (when ``values``).
    """

    hooks = frozenset({Hook.SCORE_BIAS, Hook.POST_SOFTMAX})

    def __init__(self, head_dim: int, max_relative: int = 16, values: bool = True) -> None:
        super().__init__()
        check_int("head_dim", head_dim, minimum=1)
        check_int("max_relative", max_relative, minimum=1)
        check_bool("values", values)
        self.head_dim, self.max_relative, self.values = head_dim, max_relative, values
        self.needs_probs = values  # the value term needs the attention probabilities
        self.key_table = nn.Parameter(torch.randn(2 * max_relative + 1, head_dim) * head_dim ** -0.5)
        self.value_table = nn.Parameter(torch.randn(2 * max_relative + 1, head_dim) * head_dim ** -0.5) if values else None

    def _query_table(self, q: Tensor, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """``q . aK[r] / sqrt(d)`` for every slot ``r``: ``[B, H, Tq, 2k+1]``."""
        check_sequence_positions(q_pos, kv_pos, integer_for="ShawRelative")
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"ShawRelative was built for head_dim={self.head_dim}; q has {q.shape[-1]}")
        return torch.matmul(q, self.key_table.to(q.dtype).t()) * self.head_dim ** -0.5

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
                          state: LayerDecodingState | None = None) -> PairwiseBias:
        """The decoding hook: the whole bias ``[B, H, rows, Tk]`` at once, by one gather at the
        pairs' slots (the per-block gathers through the positions cost more than the bias); the
        offset value term reads its last keys from it."""
        table = self._query_table(q, q_pos, kv_pos)  # [B, H, Tq, 2k+1]
        slot = clipped_offsets(q_pos, kv_pos, self.max_relative).expand(*table.shape[:2], -1, -1)  # [B, H, Tq, Tk]
        return dense_bias(table.gather(-1, slot), name="ShawRelative keys")

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        table = self._query_table(q, q_pos, kv_pos)  # [B, H, Tq, 2k+1]
        kmax = self.max_relative
        rows_of = SharedGradTable(table)  # a chunk's rows, with one gradient buffer for all chunks

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            slot = clipped_relative_index(take(kv_pos, b, kv_idx) - take(q_pos, b, q_idx), kmax)
            if is_dense_block(b, h, q_idx, kv_idx):
                rows = rows_of.rows(q_idx)  # [B, H, rows, 2k+1]
                return rows.gather(-1, slot.expand(rows.shape[0], rows.shape[1], -1, -1))
            return table[b, h, q_idx, slot]  # scalar indices (FlexAttention's score_mod)

        return PairwiseBias(bias, per_batch=True, learned=rows_of.learned, name="ShawRelative keys")

    def math_parameters(self) -> tuple[Tensor, ...]:
        """Only ``aV``: the key table reaches the scores through the bias's ``learned`` table."""
        return () if self.value_table is None else (self.value_table,)

    def offset_values(self) -> Tensor | None:
        """``aV``: the value term is ``sum_j a_ij aV[clip(j - i, -k, k) + k]``."""
        return self.value_table

    def value_term(self, probs: Tensor, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """``probs [B, H, Tq, Tk]`` -> ``sum_r M_ir aV[r]`` ``[B, H, Tq, d]``."""
        slots = clipped_offsets(q_pos, kv_pos, self.max_relative).expand(probs.shape[0], probs.shape[1], -1, -1)
        mass = probs.new_zeros(*probs.shape[:-1], 2 * self.max_relative + 1).scatter_add_(-1, slots, probs)
        return torch.matmul(mass, self.value_table.to(probs.dtype))
