"""Tensors and models too large for the machine, refused before anything is allocated or built:
a ``ValueError`` with the estimate instead of an allocator error, or the machine swapping, half-way
through. Hostile sizes (``k=10**9`` eigenvectors, a million blocks) reach the encodings and models
of every modality; this is the one place that sizes them against the device's memory.

::

    check_allocation("laplacian_pe(k=1000000000): the encodings", (n, k), torch.float32, device)
    check_build("CausalLM(depth=1000000, dim=16)", parameters=p, blocks=1000000)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["check_allocation", "check_build", "format_bytes"]


def format_bytes(size: float) -> str:
    """``3.2 GB``-style size (powers of 1000, as a person reads them)."""
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB", "EB"):
        if abs(size) < 1000 or unit == "EB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} EB"  # pragma: no cover - the loop returns


def _device_memory(device: Any) -> int | None:
    """Total memory of ``device`` in bytes (physical RAM for the CPU), or None when unknown."""
    import torch

    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu":
        try:
            return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):  # not a POSIX system
            return None
    return None


def check_allocation(what: str, shape: Sequence[int], dtype: torch.dtype, device: Any = None) -> None:
    """Refuse, before anything is allocated, a tensor of ``shape`` and ``dtype`` that could not fit
    in the memory of ``device`` (RAM for the CPU): a ``ValueError`` with the estimate, instead of an
    allocator error (or the machine swapping) half-way through. ``what`` names the tensor and the
    argument that sized it, e.g. ``"laplacian_pe(k=1000000000): the encodings [N, k]"``."""
    import torch

    if torch.compiler.is_compiling():  # sizes a trace sees are the caller's; nothing to read here
        return
    numel = 1
    for n in shape:
        numel *= max(int(n), 0)  # Python ints: no overflow, whatever the sizes
    size = numel * torch.empty((), dtype=dtype).element_size()
    total = _device_memory(device)
    if total is not None and size > total:
        where = "this machine's RAM" if torch.device("cpu" if device is None else device).type == "cpu" else str(device)
        raise ValueError(
            f"{what} would need {format_bytes(size)} (shape {tuple(int(n) for n in shape)}, {dtype}), "
            f"more than the {format_bytes(total)} of {where}"
        )


# Building a model costs about this much Python time per block (the modules, their parameters'
# initialisation), measured on a CPU; a build estimated above BUILD_SECONDS_LIMIT is refused.
SECONDS_PER_BLOCK = 2.5e-3
SECONDS_PER_PARAMETER = 1e-8
BUILD_SECONDS_LIMIT = 600.0


def check_build(what: str, *, parameters: int, blocks: int, device: Any = None) -> None:
    """Refuse, before anything is built, a model whose ``parameters`` (float32) could not fit in
    the memory of ``device``, or whose ``blocks`` and parameters would take more than
    :data:`BUILD_SECONDS_LIMIT` to build: a ``ValueError`` with the estimate. ``what`` names the
    model and the arguments that sized it, e.g. ``"CausalLM(depth=1000000, dim=16)"``."""
    import torch

    check_allocation(f"{what}: the parameters", (parameters,), torch.float32, device)
    seconds = blocks * SECONDS_PER_BLOCK + parameters * SECONDS_PER_PARAMETER
    if seconds > BUILD_SECONDS_LIMIT:
        raise ValueError(
            f"{what} would take about {seconds / 60:.0f} minutes to build ({blocks} blocks, {parameters:.2e} "
            f"parameters; the limit is {BUILD_SECONDS_LIMIT / 60:.0f} minutes); lower the sizes"
        )
