"""TUPE, untied positional encoding (Ke et al. 2021, Rethinking Positional Encoding in Language
Pre-training, https://arxiv.org/abs/2006.15595).

``a_ij = (x_i Wq).(x_j Wk) / sqrt(2d) + (p_i Uq).(p_j Uk) / sqrt(2d)`` with ``p`` a learned
absolute table ``(max_len, C)`` and ``Uq, Uk: C -> H*d`` per-head projections: word and position
correlations are computed apart, with no cross terms. One instance shared by every layer (the
default in a stack) gives every layer the same position term, as in the paper (it is recomputed
per layer: modules keep no per-call state); one instance per layer unties it. The paper's
optional T5-style relative term is not included. ``untie_cls=True`` resets the [CLS] token
(position 0): its row of the position term becomes a learned scalar per head
(``cls_to_others``, the paper's ``theta_1``) and its column, for the other queries,
``others_to_cls`` (``theta_2``), so [CLS] is not tied to the first position.

Hooks: q/k transform (``q / sqrt(2)``: with the core's ``1/sqrt(d)`` the content term gets
``1/sqrt(2d)``) and a score bias (the position term with its own ``1/sqrt(2d)``). Kernel path:
per call the positions are projected once, ``p Uq / sqrt(2d)`` ``[B or 1, H, Tq, d]`` and ``p Uk``
``[B or 1, H, Tk, d]`` (listed in ``learned``); for few queries against many keys (a cached
decoding step) the queries are instead taken back through ``Uk`` (``[B or 1, H, Tq, C]``) and
dotted with the raw table rows, which costs ``d`` times less than projecting every key again. On the dense path (SDPA's fused kernel, chunk by
chunk of query rows) the bias function computes each chunk's term by one matmul, so no
``[H, T, T]`` tensor is kept and the chunked backward returns gradients of the small projected
tables only; FlexAttention's ``score_mod`` evaluates the same function per element as a
``d``-long dot product.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..common.checks import (
    check_bool,
    check_int,
    check_number,
    check_positions,
)
from ..common.decoding_state import LayerDecodingState
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import (
    PairwiseBias,
    dense_bias,
    is_dense_block,
    run_first,
    take,
)
from ..common.registry import register
from ..primitives.budget import check_allocation
from ..primitives.shared_table import SharedGradTable
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
            check_int(name, value, minimum=1)
        if head_dim is not None:
            check_int("head_dim", head_dim, minimum=1)
        check_bool("untie_cls", untie_cls)
        check_number("init_std", init_std, minimum=0.0)
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads}), or give head_dim")
            head_dim = dim // num_heads
        self.dim, self.num_heads, self.head_dim, self.max_len = dim, num_heads, head_dim, max_len
        self.untie_cls = untie_cls
        check_allocation(f"tupe(max_len={max_len}, dim={dim}): the table [max_len, dim]", (max_len, dim), torch.float32)
        self.table = nn.Parameter(torch.randn(max_len, dim) * init_std)
        self.pos_q = nn.Linear(dim, num_heads * head_dim, bias=False)
        self.pos_k = nn.Linear(dim, num_heads * head_dim, bias=False)
        if untie_cls:
            self.cls_to_others = nn.Parameter(torch.zeros(num_heads))
            self.others_to_cls = nn.Parameter(torch.zeros(num_heads))

    def _positions(self, positions: Tensor) -> Tensor:
        """``[B or 1, T]`` -> table rows ``[B or 1, T, C]`` (error past the table)."""
        check_positions("positions", positions, ndim=(2,))
        tracing = torch.compiler.is_compiling()
        # One run of consecutive positions inside the table (a sequence, a KV cache's keys): its
        # rows as they are, a view, checked by its ends (a cached decoding step copied every key's
        # row and read the positions twice, in every layer)
        first = None if tracing else run_first(positions)
        if first is not None and 0 <= first and first + positions.shape[1] <= self.max_len:
            return self.table[first: first + positions.shape[1]].unsqueeze(0)
        # (a value check: skipped while torch.compile traces, where it would break the graph)
        if (positions.numel() and not tracing
                and (bool((positions < 0).any()) or bool((positions > self.max_len - 1).any()))):
            bad = positions.max().item() if bool((positions > self.max_len - 1).any()) else positions.min().item()
            raise ValueError(f"position {bad} is outside TUPE's table (max_len={self.max_len}, positions 0..{self.max_len - 1})")
        if positions.is_floating_point():
            return lerp_rows(self.table, positions.to(torch.float64))
        return self.table.index_select(0, positions.reshape(-1)).view(*positions.shape, self.dim)  # (faster than table[positions])

    def _project(self, rows: Tensor, proj: nn.Linear) -> Tensor:
        return proj(rows).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # [B, H, T, d]

    def projected_positions(self, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``p_i Uq / sqrt(2d)`` ``[B or 1, H, Tq, d]`` and ``p_j Uk`` ``[B or 1, H, Tk, d]``."""
        pq = self._project(self._positions(q_pos), self.pos_q) * (1 / math.sqrt(2 * self.head_dim))
        pk = self._project(self._positions(kv_pos), self.pos_k)
        return pq, pk

    def position_term(self, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """``(p_i Uq).(p_j Uk) / sqrt(2d)`` as ``[B or 1, H, Tq, Tk]`` (with the [CLS] reset)."""
        bias = self.score_bias(None, None, q_pos, kv_pos)
        device = self.table.device
        batch = max(q_pos.shape[0], kv_pos.shape[0])
        q_idx, kv_idx = torch.arange(q_pos.shape[1], device=device), torch.arange(kv_pos.shape[1], device=device)
        return bias.dense(batch, self.num_heads, q_idx, kv_idx)

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        return q * (1 / math.sqrt(2)), k

    def _key_side(self, batch: int, q_len: int, kv_len: int) -> bool:
        """Whether projecting every key's position (``p_j Uk``, ``Tk C H d`` multiply-adds) is cheaper
        than taking each query back through ``Uk`` (``(p_i Uq / sqrt(2d)) Uk^T``, ``[B, H, Tq, C]``)
        and dotting it with the raw table rows (``B H Tq (d + Tk) C``). Few queries against many
        keys -- one cached decoding step -- take the query side: ``d`` times less work there."""
        c, h, d = self.dim, self.num_heads, self.head_dim
        keys = kv_len * c * h * d + batch * h * q_len * kv_len * d
        queries = batch * h * q_len * (d + kv_len) * c
        return keys <= queries

    def _position_sides(self, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        """The two sides of the position term, ``pq [B or 1, H, Tq, w]`` and ``pk [B or 1, H or 1,
        Tk, w]``: projected as the paper writes them, or, where that is cheaper (:meth:`_key_side`),
        the queries taken back through ``Uk`` and the raw table rows for every head,
        ``(p_i Uq / sqrt(2d)) . (p_j Uk) = ((p_i Uq / sqrt(2d)) Uk^T) . p_j``."""
        if self._key_side(q_pos.shape[0], q_pos.shape[1], kv_pos.shape[1]):
            return self.projected_positions(q_pos, kv_pos)
        pq = self._project(self._positions(q_pos), self.pos_q) * (1 / math.sqrt(2 * self.head_dim))
        uk = self.pos_k.weight.view(self.num_heads, self.head_dim, self.dim)  # [H, d, C]
        pq = torch.matmul(pq, uk.to(pq.dtype))  # [B or 1, H, Tq, C]
        return pq, self._positions(kv_pos).unsqueeze(1)  # pk [B or 1, 1, Tk, C]: one row for every head

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
                          state: LayerDecodingState | None = None) -> PairwiseBias:
        """The decoding hook: the whole term ``[B or 1, H, rows, Tk]`` at once by one matmul,
        small beside the keys; the kernel takes it as it is, with none of the per-block reads."""
        term = _position_products(*self._position_sides(q_pos, kv_pos))
        if self.untie_cls:
            h = self.num_heads
            term = _reset_cls(term, (q_pos == 0)[:, None, :, None], (kv_pos == 0)[:, None, None, :],
                              self.cls_to_others.view(1, h, 1, 1), self.others_to_cls.view(1, h, 1, 1))
        return dense_bias(term, name="TUPE")

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        pq, pk = self._position_sides(q_pos, kv_pos)
        untie = self.untie_cls
        heads_k = pk.shape[1] > 1
        per_batch = pq.shape[0] > 1 or pk.shape[0] > 1
        cls_row = cls_col = None  # bound either way: torch.compile breaks its graph on reading an unset closure cell
        if untie:
            h = self.num_heads
            cls_row, cls_col = self.cls_to_others.view(h), self.others_to_cls.view(h)
        # Blocks read runs of rows of pq and pk, and every block's gradient adds into one buffer
        # per table (SharedGradTable), as DeBERTa's and Transformer-XL's do: read by indexing,
        # each block's backward zero-filled a gradient as large as the table and scattered into it.
        q_rows, k_rows = SharedGradTable(pq), SharedGradTable(pk)

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bq, bk = (b if pq.shape[0] > 1 else b * 0), (b if pk.shape[0] > 1 else b * 0)
            if is_dense_block(b, h, q_idx, kv_idx):
                # A dense block of rows x keys (every head, the batch or its one row): one matmul
                # instead of a d-long product per element.
                rows = q_rows.rows(q_idx)  # [B or 1, H, rows, d]
                cols = k_rows.rows(kv_idx)  # [B or 1, H, keys, d], or raw table rows for every head [B or 1, 1, keys, C]
                term = _position_products(rows, cols)
            else:  # scalar indices (FlexAttention's score_mod) or any other broadcast
                term = (pq[bq, h, q_idx] * pk[bk, h if heads_k else h * 0, kv_idx]).sum(-1)
            if untie:
                term = _reset_cls(term, take(q_pos, b, q_idx) == 0, take(kv_pos, b, kv_idx) == 0, cls_row[h], cls_col[h])
            return term

        # Not pq or pk themselves: their handles stand for them (see DeBERTa).
        learned = (*q_rows.learned, *k_rows.learned) + ((self.cls_to_others, self.others_to_cls) if untie else ())
        return PairwiseBias(bias, per_batch=per_batch, learned=learned, name="TUPE", pointwise=False)


def _position_products(pq: Tensor, pk: Tensor) -> Tensor:
    """``pq [B or 1, H, Tq, w]`` times ``pk [B or 1, H or 1, Tk, w]`` -> ``[B or 1, H, Tq, Tk]``.
    Raw table rows that serve every head and batch row (``pk [1, 1, Tk, C]``) go in as one
    ``[Tk, C] x [C, B H Tq]`` product, the rows as they lie: a broadcast matmul copies them once per
    head, and the product taken the other way round is slower for a decoding step's few rows."""
    if pk.shape[0] == 1 and pk.shape[1] == 1:
        b, h, tq, w = pq.shape
        term = torch.matmul(pk[0, 0], pq.reshape(b * h * tq, w).transpose(0, 1))  # [Tk, B H Tq]
        return term.transpose(0, 1).reshape(b, h, tq, -1)
    return torch.matmul(pq, pk.transpose(-1, -2))


def _reset_cls(term: Tensor, is_cls_q: Tensor, is_cls_k: Tensor, cls_to_others: Tensor, others_to_cls: Tensor) -> Tensor:
    """TUPE's [CLS] reset of ``term``: a [CLS] query row takes ``cls_to_others``, a [CLS] key
    column of another query ``others_to_cls`` (all broadcast to ``term``)."""
    term = torch.where(is_cls_q, cls_to_others.to(term.dtype), term)
    return torch.where(is_cls_k & ~is_cls_q, others_to_cls.to(term.dtype), term)
