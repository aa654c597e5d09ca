"""Background CPU load for a benchmark run: busy processes that live exactly as long as a block.

::

    with background_load(args.background_load) as load:
        result = measure(...)
        result["background_load"] = load.description   # "off", "1 busy process", ...
        result["load_average"] = load_average()          # (1, 5, 15 min), None where unknown

Each busy process is a plain Python loop (``while True: pass`` in effect) in a child interpreter,
so it takes one core and nothing else. The processes are stopped when the block ends, whether it
ends normally, by an exception or by Ctrl-C: terminated, then killed if one has not exited within
``timeout`` seconds. A parent that dies without running its ``finally`` (killed, ``os._exit``)
cannot stop them, so each child also checks every ~0.1 s that its parent is still the process that
started it (``os.getppid()``) and exits when it is not. Each child runs in a session of its own
(as a program started from another terminal would), so Ctrl-C in the terminal does not reach it
and the parent stops it itself; it ignores SIGINT as well.

This module imports only the standard library (a child never imports posenc or torch).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Iterator

# The child: ignore SIGINT, spin, and every CHECK_EVERY iterations exit if the parent has changed.
CHECK_EVERY = 1_000_000
BUSY_LOOP = f"""\
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent = int(sys.argv[1])
n = 0
while True:
    n += 1
    if n == {CHECK_EVERY}:
        n = 0
        if os.getppid() != parent:
            break
"""


@dataclass
class BackgroundLoad:
    """The busy processes of a :func:`background_load` block (none when it was off)."""

    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.processes)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def description(self) -> str:
        """``"off"``, ``"1 busy process"``, ``"2 busy processes"``."""
        return describe(self.count)


def describe(processes: int) -> str:
    """``"off"`` for 0 busy processes, else ``"N busy process(es)"``."""
    return "off" if processes < 1 else f"{processes} busy process{'es' if processes != 1 else ''}"


def start_busy_process() -> subprocess.Popen:
    """One child interpreter spinning on a core until stopped or orphaned."""
    return subprocess.Popen(
        [sys.executable, "-c", BUSY_LOOP, str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True,
        # Its own session, as a program started from another terminal would be: where the
        # scheduler groups processes by session (Linux autogroups), it then competes with the
        # benchmark as a peer instead of as one of the benchmark's own threads, the harsher case.
        start_new_session=True,
    )


def stop_processes(processes: list[subprocess.Popen], timeout: float = 5.0) -> None:
    """Terminate every process, wait up to ``timeout`` s for each, kill those still running."""
    for p in processes:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.terminate()
    for p in processes:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait()


@contextlib.contextmanager
def background_load(enabled: bool, processes: int = 1, *, timeout: float = 5.0) -> Iterator[BackgroundLoad]:
    """Run ``processes`` busy processes for the duration of the block when ``enabled``.

    Args:
        enabled: False yields an empty :class:`BackgroundLoad` and starts nothing.
        processes: how many busy processes (each takes one core), >= 1.
        timeout: seconds to wait for each after terminating it before it is killed.

    Yields:
        :class:`BackgroundLoad` (its ``description`` goes into a report's header and JSON).
    """
    if enabled and processes < 1:
        raise ValueError(f"processes must be >= 1 when the load is enabled; got {processes}")
    load = BackgroundLoad()
    try:
        if enabled:
            for _ in range(processes):
                load.processes.append(start_busy_process())
        yield load
    finally:
        stop_processes(load.processes, timeout=timeout)


def load_average() -> tuple[float, float, float] | None:
    """The system load average over 1, 5 and 15 minutes (rounded), or None where the OS has none."""
    try:
        return tuple(round(v, 2) for v in os.getloadavg())  # type: ignore[return-value]
    except (AttributeError, OSError):
        return None


def format_load_average(values: tuple[float, float, float] | list[float] | None) -> str:
    """``"1.62 1.36 0.71 (1, 5, 15 min)"``, or ``"unknown"``."""
    if values is None:
        return "unknown"
    return " ".join(f"{v:.2f}" for v in values) + " (1, 5, 15 min)"


__all__ = [
    "BackgroundLoad", "background_load", "describe", "format_load_average", "load_average",
    "start_busy_process", "stop_processes",
]
