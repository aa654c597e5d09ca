"""How many CPU threads posenc's work runs on: one policy for the library and every command, and
why (docs/architecture.md, "CPU threads and the chunk workers"). The rule is
:func:`default_threads`; :func:`set_threads` applies it. This module does not import torch.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

# the variables the OpenMP, MKL and OpenBLAS runtimes read when they load (torch, numpy, scipy):
# set before those load, they size every pool, and child processes inherit them
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under ``taskset``; else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this system
        return max(1, os.cpu_count() or 1)


def _user_setting() -> int | None:
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


def other_running() -> int | None:
    """Threads of other processes running or ready to run now, from ``/proc/loadavg``'s count of
    runnable tasks (which includes the thread asking): the median of three reads 5 ms apart, so
    that a process passing by is not counted. None where the system has no ``/proc/loadavg``."""
    counts = []
    for read in range(3):
        if read:
            time.sleep(0.005)
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(max(0, running - 1))
    return sorted(counts)[1]


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when the user set it to a positive integer, else the usable cores
    less the threads other processes are running now (:func:`other_running`), at least 1; where
    that count cannot be read, one fewer than the cores. A team of ``k`` threads keeps its pace
    while ``k`` cores are free for it: on a quiet machine every core, beside busy processes the
    cores they leave (a team that counts on a taken core waits for it at every operation)."""
    user = _user_setting()
    if user is not None:
        return user
    cores, others = usable_cores(), other_running()
    return max(1, cores - (1 if others is None else others))


def resolve_threads(threads: int | None) -> int | None:
    """The thread count :func:`set_threads` applies: ``None`` -> :func:`default_threads`;
    ``0`` -> None (torch's own default, a thread per core, left alone); ``n >= 1`` -> ``n``, at most
    the usable cores (more only wait for each other; and torch, sized by the variables before it
    loads, would not start more than the cores anyway: one answer either way)."""
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int >= 0 or None; got {threads!r} ({type(threads).__name__})")
    if threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own default, None: posenc's default); got {threads}")
    return min(threads, usable_cores()) or None


def set_threads(threads: int | None = None) -> int | None:
    """Run posenc's CPU work (and torch's, numpy's and scipy's) on ``threads`` threads.

    Args:
        threads: a positive count (at most the usable cores); ``None`` (the default) for
            :func:`default_threads`, the usable cores other processes leave free now, which
            keeps its speed when another process shares the machine; ``0`` to leave torch's own default (a thread per
            core) untouched.

    Returns the count set (None for ``0``). Sets ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and
    ``OPENBLAS_NUM_THREADS`` for the libraries not loaded yet and for child processes, and, when
    torch is already imported, ``torch.set_num_threads``. Call it once, before the work: torch's
    setting is process-wide (posenc's worker pools read it on each call).
    """
    count = resolve_threads(threads)
    if count is None:
        return None
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(count)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(count)
    return count


@contextmanager
def using_threads(threads: int | None = None) -> Iterator[int | None]:
    """:func:`set_threads` for the body only: the thread variables and torch's count (when torch
    was loaded before the block) are put back at the end, so that a command run from Python (the
    tests, a notebook) leaves the process as it found it."""
    saved = {variable: os.environ.get(variable) for variable in THREAD_VARIABLES}
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None and hasattr(torch, "get_num_threads") else None
    try:
        yield set_threads(threads)
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value
        torch = sys.modules.get("torch")
        if before is not None and torch is not None:
            torch.set_num_threads(before)
