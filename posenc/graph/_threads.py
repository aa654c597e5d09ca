"""Coarse-grained CPU parallelism for the graph encodings.

torch runs each CPU operation above a small size on all its intra-op (OpenMP) threads, which meet
at a barrier when the operation ends. The batched encodings are thousands of such operations (per
size bucket: a few dozen; per node block of a large graph: a few dozen), each only a fraction of a
millisecond of work. On a machine where another process holds a core, a thread of every team is
regularly descheduled and the others spin at the barrier until it runs again, so each operation
costs a scheduler time slice instead of its work: on 2 cores with one busy process beside it, the
10k-node RWSE went from 2.4 s to 20 s and the batched molecule encodings fell below PyG's per-graph
loop.

Here the independent items of work (size buckets, graphs, node blocks) are spread over up to
``torch.get_num_threads()`` Python threads instead (the calling thread is one of them), and every
operation runs with one intra-op thread (torch releases the GIL inside its operations). The threads
meet once, at the end; they take the items in turn, so a thread whose core is taken simply does
fewer of them. On a quiet machine the work is spread as before.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")


def workers(device: torch.device) -> int:
    """Threads to spread items over: torch's intra-op thread count on CPU, 1 elsewhere (an
    accelerator runs the operations asynchronously anyway)."""
    return torch.get_num_threads() if device.type == "cpu" else 1


@contextmanager
def single_threaded(device: torch.device) -> Iterator[int]:
    """Run the body with one intra-op thread on CPU (torch's setting is process-wide, restored at
    the end); yields the number of worker threads for :func:`run_items`."""
    count = workers(device)
    if count == 1:
        yield 1
        return
    torch.set_num_threads(1)
    try:
        yield count
    finally:
        torch.set_num_threads(count)


def run_items(items: Sequence[Callable[[], T]], count: int) -> list[T]:
    """Results of the callables, in order, computed by ``count`` threads (the calling thread and
    ``count - 1`` new ones) that take the next unstarted item in turn; call inside
    :func:`single_threaded` (the new threads start with its single intra-op thread). The first
    exception raised by an item is raised here, after all threads have stopped."""
    results: list = [None] * len(items)
    errors: list[BaseException] = []
    lock = threading.Lock()
    position = iter(range(len(items)))

    def work() -> None:
        while True:
            with lock:
                if errors:
                    return
                i = next(position, None)
            if i is None:
                return
            try:
                results[i] = items[i]()
            except BaseException as exc:  # re-raised by the caller
                with lock:
                    errors.append(exc)
                return

    count = max(1, min(count, len(items)))
    threads = [threading.Thread(target=work, name=f"posenc-graph-{j}", daemon=True) for j in range(count - 1)]
    for t in threads:
        t.start()
    try:
        work()
    finally:
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return results


def positions_by_part(key: torch.Tensor, count: int) -> list[torch.Tensor]:
    """Positions ``i`` with ``key[i] == p`` (ascending) for every part ``p`` in ``0 .. count - 1``
    (``key >= 0``), by one stable sort: the edges or nodes of each item of work."""
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=count).tolist() if key.numel() else [0] * count
    return list(torch.split(order, counts))


_blas_lock = threading.Lock()
_blas_users = 0
_blas_limiter = None
_blas_controller = None


@contextmanager
def blas_single_threaded() -> Iterator[None]:
    """Run the body with one BLAS thread in the libraries numpy and scipy load (OpenBLAS; through
    ``threadpoolctl`` when it is installed, else a no-op). ARPACK (``scipy.sparse.linalg.eigsh``)
    makes many small BLAS calls; multi-threaded, their threads spin for nothing on a quiet machine
    and stall on a busy one. Safe to nest and to enter from several threads: the first entry sets
    the limit, the last exit restores the previous setting. The OpenBLAS of numpy and scipy (0.3.31
    here) did not take a limit set from a new thread (one set by the main thread holds in all), so
    enter it in the calling thread around :func:`run_items` as well."""
    global _blas_users, _blas_limiter, _blas_controller
    with _blas_lock:
        if _blas_users == 0:
            try:
                if _blas_controller is None:
                    from threadpoolctl import ThreadpoolController

                    _blas_controller = ThreadpoolController()  # inspects the loaded libraries once
                _blas_limiter = _blas_controller.limit(limits=1, user_api="blas")
            except Exception:  # threadpoolctl missing or failing: run as is
                _blas_limiter = None
        _blas_users += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0 and _blas_limiter is not None:
                _blas_limiter.restore_original_limits()
                _blas_limiter = None
