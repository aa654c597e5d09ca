"""Float64 reference implementations, written independently of posenc's kernels.

Masks are built with plain Python loops from their definitions, biases from the papers'
formulas, and attention as an explicit softmax in float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def allowed_matrix(
    batch: int,
    q_len: int,
    kv_len: int,
    *,
    causal: bool = False,
    key_valid: Tensor | None = None,
    q_segments: Tensor | None = None,
    kv_segments: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """``[B, Tq, Tk]`` bool, True where query i may attend key j (bottom-right causal alignment)."""
    offset = kv_len - q_len
    out = torch.zeros(batch, q_len, kv_len, dtype=torch.bool)
    for b in range(batch):
        for i in range(q_len):
            for j in range(kv_len):
                ok = True
                if causal and j > i + offset:
                    ok = False
                if window is not None and abs(i + offset - j) >= window:
                    ok = False
                if key_valid is not None and not bool(key_valid[b if key_valid.shape[0] > 1 else 0, j]):
                    ok = False
                if q_segments is not None:
                    qb = b if q_segments.shape[0] > 1 else 0
                    kb = b if kv_segments.shape[0] > 1 else 0
                    if int(q_segments[qb, i]) != int(kv_segments[kb, j]):
                        ok = False
                out[b, i, j] = ok
    return out


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None,
    *,
    scale: float | None = None,
    score_bias: Tensor | None = None,
    prob_bias: Tensor | None = None,
) -> Tensor:
    """Explicit float64 attention. ``q [B, H, Tq, D]``, ``k, v [B, Hkv, Tk, D]``; biases ``[B|1, H, Tq, Tk]``.

    Fully masked rows give zeros.
    """
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if score_bias is not None:
        s = s + score_bias.double()
    if allowed is not None:
        a = allowed[:, None]
        s = torch.where(a, s, torch.full_like(s, -math.inf))
        row = a.any(-1, keepdim=True)
        s = torch.where(row, s, torch.zeros_like(s))
        p = torch.softmax(s, dim=-1) * a
    else:
        p = torch.softmax(s, dim=-1)
    if prob_bias is not None:
        pb = prob_bias.double()
        p = p + (pb if allowed is None else pb * allowed[:, None])
    return torch.einsum("bhij,bhjd->bhid", p, v)


def rope_rotate(x: Tensor, positions: Tensor, base: float = 10000.0, *, interleaved: bool, rotary_dim: int | None = None) -> Tensor:
    """RoPE via complex multiplication. ``x [B, H, T, D]``, ``positions [B|1, T]``."""
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    x = x.double()
    xr, rest = x[..., :r], x[..., r:]
    theta = torch.tensor([base ** (-2.0 * i / r) for i in range(r // 2)], dtype=torch.float64)
    ang = positions.double()[:, None, :, None] * theta
    rot = torch.polar(torch.ones_like(ang), ang)
    if interleaved:
        z = torch.complex(xr[..., 0::2], xr[..., 1::2]) * rot
        out = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    else:
        z = torch.complex(xr[..., : r // 2], xr[..., r // 2 :]) * rot
        out = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((out, rest), dim=-1)


def alibi_bias(slopes: list[float], q_pos: Tensor, kv_pos: Tensor, symmetric: bool = False) -> Tensor:
    """``-m_h * (i - j)`` (or ``|i - j|``) as ``[B|1, H, Tq, Tk]`` float64."""
    m = torch.tensor(slopes, dtype=torch.float64)
    d = q_pos.double()[:, None, :, None] - kv_pos.double()[:, None, None, :]
    if symmetric:
        d = d.abs()
    return -m[None, :, None, None] * d


def erpe_bias(weight: Tensor, q_pos: Tensor, kv_pos: Tensor, max_len: int) -> Tensor:
    """``w[h, i - j + L - 1]`` by loops, ``[B|1, H, Tq, Tk]`` (differentiable in ``weight``)."""
    bsz = max(q_pos.shape[0], kv_pos.shape[0])

    rows = []
    for b in range(bsz):
        qp = q_pos[b if q_pos.shape[0] > 1 else 0]
        kp = kv_pos[b if kv_pos.shape[0] > 1 else 0]
        idx = torch.tensor([[int(qp[i]) - int(kp[j]) + max_len - 1 for j in range(len(kp))] for i in range(len(qp))])
        rows.append(weight.double()[:, idx])
    return torch.stack(rows)


def sinusoid(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    out = torch.zeros(*positions.shape, dim, dtype=torch.float64)
    for idx in torch.cartesian_prod(*[torch.arange(s) for s in positions.shape]).reshape(-1, positions.dim()):
        p = float(positions[tuple(idx)])
        for k in range(dim // 2):
            out[tuple(idx) + (2 * k,)] = math.sin(p / base ** (2 * k / dim))
            out[tuple(idx) + (2 * k + 1,)] = math.cos(p / base ** (2 * k / dim))
    return out


# ---- relative biases (seq-bias) -------------------------------------------------------------------

def attention_from_scores(scores: Tensor, v: Tensor, allowed: Tensor | None, value_extra=None) -> Tensor:
    """Softmax of full float64 ``scores [B, H, Tq, Tk]`` (masked entries dropped, fully masked rows
    give zeros) times ``v [B, Hkv, Tk, D]``; ``value_extra(probs)`` is added to the output."""
    v = v.double().repeat_interleave(scores.shape[1] // v.shape[1], dim=1)
    s = scores.double()
    if allowed is not None:
        a = allowed[:, None]
        s = torch.where(a, s, torch.full_like(s, -math.inf))
        s = torch.where(a.any(-1, keepdim=True), s, torch.zeros_like(s))
        p = torch.softmax(s, dim=-1) * a
    else:
        p = torch.softmax(s, dim=-1)
    out = torch.einsum("bhij,bhjd->bhid", p, v)
    return out if value_extra is None else out + value_extra(p)


def content_scores(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """``q.k * scale`` in float64 with key heads repeated, ``[B, H, Tq, Tk]``."""
    k = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return torch.einsum("bhid,bhjd->bhij", q.double(), k) * scale


def _pairs(q_pos: Tensor, kv_pos: Tensor):
    """Yield ``(b, i, j, pos_i, pos_j)`` over the batch the positions span."""
    bsz = max(q_pos.shape[0], kv_pos.shape[0])
    for b in range(bsz):
        qp = q_pos[b if q_pos.shape[0] > 1 else 0]
        kp = kv_pos[b if kv_pos.shape[0] > 1 else 0]
        for i in range(len(qp)):
            for j in range(len(kp)):
                yield b, i, j, qp[i].item(), kp[j].item()


def t5_bucket(r: int, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> int:
    """T5's bucket of one relative position ``r = j - i``, written from the paper's description."""
    if bidirectional:
        half = num_buckets // 2
        offset = half if r > 0 else 0
        n = abs(r)
    else:
        half, offset, n = num_buckets, 0, max(-r, 0)
    exact = half // 2
    if n < exact:
        return offset + n
    log_part = int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return offset + min(half - 1, exact + log_part)


def t5_bias(table: Tensor, q_pos: Tensor, kv_pos: Tensor, *, bidirectional: bool, num_buckets: int = 32,
            max_distance: int = 128) -> Tensor:
    """``table[bucket(j - i), h]`` as ``[B|1, H, Tq, Tk]`` (differentiable in ``table [buckets, H]``)."""
    bsz = max(q_pos.shape[0], kv_pos.shape[0])
    idx = torch.zeros(bsz, q_pos.shape[1], kv_pos.shape[1], dtype=torch.long)
    for b, i, j, pi, pj in _pairs(q_pos, kv_pos):
        idx[b, i, j] = t5_bucket(int(pj - pi), bidirectional=bidirectional, num_buckets=num_buckets,
                                 max_distance=max_distance)
    return table.double()[idx].permute(0, 3, 1, 2)


def kerple_bias(r1: Tensor, r2: Tensor, variant: str, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """``-r1 ln(1 + r2 |i-j|)`` or ``-r1 |i-j|^r2`` as ``[B|1, H, Tq, Tk]``."""
    dist = (q_pos.double()[:, None, :, None] - kv_pos.double()[:, None, None, :]).abs()
    r1, r2 = r1.double()[None, :, None, None], r2.double()[None, :, None, None]
    if variant == "log":
        return -r1 * torch.log(1 + r2 * dist)
    return -r1 * dist ** r2


def fire_bias(c: Tensor, threshold: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
              q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """FIRE: ``f(psi(|i-j|) / (psi(max(L, i)) + 1e-6))``, ``psi(x) = ln(|c| x + 1)``,
    ``f(x) = W2 relu(W1 x + b1) + b2``; ``[B|1, H, Tq, Tk]``."""
    c = c.double().abs()
    qi = q_pos.double()[:, :, None]
    dist = (qi - kv_pos.double()[:, None, :]).abs()
    norm = torch.log(c * torch.maximum(qi, threshold.double()) + 1) + 1e-6
    x = torch.log(c * dist + 1) / norm  # [B|1, Tq, Tk]
    hidden = torch.relu(x[..., None] * w1.double()[:, 0] + b1.double())
    out = hidden @ w2.double().t() + b2.double()  # [B|1, Tq, Tk, H]
    return out.permute(0, 3, 1, 2)


def shaw_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, key_table: Tensor,
                   value_table: Tensor | None, max_relative: int, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """Shaw et al. by the paper's two equations, with explicit per-pair embeddings ``[B, Tq, Tk, D]``."""
    bsz = q.shape[0]
    d = q.shape[-1]
    slot = torch.zeros(max(q_pos.shape[0], kv_pos.shape[0]), q.shape[2], k.shape[2], dtype=torch.long)
    for b, i, j, pi, pj in _pairs(q_pos, kv_pos):
        slot[b, i, j] = max(-max_relative, min(max_relative, int(pj - pi))) + max_relative
    slot = slot.expand(bsz, -1, -1) if slot.shape[0] == 1 else slot
    ak = key_table.double()[slot]  # [B, Tq, Tk, D]
    scores = content_scores(q, k) + torch.einsum("bhid,bijd->bhij", q.double(), ak) * d ** -0.5
    if value_table is None:
        return attention_from_scores(scores, v, allowed)
    av = value_table.double()[slot]
    return attention_from_scores(scores, v, allowed, lambda p: torch.einsum("bhij,bijd->bhid", p, av))


