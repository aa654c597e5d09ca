"""Rotary position embedding, RoPE (Su et al. 2021, https://arxiv.org/abs/2104.09864).

``theta_k = base^(-2k/r)`` for ``k < r/2``; each pair of query and key features is rotated by
``p * theta_k``, so ``q_i . k_j`` depends on positions only through ``i - j``. Hook: q/k
transform. Kernel: SDPA (flash) -- nothing touches the scores.

Pairing conventions (both are used by real checkpoints): ``pairing="half_split"`` pairs
``(k, k + r/2)`` as GPT-NeoX and Hugging Face Llama do; ``pairing="interleaved"`` pairs
``(2k, 2k+1)`` as GPT-J, rotary-embedding-torch and torchtune do. ``rotary_dim = r < head_dim``
rotates only the first ``r`` features (partial rotary).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..common.rotary import apply_rotary, rotary_angles

PAIRINGS = ("half_split", "interleaved")


def rope_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """``base^(-2k/r)`` for ``k = 0 .. r/2 - 1`` (float64)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    if base <= 1:
        raise ValueError(f"base must be > 1, got {base}")
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return base ** (-k / rotary_dim)


@register(
    "rope",
    modality="seq",
    paper="Su et al. 2021, RoFormer, https://arxiv.org/abs/2104.09864",
    summary="rotary q/k transform; half-split or interleaved pairs, partial rotary",
)
class RotaryEncoding(PositionEncoding):
    """Args:
        head_dim: per-head width ``D``.
        base: frequency base (10000).
        rotary_dim: features rotated, even, ``<= head_dim``; default all.
        pairing: "half_split" (GPT-NeoX, HF Llama) or "interleaved" (GPT-J, torchtune).

    Shapes: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T]`` (integer or float).
    """

    hooks = frozenset({Hook.QK})

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Literal["half_split", "interleaved"] = "half_split",
    ) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim ({rotary_dim}) must not exceed head_dim ({head_dim})")
        if pairing not in PAIRINGS:
            raise ValueError(f"pairing must be one of {PAIRINGS}; got {pairing!r}")
        self.head_dim, self.rotary_dim, self.base, self.pairing = head_dim, rotary_dim, base, pairing
        self.register_buffer("inv_freq", rope_inv_freq(rotary_dim, base), persistent=False)

    def _tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        if positions.dim() != 2:
            raise ValueError(f"positions must be [batch or 1, tokens]; got {tuple(positions.shape)}")
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float64:  # the module was cast (.half(), .float()): recompute exactly
            inv_freq = rope_inv_freq(self.rotary_dim, self.base).to(positions.device)
        angles = rotary_angles(positions, inv_freq).unsqueeze(1)  # [B, 1, T, r/2]
        return angles.cos(), angles.sin()

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        interleaved = self.pairing == "interleaved"
        cos, sin = self._tables(q_pos)
        q = apply_rotary(q, cos, sin, interleaved=interleaved)
        if k.shape[2] > 0:
            if kv_pos is not q_pos:
                cos, sin = self._tables(kv_pos)
            k = apply_rotary(k, cos, sin, interleaved=interleaved)
        return q, k
