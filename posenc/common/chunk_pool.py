"""Chunks of work on a few worker threads, each running torch with one intra-op thread, so that a
busy core elsewhere does not stall every small operation of a chunk (docs/architecture.md, "CPU
threads and the chunk workers"). The number of workers is torch's thread count, which
:func:`posenc.common.threads.set_threads` sets.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
from typing import Callable, Iterable, Iterator, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

_local = threading.local()


class _Pool:
    """``size`` daemon threads, each with torch's intra-op threads set to one (per thread)."""

    def __init__(self, size: int) -> None:
        self.size, self.pid = size, os.getpid()
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        ready = threading.Barrier(size + 1)
        caller_threads = torch.get_num_threads()
        for i in range(size):
            threading.Thread(target=self._work, args=(ready,), name=f"posenc-chunks-{i}", daemon=True).start()
        ready.wait()
        # set_num_threads(1) in a worker also changes the default that new threads start with;
        # put that back for everyone else (each worker keeps its own setting).
        torch.set_num_threads(caller_threads)

    def _work(self, ready: threading.Barrier) -> None:
        # torch sets a thread's count from the process default at its first use in that thread:
        # use it first, then set one, or that first use would undo it.
        torch.get_num_threads()
        torch.set_num_threads(1)
        _local.in_worker = True
        ready.wait()
        while True:
            fn, item, (grad_enabled, inference), done = self.tasks.get()
            try:
                # the caller's grad mode and inference mode (both thread-local): a chunk writes
                # into the caller's tensors, which under inference_mode are inference tensors
                with torch.inference_mode(inference), torch.set_grad_enabled(grad_enabled):
                    done.put((True, fn(item)))
            except BaseException as exc:  # handed to the caller, raised there
                done.put((False, exc))


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool(size: int) -> _Pool:
    global _pool
    with _pool_lock:
        # A forked child inherits the object but not its threads: start new ones there.
        if _pool is None or _pool.size != size or _pool.pid != os.getpid():
            _pool = _Pool(size)
        return _pool


def workers() -> int:
    """How many workers :func:`ordered_map` would use now (1: inline)."""
    if getattr(_local, "in_worker", False) or getattr(_local, "inline", 0) or torch.compiler.is_compiling():
        return 1
    return torch.get_num_threads()


@contextlib.contextmanager
def inline() -> Iterator[None]:
    """Run every chunk on the calling thread inside the block (for tools that only see that
    thread, such as the profiler-based CPU memory tracker of ``posenc bench``)."""
    _local.inline = getattr(_local, "inline", 0) + 1
    try:
        yield
    finally:
        _local.inline -= 1


def ordered_map(fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """``fn(item)`` for each item, on the workers, yielded in the order of ``items``; at most two
    items per worker are in flight, so results do not pile up. An exception in ``fn`` is raised
    here, when its item's turn comes.

    Until the last result is taken, the calling thread runs torch on one thread: what it does with
    the results (adding gradients up) runs beside the workers, and its own parallel regions would
    wait at their barriers for threads whose cores the workers hold."""
    items = list(items)
    size = workers()
    if size <= 1 or len(items) <= 1:
        for item in items:
            yield fn(item)
        return
    pool = _get_pool(size)
    modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
    pending: collections.deque = collections.deque()
    todo = iter(items)

    def submit() -> bool:
        item = next(todo, _END)
        if item is _END:
            return False
        done: queue.SimpleQueue = queue.SimpleQueue()
        pool.tasks.put((fn, item, modes, done))
        pending.append(done)
        return True

    for _ in range(2 * size):
        if not submit():
            break
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        while pending:
            ok, value = pending.popleft().get()
            submit()
            if not ok:
                raise value
            yield value
    finally:
        torch.set_num_threads(caller_threads)


_END = object()
