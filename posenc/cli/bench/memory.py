"""Peak memory of one step: CUDA's allocator statistics, or a CPU tracker built on the profiler.

PyTorch keeps no peak counter for CPU tensors. :class:`CPUPeakMemory` builds one from the
profiler: with ``profile_memory=True`` the CPU allocator reports every allocation and free made
while the profiler runs, with its address and size. Replayed in time order, the allocations made
inside the block minus the frees of those same blocks give the bytes the block has allocated and
still holds at each moment; the peak is the maximum of that running total. Frees of memory
allocated before the block are left out (the block did not allocate it), so the figure is what
the block adds on top of the memory it started with -- the same quantity as
``max_memory_allocated() - memory_allocated()`` on CUDA after a peak reset.

Every allocation made through PyTorch's CPU allocator counts, including the scratch buffers of
kernels (SDPA's flash kernel, matmuls' temporary copies); memory that a library obtains with its
own ``malloc`` (BLAS workspaces) does not.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    import torch


MB = 1024 * 1024


# Lines that the profiler and the CPU allocator write straight to file descriptor 2 while a
# CPUPeakMemory block runs: start/stop notices, a missing-GPU notice, and the allocator's
# one-time warning that blocks allocated before profiling started have no free events (expected
# here: such frees are exactly the ones the tracker leaves out).
_NOISE = (
    "SyncActivityProfilerHandler",
    "gpuGetDeviceCount",
    "Memory block of unknown size was allocated before the profiling started",
)


@contextlib.contextmanager
def _filtered_stderr(noise: tuple[str, ...] = _NOISE) -> Iterator[None]:
    """Capture file descriptor 2 and write it back without the lines containing ``noise``."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not any(n in line for n in noise)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _allocation_events(prof: torch.profiler.profile) -> list[tuple[int, int, int]]:
    """``(time_ns, address, bytes)`` of every CPU allocation (bytes > 0) and free (bytes < 0), in time order.

    Uses the profiler's event tree, which carries addresses; when that private API is missing the
    plain ``[memory]`` events are used (no addresses: every free then counts, address -1).
    """
    results = prof.profiler.kineto_results
    events: list[tuple[int, int, int]] = []
    try:
        from torch._C._profiler import _EventType

        stack = list(results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.tag == _EventType.Allocation:
                f = node.extra_fields
                if f.device.type == "cpu":
                    events.append((node.start_time_ns, int(f.ptr), int(f.alloc_size)))
    except (ImportError, AttributeError):
        events = [
            (e.start_ns(), -1, int(e.nbytes()))
            for e in results.events()
            if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
        ]
    events.sort(key=lambda e: e[0])
    return events


def peak_of_events(events: list[tuple[int, int, int]]) -> tuple[int, int]:
    """``(peak, allocated)`` bytes from time-ordered ``(time, address, bytes)`` events.

    ``peak`` is the maximum over time of the bytes allocated by these events and not yet freed;
    ``allocated`` is the total allocated. A free of an address with no allocation among the events
    (allocated before the window) is ignored; address -1 means unknown, and such frees count.
    """
    live: dict[int, int] = {}
    current = peak = allocated = 0
    for _, addr, nbytes in events:
        if nbytes > 0:
            allocated += nbytes
            current += nbytes
            if addr != -1:
                live[addr] = live.get(addr, 0) + nbytes
            peak = max(peak, current)
        elif nbytes < 0:
            if addr == -1:
                current += nbytes
            elif addr in live:
                current -= live.pop(addr)
    return peak, allocated


class CPUPeakMemory:
    """Context manager: peak bytes allocated (and not yet freed) by PyTorch's CPU allocator inside it.

    Example::

        with CPUPeakMemory() as mem:
            loss = model(x).sum(); loss.backward()
        print(mem.peak_bytes / 2**20, "MB")

    Attributes (set on exit):
        peak_bytes: the maximum, over time, of the bytes allocated inside the block and still live.
        allocated_bytes: the total allocated inside the block (every allocation, freed or not).
    """

    def __init__(self) -> None:
        self.peak_bytes: int | None = None
        self.allocated_bytes: int | None = None
        self._prof: torch.profiler.profile | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "CPUPeakMemory":
        import torch

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(_filtered_stderr())
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        self._stack.enter_context(self._prof)
        return self

    def __exit__(self, *exc) -> None:
        prof, self._prof = self._prof, None
        self._stack.__exit__(*exc)
        if exc[0] is None:
            self.peak_bytes, self.allocated_bytes = peak_of_events(_allocation_events(prof))

    @property
    def peak_mb(self) -> float:
        if self.peak_bytes is None:
            raise RuntimeError("CPUPeakMemory.peak_mb is set when the with-block ends")
        return self.peak_bytes / MB


def peak_memory_bytes(step: Callable[[], object], device: torch.device | str) -> int:
    """Run ``step()`` once and return the peak bytes it allocated above what was allocated before it.

    On CUDA: ``max_memory_allocated`` after a peak reset, minus ``memory_allocated`` before.
    On CPU: :class:`CPUPeakMemory`, with the chunks of the chunked kernel paths run on the calling
    thread (:func:`posenc.common.chunk_pool.inline`): the profiler sees no other thread. With the
    worker pool, up to one chunk's working set per worker is alive at once instead of one in all.
    Other devices are a ValueError.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    if device.type == "cpu":
        # The profiler only sees the calling thread: run the chunked paths' chunks there too.
        from ...common import chunk_pool

        with chunk_pool.inline(), CPUPeakMemory() as mem:
            step()
        assert mem.peak_bytes is not None
        return mem.peak_bytes
    raise ValueError(f"peak memory is measured on 'cpu' or 'cuda' devices; got device {str(device)!r}")


def held_bytes(obj: object, *, max_depth: int = 8) -> int:
    """Bytes of the tensor storages that ``obj`` holds: what a KV cache keeps between decoding
    steps, spare capacity included. Reached through lists, tuples, dicts, sets and plain objects'
    attributes (``__dict__`` and ``__slots__``) down to ``max_depth`` levels, never through a
    module (a cache that points back to its model does not hold the weights). A storage shared by
    several views counts once, with its whole size."""
    import torch

    seen: set[int] = set()
    storages: dict[tuple[str, int], int] = {}
    stack: list[tuple[object, int]] = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if id(item) in seen or item is None or isinstance(item, (str, bytes, int, float, torch.nn.Module)):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[(str(item.device), storage.data_ptr())] = storage.nbytes()
            continue
        if depth >= max_depth:
            continue
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(item)
        else:
            children = list(getattr(item, "__dict__", {}).values())
            for cls in type(item).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if isinstance(name, str) and hasattr(item, name):
                        children.append(getattr(item, name))
        stack.extend((child, depth + 1) for child in children)
    return sum(storages.values())
