"""Rotary application, shared by every rotary encoding (1D RoPE and its scalings, xPos, 2D RoPE).

Two pairing conventions are used by real checkpoints and both are supported, by name:

* ``interleaved=True``: pairs ``(2k, 2k+1)`` (GPT-J, rotary-embedding-torch, torchtune);
* ``interleaved=False``: half-split pairs ``(k, k + r/2)`` (GPT-NeoX, Hugging Face Llama).

Only the first ``r = 2 * cos.shape[-1]`` features are rotated (partial rotary); the rest pass
through. The backward pass is the rotation by the opposite angle, so nothing but ``cos`` and ``sin``
is saved for it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Angles ``positions[..., None] * inv_freq``: ``[..., T]`` x ``[R/2]`` -> ``[..., T, R/2]``.

    Computed in float64: in float32 the angle of position 100,000 is off by about 0.01 rad. The
    tables are small (``T x R/2``), so this costs nothing measurable.
    """
    return positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    # The result keeps x's memory layout (empty_like preserves strides): q and k usually arrive
    # as transposed views of the projections, like v, and SDPA's fused kernel is faster when q,
    # k and v share one layout than when q and k are compact and v is not.
    r = 2 * cos.shape[-1]
    out = torch.empty_like(x)
    if interleaved:
        x0, x1 = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = x0 * cos - x1 * sin
        out[..., 1:r:2] = x1 * cos + x0 * sin
    else:
        h = r // 2
        x0, x1 = x[..., :h], x[..., h:r]
        out[..., :h] = x0 * cos - x1 * sin
        out[..., h:r] = x1 * cos + x0 * sin
    if r < x.shape[-1]:
        out[..., r:] = x[..., r:]
    return out


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _rotate(x, cos, sin, interleaved)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            raise RuntimeError("apply_rotary: gradients for cos/sin are not supported; pass detached tables")
        return _rotate(grad, cos, -sin, ctx.interleaved), None, None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> Tensor:
    """Rotate the feature pairs of ``x`` by the angles whose cosines and sines are given.

    Args:
        x: ``[B, H, T, D]``.
        cos, sin: ``[B or 1, 1, T, R/2]`` (or anything broadcasting to ``x[..., :R/2]``), ``R <= D`` even.
        interleaved: pairing convention (see module docstring).
    """
    half = cos.shape[-1]
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if 2 * half > x.shape[-1]:
        raise ValueError(f"rotary tables cover {2 * half} features but x has only {x.shape[-1]} (shape {tuple(x.shape)})")
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if cos.requires_grad or sin.requires_grad:
        # Learned frequencies (RoPE-Mixed): let autograd differentiate the angles too.
        return _rotate(x, cos, sin, interleaved)
    return _Rotary.apply(x, cos, sin, interleaved)
