"""Interleaved timing of several steps, and progress reporting on stderr.

:func:`time_interleaved` runs every step once per round (round robin, the order rotated from round
to round), so that slow drift on a shared machine -- other processes, thermal limits -- falls on
all rows alike. A step that raises is dropped from the remaining rounds and its error is kept.
:func:`paired_ratio` compares two rows timed so round by round: a slow phase of the machine that
falls on one round cancels in that round's ratio, where a ratio of two medians can take one row's
median from a fast phase and the other's from a slow one.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ...training.report import Progress

if TYPE_CHECKING:
    import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on ``device`` (a no-op on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def error_text(exc: BaseException) -> str:
    """``"TypeName: message"`` on one line."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@dataclass
class TimingResult:
    """Per-step wall and process CPU times in milliseconds (timed rounds only), the last output
    (when asked for), or the error that stopped the step."""

    times_ms: list[float] = field(default_factory=list)
    error: str | None = None
    cpu_ms: list[float] = field(default_factory=list)
    output: object = None

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms and self.error is None else None

    @property
    def median_cpu_ms(self) -> float | None:
        return statistics.median(self.cpu_ms) if self.cpu_ms and self.error is None else None


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float | None:
    """The median over rounds of ``numerator[r] / denominator[r]``, for two rows timed in the
    same rounds (round robin: round ``r`` of one is seconds from round ``r`` of the other). Rows
    with different numbers of timed rounds (one stopped part-way) are not paired: the ratio of
    their medians. None when either has no times or a zero median."""
    if not numerator or not denominator:
        return None
    if len(numerator) == len(denominator) and all(d > 0 for d in denominator):
        return statistics.median(n / d for n, d in zip(numerator, denominator))
    bottom = statistics.median(denominator)
    return statistics.median(numerator) / bottom if bottom > 0 else None


def time_interleaved(
    steps: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int,
    device: torch.device,
    before_step: Mapping[str, Callable[[], object]] | None = None,
    progress: bool | Progress = True,
    keep_output: bool = False,
) -> dict[str, TimingResult]:
    """Time each of ``steps`` ``repeats`` times after ``warmup`` untimed rounds, round robin.

    Args:
        steps: name -> a callable doing one full step (e.g. forward and backward).
        repeats: timed rounds (>= 1); warmup: untimed rounds first (>= 0).
        device: synchronized before and after each timed step.
        before_step: name -> an untimed callable run before each step (e.g. clearing gradients).
        progress: report progress on stderr (or on this :class:`~posenc.training.report.Progress`, left open).
        keep_output: keep each step's last return value (to check results against each other).

    Returns:
        name -> :class:`TimingResult`; a step that raised has ``error`` set and no median.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0; got repeats={repeats}, warmup={warmup}")
    names = list(steps)
    results = {name: TimingResult() for name in names}
    before_step = before_step or {}
    rounds = warmup + repeats
    own_bar = not isinstance(progress, Progress)
    bar = Progress(rounds * len(names), "timing", enabled=bool(progress)) if own_bar else progress
    try:
        for r in range(rounds):
            timed = r >= warmup
            shift = r % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                result = results[name]
                if result.error is not None:
                    bar.update(note=name)
                    continue
                try:
                    if name in before_step:
                        before_step[name]()
                    synchronize(device)
                    cpu, start = time.process_time(), time.perf_counter()
                    out = steps[name]()
                    synchronize(device)
                    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
                except Exception as exc:  # a failing row is reported, not fatal
                    result.error = error_text(exc)
                else:
                    if timed:
                        result.times_ms.append(elapsed * 1e3)
                        result.cpu_ms.append(cpu * 1e3)
                    if keep_output:
                        result.output = out
                bar.update(note=f"{'round' if timed else 'warm-up'} {r + 1}/{rounds}: {name}")
    finally:
        if own_bar:
            bar.close()
    return results
