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
``delta(i,j)``. Its p2c term depends on the positions:

- integer runs of consecutive positions shared by the batch (the usual case, KV cache
  included), on CPU: the bucket of a pair depends on ``j - i`` alone, so a block multiplies each
  run of keys by the few ``Qr`` rows its offsets reach and reads each pair's entry through a
  strided view (the skew of Transformer-XL's relative shift); keys whose every pair in the block
  is beyond the span take one product per key. Nothing of size ``2k x Tk`` is built, and peak
  memory grows linearly with ``T``, for about twice the p2c multiply-adds of a table. A decoding
  step (the decoding hook, :meth:`DeBERTa.decode_score_bias`) without log buckets builds its whole
  bias at once, where the buckets clip found by arithmetic: the keys before the span take one
  product with ``Qr[0]``, those within it a slice of ``Qr`` and the c2p row read backwards. One
  row hands ``k.Qr[0]`` for every key to SDPA's fused kernel as a move of the query, and the rest
  (``k.(Qr[m] - Qr[0])`` within the span, c2p) as its float mask.
- any other positions, code being traced by ``torch.compile`` (no host reads: one graph), and
  FlexAttention (scalar indices, as a ``d``-long dot product per element): the per-call table
  ``p2c = k Qr^T / sqrt(3d)`` ``[B, H, 2k, Tk]``, read bucket-major through a
  :class:`~posenc.common.pairwise.SharedGradTable` whose gradient every block adds into one buffer.
  It holds ``2k`` values per key: linear in ``T``, but as large as ``T x T / 2`` at ``T = 4k``.

``q``, ``Kr``, ``Qr`` and the keys are what the dense path's chunked backward differentiates; the
gradients flow on into q, k, ``P`` and the projections. Positions must be integers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..common.amp import autocast_off
from ..common.checks import (
    check_bool,
    check_int,
    check_number,
    check_sequence_positions,
)
from ..common.derived import DerivedTensors
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import (
    PairwiseBias,
    SharedGradTable,
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
        (:class:`~posenc.common.derived.DerivedTensors`): two ``[2k, C] x [C, C]`` products per
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

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
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
        offset = None if traced else shared_run_offset(q_pos, kv_pos)
        q_rows = SharedGradTable(q)
        if offset is not None and q.device.type == "cpu":
            return self._skewed_bias(q, k, kr, kr_by_dim, qr, q_rows, offset)
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

    def _skewed_bias(
        self, q: Tensor, k: Tensor, kr: Tensor, kr_by_dim: Tensor, qr: Tensor, q_rows: SharedGradTable, offset: int,
    ) -> PairwiseBias:
        """The bias over runs of consecutive positions shared by the batch (``kv_pos - q_pos`` is
        ``offset + j - i``): the p2c bucket depends on ``j - i`` alone, so a block computes its
        p2c entries from the few ``Qr`` rows its offsets reach (:class:`_SkewedPositionToContent`)
        and no ``[B, H, 2k, Tk]`` table or gradient buffer is kept."""
        span, log_buckets, max_position = self.span, self.log_buckets, self.max_position
        tq, tk = q.shape[2], k.shape[2]
        k_rows = SharedGradTable(k)
        kept: list[Tensor] = []

        def buckets() -> Tensor:
            """``bucket_of[m]``: the p2c row where ``j - i = m - (Tq - 1)``; non-decreasing in ``m``
            (built on first use: a decoding step without log buckets needs none)."""
            if not kept:
                kept.append(deberta_index(offset - (tq - 1) + torch.arange(tq + tk - 1), span, log_buckets, max_position))
            return kept[0]

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            # a block of one run of rows over keys 0 .. n-1 (the readers below take both as slices)
            if is_dense_block(b, h, q_idx, kv_idx) and run_start(kv_idx) == 0:
                start, rows = run_start(q_idx), q_idx.shape[2]
                if start is not None:
                    keys = k_rows.rows(kv_idx)  # [B, H, n, d]; its gradient adds into one buffer
                    if rows < _MIN_SKEW_ROWS and not log_buckets:  # a last chunk of a few rows
                        return _few_rows_linear(q_rows.rows(q_idx), keys, kr_by_dim, qr, offset - start + span)
                    rel = q_idx - kv_idx - offset  # i - j in positions
                    c2p = _content_to_position(q_rows, q_idx, kr_by_dim, deberta_index(rel, span, log_buckets, max_position))
                    if rows >= _MIN_SKEW_ROWS:
                        return c2p + _SkewedPositionToContent.apply(qr, keys, buckets(), tq, start, rows)
                    m = kv_idx.reshape(1, -1) - q_idx.reshape(-1, 1) + (tq - 1)  # [rows, n]
                    return c2p + torch.stack([_row_position_to_content(keys, qr, buckets()[m[r]]) for r in range(rows)],
                                             dim=2)
            rel = q_idx - kv_idx - offset
            c = deberta_index(rel, span, log_buckets, max_position)
            p = deberta_index(-rel, span, log_buckets, max_position)
            return (q[b, h, q_idx] * kr[h, c]).sum(-1) + (k[b, h, kv_idx] * qr[h, p]).sum(-1)

        learned = (*q_rows.learned, kr, qr, *k_rows.learned)
        return PairwiseBias(bias, per_batch=True, learned=learned, name="DeBERTa", pointwise=False)


# Fewer query rows than this (cached decoding) take each row's p2c entries as one product of the
# keys with their Qr rows: the skew's windows would cost more than they save.
_MIN_SKEW_ROWS = 8


def _row_position_to_content(keys: Tensor, qr: Tensor, buckets: Tensor) -> Tensor:
    """One query row's p2c entries ``keys[..., j, :] . qr[:, buckets[j]]`` -> ``[B, H, n]``
    (``keys [B, H, n, d]``, ``qr [H, 2k, d]``, ``buckets [n]`` non-decreasing along the keys).
    The keys before the first change of bucket and after the last share one ``Qr`` row each
    (beyond the span: most of a long cache), so they take a matrix-vector product; only the
    keys between gather their rows."""
    n = buckets.shape[0]
    first, last = buckets[0], buckets[-1]
    a = int((buckets == first).sum())  # keys 0 .. a-1 in the first bucket
    b = n - int((buckets == last).sum()) if a < n else n  # keys b .. n-1 in the last
    parts = [matvec(keys[:, :, :a], qr[:, first])]  # [B, H, a]
    if b > a:
        low, high = int(buckets[a]), int(buckets[b - 1])
        # one Qr row per key; consecutive buckets (every distance within the span without log
        # buckets) are a slice of Qr, not a gather
        between = qr[:, low: high + 1] if high - low == b - a - 1 else qr[:, buckets[a:b]]  # [H, b - a, d]
        parts.append((keys[:, :, a:b] * between).sum(-1))
    if n > b:
        parts.append(matvec(keys[:, :, b:], qr[:, last]))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


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


def _layout(bucket_of: Tensor, q_len: int, start: int, rows: int, keys: int):
    """Which keys need a window: ``(constant, windowed)``. ``constant`` lists ``(first, stop,
    buckets [stop - first])`` for the runs of keys whose every pair in these rows falls in one
    bucket (beyond the span on one side: most keys of a long sequence), ``windowed`` the
    ``(first key, blocks, width)`` pieces of the keys between: blocks of as many keys as rows (a
    block's window of ``Qr`` rows is ``rows + width - 1`` long, so its matmul costs about twice
    the content scores'), then the remainder as one narrower block."""
    m_top = torch.arange(keys) - start + q_len - 1  # m = j - i + Tq - 1 at each key's first row
    low, high = bucket_of[m_top - (rows - 1)], bucket_of[m_top]
    varying = (low != high).nonzero().flatten().tolist()
    a, b = (varying[0], varying[-1] + 1) if varying else (keys, keys)
    constant = [(first, stop, low[first:stop]) for first, stop in ((0, a), (b, keys)) if stop > first]
    windowed = []
    if b > a:
        width = min(rows, b - a)
        full = (b - a) // width
        windowed.append((a, full, width))
        if b - a > full * width:
            windowed.append((a + full * width, 1, b - a - full * width))
    return constant, windowed


def _run_buckets(buckets: Tensor) -> tuple[Tensor, Tensor | None]:
    """The distinct buckets of a run ``[U]`` and its keys' one-hot ``[keys, U]``, None when
    ``U == 1`` (a run of constant keys mostly has one bucket: the span's clamp)."""
    distinct, inverse = torch.unique_consecutive(buckets, return_inverse=True)
    if distinct.numel() == 1:
        return distinct, None
    return distinct, torch.nn.functional.one_hot(inverse, distinct.numel())


def _window_buckets(bucket_of: Tensor, q_len: int, start: int, rows: int, first: int, blocks: int, width: int) -> Tensor:
    """``[blocks, rows + width - 1]``: the ``Qr`` row of every offset a block of keys reaches,
    from its largest ``j - i`` down (block ``t`` holds keys ``first + t * width ...``)."""
    window = rows + width - 1
    m_first = first - (start + rows - 1) + q_len - 1  # the smallest m = j - i + Tq - 1 of block 0
    m = m_first + width * torch.arange(blocks).unsqueeze(1) + torch.arange(window - 1, -1, -1)
    return bucket_of[m]


def _skew(t: Tensor, rows: int, width: int) -> Tensor:
    """``[B, H, blocks, width, rows + width - 1]`` products of keys and their window (window
    counted down) -> the view ``[B, H, blocks, rows, width]`` of each pair's entry: row ``r`` and
    key ``c`` sit at window ``width - 1 - c + r``, i.e. at ``c * (window - 1) + r + width - 1``."""
    s = t.stride()
    return t.as_strided((*t.shape[:3], rows, width), (s[0], s[1], s[2], 1, s[3] - 1), t.storage_offset() + width - 1)


class _SkewedPositionToContent(torch.autograd.Function):
    """``p2c[b, h, i, j] = k[b, h, j] . Qr[h, bucket_of[j - i + Tq - 1]]`` for the query rows
    ``start .. start + rows - 1`` and the keys given (``0 .. n - 1``). Per block of keys, the
    ``Qr`` rows of the offsets it reaches (a window of ``rows + width - 1``) times its keys, one
    batched matmul for all blocks; each pair's entry is then a strided view of the products (the
    skew of Transformer-XL's relative shift), so no gather and no ``[B, H, 2k, Tk]`` table.
    The backward writes the gradient through the same view and multiplies back.

    ``qr [H, 2k, d]``, ``k [B, H, n, d]``, ``bucket_of [Tq + Tk - 1]`` (long) -> ``[B, H, rows, n]``."""

    @staticmethod
    def forward(ctx, qr, k, bucket_of, q_len, start, rows):
        ctx.save_for_backward(qr, k)
        ctx.args = (bucket_of, q_len, start, rows)
        b, h, n, _ = k.shape
        out = k.new_empty((b, h, rows, n))
        constant, windowed = _layout(bucket_of, q_len, start, rows, n)
        for first, stop, buckets in constant:  # one product per key, the same for every row
            distinct, hot = _run_buckets(buckets)
            products = torch.matmul(qr[:, distinct], k[:, :, first:stop].transpose(-1, -2)).transpose(-1, -2)  # [B, H, keys, U]; see matvec
            values = products[..., 0] if hot is None else (products * hot.to(products.dtype)).sum(-1)
            out[..., first:stop] = values.unsqueeze(2).expand(b, h, rows, -1)
        for first, blocks, width in windowed:
            idx = _window_buckets(bucket_of, q_len, start, rows, first, blocks, width)
            windows = qr[:, idx].transpose(-1, -2)  # [H, blocks, d, W]
            keys = k[:, :, first:first + blocks * width].unflatten(2, (blocks, width))  # [B, H, blocks, K, d]
            t = k.new_empty((b, h, blocks, width, rows + width - 1))
            for i in range(b):  # per batch element: a broadcast matmul would copy the windows B times
                torch.matmul(keys[i], windows, out=t[i])
            out[..., first:first + blocks * width].unflatten(-1, (blocks, width)).copy_(
                _skew(t, rows, width).permute(0, 1, 3, 2, 4))
        return out

    @staticmethod
    @autocast_off
    def backward(ctx, grad):
        qr, k = ctx.saved_tensors
        bucket_of, q_len, start, rows = ctx.args
        b, h, n, _ = k.shape
        d_qr = torch.zeros_like(qr) if ctx.needs_input_grad[0] else None
        d_k = torch.empty_like(k) if ctx.needs_input_grad[1] else None
        constant, windowed = _layout(bucket_of, q_len, start, rows, n)
        for first, stop, buckets in constant:
            distinct, hot = _run_buckets(buckets)
            d_products = grad[..., first:stop].sum(2).unsqueeze(-1)  # [B, H, keys, 1]
            if hot is not None:
                d_products = d_products * hot.to(grad.dtype)  # [B, H, keys, U]
            if d_k is not None:
                d_k[:, :, first:stop] = torch.matmul(d_products, qr[:, distinct])
            if d_qr is not None:
                d_qr.index_add_(1, distinct, torch.matmul(d_products.transpose(-1, -2), k[:, :, first:stop]).sum(0))
        for first, blocks, width in windowed:
            idx = _window_buckets(bucket_of, q_len, start, rows, first, blocks, width)
            windows = qr[:, idx]  # [H, blocks, W, d]
            keys = k[:, :, first:first + blocks * width].unflatten(2, (blocks, width))
            d_t = grad.new_zeros((b, h, blocks, width, rows + width - 1))
            _skew(d_t, rows, width).copy_(grad[..., first:first + blocks * width].unflatten(-1, (blocks, width))
                                          .permute(0, 1, 3, 2, 4))
            if d_k is not None:
                for i in range(b):
                    torch.matmul(d_t[i], windows, out=d_k[i, :, first:first + blocks * width].unflatten(1, (blocks, width)))
            if d_qr is not None:
                d_windows = sum(torch.matmul(d_t[i].transpose(-1, -2), keys[i]) for i in range(b))  # [H, blocks, W, d]
                d_qr.index_add_(1, idx.reshape(-1), d_windows.flatten(1, 2))
        return d_qr, d_k, None, None, None, None
