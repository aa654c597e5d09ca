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
``1/sqrt(3d)``) and a content-dependent score bias. Kernel path: per call the bias builds
``Kr / sqrt(d)`` ``[H, 2k, d]`` and the per-batch table ``p2c = k Qr^T / sqrt(3d)``
``[B, H, Tk, 2k]``; its function gathers ``p2c[b, h, j, delta(j,i)]`` and, for a dense block of
query rows (the dense path feeds SDPA's fused kernel chunk by chunk), computes the block's c2p
rows ``q_t Kr^T`` ``[B, H, rows, 2k]`` by one matmul and gathers them at ``delta(i,j)`` (under
FlexAttention, per element, as a ``d``-long dot product). No ``[B, H, T, T]`` tensor is kept.
``q``, ``Kr`` and ``p2c`` are what the dense path's chunked backward differentiates; the
gradients flow on into q, k, ``P`` and the projections. A block reads ``p2c`` bucket-major
(``[B, H, 2k, Tk]``, gathered along the buckets) and ``q`` a chunk of rows at a time, each
through a :class:`~posenc.common.pairwise.SharedGradTable` whose gradient every block adds into
one buffer, so the backward never builds a full-size gradient per chunk of rows. ``p2c`` holds
``2k`` values per key: linear in ``T``, but as large as ``T x T / 2`` at ``T = 4k``.
Positions must be integers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..common.checks import check_bool, check_int, check_number, check_sequence_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, SharedGradTable, is_dense_block, rows_times_table, take
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
        d = self.head_dim
        if q.shape[1] != k.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        kr = self._relative(self.pos_k).to(q.dtype) * (1 / math.sqrt(d))
        qr = self._relative(self.pos_q).to(k.dtype) * (1 / math.sqrt(3 * d))  # scaled here: [H, 2k, d], not [B, H, 2k, Tk]
        return kr, torch.matmul(qr, k.transpose(-1, -2))

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        return q * (1 / math.sqrt(3)), k

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        check_sequence_positions(q_pos, kv_pos)
        if q_pos.is_floating_point() or kv_pos.is_floating_point():
            raise ValueError("DeBERTa's relative buckets need integer positions; got floating-point positions")
        kr, p2c_t = self._parts(q, k)
        p2c = p2c_t.transpose(-1, -2)  # [B, H, Tk, 2k], a view
        # p2c by bucket then key, [B, H, 2k, Tk]: a block of rows gathers it along the buckets, and
        # every block's gradient adds into one buffer (SharedGradTable), not a full-size one each.
        p2c_by_bucket = SharedGradTable(p2c_t)
        q_rows = SharedGradTable(q)
        span, log_buckets, max_position = self.span, self.log_buckets, self.max_position
        kr_by_dim = kr.transpose(-1, -2)  # [H, d, 2k]; a dense block always spans every head

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            rel = take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx)  # i - j
            c = deberta_index(rel, span, log_buckets, max_position)
            p = deberta_index(-rel, span, log_buckets, max_position)
            if is_dense_block(b, h, q_idx, kv_idx) and int(kv_idx[0, 0, 0, 0]) == 0:
                # A dense block of rows x keys 0 .. n-1: the c2p rows by one matmul, gathered by
                # bucket; the p2c entries gathered from the bucket-major table.
                rows = q_rows.rows(q_idx)  # [B, H, rows, d]
                c2p_rows = rows_times_table(rows, kr_by_dim)  # [B, H, rows, 2k]
                c2p = torch.gather(c2p_rows, -1, c.expand(*c2p_rows.shape[:2], *c.shape[2:]))
                return c2p + p2c_by_bucket.gather(p.expand(*c2p.shape))
            # scalar indices (FlexAttention's score_mod) or any other broadcast
            return (q[b, h, q_idx] * kr[h, c]).sum(-1) + p2c[b, h, kv_idx, p]

        # Not q or p2c themselves: their handles stand for them (listing both would send every
        # chunk's gradient through the handles early).
        learned = (*q_rows.learned, kr, *p2c_by_bucket.learned)
        return PairwiseBias(bias, per_batch=True, learned=learned, name="DeBERTa")
