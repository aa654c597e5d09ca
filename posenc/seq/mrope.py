"""Multimodal RoPE, M-RoPE (Wang et al. 2024, Qwen2-VL, https://arxiv.org/abs/2409.12191; Qwen2.5-VL;
Qwen3-VL's interleaved layout): RoPE whose rotary pairs are shared among three position axes,
time ``t``, height ``h`` and width ``w``.

Each pair ``k`` (of the ``r/2``, ``theta_k = base^(-2k/r)`` as RoPE's) is assigned one axis and
turns by that axis's position: ``angle_k = pos[axis_k] * theta_k``. A text token has the same
index on all three axes, so on text alone M-RoPE is RoPE exactly; an image or video token has its
``(t, h, w)`` on the grid (:func:`posenc.seq.mrope_positions.mrope_position_ids` builds the
positions of a mixed sequence). The assignment (``sections = (s_t, s_h, s_w)``):

* ``layout="sections"`` (Qwen2-VL, Qwen2.5-VL): contiguous blocks, the first ``s_t`` pairs to
  time, the next ``s_h`` to height, the last ``s_w`` to width; ``s_t + s_h + s_w = r/2``
  (``(16, 24, 24)`` for a head of 128);
* ``layout="interleaved"`` (Qwen3-VL, timm's ``RotaryEmbeddingMRope``): pairs ``1, 4, 7, ...`` below
  ``3 s_h`` to height, ``2, 5, 8, ...`` below ``3 s_w`` to width, every other pair to time (``s_t``
  is then what is left; ``(24, 20, 20)`` for a head of 128), so every axis gets high and low
  frequencies.

Pairing as RoPE's (half-split ``(k, k + r/2)`` as Hugging Face, or interleaved); ``rotary_dim``,
``base`` and a static context extension (``scaling``, :mod:`.rope_scaling`) as
:class:`~.rope.RotaryEncoding`'s. Positions: ``[B or 1, T, 3]`` ``(t, h, w)``, or ``[B or 1, T]``
for text (every axis the same), integer or float; a KV cache holds them as given, so a decoding
step after a ``[B, T, 3]`` prompt passes ``[B, 1, 3]``
(:func:`~posenc.seq.mrope_positions.mrope_next_positions`). Hook: q/k transform; kernel: SDPA.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from ..common.checks import check_choice, check_static_positions, is_int
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.rotary import Pairing, apply_rotary
from .rope import check_rope_arguments, rope_frequencies
from .rope_scaling import RopeScaling

LAYOUTS = ("sections", "interleaved")
Layout = Literal["sections", "interleaved"]
#: Qwen2-VL's and Qwen2.5-VL's sections for a head of 128 (their ``mrope_section``).
QWEN2_VL_SECTIONS = (16, 24, 24)
#: Qwen3-VL's sections for a head of 128 (interleaved).
QWEN3_VL_SECTIONS = (24, 20, 20)


def default_sections(pairs: int, layout: Layout = "sections") -> tuple[int, int, int]:
    """Qwen's split scaled to ``pairs`` rotary pairs: height and width ``3/8`` of them each in the
    "sections" layout (Qwen2-VL's ``(16, 24, 24)`` at 64 pairs), ``5/16`` each "interleaved"
    (Qwen3-VL's ``(24, 20, 20)``); time the rest."""
    check_choice("layout", layout, LAYOUTS)
    side = 3 * pairs // 8 if layout == "sections" else 5 * pairs // 16
    return pairs - 2 * side, side, side


def mrope_axes(sections: Sequence[int] | None, pairs: int, layout: Layout = "sections") -> Tensor:
    """The axis of each rotary pair, long ``[pairs]`` (0 time, 1 height, 2 width), for ``sections =
    (s_t, s_h, s_w)`` in ``layout`` (see the module docstring; None: :func:`default_sections`)."""
    if sections is None:
        sections = default_sections(pairs, layout)
    if not (isinstance(sections, (tuple, list)) and len(sections) == 3 and all(is_int(s) for s in sections)):
        raise TypeError(f"sections must be three ints (t, h, w); got {sections!r}")
    if any(s < 0 for s in sections):
        raise ValueError(f"sections must be >= 0; got {tuple(sections)}")
    check_choice("layout", layout, LAYOUTS)
    if layout == "sections":
        if sum(sections) != pairs:
            raise ValueError(f"sections {tuple(sections)} must add up to the {pairs} rotary pairs (rotary_dim / 2) "
                             "in the 'sections' layout")
        return torch.repeat_interleave(torch.arange(3), torch.tensor([int(s) for s in sections]))
    axes = torch.zeros(pairs, dtype=torch.long)
    axes[1: 3 * sections[1]: 3] = 1  # stops past the last pair clamp, as Qwen3-VL's slices do
    axes[2: 3 * sections[2]: 3] = 2
    return axes


def _check_positions(name: str, positions: Tensor, length: int) -> None:
    check_static_positions(name, positions)
    if positions.dim() == 2 and positions.shape[1] == length:
        return
    if positions.dim() == 3 and positions.shape[1] == length and positions.shape[2] == 3:
        return
    raise ValueError(f"M-RoPE {name} must be [batch or 1, {length}] (text) or [batch or 1, {length}, 3] (t, h, w); "
                     f"got {tuple(positions.shape)}")


def mrope_angles(positions: Tensor, inv_freq: Tensor, axes: Tensor) -> Tensor:
    """Float64 angles ``[B or 1, T, r/2]``: ``positions [B or 1, T, 3]`` read at each pair's axis
    times its frequency; ``positions [B or 1, T]`` (text) times every frequency (all axes equal)."""
    inv_freq = inv_freq.to(device=positions.device, dtype=torch.float64)
    if positions.dim() == 3:
        return positions.to(torch.float64).index_select(-1, axes.to(positions.device)) * inv_freq
    return positions.to(torch.float64)[..., None] * inv_freq


def mrope_cos_sin(
    positions: Tensor, inv_freq: Tensor, axes: Tensor, *, attention_factor: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of :func:`mrope_angles`, each times ``attention_factor`` (float64)."""
    angles = mrope_angles(positions, inv_freq, axes)
    cos, sin = angles.cos(), angles.sin()
    return (cos, sin) if attention_factor == 1.0 else (cos * attention_factor, sin * attention_factor)


def apply_mrope(
    q: Tensor,
    k: Tensor,
    positions: Tensor,
    *,
    k_positions: Tensor | None = None,
    sections: Sequence[int] | None = None,
    layout: Layout = "sections",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    pairing: Pairing = "half_split",
    scaling: RopeScaling | None = None,
) -> tuple[Tensor, Tensor]:
    """Rotate ``q [B, Hq, Tq, D]`` and ``k [B, Hkv, Tk, D]`` by M-RoPE at ``positions [B or 1, Tq, 3]``
    (or ``[B or 1, Tq]`` for text); ``k_positions`` likewise (default ``positions``). The other
    arguments as :class:`MRoPE`'s. Tables in float64, results in the inputs' dtypes."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be [batch, heads, tokens, head_dim] with one head_dim; got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    r = check_rope_arguments(q.shape[-1], rotary_dim, pairing, scaling, static="M-RoPE")
    axes = mrope_axes(sections, r // 2, layout)
    inv_freq, factor = rope_frequencies(r, base, scaling)
    _check_positions("positions", positions, q.shape[2])
    k_positions = positions if k_positions is None else k_positions
    _check_positions("k_positions", k_positions, k.shape[2])
    out = []
    for x, pos in ((q, positions), (k, k_positions)):
        cos, sin = mrope_cos_sin(pos, inv_freq, axes, attention_factor=factor)
        out.append(apply_rotary(x, cos.unsqueeze(1), sin.unsqueeze(1), interleaved=pairing == "interleaved"))
    return out[0], out[1]


@register(
    "mrope",
    modality="seq",
    paper="Wang et al. 2024, Qwen2-VL, https://arxiv.org/abs/2409.12191 (interleaved: Qwen3-VL)",
    summary="multimodal RoPE: rotary pairs split among (t, h, w) position axes; text is RoPE; "
            "sections or interleaved layout",
)
class MRoPE(PositionEncoding):
    """Args:
        head_dim: per-head width ``D``.
        sections: rotary pairs ``(s_t, s_h, s_w)``; None: :func:`default_sections` (Qwen2-VL's
            ``(16, 24, 24)`` and Qwen3-VL's ``(24, 20, 20)`` at ``r = 128``, scaled to other widths).
        layout: "sections" (Qwen2-VL, Qwen2.5-VL) or "interleaved" (Qwen3-VL).
        base: frequency base (10000; Qwen2-VL's configs use 1,000,000).
        rotary_dim: features rotated, even, ``<= head_dim``; default all.
        pairing: "half_split" (Hugging Face) or "interleaved".
        scaling: a static context extension of the frequencies (:mod:`.rope_scaling`), or None.

    Shapes: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T, 3]`` or ``[B or 1, T]``.
    """

    hooks = frozenset({Hook.QK})

    def __init__(
        self,
        head_dim: int,
        sections: Sequence[int] | None = None,
        layout: Layout = "sections",
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
        scaling: RopeScaling | None = None,
    ) -> None:
        super().__init__()
        rotary_dim = check_rope_arguments(head_dim, rotary_dim, pairing, scaling, static="M-RoPE")
        axes = mrope_axes(sections, rotary_dim // 2, layout)
        inv_freq, self.attention_factor = rope_frequencies(rotary_dim, base, scaling)
        self.head_dim, self.rotary_dim, self.base, self.pairing = head_dim, rotary_dim, base, pairing
        sections = default_sections(rotary_dim // 2, layout) if sections is None else sections
        self.sections, self.layout, self.scaling = tuple(int(s) for s in sections), layout, scaling
        self.register_buffer("axes", axes, persistent=False)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, sections={self.sections}, layout={self.layout!r}, base={self.base}, "
                f"rotary_dim={self.rotary_dim}, pairing={self.pairing!r}")

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this M-RoPE was built for head_dim={self.head_dim}")
        _check_positions("q_pos", q_pos, q.shape[2])
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float64:  # the module was cast: recompute exactly
            inv_freq = rope_frequencies(self.rotary_dim, self.base, self.scaling)[0]
        interleaved = self.pairing == "interleaved"

        def rotate(x: Tensor, pos: Tensor) -> Tensor:
            cos, sin = mrope_cos_sin(pos, inv_freq, self.axes, attention_factor=self.attention_factor)
            return apply_rotary(x, cos.unsqueeze(1), sin.unsqueeze(1), interleaved=interleaved)

        q_out = rotate(q, q_pos)
        if k.shape[2] == 0:
            return q_out, k
        if kv_pos is not q_pos:
            _check_positions("kv_pos", kv_pos, k.shape[2])
        return q_out, rotate(k, kv_pos)


__all__ = [
    "LAYOUTS", "QWEN2_VL_SECTIONS", "QWEN3_VL_SECTIONS", "default_sections", "mrope_axes", "mrope_angles",
    "mrope_cos_sin", "apply_mrope", "MRoPE",
]