def transformer_xl_scores(q: Tensor, k: Tensor, u: Tensor, v: Tensor, w_r: Tensor, dim: int,
                          q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """``(q_i.k_j + q_i.W_R R_(i-j) + u.k_j + v.W_R R_(i-j)) / sqrt(d)``, term by term, ``[B, H, Tq, Tk]``."""
    bsz, h, tq, d = q.shape
    kk = k.double().repeat_interleave(h // k.shape[1], dim=1)
    dist = q_pos[:, :, None] - kv_pos[:, None, :]  # [B|1, Tq, Tk]
    r = sinusoid(dist, dim)  # [B|1, Tq, Tk, dim]
    wr = (r @ w_r.double().t()).unflatten(-1, (h, d))  # [B|1, Tq, Tk, H, d]
    qd = q.double()
    a = torch.einsum("bhid,bhjd->bhij", qd, kk)
    b_term = torch.einsum("bhid,bijhd->bhij", qd, wr.expand(bsz, -1, -1, -1, -1))
    c_term = torch.einsum("hd,bhjd->bhj", u.double(), kk)[:, :, None, :]
    d_term = torch.einsum("hd,bijhd->bhij", v.double(), wr.expand(bsz, -1, -1, -1, -1))
    return (a + b_term + c_term + d_term) * d ** -0.5


def cape_scores(scores: Tensor, static: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """``S + B + W2 leaky_relu(W1 [S; B] + b1) + b2`` over the head axis, ``[B, H, Tq, Tk]``."""
    static = static.double().expand(scores.shape[0], -1, -1, -1)
    x = torch.cat((scores, static), dim=1).permute(0, 2, 3, 1)
    hidden = torch.nn.functional.leaky_relu(x @ w1.double().t() + b1.double())
    return scores + static + (hidden @ w2.double().t() + b2.double()).permute(0, 3, 1, 2)


def cope_scores(scores: Tensor, q: Tensor, pos_emb: Tensor, allowed: Tensor, npos_max: int) -> Tensor:
    """CoPE: gates ``sigmoid(s_ij)`` on visible keys, ``p_ij = sum_{t >= j} g_it`` (visible keys only, so
    ``t <= i`` under a causal mask), clamped to ``npos_max - 1``, ``+ q_i.e(p_ij) / sqrt(d)`` with ``e``
    linearly interpolated between the rows of ``pos_emb``."""
    d = q.shape[-1]
    gates = torch.sigmoid(scores) * allowed[:, None]
    tk = scores.shape[-1]
    pos = torch.stack([gates[..., j:].sum(-1) for j in range(tk)], dim=-1).clamp(max=npos_max - 1)
    lo = pos.detach().floor()
    w = pos - lo
    e = pos_emb.double()
    e_lo = e[lo.long()]  # [B, H, Tq, Tk, d]
    e_hi = e[pos.detach().ceil().long()]
    emb = w[..., None] * e_hi + (1 - w[..., None]) * e_lo
    return scores + torch.einsum("bhid,bhijd->bhij", q.double(), emb) * d ** -0.5


# ---- DeBERTa ---------------------------------------------------------------------------------


def log_bucket_ref(r: int, bucket_size: int, max_position: int) -> int:
    """DeBERTa-v2's log bucket of one distance, in plain Python."""
    mid = bucket_size // 2
    if -mid < r < mid:
        return r
    a = abs(r)
    if a <= mid:
        return r
    log_pos = math.ceil(math.log(a / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return int(math.copysign(log_pos, r))


def delta_ref(r: int, span: int, log_buckets: bool, max_position: int) -> int:
    if log_buckets:
        r = log_bucket_ref(r, span, max_position)
    return min(max(r + span, 0), 2 * span - 1)


def deberta_scores(q: Tensor, k: Tensor, rel: Tensor, w_q: Tensor, w_k: Tensor, span: int, log_buckets: bool,
                   max_position: int, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """``(Qc.Kc + Qc.Kr[delta(i,j)] + Kc.Qr[delta(j,i)]) / sqrt(3d)`` by explicit index tables,
    ``[B, H, Tq, Tk]`` (``q`` before DeBERTa's own ``1/sqrt(3)``)."""
    h, d = q.shape[1], q.shape[-1]
    k = k.double().repeat_interleave(h // k.shape[1], 1)
    q = q.double()
    bsz = max(q_pos.shape[0], kv_pos.shape[0])
    c_idx = torch.zeros(bsz, q.shape[2], k.shape[2], dtype=torch.long)
    p_idx = torch.zeros_like(c_idx)
    for b, i, j, pi, pj in _pairs(q_pos, kv_pos):
        c_idx[b, i, j] = delta_ref(int(pi - pj), span, log_buckets, max_position)
        p_idx[b, i, j] = delta_ref(int(pj - pi), span, log_buckets, max_position)
    c_idx, p_idx = c_idx.expand(q.shape[0], -1, -1), p_idx.expand(q.shape[0], -1, -1)
    scores = torch.einsum("bhid,bhjd->bhij", q, k)
    extra = []
    for head in range(h):
        kr = rel.double() @ w_k.double()[head * d : (head + 1) * d].T  # [2k, d]
        qr = rel.double() @ w_q.double()[head * d : (head + 1) * d].T
        c2p = torch.einsum("bid,bijd->bij", q[:, head], kr[c_idx])
        p2c = torch.einsum("bjd,bijd->bij", k[:, head], qr[p_idx])
        extra.append(c2p + p2c)
    return (scores + torch.stack(extra, 1)) / math.sqrt(3 * d)


def vector_erpe_bias(q: Tensor, weight: Tensor, q_pos: Tensor, kv_pos: Tensor, max_len: int, scale: float) -> Tensor:
    """``q_i . r_(pos_i - pos_j) * scale`` (ConvTran's vector variant), ``[B, H, Tq, Tk]``; ``weight``
    ``[1 or H, 2L - 1, D]``."""
    b, h, tq, _ = q.shape
    out = torch.zeros(b, h, tq, kv_pos.shape[1], dtype=torch.float64)
    w = weight.double().expand(h, -1, -1)
    for bb, i, j, pi, pj in _pairs(q_pos, kv_pos):
        rows = range(b) if max(q_pos.shape[0], kv_pos.shape[0]) == 1 else [bb]
        for r in rows:
            out[r, :, i, j] = (q[r, :, i].double() * w[:, int(pi - pj) + max_len - 1]).sum(-1) * scale
    return out


def fox_log_gates(k: Tensor, weight: Tensor, bias: Tensor, key_valid: Tensor | None = None) -> Tensor:
    """``log f [B, H, T]`` of the Forgetting Transformer's gates from the keys, head ``h`` reading
    key head ``h // (H / Hkv)``, by loops; padded keys count as zero keys (posenc zeroes them)."""
    b_size, kv_heads, length, _ = k.shape
    heads = weight.shape[0]
    out = torch.zeros(b_size, heads, length, dtype=torch.float64)
    for b in range(b_size):
        for h in range(heads):
            for t in range(length):
                key = k[b, h // (heads // kv_heads), t].double()
                if key_valid is not None and not bool(key_valid[b if key_valid.shape[0] > 1 else 0, t]):
                    key = torch.zeros_like(key)
                logit = (key * weight[h].double()).sum() + bias[h].double()
                out[b, h, t] = -torch.log1p(torch.exp(-logit))  # log sigmoid
    return out


def fox_bias(log_gates: Tensor, q_len: int) -> Tensor:
    """``D [B, H, Tq, Tk]``, the paper's ``sum_{l = j+1 .. i} log f_l`` for query ``i`` (the token of
    key index ``i + Tk - Tq``) and key ``j <= i``, by explicit sums; 0 where ``j > i`` (masked)."""
    b_size, heads, kv_len = log_gates.shape
    offset = kv_len - q_len
    out = torch.zeros(b_size, heads, q_len, kv_len, dtype=torch.float64)
    for i in range(q_len):
        for j in range(min(i + offset, kv_len - 1) + 1):
            out[:, :, i, j] = log_gates[:, :, j + 1: i + offset + 1].double().sum(-1)
    return out
