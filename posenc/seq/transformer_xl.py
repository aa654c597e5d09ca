"""Transformer-XL relative attention (Dai et al. 2019, https://arxiv.org/abs/1901.02860).

``A_ij = q_i.k_j + q_i.W_R R_(i-j) + u.k_j + v.W_R R_(i-j)`` (then times ``1/sqrt(d)``), with
``R`` the sinusoid table of the distance ``i - j`` (width ``dim``, :func:`posenc.primitives.sinusoid.sinusoid_table`),
``W_R`` a learned ``dim -> H * d`` projection and ``u, v [H, d]`` learned per head.

Two hooks:

* q/k: ``q -> q + u`` gives terms (a) + (c): ``(q + u).k``.
* score bias: terms (b) + (d) ``= (q + v).W_R R_(i-j)``, content-dependent. ``W_R R`` is
  projected once for the ``R`` distinct distances (``[R, H, d]``); for each block of query rows
  the kernel asks for, one matmul gives ``(q + v).W_R R`` over the distances those rows need,
  gathered by ``i - j``, so no ``[B, H, T, R]`` table (about ``T x 2T``) ever exists. For few
  queries against many distances the queries go through ``W_R`` instead,
  ``((q + v) W_R^h) . R``: ``[B, H, Tq, dim]`` dotted with the raw sinusoids, ``d`` times less
  work than projecting every distance again. Without gradients to ``W_R`` (a cached decoding
  step, inference) ``W_R R`` is cut from a table kept between calls over a growing range of
  distances, rebuilt when ``W_R`` changes (:class:`~posenc.primitives.derived.DerivedTensors`). The bias
  receives the already shifted ``q + u`` and uses ``(q + u) - u + v``, so the positional term reads
  ``q``, not ``q + u``. ``q + v`` and ``W_R R`` are listed as ``learned`` so the chunked dense
  path's backward carries the gradient to ``q``, ``v`` and ``W_R``.

Memory and masks: there is no segment-level recurrence memory here; the KV cache of
:class:`posenc.MultiheadAttention` is its analogue (cached keys keep their positions, the queries
continue after them, and ``i - j`` is taken from those positions). The distances span
``min(q_pos) - max(kv_pos) .. max(q_pos) - min(kv_pos)`` (both signs, so bidirectional attention
works too); the distance is unclipped, as in the paper.
``R`` uses posenc's interleaved sin/cos layout; the paper concatenates ``[sin, cos]``, a fixed
permutation that the learned ``W_R`` absorbs.

Kernel: the chunked dense path on CPU, FlexAttention on CUDA. Integer positions ``[B or 1, T]``.
Under ``torch.compile`` the term is written as a product of a query and a key feature
(:meth:`TransformerXLRelative._traced_bias`), which needs no distance range from the positions:
the model traces as one graph.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_int, check_sequence_positions
from ..common.decoding_state import LayerDecodingState
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import (
    PairwiseBias,
    dense_bias,
    is_dense_block,
    rows_times_table,
    shared_run_offset,
    take,
)
from ..common.registry import register
from ..primitives.derived import DerivedTensors
from ..primitives.shared_table import SharedGradTable
from ..primitives.sinusoid import sinusoid_table


@register(
    "transformer_xl",
    modality="seq",
    paper="Dai et al. 2019, Transformer-XL, https://arxiv.org/abs/1901.02860",
    summary="sinusoid of i - j projected per head, with global content and position biases u, v",
)
class TransformerXLRelative(PositionEncoding):
    """Args:
        dim: model width (width of the sinusoid ``R``).
        num_heads: query heads ``H``.
        head_dim: ``d``.

    Parameters: ``u [H, d]``, ``v [H, d]``, ``r_proj`` (``W_R``, ``Linear(dim, H * d, bias=False)``).
    """

    hooks = frozenset({Hook.QK, Hook.SCORE_BIAS})

    def __init__(self, dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        if dim % 2:
            raise ValueError(f"dim must be a positive even number, got {dim}")
        check_int("num_heads", num_heads, minimum=1)
        check_int("head_dim", head_dim, minimum=1)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, head_dim
        self.u = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)
        self.r_proj = nn.Linear(dim, num_heads * head_dim, bias=False)
        # W_R R over a range of distances, kept between calls without gradients to W_R (decoding)
        self._projected: DerivedTensors[Tensor] = DerivedTensors()
        self._covered = (1, 0)  # the distances the kept table covers (empty)

    def _check(self, q: Tensor, q_pos: Tensor, kv_pos: Tensor) -> None:
        if q.shape[1] != self.num_heads or q.shape[-1] != self.head_dim:
            raise ValueError(
                f"TransformerXLRelative was built for {self.num_heads} heads of {self.head_dim}; q is {tuple(q.shape)}"
            )
        check_sequence_positions(q_pos, kv_pos, integer_for="TransformerXLRelative")

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``q + u`` (terms a + c); keys unchanged."""
        self._check(q, q_pos, kv_pos)
        return q + self.u.to(q.dtype)[None, :, None, :], k

    def _shifted_queries(self, q: Tensor, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """``(q + v) / sqrt(d)`` ``[B, H, Tq, d]`` from the shifted ``q + u``: the 1/sqrt(d) of the
        positional terms folded into the queries."""
        self._check(q, q_pos, kv_pos)
        return (q + (self.v - self.u).to(q.dtype)[None, :, None, :]) * self.head_dim ** -0.5

    def _distances(self, qv: Tensor, q: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor, int, int | None]:
        """The distance table the bias reads and the queries that read it, ``(qv, wr, lo, offset)``:
        ``wr [H or 1, R, d or dim]`` by distance from ``lo``, ``offset = kv_pos[0] - q_pos[0]`` over
        runs of consecutive positions (else None)."""
        b, h, tq, d = qv.shape
        tk = kv_pos.shape[1]
        offset = shared_run_offset(q_pos, kv_pos)  # kv_pos[j] - q_pos[i] = offset + j - i
        if offset is not None:  # the distance range by arithmetic, no reduction read back
            lo, hi = -offset - (tk - 1), tq - 1 - offset
        else:
            lo = int(q_pos.min()) - int(kv_pos.max())
            hi = int(q_pos.max()) - int(kv_pos.min())
        dists = hi - lo + 1
        if DerivedTensors.keeps((self.r_proj.weight,)):
            wr = self._kept_table(lo, hi, q.dtype, q.device)  # [H, R, d]
        elif b * h * tq * (d + dists) * self.dim < dists * self.dim * h * d + b * h * tq * dists * d:
            # Few queries against many distances: the same term as ((q + v) W_R^h) . R, the
            # queries taken back to the sinusoid's width instead of projecting every distance's R
            # again, d times less work there.
            w = self.r_proj.weight.view(h, d, self.dim).to(qv.dtype)  # [H, d, dim]
            qv = torch.matmul(qv, w)  # [B, H, Tq, dim]
            wr = self._sinusoids(lo, hi, q.device).to(q.dtype).unsqueeze(0)  # [1, R, dim]: one table for every head
        else:  # W_R R per distance
            wr = self.r_proj(self._sinusoids(lo, hi, q.device)).view(-1, h, d).transpose(0, 1).to(q.dtype)  # [H, R, d]
        return qv, wr, lo, offset

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
                          state: LayerDecodingState | None = None) -> PairwiseBias:
        """The decoding hook: over one run of positions, row ``i`` reads the distances ``i -
        offset`` down to ``i - offset - Tk + 1``, one slice of the table read backwards: the whole
        ``[B, H, rows, Tk]`` bias by a product and a flip per row, no index tensor."""
        qv, wr, lo, offset = self._distances(self._shifted_queries(q, q_pos, kv_pos), q, q_pos, kv_pos)
        if offset is None:
            return self.score_bias(q, k, q_pos, kv_pos)
        n = kv_pos.shape[1]
        rows = []
        for r in range(qv.shape[2]):
            top = r - offset - lo  # the row of wr at key 0
            part = rows_times_table(qv[:, :, r: r + 1], wr[:, top - n + 1: top + 1].transpose(-1, -2))
            rows.append(part.flip(-1))  # [B, H, 1, n]
        return dense_bias(rows[0] if len(rows) == 1 else torch.cat(rows, dim=2), name="TransformerXLRelative")

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        """``q`` is the shifted ``q + u`` from :meth:`transform_qk`."""
        qv = self._shifted_queries(q, q_pos, kv_pos)  # [B, H, Tq, d]
        if torch.compiler.is_compiling():
            return self._traced_bias(qv, q_pos, kv_pos)
        qv, wr, lo, _ = self._distances(qv, q, q_pos, kv_pos)
        heads_r = wr.shape[0] > 1
        qv_rows = SharedGradTable(qv)  # read a chunk of rows at a time, one gradient buffer

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            dense = is_dense_block(b, h, q_idx, kv_idx)
            rel = take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx) - lo  # row of wr, [B or 1, 1, rows, keys]
            if dense:
                # A block of query rows: one matmul against the distances these rows need, then a
                # gather by distance. Only [B, H, rows, R'] lives, never [B, H, Tq, R].
                first, last = int(rel.min()), int(rel.max())
                rows = qv_rows.rows(q_idx)  # [B, H, rows, d or dim]
                table = rows_times_table(rows, wr[:, first: last + 1].transpose(-1, -2))  # [B, H, rows, R']
                return table.gather(-1, (rel - first).expand(table.shape[0], table.shape[1], -1, -1))
            return (qv[b, h, q_idx] * wr[h if heads_r else h * 0, rel]).sum(-1)  # scalar indices (FlexAttention's score_mod)

        learned = (*qv_rows.learned, wr) if heads_r and wr.requires_grad else qv_rows.learned
        return PairwiseBias(bias, per_batch=True, learned=learned, name="TransformerXLRelative", pointwise=False)

    def _traced_bias(self, qv: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        """The bias while ``torch.compile`` traces, with no distance range read from the positions
        (each read was a graph break). With ``a = (q + v) W_R^h`` ``[B, H, Tq, dim]`` and the
        angle-difference identities, ``a . R_(i-j)`` is ``Q'_i . K'_j``:
        ``sin((i - j)w) = sin(iw)cos(jw) - cos(iw)sin(jw)``, ``cos((i - j)w) = cos(iw)cos(jw) + sin(iw)sin(jw)``, so
        ``Q'_i = [a_sin sin(iw) + a_cos cos(iw), a_cos sin(iw) - a_sin cos(iw)]`` and
        ``K'_j = [cos(jw), sin(jw)]``. A block of rows is one matmul ``[rows, dim] x [dim, keys]``
        (``dim / d`` times the work of the eager table, which needs the range); gradients
        follow by plain autograd."""
        h, d = self.num_heads, self.head_dim
        a = torch.matmul(qv, self.r_proj.weight.view(h, d, self.dim).to(qv.dtype))  # [B, H, Tq, dim]
        a_sin, a_cos = a[..., 0::2], a[..., 1::2]  # the coefficients of sin((i - j)w), cos((i - j)w)
        q_angles = sinusoid_table(q_pos, self.dim, dtype=qv.dtype).unsqueeze(1)  # [B or 1, 1, Tq, dim], float64 angles
        q_sin, q_cos = q_angles[..., 0::2], q_angles[..., 1::2]
        q_feat = torch.cat((a_sin * q_sin + a_cos * q_cos, a_cos * q_sin - a_sin * q_cos), dim=-1)  # [B, H, Tq, dim]
        k_angles = sinusoid_table(kv_pos, self.dim, dtype=qv.dtype)  # [B or 1, Tk, dim]
        k_feat = torch.cat((k_angles[..., 1::2], k_angles[..., 0::2]), dim=-1)  # [cos(jw), sin(jw)]

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            if is_dense_block(b, h, q_idx, kv_idx):
                rows = q_feat.index_select(2, q_idx.reshape(-1))  # [B, H, rows, dim]
                keys = k_feat.index_select(1, kv_idx.reshape(-1)).unsqueeze(1)  # [B or 1, 1, keys, dim]
                return torch.matmul(rows, keys.transpose(-1, -2))
            return (q_feat[b, h, q_idx] * take(k_feat, b, kv_idx)).sum(-1)  # scalar indices (FlexAttention's score_mod)

        learned = (q_feat,) if q_feat.requires_grad else ()
        return PairwiseBias(bias, per_batch=True, learned=learned, name="TransformerXLRelative", pointwise=False)

    def _sinusoids(self, lo: int, hi: int, device: torch.device) -> Tensor:
        """``R`` for the distances ``lo .. hi``: ``[hi - lo + 1, dim]``."""
        return sinusoid_table(torch.arange(lo, hi + 1, device=device), self.dim, dtype=self.r_proj.weight.dtype)

    def _kept_table(self, lo: int, hi: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``W_R R`` ``[H, hi - lo + 1, d]`` cut from a table kept between calls (valid while
        ``W_R`` is unchanged, see :class:`~posenc.primitives.derived.DerivedTensors`). A call past its
        range grows the range by half its width at least, so a cached decoding step, whose
        distances reach one further each time, neither evaluates every distance's sinusoid
        (float64 angles) nor projects it again: about one table per doubling of the context."""
        a, b = self._covered
        extra = max(256, (hi - lo + 1) // 2)
        if a > b:
            a, b = lo, hi + extra
        else:
            a, b = (lo - extra if lo < a else a), (hi + extra if hi > b else b)
        self._covered = (a, b)

        def build() -> Tensor:  # by head: a head's slice of distances is one block of memory
            table = self.r_proj(self._sinusoids(a, b, device)).view(-1, self.num_heads, self.head_dim)
            return table.transpose(0, 1).contiguous()

        return self._projected.get((self.r_proj.weight,), build, key=(a, b, device))[:, lo - a: hi - a + 1].to(dtype)
