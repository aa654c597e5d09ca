"""TUPE, untied positional encoding (Ke et al. 2021, Rethinking Positional Encoding in Language
Pre-training, https://arxiv.org/abs/2006.15595).

``a_ij = (x_i Wq).(x_j Wk) / sqrt(2d) + (p_i Uq).(p_j Uk) / sqrt(2d)`` with ``p`` a learned
absolute table ``(max_len, C)`` and ``Uq, Uk: C -> H*d`` per-head projections: word and position
correlations are computed apart, with no cross terms. One instance shared by every layer (the
default in a stack) computes the same position term for each layer, as in the paper; one
instance per layer unties it. The paper's optional T5-style relative term is not included.
``untie_cls=True`` resets the [CLS] token (position 0): its row
of the position term becomes a learned scalar ``theta_1`` per head and its column (other
queries) ``theta_2``, so [CLS] is not tied to the first position.

Hooks: q/k transform (``q / sqrt(2)``: with the core's ``1/sqrt(d)`` the content term gets
``1/sqrt(2d)``) and a score bias (the position term with its own ``1/sqrt(2d)``). Kernel path:
the position term does not depend on the batch's content, so it is materialised once per call
as ``[B or 1, H, Tq, Tk]`` (``[1, H, T, T]`` for shared positions: 32 MB at H=8, T=1024) and the
bias function gathers from it; the dense path hands it to SDPA's fused kernel chunk by chunk and
returns its gradient through the chunked backward (it is listed in ``learned``); FlexAttention
reads it as a captured tensor. Computing the ``d``-long dot product inside the element-wise bias
function instead would cost ``d`` times the memory per chunk.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias
from ..common.registry import register
from .learned import lerp_rows


@register(
    "tupe",
    modality="seq",
    paper="Ke et al. 2021, Rethinking Positional Encoding in Language Pre-training, https://arxiv.org/abs/2006.15595",
    summary="untied position correlation (p_i Uq).(p_j Uk)/sqrt(2d) from a learned table; optional [CLS] untying",
)
class TUPE(PositionEncoding):
    """Args:
        dim: model width ``C`` (the width of the position table).
        num_heads: query heads ``H``.
        max_len: rows of the position table; positions past it are an error.
        head_dim: per-head width ``d``; default ``dim // num_heads``.
        untie_cls: learned [CLS]-to-others and others-to-[CLS] scalars per head (position 0).
        init_std: standard deviation of the table's initialisation (0.02).

    Shapes: ``q [B, H, Tq, d]``, ``k [B, Hkv, Tk, d]``, positions ``[B or 1, T]`` (integer, or float:
    linear interpolation between table rows).
    """

    hooks = frozenset({Hook.QK, Hook.SCORE_BIAS})

    def __init__(
        self,
        dim: int,
        num_heads: int,
        max_len: int,
        head_dim: int | None = None,
        untie_cls: bool = False,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("num_heads", num_heads), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads}), or give head_dim")
            head_dim = dim // num_heads
        self.dim, self.num_heads, self.head_dim, self.max_len = dim, num_heads, head_dim, max_len
        self.untie_cls = untie_cls
        self.table = nn.Parameter(torch.randn(max_len, dim) * init_std)
        self.pos_q = nn.Linear(dim, num_heads * head_dim, bias=False)
        self.pos_k = nn.Linear(dim, num_heads * head_dim, bias=False)
        if untie_cls:
            self.cls_to_others = nn.Parameter(torch.zeros(num_heads))
            self.others_to_cls = nn.Parameter(torch.zeros(num_heads))

    def _positions(self, positions: Tensor) -> Tensor:
        """``[B or 1, T]`` -> table rows ``[B or 1, T, C]`` (error past the table)."""
        if positions.dim() != 2:
            raise ValueError(f"positions must be [batch or 1, tokens]; got {tuple(positions.shape)}")
        if positions.numel() and (bool((positions < 0).any()) or bool((positions > self.max_len - 1).any())):
            bad = positions.max().item() if bool((positions > self.max_len - 1).any()) else positions.min().item()
            raise ValueError(f"position {bad} is outside TUPE's table (max_len={self.max_len}, positions 0..{self.max_len - 1})")
        if positions.is_floating_point():
            return lerp_rows(self.table, positions.to(torch.float64))
        return self.table[positions]

    def _project(self, rows: Tensor, proj: nn.Linear) -> Tensor:
        return proj(rows).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # [B, H, T, d]

    def position_term(self, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """``(p_i Uq).(p_j Uk) / sqrt(2d)`` as ``[B or 1, H, Tq, Tk]`` (with the [CLS] reset)."""
        pq = self._project(self._positions(q_pos), self.pos_q)
        pk = self._project(self._positions(kv_pos), self.pos_k)
        term = torch.matmul(pq, pk.transpose(-1, -2)) / math.sqrt(2 * self.head_dim)
        if self.untie_cls:
            q_cls = (q_pos == 0)[:, None, :, None]
            kv_cls = (kv_pos == 0)[:, None, None, :]
            h = self.num_heads
            term = torch.where(q_cls, self.cls_to_others.view(1, h, 1, 1).to(term.dtype), term)
            term = torch.where(kv_cls & ~q_cls, self.others_to_cls.view(1, h, 1, 1).to(term.dtype), term)
        return term

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        return q * (1 / math.sqrt(2)), k

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        term = self.position_term(q_pos, kv_pos)
        per_batch = term.shape[0] > 1

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return term[b if per_batch else b * 0, h, q_idx, kv_idx]

        return PairwiseBias(bias, per_batch=per_batch, learned=(term,), name="TUPE")
