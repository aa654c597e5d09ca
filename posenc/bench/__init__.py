"""Benchmarks, run from the command line as ``posenc bench NAME``.

:data:`BENCHMARKS` is the table the command line reads: benchmark name -> (module, one-line
help). Each module defines ``add_arguments(parser)`` and ``run(args) -> int`` (the exit status)
and is imported only when its subcommand runs. A new benchmark is a module here plus a line in
the table.

Shared pieces: :mod:`.timing` (interleaved timing, progress), :mod:`.memory` (peak memory of one
step, including a CPU tracker), :mod:`.report` (text tables).
"""

from __future__ import annotations

BENCHMARKS: dict[str, tuple[str, str]] = {
    "attention": (
        "posenc.bench.attention",
        "forward+backward causal self-attention per encoding, against bare SDPA (time, ratio, peak memory)",
    ),
}

__all__ = ["BENCHMARKS"]
