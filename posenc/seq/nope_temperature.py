"""NoPE with Llama 4's attention temperature: the NoPE layers of iRoPE (Meta 2025, Llama 4; the
temperature of Nakanishi 2025, Scalable-Softmax, https://arxiv.org/abs/2501.19399).

Llama 4 interleaves RoPE layers with layers that have no position encoding (every fourth,
:mod:`.layer_schedule`); on those, the queries are scaled by a factor that grows with the
query's position, so that attention over very long contexts stays sharp:

    ``tau(p) = ln(floor((p + 1) / floor_scale) + 1) * attn_scale + 1``

(``floor_scale`` 8192, ``attn_scale`` 0.1: 1 up to position 8190, 1.069 from 8191, 1.11 from
16383, ...). Keys are untouched, so the scores are ``tau(i) q_i . k_j``. Positions before 0 get
factor 1. transformers reads the position in the KV cache (``cache_position``); here it is the
query's position ``q_pos``, which is the same unless positions are shifted (left padding with
``position_ids``). Hook: q/k transform (q only); kernel: SDPA.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..common.checks import (
    check_number,
    check_sequence_positions,
    check_static_positions,
)
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register


def attention_temperature(positions: Tensor, floor_scale: float = 8192.0, attn_scale: float = 0.1) -> Tensor:
    """``tau(p)`` of the module docstring for ``positions [...]`` (integer or float), float64."""
    check_static_positions("positions", positions)
    steps = torch.floor((positions.to(torch.float64) + 1.0) / floor_scale).clamp_min(0.0)
    return torch.log1p(steps) * attn_scale + 1.0


@register(
    "nope_temperature",
    modality="seq",
    paper="Meta 2025, Llama 4 (iRoPE); Nakanishi 2025, Scalable-Softmax Is Superior for Attention, "
    "https://arxiv.org/abs/2501.19399",
    summary="no position encoding; queries scaled by ln(floor((p+1)/floor_scale)+1)*attn_scale+1 (Llama 4's NoPE "
            "layers)",
)
class NoPETemperature(PositionEncoding):
    """Args:
        floor_scale: positions per step of the temperature (8192, Llama 4's).
        attn_scale: strength (0.1, Llama 4's; 0 is NoPE).

    Shapes: ``q [B, Hq, Tq, D]`` scaled per query position ``q_pos [B or 1, Tq]``; ``k`` unchanged.
    """

    hooks = frozenset({Hook.QK})

    def __init__(self, floor_scale: float = 8192.0, attn_scale: float = 0.1) -> None:
        super().__init__()
        self.floor_scale = check_number("floor_scale", floor_scale, minimum=0.0, strict=True)
        self.attn_scale = check_number("attn_scale", attn_scale, minimum=0.0)

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        check_sequence_positions(q_pos, kv_pos)
        tau = attention_temperature(q_pos, self.floor_scale, self.attn_scale)[:, None, :, None]  # [B or 1, 1, Tq, 1]
        # in at least float32, as Llama 4 (a bfloat16 factor would be off by up to 0.4%)
        dtype = torch.promote_types(q.dtype, torch.float32)
        return (q.to(dtype) * tau.to(device=q.device, dtype=dtype)).to(q.dtype), k


__all__ = ["attention_temperature", "NoPETemperature"]
