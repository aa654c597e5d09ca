"""3D (space-time) axial rotary position embedding for video tokens.

RoPE-ViT's axial 2D RoPE (Heo et al. 2024, https://arxiv.org/abs/2403.13298) with a third axis
for time, as video transformers do (e.g. the ``t, h, w`` sections of Qwen2-VL's M-RoPE,
Wang et al. 2024, https://arxiv.org/abs/2409.12191).

The ``D/2`` rotary pairs of each head are split among the axes: ``axis_pairs = (n_t, n_r, n_c)``
(given in the coordinate order ``(t, row, col)``; default: ``n_r = n_c = (D/2) // 3``, the spare
pairs to time). Each axis has its own frequency ladder ``theta_j = base^(-j/n)``,
``j = 0 .. n - 1`` (base 100, RoPE-ViT's axial default), and a token at ``(t, row, col)`` rotates

* pairs ``0 .. n_t - 1`` by ``t * theta_j``,
* the next ``n_c`` pairs by ``col * theta_j``, the next ``n_r`` by ``row * theta_j``
  (the 2D part in RoPE-ViT's order, columns first),
* any remaining pairs not at all (partial rotary).

So ``q_i . k_j`` depends on positions only through the 3D offset ``(dt, drow, dcol)``, and
``axis_pairs = (0, D/4, D/4)`` is exactly ``rope2d_axial`` on ``(row, col)`` (a time-blind,
per-frame encoding). Pairing: ``"interleaved"`` pairs ``(2k, 2k+1)`` (RoPE-ViT) or
``"half_split"`` pairs ``(k, k + r/2)`` over the ``r = 2 * sum(axis_pairs)`` rotated features. Coordinates are tubelet indices: more frames or larger
frames extrapolate to larger angles (nothing is resampled). Prefix tokens (class, registers) are
not rotated. Hook: q/k transform (:func:`posenc.primitives.rotary.apply_rotary`). Kernel: SDPA.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Sequence

import torch
from torch import Tensor

from ..common.checks import check_choice, check_int, check_number, is_int
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from .grid import patch_coords
from .rope2d import PAIRINGS, _rotate_patches


def rope3d_axis_pairs(head_dim: int, axis_pairs: Sequence[int] | None = None) -> tuple[int, int, int]:
    """Rotary pairs per axis ``(t, row, col)``: checked, or the default split of ``head_dim / 2``."""
    check_int("head_dim", head_dim, minimum=1)
    if head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int for 3D RoPE; got {head_dim!r}")
    total = head_dim // 2
    if axis_pairs is None:
        space = total // 3
        if space == 0:
            raise ValueError(f"head_dim={head_dim} has {total} rotary pairs; 3D RoPE needs at least 3 (head_dim >= 6)")
        return total - 2 * space, space, space
    if not (isinstance(axis_pairs, (tuple, list)) and len(axis_pairs) == 3
            and all(is_int(v) for v in axis_pairs)):
        raise TypeError(f"axis_pairs must be three ints (t, row, col) or None; got {axis_pairs!r}")
    pairs = tuple(int(v) for v in axis_pairs)
    if any(v < 0 for v in pairs) or sum(pairs) == 0 or sum(pairs) > total:
        raise ValueError(
            f"axis_pairs (t, row, col) must be >= 0, not all zero, and use at most head_dim / 2 = {total} pairs; got {pairs}"
        )
    return pairs  # type: ignore[return-value]


def rope3d_frequencies(n: int, base: float, device=None) -> Tensor:
    """One axis's ladder ``base^(-j/n)`` for ``j = 0 .. n - 1`` (float64; empty for ``n = 0``)."""
    check_number("base", base, minimum=1.0, strict=True)
    j = torch.arange(n, dtype=torch.float64, device=device)
    return base ** (-j / max(n, 1))


def rope3d_angles(coords: Tensor, axis_pairs: Sequence[int], base: float) -> Tensor:
    """Angles ``[..., n_t + n_c + n_r]`` (float64) of ``coords [..., 3]`` ``(t, row, col)``:
    time pairs, then column pairs, then row pairs."""
    n_t, n_r, n_c = axis_pairs
    coords = coords.to(torch.float64)
    parts = [coords[..., axis : axis + 1] * rope3d_frequencies(n, base, coords.device)
             for axis, n in ((0, n_t), (2, n_c), (1, n_r))]
    return torch.cat(parts, dim=-1)


@register(
    "rope3d",
    modality="vision",
    paper="Heo et al. 2024, RoPE-ViT, https://arxiv.org/abs/2403.13298, with a time axis (M-RoPE, "
    "https://arxiv.org/abs/2409.12191)",
    summary="video: rotary pairs split among t, row and col, each axis its own ladder 100^(-j/n)",
)
class Rope3D(PositionEncoding):
    """Args:
        head_dim: per-head width ``D`` (even).
        axis_pairs: rotary pairs for ``(t, row, col)`` (default: as equal as possible, spare pairs
            to time); at most ``D/2`` in all, the rest of the features pass through.
        base: frequency base (100).
        num_prefix_tokens: leading tokens (class, registers) left unrotated.
        pairing: "interleaved" (RoPE-ViT) or "half_split".

    Shapes: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T, 3]`` (t, row, col;
    integer or float).
    """

    hooks = frozenset({Hook.QK})
    grid_ndim: ClassVar[int] = 3

    def __init__(
        self,
        head_dim: int,
        axis_pairs: Sequence[int] | None = None,
        base: float = 100.0,
        num_prefix_tokens: int = 0,
        pairing: Literal["interleaved", "half_split"] = "interleaved",
    ) -> None:
        super().__init__()
        self.axis_pairs = rope3d_axis_pairs(head_dim, axis_pairs)
        check_number("base", base, minimum=1.0, strict=True)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        check_choice("pairing", pairing, PAIRINGS)
        self.head_dim, self.base, self.num_prefix_tokens, self.pairing = head_dim, base, num_prefix_tokens, pairing

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, axis_pairs={self.axis_pairs}, base={self.base}, "
                f"num_prefix_tokens={self.num_prefix_tokens}, pairing={self.pairing!r}")

    def _angles(self, positions: Tensor, length: int) -> Tensor:
        coords = patch_coords(positions, length, self.num_prefix_tokens, "rope3d", ndim=3)
        return rope3d_angles(coords, self.axis_pairs, self.base).unsqueeze(1)  # [B or 1, 1, N, pairs]

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this rope3d was built for head_dim={self.head_dim}")
        interleaved, p = self.pairing == "interleaved", self.num_prefix_tokens
        angles = self._angles(q_pos, q.shape[2])
        q = _rotate_patches(q, angles.cos(), angles.sin(), p, interleaved)
        if k.shape[2] > 0:
            if kv_pos is not q_pos:
                angles = self._angles(kv_pos, k.shape[2])
            k = _rotate_patches(k, angles.cos(), angles.sin(), p, interleaved)
        return q, k
