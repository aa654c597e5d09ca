"""Rotary application, shared by every rotary encoding (1D RoPE and its scalings, xPos, 2D RoPE).

Both pairings of real checkpoints, by name: ``"interleaved"`` rotates pairs ``(2k, 2k+1)`` (GPT-J,
rotary-embedding-torch, torchtune), ``"half_split"`` pairs ``(k, k + r/2)`` (GPT-NeoX, Hugging Face
Llama). Only the first ``r = 2 * cos.shape[-1]`` features are rotated (partial rotary). The
backward pass is the rotation by the opposite angle, so nothing but ``cos`` and ``sin`` is saved.
The functions take inverse frequencies; :func:`posenc.functional.rope_cos_sin` makes them from a
base and a context-extension scaling.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..common.amp import autocast_off

PAIRINGS = ("half_split", "interleaved")
Pairing = Literal["half_split", "interleaved"]


def check_pairing(pairing: str) -> bool:
    """``pairing`` checked; returns whether it is interleaved."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}; got {pairing!r}")
    return pairing == "interleaved"


def rotary_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Angles ``positions[..., t] * inv_freq[..., k]``: ``[..., T]`` x ``[R/2]`` (or ``[..., R/2]``,
    one set of frequencies per leading index, as length-dependent scalings give) -> ``[..., T, R/2]``.

    Computed in float64: in float32 the angle of position 100,000 is off by about 0.01 rad. The
    tables are small (``T x R/2``), so this costs nothing measurable.
    """
    return positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64).unsqueeze(-2)


def rotary_cos_sin(positions: Tensor, inv_freq: Tensor, *, attention_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of :func:`rotary_angles` (float64 ``[..., T, R/2]``), each times
    ``attention_factor`` (a context extension's temperature: the scores are scaled by its square)."""
    angles = rotary_angles(positions, inv_freq)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos, sin


def _pairs(x: Tensor, r: int, interleaved: bool) -> tuple[Tensor, Tensor]:
    """The two members of each rotated pair of ``x``'s first ``r`` features, as views."""
    if interleaved:
        return x[..., 0:r:2], x[..., 1:r:2]
    return x[..., : r // 2], x[..., r // 2 : r]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The rotation, written into one output buffer: four element-wise kernels (one ``mul`` and
    one ``addcmul_`` per half), not the nine of the expression, which matters most where ``x`` is
    small (a decoding step). Not differentiable itself (``out=``): :class:`_Rotary` wraps it."""
    # The result keeps x's memory layout (empty_like preserves strides): q and k usually arrive
    # as transposed views of the projections, like v, and SDPA's fused kernel is faster when q,
    # k and v share one layout than when q and k are compact and v is not.
    r = 2 * cos.shape[-1]
    out = torch.empty_like(x)
    x0, x1 = _pairs(x, r, interleaved)
    o0, o1 = _pairs(out, r, interleaved)
    torch.mul(x0, cos, out=o0).addcmul_(x1, sin, value=-1)
    torch.mul(x1, cos, out=o1).addcmul_(x0, sin)
    if r < x.shape[-1]:
        out[..., r:] = x[..., r:]
    return out


def _rotate_differentiable(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """:func:`_rotate` as an expression autograd differentiates in every input (learned angles)."""
    r = 2 * cos.shape[-1]
    x0, x1 = _pairs(x, r, interleaved)
    first, second = x0 * cos - x1 * sin, x1 * cos + x0 * sin
    if interleaved:
        rotated = torch.stack((first, second), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((first, second), dim=-1)
    return rotated if r == x.shape[-1] else torch.cat((rotated, x[..., r:]), dim=-1)


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _rotate(x, cos, sin, interleaved)

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            raise RuntimeError("apply_rotary: gradients for cos/sin are not supported; pass detached tables")
        return _rotate(grad, cos, -sin, ctx.interleaved), None, None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> Tensor:
    """Rotate the feature pairs of ``x`` by the angles whose cosines and sines are given.

    Args:
        x: ``[B, H, T, D]``.
        cos: ``[B or 1, 1, T, R/2]`` (or anything broadcasting to ``x[..., :R/2]``), ``R <= D`` even.
        sin: as ``cos``.
        interleaved: pairing convention (see module docstring).
    """
    half = cos.shape[-1]
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if 2 * half > x.shape[-1]:
        raise ValueError(f"rotary tables cover {2 * half} features but x has only {x.shape[-1]} (shape {tuple(x.shape)})")
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
        return _rotate(x, cos, sin, interleaved)  # inference: no autograd node to build
    if cos.requires_grad or sin.requires_grad or torch.compiler.is_compiling():
        # Learned frequencies (RoPE-Mixed): let autograd differentiate the angles too. Under
        # torch.compile the expression is what inductor fuses (dynamo refuses out= into views).
        return _rotate_differentiable(x, cos, sin, interleaved)
    return _Rotary.apply(x, cos, sin, interleaved)


def apply_rotary_qk(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    kv_pos: Tensor,
    inv_freq: Tensor,
    *,
    pairing: Pairing,
    attention_factor: float = 1.0,
    by_position: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Rotate queries and keys at their own positions with one set of frequencies.

    Args:
        q: ``[B, Hq, Tq, D]``; k: ``[B, Hkv, Tk, D]``.
        q_pos: query positions ``[B or 1, Tq]`` (integer or float).
        kv_pos: key positions ``[B or 1, Tk]`` (integer or float).
        inv_freq: ``[R/2]``, or ``[B or 1, R/2]`` (one set per batch row), ``R <= D``.
        pairing: "half_split" or "interleaved".
        attention_factor: multiplies ``cos`` and ``sin`` (both q and k).
        by_position: ``cos`` and ``sin`` of these frequencies (attention factor included) at the
            integer positions ``0 .. L-1``, ``[L, R/2]`` each, read at the positions instead of
            computed (a table kept for cached decoding); every position must lie in it.

    Returns ``(q, k)`` of the same shapes.
    """
    interleaved = check_pairing(pairing)

    def tables(positions: Tensor) -> tuple[Tensor, Tensor]:  # [B, T, R/2] each
        if by_position is not None:
            return by_position[0][positions], by_position[1][positions]
        return rotary_cos_sin(positions, inv_freq, attention_factor=attention_factor)

    cos, sin = tables(q_pos)
    q = apply_rotary(q, cos.unsqueeze(1), sin.unsqueeze(1), interleaved=interleaved)
    if k.shape[2] > 0:
        if kv_pos is not q_pos:
            cos, sin = tables(kv_pos)
        k = apply_rotary(k, cos.unsqueeze(1), sin.unsqueeze(1), interleaved=interleaved)
    return q, k
