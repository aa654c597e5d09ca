"""DINOv3's rotary position embedding for ViTs (Simeoni et al. 2025, DINOv3,
https://arxiv.org/abs/2508.10104; transformers' ``DINOv3ViTRopePositionEmbedding``, timm's
``RotaryEmbeddingDinoV3``).

Unlike RoPE-ViT's axial RoPE (``rope2d_axial``), whose angles grow with the patch index, DINOv3
places each patch at its centre in a box normalised to ``[-1, 1]``, so a larger image spans the
same range with finer steps (it interpolates where RoPE-ViT extrapolates):

* coordinates: patch ``(row, col)`` of an ``R x C`` grid sits at ``2 (row + 0.5) / n_r - 1``,
  ``2 (col + 0.5) / n_c - 1``, with ``n_r = R, n_c = C`` (``normalize="separate"``, the default),
  or both ``min(R, C)`` or ``max(R, C)`` (``"min"``, ``"max"``);
* frequencies: ``D/4`` per axis, ``theta_j = base^(-4j/D)`` (base 100), the angle ``2 pi * c * theta_j``;
  the first ``D/4`` pairs turn with the row, the next ``D/4`` with the column;
* pairing: half-split pairs ``(k, k + D/2)`` (DINOv3, ``rotate_half``), or ``"interleaved"`` (timm's
  ``rotate_half=False``);
* class and register tokens (``num_prefix_tokens``) are not rotated;
* training-time augmentation of the coordinates (only in ``train()`` mode, off by default): a shift
  by ``U[-shift, shift]`` per axis, a jitter multiplying each axis by a log-uniform factor in
  ``[1/jitter, jitter]``, a rescale multiplying both by one in ``[1/rescale, rescale]``, drawn in
  that order from torch's generator in float32 as DINOv3 draws them (so a seeded run draws the same
  numbers). DINOv3 draws once per forward pass for all blocks; an encoding shared by the blocks of a
  posenc ViT draws once per block call (the same draw for its queries and keys). For DINOv3's regime,
  draw once with :func:`dinov3_augment_coords` and pass the coordinates with ``coordinates="normalized"``.

Positions: ``coordinates="grid"`` (default) reads ``(row, col)`` patch indices ``[B or 1, T, 2]``
(integer, or float for fractional patches) as every vision encoding does, the grid being the
extent of the keys' positions (``floor(max) + 1`` per axis, one grid for the batch);
``coordinates="normalized"`` reads the normalised coordinates themselves (any real numbers, e.g.
from :func:`dinov3_patch_coords`, per row of a batch of different grids). Hook: q/k transform;
kernel: SDPA (flash).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from ..common.checks import (
    check_choice,
    check_int,
    check_number,
    check_static_positions,
)
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.rotary import apply_rotary
from .grid import patch_coords
from .rope2d import PAIRINGS, _rotate_patches

NORMALIZATIONS = ("separate", "min", "max")
COORDINATES = ("grid", "normalized")


def dinov3_frequencies(head_dim: int, base: float = 100.0) -> Tensor:
    """``base^(-4j/D)`` for ``j = 0 .. D/4 - 1`` (float64): the inverse periods of each axis."""
    check_int("head_dim", head_dim, minimum=4)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a positive multiple of 4 for DINOv3 RoPE; got {head_dim}")
    check_number("base", base, minimum=1.0, strict=True)
    return base ** (-4.0 * torch.arange(head_dim // 4, dtype=torch.float64) / head_dim)


def _denominators(rows: int, cols: int, normalize: str) -> tuple[float, float]:
    if normalize == "separate":
        return float(rows), float(cols)
    side = float(min(rows, cols) if normalize == "min" else max(rows, cols))
    return side, side


def dinov3_patch_coords(
    rows: int, cols: int, *, normalize: str = "separate", dtype: torch.dtype = torch.float64, device=None
) -> Tensor:
    """The normalised centres of an ``rows x cols`` patch grid in raster order, ``[rows * cols, 2]``
    as ``(row, col)``: ``2 (i + 0.5) / n - 1``, ``n`` per ``normalize`` (see the module docstring)."""
    check_int("rows", rows, minimum=1)
    check_int("cols", cols, minimum=1)
    check_choice("normalize", normalize, NORMALIZATIONS)
    den_r, den_c = _denominators(rows, cols, normalize)
    r = (torch.arange(rows, dtype=torch.float64, device=device) + 0.5) / den_r
    c = (torch.arange(cols, dtype=torch.float64, device=device) + 0.5) / den_c
    grid = torch.stack(torch.meshgrid(r, c, indexing="ij"), dim=-1).reshape(-1, 2)
    return (2.0 * grid - 1.0).to(dtype)


def _check_augment(shift: float | None, jitter: float | None, rescale: float | None) -> None:
    for name, value, low in (("shift", shift, 0.0), ("jitter", jitter, 1.0), ("rescale", rescale, 1.0)):
        if value is not None:
            check_number(name, value, minimum=low)


def dinov3_augment_draw(
    *, shift: float | None = None, jitter: float | None = None, rescale: float | None = None,
    generator: torch.Generator | None = None, device=None,
) -> tuple[Tensor, Tensor]:
    """One draw of DINOv3's coordinate augmentation as ``(offset, factor)`` (float64 ``[2]`` each,
    ``(row, col)``): coordinates become ``(c + offset) * factor``. ``offset ~ U[-shift, shift]`` per
    axis; ``factor`` = ``exp(U[-ln jitter, ln jitter])`` per axis times ``exp(U[-ln rescale, ln
    rescale])`` for both. Drawn in float32 in that order, as DINOv3 draws them; None skips a step
    (and its draw). ``shift >= 0``, ``jitter >= 1``, ``rescale >= 1``."""
    _check_augment(shift, jitter, rescale)
    offset = torch.zeros(2, dtype=torch.float64, device=device)
    factor = torch.ones(2, dtype=torch.float64, device=device)

    def uniform(n: int, span: float) -> Tensor:
        return torch.empty(n, device=device, dtype=torch.float32).uniform_(-span, span, generator=generator).double()

    if shift is not None:
        offset = uniform(2, shift)
    if jitter is not None:
        factor = factor * uniform(2, math.log(jitter)).exp()
    if rescale is not None:
        factor = factor * uniform(1, math.log(rescale)).exp()
    return offset, factor


def dinov3_augment_coords(
    coords: Tensor,
    *,
    shift: float | None = None,
    jitter: float | None = None,
    rescale: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """``coords [..., 2]`` moved by one :func:`dinov3_augment_draw` (float64): the same shift and
    scale for every coordinate, as DINOv3 moves a whole image's grid at once."""
    check_static_positions("coords", coords)
    offset, factor = dinov3_augment_draw(shift=shift, jitter=jitter, rescale=rescale, generator=generator,
                                         device=coords.device)
    return (coords.to(torch.float64) + offset) * factor


