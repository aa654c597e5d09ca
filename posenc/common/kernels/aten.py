"""SDPA's private CPU flash kernels, which the dense path calls with a float bias block.

Every call to them goes through the two functions here; ``tests/test_kernels_aten.py`` compares
the schemas below with the installed torch, so a change of signature fails loudly there instead
of silently here.
"""

from __future__ import annotations

import torch
from torch import Tensor

CPU_FLASH_FORWARD_SCHEMA = (
    "aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, "
    "float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) "
    "-> (Tensor output, Tensor logsumexp)"
)


CPU_FLASH_BACKWARD_SCHEMA = (
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, "
    "Tensor key, Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, "
    "Tensor? attn_mask=None, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)"
)


def cpu_flash_forward(q: Tensor, k: Tensor, v: Tensor, block: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """SDPA's CPU flash kernel with an additive float ``block`` ``[B or 1, H or 1, Tq, Tk]``.

    ``q [B, H, Tq, D]``, ``k, v [B, H, Tk, D]`` -> ``out [B, H, Tq, D]``, ``lse [B, H, Tq]``
    (float32 for float32 and half inputs, float64 for float64)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=block, scale=scale)


def cpu_flash_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, block: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of :func:`cpu_flash_forward` for a constant ``block``: ``(dq, dk, dv)``."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out.contiguous(), q, k, v, out, lse.contiguous(), 0.0, False, attn_mask=block, scale=scale
    )
