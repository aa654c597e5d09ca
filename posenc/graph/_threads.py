"""Coarse-grained CPU parallelism for the graph encodings.

torch runs each CPU operation above a small size on all its intra-op (OpenMP) threads, which meet
at a barrier when the operation ends. The batched encodings are thousands of such operations (per
size bucket: a few dozen; per node block of a large graph: a few dozen), each a fraction of a
millisecond of work. When another process holds a core, one thread of every team is regularly
descheduled while the others spin at the barrier, so each operation costs a scheduler time slice
instead of its work (2 cores, one busy process in another session: the 10k-node RWSE 2.2 s ->
33 s, the batched molecule LapPE 0.04 s -> 3 s).

Here the independent items of work (size chunks, large graphs, node blocks) are spread over up to
``torch.get_num_threads()`` threads instead (the calling thread and a small pool of helpers), and
every operation runs on one intra-op thread (torch releases the GIL inside its operations). The
threads meet once, at the end; they take the items in turn, so a thread whose core is taken
simply does fewer of them. How many threads: torch's count, which
:func:`posenc.common.threads.set_threads` sets (the one policy of the library and the commands).

torch's intra-op thread count is process-wide: :func:`single_threaded` sets it to 1 for the
duration of a call and restores it, and holds a lock meanwhile, so concurrent calls from several
threads take turns instead of restoring each other's setting. The helpers are started once and
reused (a thread started per call cost a tenth of a batched molecule RWSE); a forked child starts
its own.
"""

from __future__ import annotations

import os
import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")

_call_lock = threading.RLock()  # one call at a time changes torch's thread count
_pool_lock = threading.Lock()
_pool_jobs: queue.SimpleQueue | None = None
_pool_size = 0


class single_threaded:
    """``with single_threaded(device) as count:`` runs the body with one intra-op thread on CPU and
    gives the number of threads for :func:`run_items` (torch's count before; 1 on an accelerator,
    whose operations run asynchronously anyway). torch's setting is process-wide: it is restored
    at the end, and other threads' calls wait meanwhile. (A class: entered once per small graph,
    it must cost little.)"""

    __slots__ = ("_device", "_count")

    def __init__(self, device: torch.device) -> None:
        self._device, self._count = device, 1

    def __enter__(self) -> int:
        if self._device.type != "cpu":
            return 1
        count = torch.get_num_threads()  # this thread's count: 1 inside a call of its own already
        if count == 1:
            return 1
        _call_lock.acquire()
        torch.set_num_threads(1)
        self._count = count
        return count

    def __exit__(self, *exc) -> None:
        if self._count > 1:
            torch.set_num_threads(self._count)
            self._count = 1
            _call_lock.release()


def _helper_loop(jobs: queue.SimpleQueue) -> None:
    while True:
        jobs.get()()


def _helpers(count: int) -> queue.SimpleQueue:
    """The job queue of a pool of at least ``count`` daemon helper threads (started on demand)."""
    global _pool_jobs, _pool_size
    with _pool_lock:
        if _pool_jobs is None:
            _pool_jobs = queue.SimpleQueue()
        while _pool_size < count:
            threading.Thread(
                target=_helper_loop, args=(_pool_jobs,), name=f"posenc-graph-{_pool_size}", daemon=True
            ).start()
            _pool_size += 1
        return _pool_jobs


def run_items(items: Sequence[Callable[[], T]], count: int) -> list[T]:
    """Results of the callables, in order, computed by ``count`` threads (the calling thread and
    ``count - 1`` pool helpers) that take the next unstarted item in turn. Helpers are used only
    inside :func:`single_threaded` (elsewhere the items run here, one after the other), and run
    with one intra-op thread. The first exception raised by an item is raised here, after all
    threads have stopped."""
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

    inside = torch.get_num_threads() == 1  # single_threaded has set torch's (process-wide) count
    helpers = max(1, min(count, len(items))) - 1 if inside else 0
    if helpers:
        done = threading.Semaphore(0)

        def helper() -> None:
            try:
                if torch.get_num_threads() != 1:  # a helper's own OpenMP setting (the global is 1)
                    torch.set_num_threads(1)
                work()
            finally:
                done.release()

        jobs = _helpers(helpers)
        for _ in range(helpers):
            jobs.put(helper)
    try:
        work()
    finally:
        for _ in range(helpers):
            done.acquire()
    if errors:
        raise errors[0]
    return results


def positions_by_part(key: torch.Tensor, count: int) -> list[torch.Tensor]:
    """Positions ``i`` with ``key[i] == p`` (ascending) for every part ``p`` in ``0 .. count - 1``
    (``key >= 0``), by one stable sort: the edges or nodes of each item of work."""
    if count == 0:
        return []
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=count).tolist() if key.numel() else [0] * count
    return list(torch.split(order, counts))


