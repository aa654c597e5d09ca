"""Custom autograd Functions under autocast.

posenc's written-out backward passes (the chunked attention backward, the bias tables' gathers,
FIRE's segments, DeBERTa's skewed products, rotary) write products into buffers of the working
dtype they chose (float32 for bfloat16 inputs). Autocast is thread-local state: such a backward
run inside an autocast region, or traced by ``torch.compile`` under one, would get bfloat16
products for those buffers and fail. :func:`autocast_off` runs it with autocast off, as it runs
anyway outside the region (PyTorch's recommended pattern).
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


def autocast_off(backward: F) -> F:
    """Decorator for a custom Function's ``backward(ctx, *grads)``: run it with autocast off on
    the device of its first gradient (CPU when every gradient is None)."""
    if not callable(backward):
        raise TypeError(f"autocast_off decorates a Function's backward; got {type(backward).__name__}")

    @functools.wraps(backward)
    def run(ctx, *grads):
        device = next((g.device.type for g in grads if isinstance(g, torch.Tensor)), "cpu")
        with torch.autocast(device, enabled=False):
            return backward(ctx, *grads)

    return run  # type: ignore[return-value]
