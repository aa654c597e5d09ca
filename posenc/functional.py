"""Position encodings as pure functions, for attention you write yourself.

Every function here is the one definition the posenc modules use (:class:`posenc.seq.RotaryEncoding`
calls :func:`apply_rope`'s pieces, :class:`posenc.seq.ALiBi` :func:`alibi_penalty`, ...): pure,
typed, shapes in the docstrings, no state, and no Python branch on tensor values, so they trace
whole under ``torch.compile(fullgraph=True)``. Positions are explicit arguments.

Attention layout: ``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]`` (transpose ``[B, T, H, D]``
first).

RoPE (Su et al. 2021) in your own attention::

    import torch.nn.functional as F
    import posenc.functional as PF

    q, k = PF.apply_rope(q, k, torch.arange(T))           # half-split pairs (GPT-NeoX, HF Llama)
    q, k = PF.apply_rope(q, k, pos, pairing="interleaved", rotary_dim=32)  # GPT-J style, partial
    q, k = PF.apply_rope(q, k, pos, scaling=PF.rope_scaling_config("yarn", factor=4.0, original_max_len=2048))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

ALiBi (Press et al. 2022)::

    bias = PF.alibi_bias(T, T, PF.alibi_slopes(H), causal=True)   # [H, T, T], -inf after the query
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

FoX (Lin et al. 2025), the forget-gate bias, from the keys of your own attention::

    log_f = PF.fox_log_gates(k, gate_weight, gate_bias)              # [B, Hq, T]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=PF.fox_bias(log_f))

M-RoPE (Qwen2-VL) over a mixed sequence, and DINOv3's RoPE over patch centres::

    ids, deltas = PF.mrope_position_ids(types, image_grids=[[1, 4, 6]], spatial_merge_size=2)
    q, k = PF.apply_mrope(q, k, ids.permute(1, 2, 0), sections=(16, 24, 24))   # [B, L, 3] positions
    q, k = PF.apply_dinov3_rope(q, k, PF.dinov3_patch_coords(14, 14), num_prefix_tokens=5)

What is here:

* rotary: :func:`apply_rope`, :func:`rope_cos_sin` (the cos/sin cache), :func:`rope_frequencies`,
  :func:`apply_rotary` (apply a cache you hold), :func:`rope_scaling_config` (context-extension configs:
  linear/PI, NTK, dynamic NTK, YaRN, Llama 3, LongRoPE, proportional; :data:`ROPE_SCALINGS`);
* multimodal and today's rotary variants: :func:`apply_mrope`, :func:`mrope_cos_sin`,
  :func:`mrope_position_ids` (M-RoPE's ``(3, B, L)`` ids and ``rope_deltas`` from token types and
  grids; it reads the token types, so it runs before a compiled graph, not in it),
  :func:`mrope_next_positions`; :func:`dinov3_patch_coords`, :func:`dinov3_augment_coords`,
  :func:`dinov3_rope_angles`, :func:`apply_dinov3_rope` (DINOv3); proportional RoPE (Gemma 4) is
  ``rope_scaling_config("proportional", partial_rotary_factor=...)``; :func:`attention_temperature`
  (Llama 4's NoPE layers);
* ALiBi: :func:`alibi_slopes`, :func:`alibi_bias`, :func:`alibi_penalty`;
* FoX: :func:`fox_log_gates` (``log f`` per token and head from the keys), :func:`fox_bias` (the
  dense causal bias ``F_i - F_j``, ``-inf`` after the query);
* T5: :func:`t5_relative_buckets`, :func:`t5_bias`;
* relative indices: :func:`relative_positions`, :func:`relative_position_grid`,
  :func:`clipped_relative_index`;
* absolute tables: :func:`sinusoid_table` (Vaswani 1D), :func:`sincos2d_table` and
  :func:`sincos2d_grid` (2D, timm or MAE layout).

Importing this module imports the sequence and vision packages it draws from; ``import posenc``
alone does not.
"""

from __future__ import annotations

from .primitives.rotary import PAIRINGS, apply_rotary, rotary_angles, rotary_cos_sin
from .primitives.sinusoid import sinusoid_frequencies, sinusoid_table
from .seq.alibi import alibi_bias, alibi_penalty, alibi_slopes
from .seq.fox import fox_bias, fox_log_gates
from .seq.mrope import apply_mrope, mrope_cos_sin
from .seq.mrope_positions import mrope_next_positions, mrope_position_ids
from .seq.nope_temperature import attention_temperature
from .seq.relative import (
    clipped_relative_index,
    relative_position_grid,
    relative_positions,
)
from .seq.rope import apply_rope, rope_cos_sin, rope_frequencies
from .seq.rope_scaling import (
    ROPE_SCALINGS,
    RopeScaling,
    rope_scaling_config,
    rope_scaling_from_dict,
)
from .seq.t5 import t5_bias, t5_relative_buckets
from .vision.rope_dinov3 import apply_dinov3_rope, dinov3_augment_coords, dinov3_patch_coords, dinov3_rope_angles
from .vision.sincos2d import sincos2d_grid, sincos2d_table

__all__ = [
    "PAIRINGS", "apply_rope", "rope_cos_sin", "rope_frequencies", "apply_rotary", "rotary_angles", "rotary_cos_sin",
    "ROPE_SCALINGS", "RopeScaling", "rope_scaling_config", "rope_scaling_from_dict",
    "alibi_slopes", "alibi_bias", "alibi_penalty", "fox_log_gates", "fox_bias",
    "t5_relative_buckets", "t5_bias",
    "relative_positions", "relative_position_grid", "clipped_relative_index",
    "sinusoid_frequencies", "sinusoid_table", "sincos2d_table", "sincos2d_grid",
    "apply_mrope", "mrope_cos_sin", "mrope_position_ids", "mrope_next_positions", "attention_temperature",
    "dinov3_patch_coords", "dinov3_augment_coords", "dinov3_rope_angles", "apply_dinov3_rope",
]
