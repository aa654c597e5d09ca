"""2D rotary position embedding for images: axial and mixed (RoPE-ViT).

Paper: Heo et al. 2024, Rotary Position Embedding for Vision Transformer,
https://arxiv.org/abs/2403.13298 (code: naver-ai/rope-vit).

A token at ``(row y, col x)`` rotates the ``D/2`` feature pairs of its query and key by angles
``phi_k(x, y)``; since ``phi`` is linear in ``(x, y)``, ``q_i . k_j`` depends on positions only
through the 2D offset ``(x_i - x_j, y_i - y_j)``.

* ``rope2d_axial``: ``theta_j = base^(-4j/D)``, ``j = 0 .. D/4 - 1`` (base 100, RoPE-ViT's axial
  default); the first ``D/4`` pairs rotate by ``x * theta_j``, the last ``D/4`` by ``y * theta_j``.
* ``rope2d_mixed``: learned per-head frequencies, ``phi_{h,k} = x * f^x_{h,k} + y * f^y_{h,k}``.
  Initialisation (RoPE-ViT): magnitudes ``m_j = base^(-4j/D)`` (base 10), a random angle
  ``alpha_h ~ U[0, 2 pi)`` per head; the first ``D/4`` pairs get direction ``alpha_h``, the last
  ``D/4`` direction ``alpha_h + pi/2``: ``f^x = m cos(.)``, ``f^y = m sin(.)``. RoPE-ViT learns
  one set per block, so the ViT builds one instance per block (``per_layer = True``).

Pairing: ``"interleaved"`` pairs ``(2k, 2k+1)`` as RoPE-ViT (complex view); ``"half_split"``
pairs ``(k, k + D/2)``. Coordinates are patch indices, so a larger image extrapolates to larger
angles as in RoPE-ViT (nothing is resampled). Prefix tokens (class, registers) are not rotated.
Hook: q/k transform (:func:`posenc.primitives.rotary.apply_rotary`). Kernel: SDPA (flash).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.rotary import apply_rotary
from .grid import patch_coords

PAIRINGS = ("interleaved", "half_split")


def rope2d_frequencies(head_dim: int, base: float) -> Tensor:
    """``base^(-4j/D)`` for ``j = 0 .. D/4 - 1`` (float64)."""
    check_int("head_dim", head_dim, minimum=1)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a positive multiple of 4 for 2D RoPE; got {head_dim}")
    check_number("base", base, minimum=1.0, strict=True)
    j = torch.arange(head_dim // 4, dtype=torch.float64)
    return base ** (-4.0 * j / head_dim)


def _rotate_patches(x: Tensor, cos: Tensor, sin: Tensor, num_prefix: int, interleaved: bool) -> Tensor:
    """Rotate the tokens of ``x [B, H, T, D]`` after the first ``num_prefix``."""
    if num_prefix == 0:
        return apply_rotary(x, cos, sin, interleaved=interleaved)
    patches = apply_rotary(x[:, :, num_prefix:], cos, sin, interleaved=interleaved)
    return torch.cat((x[:, :, :num_prefix], patches), dim=2)


class _Rope2D(PositionEncoding):
    hooks = frozenset({Hook.QK})

    def _init_common(self, head_dim: int, num_prefix_tokens: int, pairing: str) -> None:
        check_int("head_dim", head_dim, minimum=1)
        if head_dim % 4:
            raise ValueError(f"head_dim must be a positive multiple of 4 for 2D RoPE; got {head_dim}")
        check_choice("pairing", pairing, PAIRINGS)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        self.head_dim, self.num_prefix_tokens, self.pairing = head_dim, num_prefix_tokens, pairing

    def extra_repr(self) -> str:
        heads = f", num_heads={self.num_heads}" if self.num_heads is not None else ""
        return (f"head_dim={self.head_dim}{heads}, base={self.base}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"pairing={self.pairing!r}")

    def _angles(self, coords: Tensor) -> Tensor:
        """``coords [B or 1, N, 2]`` -> angles ``[B or 1, H or 1, N, D/2]`` (float64)."""
        raise NotImplementedError

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        name = type(self).__name__
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this {name} was built for head_dim={self.head_dim}")
        interleaved, p = self.pairing == "interleaved", self.num_prefix_tokens
        angles = self._angles(patch_coords(q_pos, q.shape[2], p, name))
        q = _rotate_patches(q, angles.cos(), angles.sin(), p, interleaved)
        if k.shape[2] > 0:
            if kv_pos is not q_pos:
                angles = self._angles(patch_coords(kv_pos, k.shape[2], p, name))
            k = _rotate_patches(k, angles.cos(), angles.sin(), p, interleaved)
        return q, k


@register(
    "rope2d_axial",
    modality="vision",
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer, https://arxiv.org/abs/2403.13298",
    summary="half the rotary pairs turn with the column, half with the row; theta_j = 100^(-4j/D)",
)
class Rope2DAxial(_Rope2D):
    """Args:
        head_dim: per-head width ``D`` (a multiple of 4).
        base: frequency base (100, RoPE-ViT's default for images).
        num_prefix_tokens: leading tokens (class, registers) left unrotated.
        pairing: "interleaved" (RoPE-ViT) or "half_split".

    Shapes: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T, 2]`` (row, col;
    integer or float).
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 100.0,
        num_prefix_tokens: int = 0,
        pairing: Literal["interleaved", "half_split"] = "interleaved",
    ) -> None:
        super().__init__()
        self._init_common(head_dim, num_prefix_tokens, pairing)
        self.base = base
        self.register_buffer("theta", rope2d_frequencies(head_dim, base), persistent=False)

    def _angles(self, coords: Tensor) -> Tensor:
        theta = self.theta
        if theta.dtype != torch.float64:  # the module was cast: recompute exactly
            theta = rope2d_frequencies(self.head_dim, self.base).to(coords.device)
        coords = coords.to(torch.float64)
        angles = torch.cat((coords[..., 1:2] * theta, coords[..., 0:1] * theta), dim=-1)  # x pairs, then y pairs
        return angles.unsqueeze(1)


