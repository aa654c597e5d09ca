"""DeBERTa disentangled attention (He et al. 2021, DeBERTa: Decoding-enhanced BERT with Disentangled
Attention, https://arxiv.org/abs/2006.03654).

``A_ij = Qc_i.Kc_j + Qc_i.Kr[delta(i,j)] + Kc_j.Qr[delta(j,i)]``, all scaled by ``1/sqrt(3d)``:
content-to-content, content-to-position (c2p) and position-to-content (p2c). ``Qr = P Wq_r`` and
``Kr = P Wk_r`` project a learned table ``P`` of ``2k`` relative embeddings (``k = span``, the
maximum relative distance); ``delta(i, j) = clip(i - j + k, 0, 2k - 1)``. With
``log_buckets=True`` (DeBERTa-v2) the distance first goes through the log-bucket map:
``|r| <= k/2`` stays exact, larger ``|r|`` becomes ``sign(r) * (ceil(ln(|r|/m) / ln((M-1)/m) *
(m-1)) + m)`` with ``m = k/2`` and ``M = max_position``, so distances up to ``M`` share the
``k`` buckets on each side (v2 uses ``k = 256``, ``M = 512``).

Hooks: q/k transform (``q / sqrt(3)``, so the core's ``1/sqrt(d)`` gives the content term
``1/sqrt(3d)``) and a content-dependent score bias. No ``[B, H, T, T]`` tensor is kept on any
path. A dense block of query rows (the dense path feeds SDPA's fused kernel chunk by chunk)
computes its c2p rows ``q_t Kr^T`` ``[B, H, rows, 2k]`` by one matmul and gathers them at
``delta(i,j)``.

A score-bias call builds the per-call table ``p2c = k Qr^T / sqrt(3d)`` ``[B, H, 2k, Tk]``, read
bucket-major through a :class:`~posenc.primitives.shared_table.SharedGradTable` whose gradient every
block adds into one buffer (FlexAttention reads it with scalar indices, a ``d``-long dot product
per element). It holds ``2k`` values per key: linear in ``T``, but as large as ``T x T / 2`` at
``T = 4k``. (A skewed form over runs of consecutive positions, which built no such table, was no
faster in ``posenc bench attention`` and was folded into this one.) A decoding step (the decoding
hook, :meth:`DeBERTa.decode_score_bias`) over a run of positions without log buckets builds its
whole bias at once, where the buckets clip found by arithmetic: the keys before the span take one
product with ``Qr[0]``, those within it a slice of ``Qr`` and the c2p row read backwards. One row
hands ``k.Qr[0]`` for every key to SDPA's fused kernel as a move of the query, and the rest
(``k.(Qr[m] - Qr[0])`` within the span, c2p) as its float mask.

``q``, ``Kr``, ``Qr`` and the keys are what the dense path's chunked backward differentiates; the
gradients flow on into q, k, ``P`` and the projections. Positions must be integers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..common.checks import (
    check_bool,
    check_int,
    check_number,
    check_sequence_positions,
)
from ..common.decoding_state import LayerDecodingState
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import (
    PairwiseBias,
    dense_bias,
    is_dense_block,
    key_linear_bias,
    matvec,
    rows_times_table,
    run_start,
    shared_run_offset,
    take,
)
from ..common.registry import register
from ..primitives.derived import DerivedTensors
from ..primitives.shared_table import SharedGradTable


def log_bucket_position(rel: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa-v2's log buckets of relative distances ``rel`` (integer tensor, same shape, long)."""
    mid = bucket_size // 2
    r = rel.to(torch.float64)
    sign = torch.sign(r)
    near = (r < mid) & (r > -mid)
    abs_pos = torch.where(near, torch.full_like(r, mid - 1), r.abs())
    log_pos = torch.ceil(torch.log(abs_pos / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, r, log_pos * sign).long()


def deberta_index(rel: Tensor, span: int, log_buckets: bool = False, max_position: int = 512) -> Tensor:
    """``delta = clip(bucket(rel) + span, 0, 2*span - 1)``: the row of the relative table."""
    if log_buckets:
        rel = log_bucket_position(rel, span, max_position)
    return (rel + span).clamp(0, 2 * span - 1)


@register(
    "deberta",
    modality="seq",
    paper="He et al. 2021, DeBERTa, https://arxiv.org/abs/2006.03654",
    summary="disentangled content-to-position and position-to-content terms over 2k relative embeddings",
)
class DeBERTa(PositionEncoding):
    """Args:
        dim: model width ``C`` (the width of the relative table).
        num_heads: query heads ``H``.
        head_dim: per-head width ``d``; default ``dim // num_heads``.
        span: ``k``, the maximum relative distance; the table has ``2k`` rows (256).
        log_buckets: DeBERTa-v2 log buckets (then ``span`` buckets per side cover distances up to
            ``max_position``).
        max_position: ``M`` of the log buckets (512); unused without them.
        init_std: standard deviation of the table's initialisation (0.02).

    Shapes: ``q [B, H, Tq, d]``, ``k [B, Hkv, Tk, d]``, positions ``[B or 1, T]`` (integer).
    """

    hooks = frozenset({Hook.QK, Hook.SCORE_BIAS})

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int | None = None,
        span: int = 256,
        log_buckets: bool = False,
        max_position: int = 512,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("num_heads", num_heads), ("span", span)):
            check_int(name, value, minimum=1)
        if head_dim is not None:
            check_int("head_dim", head_dim, minimum=1)
        check_bool("log_buckets", log_buckets)
        check_int("max_position", max_position, minimum=1)
        check_number("init_std", init_std, minimum=0.0)
        if log_buckets:
            if span < 4:
                raise ValueError(f"log buckets need span >= 4 (span/2 exact distances per side), got {span}")
            if max_position <= span // 2 + 1:
                raise ValueError(f"max_position must be an integer > span/2 + 1 = {span // 2 + 1}, got {max_position!r}")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads}), or give head_dim")
            head_dim = dim // num_heads
        self.dim, self.num_heads, self.head_dim = dim, num_heads, head_dim
        self.span, self.log_buckets, self.max_position = span, log_buckets, max_position
        self.rel = nn.Parameter(torch.randn(2 * span, dim) * init_std)
        self.pos_q = nn.Linear(dim, num_heads * head_dim, bias=False)  # Wq_r
        self.pos_k = nn.Linear(dim, num_heads * head_dim, bias=False)  # Wk_r
        self._tables: DerivedTensors[tuple[Tensor, Tensor]] = DerivedTensors()  # Kr, Qr without gradients
        self._row0_tables: DerivedTensors[Tensor] = DerivedTensors()  # Qr - Qr[0], for decoding

    def _relative(self, proj: nn.Linear) -> Tensor:
        return proj(self.rel).unflatten(-1, (self.num_heads, self.head_dim)).transpose(0, 1)  # [H, 2k, d]

    def tables(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``c2p [B, H, Tq, 2k]`` from the transformed ``q`` (``q/sqrt(3)``) and ``p2c [B, H, Tk, 2k]``,
        both already scaled by ``1/sqrt(3d)``."""
        kr, p2c_t = self._parts(q, k)
        return torch.matmul(q, kr.unsqueeze(0).transpose(-1, -2)), p2c_t.transpose(-1, -2)

    def _parts(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``Kr / sqrt(d)`` ``[H, 2k, d]`` (c2p is ``q_t . Kr / sqrt(d)`` with ``q_t = q/sqrt(3)``) and
        the p2c table bucket-major, ``Qr k^T / sqrt(3d)`` ``[B, H, 2k, Tk]``."""
        k, kr, qr = self._scaled_relative(q, k)
        return kr, torch.matmul(qr, k.transpose(-1, -2))

    def _scaled_relative(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(k, Kr / sqrt(d), Qr / sqrt(3d))``: the keys repeated to the query heads (GQA) and
        the relative tables ``[H, 2k, d]``, scaled here rather than a ``[B, H, 2k, Tk]`` product.
        The tables depend on the parameters alone: without gradients (a cached decoding step,
        inference) they are kept while the parameters are unchanged
        (:class:`~posenc.primitives.derived.DerivedTensors`): two ``[2k, C] x [C, C]`` products per
        layer and step were most of a decoding step."""
        d = self.head_dim
        if q.shape[1] != k.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)

        def build() -> tuple[Tensor, Tensor]:
            kr = self._relative(self.pos_k).to(q.dtype) * (1 / math.sqrt(d))
            qr = self._relative(self.pos_q).to(k.dtype) * (1 / math.sqrt(3 * d))
            return kr, qr

        kr, qr = self._tables.get((self.rel, self.pos_k.weight, self.pos_q.weight), build, key=(q.dtype, k.dtype))
        return k, kr, qr

    def _from_row0(self, qr: Tensor) -> Tensor:
        """``Qr - Qr[0]`` ``[H, 2k, d]`` (``qr`` from :meth:`_scaled_relative`, without gradients),
        kept while the parameters are unchanged: a decoding step's p2c relative to the row every
        key before the span reads."""
        return self._row0_tables.get((self.rel, self.pos_q.weight), lambda: qr - qr[:, :1], key=(qr.dtype, qr.device))

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        return q * (1 / math.sqrt(3)), k

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
                          state: LayerDecodingState | None = None) -> PairwiseBias:
        """The decoding hook: on CPU over one run of positions without log buckets, the whole
        ``[B, H, rows, Tk]`` bias at once from where the buckets clip (:func:`_few_rows_linear`),
        small beside the keys. One row's keys before the span share ``Qr[0]``: that product goes
        to the kernel as a move of the query (:func:`~posenc.common.pairwise.key_linear_bias`),
        so the keys are read once for the content scores and the bias. Else :meth:`score_bias`."""
        check_sequence_positions(q_pos, kv_pos)
        offset = None if q_pos.is_floating_point() or kv_pos.is_floating_point() else shared_run_offset(q_pos, kv_pos)
        if offset is None or q.device.type != "cpu" or self.log_buckets:
            return self.score_bias(q, k, q_pos, kv_pos)
        k, kr, qr = self._scaled_relative(q, k)  # kr, qr [H, 2k, d]
        kr_by_dim = kr.transpose(-1, -2)  # [H, d, 2k]
        if q.shape[2] == 1:  # every key's p2c is k.Qr[0] + k.(Qr[m] - Qr[0])
            rest = _few_rows_linear(q, k, kr_by_dim, self._from_row0(qr), offset + self.span, far_products=False)
            return key_linear_bias(rest, k, qr[:, :1].unsqueeze(0), k.shape[2], name="DeBERTa")
        return dense_bias(_few_rows_linear(q, k, kr_by_dim, qr, offset + self.span), name="DeBERTa")

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        check_sequence_positions(q_pos, kv_pos)
        if q_pos.is_floating_point() or kv_pos.is_floating_point():
            raise ValueError("DeBERTa's relative buckets need integer positions; got floating-point positions")
        span, log_buckets, max_position = self.span, self.log_buckets, self.max_position
        k, kr, qr = self._scaled_relative(q, k)  # kr, qr [H, 2k, d]
        kr_by_dim = kr.transpose(-1, -2)  # [H, d, 2k]; a dense block always spans every head
        traced = torch.compiler.is_compiling()
        q_rows = SharedGradTable(q)
        p2c_t = torch.matmul(qr, k.transpose(-1, -2))  # [B, H, 2k, Tk]
        p2c = p2c_t.transpose(-1, -2)  # [B, H, Tk, 2k], a view
        # p2c by bucket then key, [B, H, 2k, Tk]: a block of rows gathers it along the buckets, and
        # every block's gradient adds into one buffer (SharedGradTable), not a full-size one each.
        p2c_by_bucket = SharedGradTable(p2c_t)

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            rel = take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx)  # i - j
            c = deberta_index(rel, span, log_buckets, max_position)
            p = deberta_index(-rel, span, log_buckets, max_position)
            # traced: any keys (no host read of where they start); else keys 0 .. n-1, the leading
            # columns of the table, whose gradients go into one buffer
            if is_dense_block(b, h, q_idx, kv_idx) and (traced or run_start(kv_idx) == 0):
                # A dense block of rows x keys: the c2p rows by one matmul, gathered by bucket; the
                # p2c entries gathered from the bucket-major table.
                c2p = _content_to_position(q_rows, q_idx, kr_by_dim, c)
                if traced:
                    return c2p + p2c_t.index_select(3, kv_idx.reshape(-1)).gather(2, p.expand(*c2p.shape))
                return c2p + p2c_by_bucket.gather(p.expand(*c2p.shape))
            # scalar indices (FlexAttention's score_mod) or any other broadcast
            return (q[b, h, q_idx] * kr[h, c]).sum(-1) + p2c[b, h, kv_idx, p]

        # Not q or p2c themselves: their handles stand for them (listing both would send every
        # chunk's gradient through the handles early).
        learned = (*q_rows.learned, kr, *p2c_by_bucket.learned)
        return PairwiseBias(bias, per_batch=True, learned=learned, name="DeBERTa", pointwise=False)


def _few_rows_linear(
    rows: Tensor, keys: Tensor, kr_by_dim: Tensor, qr: Tensor, shift: int, far_products: bool = True,
) -> Tensor:
    """The whole bias of a few query rows over keys ``0 .. n-1`` without log buckets (a cached
    decoding step), from where the buckets clip, found by arithmetic on the host: row ``r``'s
    key ``j`` reads p2c row ``clip(j + s, 0, 2k - 1)`` and c2p row ``clip(2k - j - s, 0, 2k - 1)``
    with ``s = shift - r`` (``shift = kv_pos[0] - q_pos[first row] + k``). The keys before the
    span share one ``Qr`` row (one matrix-vector product) and one c2p entry; those within it read
    a slice of ``Qr`` and the c2p row reversed; no bucket or index tensor is built.

    ``far_products=False`` leaves the keys before the span their c2p entry alone, without the
    product with ``Qr[0]``: for a ``qr`` whose row 0 is zero (``Qr - Qr[0]``, with ``Qr[0]``
    added to every key by the kernel: :func:`~posenc.common.pairwise.key_linear_bias`).

    ``rows [B, H, R, d]`` (``q / sqrt(3)``), ``keys [B, H, n, d]``, ``kr_by_dim [H, d, 2k]``,
    ``qr [H, 2k, d]`` (both scaled) -> ``[B, H, R, n]``."""
    n, top = keys.shape[2], qr.shape[1] - 1
    two_k = top + 1
    # the c2p rows these keys reach start at ``lo`` (the last key of the first row): only Kr's
    # columns from there are multiplied (at most half of them once the context passes the span)
    lo = min(top, max(0, two_k - (n - 1) - shift))
    c2p_rows = rows_times_table(rows, kr_by_dim[..., lo:])  # [B, H, R, 2k - lo]: c2p row m at m - lo
    out = []
    for r in range(rows.shape[2]):
        s, c2p = shift - r, c2p_rows[:, :, r]  # [B, H, 2k - lo]
        a = min(n, max(0, 1 - s))  # keys 0 .. a-1: j + s <= 0, p2c row 0, c2p row 2k - 1
        b = min(n, max(a, top - s))  # keys b .. n-1: j + s >= 2k - 1, p2c row 2k - 1
        parts = []
        if a > 0:
            far_c2p = c2p[..., -1:]  # [B, H, 1], c2p row 2k - 1
            parts.append(matvec(keys[:, :, :a], qr[:, 0]) + far_c2p if far_products else far_c2p.expand(-1, -1, a))
        if b > a:  # c2p rows 2k - a - s down to 2k + 1 - b - s
            p2c = (keys[:, :, a:b] * qr[:, a + s: b + s]).sum(-1)
            parts.append(p2c + c2p[..., two_k + 1 - b - s - lo: two_k + 1 - a - s - lo].flip(-1))
        if n > b:  # keys after the query (no causal mask): c2p rows 1, 0, 0, ...
            c = (two_k - s - torch.arange(b, n, device=keys.device)).clamp(0, top) - lo
            parts.append(matvec(keys[:, :, b:], qr[:, top]) + c2p[..., c])
        out.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1))
    return out[0].unsqueeze(2) if len(out) == 1 else torch.stack(out, dim=2)


def _content_to_position(q_rows: SharedGradTable, q_idx: Tensor, kr_by_dim: Tensor, c: Tensor) -> Tensor:
    """A dense block's c2p term: its query rows times ``Kr`` by one matmul ``[B, H, rows, 2k]``,
    gathered at the buckets ``c`` (broadcast to ``[B, H, rows, keys]``)."""
    rows = q_rows.rows(q_idx)  # [B, H, rows, d]
    c2p_rows = rows_times_table(rows, kr_by_dim)  # [B, H, rows, 2k]
    return torch.gather(c2p_rows, -1, c.expand(*c2p_rows.shape[:2], *c.shape[2:]))