@dataclass
class BatchParts:
    """The graphs of a batch split into independent parts of work.

    ``parts[p]`` is ``("sparse", graph)`` (a large graph alone) or ``("dense", size, graphs)`` (a
    chunk of graphs of one padded ``size``: a ``[len(graphs), size, size]`` stack); every graph with
    nodes is in one part. ``edges[p]`` and ``nodes[p]`` list the positions of the part's edges and
    nodes (ascending). For the dense parts, ``coords [3, E]`` gives each edge's slot in its stack,
    local source and local target, and ``node_flat [N]`` each node's row in the stack flattened
    to ``[len(graphs) * size, ...]``.
    """

    parts: list[tuple]
    edges: list[torch.Tensor]
    nodes: list[torch.Tensor]
    coords: torch.Tensor
    node_flat: torch.Tensor

    def dense_stack(self, p: int, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dense adjacency ``[len(graphs), size, size]`` of dense part ``p`` (duplicate edges
        summed in edge order; padding nodes isolated) from the edge weights ``[E]``."""
        _, size, graphs = self.parts[p]
        e = self.edges[p]
        at = self.coords[:, e]
        adj = torch.zeros(len(graphs), size, size, dtype=dtype, device=weight.device)
        adj.index_put_((at[0], at[1], at[2]), weight[e].to(dtype), accumulate=True)
        return adj


def batch_parts(
    edge_index: torch.Tensor,
    batch: torch.Tensor,
    local: torch.Tensor,
    sizes: list[int],
    is_sparse: Callable[[int], bool],
    padded: Callable[[int], int],
    chunk_entries: int,
) -> BatchParts:
    """Split a batch (``sizes``: nodes per graph) into :class:`BatchParts`: each graph with
    ``is_sparse(n)`` alone, the others by ``padded(n)`` size in chunks of at most ``chunk_entries``
    matrix entries (at least one graph)."""
    parts: list[tuple] = []
    part_of = [0] * len(sizes)
    slot_of = [0] * len(sizes)
    size_of = [0] * len(sizes)
    buckets: dict[int, list[int]] = {}
    for g, n in enumerate(sizes):
        if n == 0:
            continue
        if is_sparse(n):
            part_of[g] = len(parts)
            parts.append(("sparse", g))
        else:
            buckets.setdefault(padded(n), []).append(g)
    for size, graphs in sorted(buckets.items()):
        per_chunk = max(1, chunk_entries // (size * size))
        for c in range(0, len(graphs), per_chunk):
            chunk = graphs[c : c + per_chunk]
            for slot, g in enumerate(chunk):
                part_of[g], slot_of[g], size_of[g] = len(parts), slot, size
            parts.append(("dense", size, chunk))
    device = batch.device
    graph_part = torch.tensor(part_of, dtype=torch.long, device=device)
    graph_slot = torch.tensor(slot_of, dtype=torch.long, device=device)
    graph_size = torch.tensor(size_of, dtype=torch.long, device=device)
    edge_graph = batch[edge_index[0]]
    coords = torch.stack([graph_slot[edge_graph], local[edge_index[0]], local[edge_index[1]]])
    return BatchParts(
        parts,
        positions_by_part(graph_part[edge_graph], len(parts)),
        positions_by_part(graph_part[batch], len(parts)),
        coords,
        graph_slot[batch] * graph_size[batch] + local,
    )


_blas_lock = threading.Lock()
_blas_users = 0
_blas_limiter = None
_blas_controller = None


@contextmanager
def blas_single_threaded() -> Iterator[None]:
    """Run the body with one BLAS thread in the libraries numpy and scipy load (OpenBLAS; through
    ``threadpoolctl`` when it is installed, else a no-op). ARPACK (``scipy.sparse.linalg.eigsh``)
    makes many small BLAS calls; multi-threaded, their threads spin for nothing on a quiet machine
    and stall on a busy one.

    Only the main thread sets the limit (the OpenBLAS 0.3.31 of numpy and scipy ignored a setting,
    and its restoring, from any other thread, while the main thread's holds for all threads), so
    enter this in the calling thread around :func:`run_items`; elsewhere it does nothing. Nested
    entries keep the limit until the outermost one exits, which restores the previous setting."""
    global _blas_users, _blas_limiter, _blas_controller
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _blas_lock:
        if _blas_users == 0:
            try:
                if _blas_controller is None:
                    import scipy.sparse.linalg  # noqa: F401  (scipy's own BLAS loaded first: the controller
                    from threadpoolctl import ThreadpoolController  # sees only the libraries loaded now)

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


def _reset_after_fork() -> None:  # the child has none of the parent's threads; no lock is held
    global _call_lock, _pool_lock, _pool_jobs, _pool_size, _blas_lock, _blas_users, _blas_limiter
    _call_lock, _pool_lock, _pool_jobs, _pool_size = threading.RLock(), threading.Lock(), None, 0
    _blas_lock, _blas_users, _blas_limiter = threading.Lock(), 0, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