@register(
    "rope2d_mixed",
    modality="vision",
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer (RoPE-Mixed), "
    "https://arxiv.org/abs/2403.13298",
    summary="learned per-head 2D rotary frequencies phi = x*f_x + y*f_y (one set per block)",
)
class Rope2DMixed(_Rope2D):
    """Args:
        head_dim: per-head width ``D`` (a multiple of 4).
        num_heads: query heads ``H`` (keys must have as many heads: the frequencies are per head).
        base: magnitude base of the initialisation (10, RoPE-ViT's mixed default).
        num_prefix_tokens: leading tokens (class, registers) left unrotated.
        pairing: "interleaved" (RoPE-ViT) or "half_split".

    Parameters: ``freqs [2, H, D/2]`` (``f^x``, ``f^y``), learned.
    Shapes: ``q [B, H, Tq, D]``, ``k [B, H, Tk, D]``, positions ``[B or 1, T, 2]`` (row, col).
    """

    per_layer: ClassVar[bool] = True

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        base: float = 10.0,
        num_prefix_tokens: int = 0,
        pairing: Literal["interleaved", "half_split"] = "interleaved",
    ) -> None:
        super().__init__()
        self._init_common(head_dim, num_prefix_tokens, pairing)
        check_int("num_heads", num_heads, minimum=1)
        self.num_heads, self.base = num_heads, base
        mag = rope2d_frequencies(head_dim, base).float()  # [D/4]
        alpha = torch.rand(num_heads, 1) * 2 * math.pi  # one direction per head
        direction = torch.cat((alpha.expand(-1, mag.numel()), (alpha + math.pi / 2).expand(-1, mag.numel())), dim=-1)
        mag2 = torch.cat((mag, mag))
        self.freqs = nn.Parameter(torch.stack((mag2 * direction.cos(), mag2 * direction.sin())))  # [2, H, D/2]

    def _angles(self, coords: Tensor) -> Tensor:
        coords = coords.to(torch.float64)
        f = self.freqs.to(torch.float64)
        x, y = coords[..., 1][:, None, :, None], coords[..., 0][:, None, :, None]  # [B, 1, N, 1]
        return x * f[0][None, :, None, :] + y * f[1][None, :, None, :]  # [B, H, N, D/2]

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[1] != self.num_heads or k.shape[1] != self.num_heads:
            raise ValueError(
                f"Rope2DMixed was built for {self.num_heads} heads (per-head frequencies); got q with {q.shape[1]} "
                f"and k with {k.shape[1]} heads"
            )
        return super().transform_qk(q, k, q_pos, kv_pos)
