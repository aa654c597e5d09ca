"""Shape checks shared by the attention entry points (softmax :func:`~posenc.common.attention.attend`
and :func:`~posenc.common.linear_attention.linear_attention`): one home for each rule."""

from __future__ import annotations

from torch import Tensor


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, value_width: bool = True) -> None:
    """``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]`` alike, ``Hq`` a multiple of ``Hkv``; else a
    ValueError naming the shapes. ``value_width=False`` lets ``v`` have its own width ``Dv``
    (linear attention after SPE: ``q, k [.., R]``, ``v [.., D]``)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, H, T, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, hq, _, d = q.shape
    same = k.shape == v.shape if value_width else k.shape[:3] == v.shape[:3]
    if not same or k.shape[0] != b or k.shape[3] != d:
        want = f"[B={b}, Hkv, Tk, D={d}] alike" if value_width else f"[B={b}, Hkv, Tk, D={d}] and [B, Hkv, Tk, Dv]"
        raise ValueError(f"k and v must be {want}; got {tuple(k.shape)} and {tuple(v.shape)}")
    if hq % k.shape[1]:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({k.shape[1]})")
