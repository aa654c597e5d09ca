"""The ``--device`` of the timing benches (``attention``, ``generate``, ``models``): one check of the
name, one of its availability, one argparse type, so that the three say the same thing."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BENCH_DEVICES = "cpu, cuda or cuda:N"


def bench_device(text: object) -> str:
    """``text`` if it names the CPU or a CUDA device (``cpu``, ``cuda``, ``cuda:N``); ValueError naming
    the value otherwise. Read as text, without importing torch (argument errors stay light)."""
    if not isinstance(text, str) or not re.fullmatch(r"cpu|cuda(:[0-9]+)?", text):
        raise ValueError(f"device must be {BENCH_DEVICES}; got {text!r}")
    return text


def require_available(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``; ValueError when it is CUDA and torch sees none (before any
    model is built, not as a driver traceback from the first tensor put there)."""
    import torch

    device = torch.device(bench_device(str(device)))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was requested but torch.cuda.is_available() is False")
    return device


def device_arg(text: str) -> str:
    """argparse type of ``--device``: the name checked, availability left to the run."""
    try:
        return bench_device(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {BENCH_DEVICES}, got {text!r}") from None


__all__ = ["BENCH_DEVICES", "bench_device", "device_arg", "require_available"]
