"""Warnings for benches run at settings too small for the figures they print.

A bench prints numbers whatever the settings; at tiny sizes some of them are noise (a ratio of two
timings of a fraction of a millisecond, "time falling" as the length doubles) or meaningless (the
share of accuracy kept by a model at chance). These functions say so in one line each; a bench
prints them (:func:`print_warnings`) and stores them in its JSON under ``"warnings"``.
"""

from __future__ import annotations

import sys
from typing import Sequence, TextIO

# A timing below this is mostly per-call overhead and timer noise on a CPU: ratios of such timings
# move by tens of percent between runs.
MIN_TIMING_MS = 5.0
# An accuracy within this many points (fraction) of chance is treated as chance: a share "kept"
# above chance divides by nearly zero there.
CHANCE_MARGIN = 0.10


def short_timing(what: str, ms: float | None, *, advice: str, floor: float = MIN_TIMING_MS) -> str | None:
    """A warning when ``ms`` (the reference timing of ``what``) is below ``floor``, else None."""
    if ms is None or ms >= floor:
        return None
    return f"{what} takes {ms:.2f} ms, below {floor:g} ms: its ratios are mostly overhead and timer noise ({advice})"


def few_rounds(repeats: int | None, warmup: int | None, *, advice: str, minimum: int = 3) -> str | None:
    """A warning when a median comes from fewer than ``minimum`` timed rounds or without a warm-up
    round: the first call pays for allocation and dispatch caches, so one cold round is no timing."""
    if repeats is None or warmup is None or (repeats >= minimum and warmup >= 1):
        return None
    return (f"median of {repeats} timed round{'s' if repeats != 1 else ''} after {warmup} warm-up: "
            f"first-call overhead and noise, not the cost of the step ({advice})")


def falling_growth(name: str, lengths: Sequence[int], growth: Sequence[float | None], *, advice: str) -> str | None:
    """A warning when ``growth`` (time at each length / time at the first) falls below 1: the time
    cannot shrink as the work grows, so the figures are below the noise."""
    falls = [t for t, g in zip(lengths[1:], growth[1:]) if g is not None and g < 1.0]
    if not falls:
        return None
    return (f"{name}: time falls as T grows (T={','.join(map(str, falls))} faster than T={lengths[0]}): "
            f"growth ratios below the noise ({advice})")


def at_chance(what: str, accuracy: float | None, chance: float, *, advice: str,
              margin: float = CHANCE_MARGIN) -> str | None:
    """A warning when ``accuracy`` is within ``margin`` of ``chance`` (no share kept is computed)."""
    if accuracy is None or accuracy >= chance + margin:
        return None
    return (f"{what}: accuracy {100 * accuracy:.1f}% is within {100 * margin:.0f} points of chance "
            f"({100 * chance:.1f}%): no share kept nor direction verdict ({advice})")


def print_warnings(warnings: Sequence[str], stream: TextIO | None = None) -> None:
    """Each warning on one line, ``warning: ...``, on ``stream`` (default stderr)."""
    for text in warnings:
        print(f"warning: {text}", file=stream or sys.stderr, flush=True)
