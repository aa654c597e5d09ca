"""Custom autograd Functions under autocast.

posenc's written-out backward passes (the chunked attention backward, the bias tables' gathers,
FIRE's segments, DeBERTa's skewed products, rotary) choose their working dtype themselves and
write products into buffers of that dtype (float32 for bfloat16 inputs, ``out=`` of ``bmm``).
Autocast is thread-local state: a backward run inside an autocast region (``loss.backward()``
within ``torch.autocast``), or traced by ``torch.compile`` under one, would get bfloat16 products
from the matmuls for those float32 buffers and fail ("expected scalar type Float but found
BFloat16"). :func:`autocast_off` runs such a backward with autocast off, as it runs anyway when
the backward is called outside the region (PyTorch's recommended pattern).
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
