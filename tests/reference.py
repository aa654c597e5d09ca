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