@torch.compiler.disable  # the grid sets the normalisation: read off the data, one graph break per call
def _index_grid(patches: Tensor) -> tuple[int, int]:
    """``floor(max) + 1`` per axis of patch indices ``[B or 1, N, 2]`` (which must be >= 0), one host read."""
    if patches.numel() == 0:
        return 1, 1
    low, high = torch.stack((patches.amin(dim=(0, 1)), patches.amax(dim=(0, 1)))).double().tolist()
    if min(low) < 0:
        raise ValueError(f"rope2d_dinov3 with coordinates='grid' needs (row, col) positions >= 0; got a minimum of "
                         f"{tuple(low)}")
    return math.floor(high[0]) + 1, math.floor(high[1]) + 1


def dinov3_rope_angles(coords: Tensor, head_dim: int, base: float = 100.0) -> Tensor:
    """Angles ``[..., N, D/2]`` (float64) of normalised ``coords [..., N, 2]``: the row's ``2 pi c
    theta_j`` for the first ``D/4`` pairs, the column's for the next ``D/4``."""
    check_static_positions("coords", coords)
    if coords.dim() < 2 or coords.shape[-1] != 2:
        raise ValueError(f"coords must be [..., tokens, 2] (row, col); got {tuple(coords.shape)}")
    theta = dinov3_frequencies(head_dim, base).to(coords.device)
    angles = 2 * math.pi * coords.to(torch.float64).unsqueeze(-1) * theta  # [..., N, 2, D/4]
    return angles.flatten(-2)


def apply_dinov3_rope(
    q: Tensor, k: Tensor, coords: Tensor, *, base: float = 100.0, num_prefix_tokens: int = 0,
    pairing: Literal["half_split", "interleaved"] = "half_split",
) -> tuple[Tensor, Tensor]:
    """Rotate ``q, k [B, H, P + N, D]`` by DINOv3's RoPE at normalised ``coords [N, 2]`` or
    ``[B, N, 2]`` (the patches; the first ``num_prefix_tokens`` tokens pass through)."""
    check_choice("pairing", pairing, PAIRINGS)
    check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
    angles = dinov3_rope_angles(coords, q.shape[-1], base)
    angles = angles.unsqueeze(0) if angles.dim() == 2 else angles
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # [B or 1, 1, N, D/2]
    interleaved = pairing == "interleaved"

    def rotate(x: Tensor) -> Tensor:
        if x.shape[2] != num_prefix_tokens + angles.shape[-2]:
            raise ValueError(f"x has {x.shape[2]} tokens; coords give {angles.shape[-2]} patches after "
                             f"{num_prefix_tokens} prefix tokens")
        patches = apply_rotary(x[:, :, num_prefix_tokens:], cos, sin, interleaved=interleaved)
        return torch.cat((x[:, :, :num_prefix_tokens], patches), dim=2)

    return rotate(q), rotate(k)


@register(
    "rope2d_dinov3",
    modality="vision",
    paper="Simeoni et al. 2025, DINOv3, https://arxiv.org/abs/2508.10104",
    summary="2D RoPE over patch centres normalised to [-1, 1], theta_j = 100^(-4j/D); optional shift/jitter/rescale",
)
class Rope2DDinoV3(PositionEncoding):
    """Args:
        head_dim: per-head width ``D`` (a multiple of 4).
        base: frequency base (100, DINOv3's).
        num_prefix_tokens: leading tokens (class, registers) left unrotated.
        normalize: "separate", "min" or "max": what each axis is divided by (see the module docstring).
        coordinates: "grid" (positions are patch indices) or "normalized" (positions are the
            coordinates).
        shift, jitter, rescale: training-time coordinate augmentation (None: off; ``shift >= 0``,
            ``jitter, rescale >= 1``), drawn at every call in ``train()`` mode.
        pairing: "half_split" (DINOv3) or "interleaved".

    Shapes: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T, 2]``.
    """

    hooks = frozenset({Hook.QK})

    def __init__(
        self,
        head_dim: int,
        base: float = 100.0,
        num_prefix_tokens: int = 0,
        normalize: Literal["separate", "min", "max"] = "separate",
        coordinates: Literal["grid", "normalized"] = "grid",
        shift: float | None = None,
        jitter: float | None = None,
        rescale: float | None = None,
        pairing: Literal["half_split", "interleaved"] = "half_split",
    ) -> None:
        super().__init__()
        self.register_buffer("theta", dinov3_frequencies(head_dim, base), persistent=False)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        check_choice("normalize", normalize, NORMALIZATIONS)
        check_choice("coordinates", coordinates, COORDINATES)
        check_choice("pairing", pairing, PAIRINGS)
        _check_augment(shift, jitter, rescale)
        self.head_dim, self.base, self.num_prefix_tokens = head_dim, base, num_prefix_tokens
        self.normalize, self.coordinates, self.pairing = normalize, coordinates, pairing
        self.shift, self.jitter, self.rescale = shift, jitter, rescale
        if coordinates == "grid":
            # each call normalises by the grid of its keys: keys cached under a smaller grid would differ
            self.supports_kv_cache = False

    def extra_repr(self) -> str:
        augment = "".join(f", {n}={getattr(self, n)}" for n in ("shift", "jitter", "rescale")
                          if getattr(self, n) is not None)
        return (f"head_dim={self.head_dim}, base={self.base}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"normalize={self.normalize!r}, coordinates={self.coordinates!r}{augment}, pairing={self.pairing!r}")

    def _normalized(self, patches: Tensor, grid: tuple[int, int]) -> Tensor:
        if self.coordinates == "normalized":
            return patches.to(torch.float64)
        den = torch.tensor(_denominators(*grid, self.normalize), dtype=torch.float64, device=patches.device)
        return 2.0 * (patches.to(torch.float64) + 0.5) / den - 1.0

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this rope2d_dinov3 was built for head_dim={self.head_dim}")
        p = self.num_prefix_tokens
        q_patches = patch_coords(q_pos, q.shape[2], p, "rope2d_dinov3")
        has_keys = k.shape[2] > 0
        kv_patches = patch_coords(kv_pos, k.shape[2], p, "rope2d_dinov3") if has_keys and kv_pos is not q_pos \
            else q_patches
        grid = _index_grid(kv_patches) if self.coordinates == "grid" else (1, 1)
        q_coords = self._normalized(q_patches, grid)
        kv_coords = q_coords if kv_patches is q_patches else self._normalized(kv_patches, grid)
        if self.training and any(v is not None for v in (self.shift, self.jitter, self.rescale)):
            # one draw for the call: queries and keys move together, so the scores see one box
            offset, factor = dinov3_augment_draw(shift=self.shift, jitter=self.jitter, rescale=self.rescale,
                                                 device=q.device)
            q_coords, kv_coords = (q_coords + offset) * factor, (kv_coords + offset) * factor
        theta = self.theta if self.theta.dtype == torch.float64 else dinov3_frequencies(self.head_dim, self.base)
        theta = theta.to(q.device)
        interleaved = self.pairing == "interleaved"

        def rotate(x: Tensor, coords: Tensor) -> Tensor:
            angles = (2 * math.pi * coords.unsqueeze(-1) * theta).flatten(-2).unsqueeze(1)  # [B or 1, 1, N, D/2]
            return _rotate_patches(x, angles.cos(), angles.sin(), p, interleaved)

        q = rotate(q, q_coords)
        if has_keys:
            k = rotate(k, kv_coords)
        return q, k


__all__ = [
    "NORMALIZATIONS", "COORDINATES", "dinov3_frequencies", "dinov3_patch_coords", "dinov3_augment_draw",
    "dinov3_augment_coords",
    "dinov3_rope_angles", "apply_dinov3_rope", "Rope2DDinoV3",
]
