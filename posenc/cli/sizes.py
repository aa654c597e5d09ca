"""One size policy for every ``posenc`` command: a size-like flag is bounded by an estimate of
the run's work and memory, checked before anything is built.

A command describes its run as a :class:`Work` computed from its arguments alone (floating-point
operations, model calls, peak bytes; the cost models below), lists its size flags, and calls
:func:`size_error` before any work. A run estimated above :data:`HOURS_LIMIT` hours on its
device, or above :data:`MEMORY_SHARE` of the device's memory, is refused with one line naming
the flag most responsible (the one whose default shrinks the estimate most), its value, the
estimate, the limit and the largest value that fits; ``--allow-large`` runs it anyway.

The estimates are rough on purpose (dense float32 arithmetic at :data:`CPU_FLOPS` or
:data:`GPU_FLOPS`, plus :data:`CALL_SECONDS` a model call): they catch absurd sizes (a million
decoding steps, a billion repeats, a million seeds), they do not predict run times. Nothing here
imports torch unless a run is over the CPU's limits with ``--device auto`` (then whether CUDA is
there decides).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

# Assumed speeds: float32 operations a second, and the least time one model call (a training
# step, a forward pass, a decoding step) takes whatever its size (Python, dispatch, launches).
CPU_FLOPS = 2e10
GPU_FLOPS = 2e13
CALL_SECONDS = 1e-3
HOURS_LIMIT = 24.0  # estimated work above this is refused without --allow-large
MEMORY_SHARE = 0.8  # of the device's memory
ALLOW_FLAG = "--allow-large"
FLOAT32 = 4


@dataclass(frozen=True)
class Work:
    """What a run costs: ``flops`` floating-point operations, ``calls`` model calls, ``bytes`` at
    its peak. ``a + b`` is one after the other (peak: the larger); ``a * n`` is ``n`` times ``a``."""

    flops: float = 0.0
    calls: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.calls + other.calls, max(self.bytes, other.bytes))

    def __mul__(self, n: float) -> Work:
        return Work(self.flops * n, self.calls * n, self.bytes)

    __rmul__ = __mul__

    def seconds(self, gpu: bool) -> float:
        return self.flops / (GPU_FLOPS if gpu else CPU_FLOPS) + self.calls * CALL_SECONDS


def sequence(parts: Sequence[Work]) -> Work:
    """The parts one after another."""
    out = Work()
    for part in parts:
        out = out + part
    return out


# ---- cost models ----------------------------------------------------------------------------


def transformer(batch: float, tokens: float, dim: float, depth: float, *, vocab: float = 0, train: bool = True,
                steps: float = 1) -> Work:
    """``steps`` passes of a transformer (attention and a 4x MLP per block, ``vocab`` logits) over
    ``batch x tokens``: forward and backward with AdamW when ``train``, else forward only.
    Attention runs chunk by chunk (no ``T x T`` tensor is kept), so memory is linear in ``tokens``."""
    per_token = 24 * depth * dim * dim + 4 * depth * tokens * dim + 2 * dim * vocab
    forward = batch * tokens * per_token
    params = 12 * depth * dim * dim + vocab * dim
    if train:
        memory = FLOAT32 * (4 * params + batch * tokens * (16 * depth * dim + 2 * vocab))
        return Work(3 * forward * steps, steps, memory)
    return Work(forward * steps, steps, FLOAT32 * (params + batch * tokens * (8 * dim + vocab)))


def scoring(tokens: float, length: float, dim: float, depth: float, *, vocab: float = 256, batch: float = 0) -> Work:
    """Scoring ``tokens`` tokens in windows of ``length`` (no gradient); ``batch`` windows at once
    (0: about 4096 tokens a pass, as :func:`posenc.seq.byte_lm.bits_per_byte_at` does)."""
    windows = max(1.0, math.ceil(tokens / max(length, 1)))
    at_once = batch or max(1.0, 4096 // max(length, 1))
    passes = math.ceil(windows / at_once)
    return transformer(min(at_once, windows), length, dim, depth, vocab=vocab, train=False, steps=passes)


def decoding(batch: float, context: float, new_tokens: float, dim: float, depth: float, *, vocab: float = 256) -> Work:
    """``new_tokens`` cached decoding steps of ``batch`` rows after ``context`` tokens: each step one
    token through every block against the whole cache (kept in float32)."""
    reach = context + new_tokens
    step = batch * (24 * depth * dim * dim + 4 * depth * reach * dim + 2 * dim * vocab)
    cache = FLOAT32 * 2 * depth * batch * reach * dim
    return Work(step * new_tokens, new_tokens, cache + FLOAT32 * (12 * depth * dim * dim + vocab * dim))


# ---- limits ---------------------------------------------------------------------------------


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _cuda_memory(device: str) -> int | None:
    """Total memory of the CUDA device named (``cuda`` is device 0), or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


@dataclass(frozen=True)
class Limits:
    """What a run may take on one device: seconds of estimated work, bytes of memory (None: unknown)."""

    where: str
    gpu: bool
    seconds: float
    memory: float | None


def limits_for(device: str | None) -> Limits:
    """The limits of ``device`` (``cpu``, ``cuda``, ``cuda:N``; None and ``auto`` are the CPU here,
    see :func:`size_error`)."""
    seconds = HOURS_LIMIT * 3600
    name = device or "cpu"
    if name.startswith("cuda"):
        memory = _cuda_memory(name)
        if memory is not None:
            return Limits(name, True, seconds, MEMORY_SHARE * memory)
    memory = _physical_memory()
    return Limits("cpu", False, seconds, None if memory is None else MEMORY_SHARE * memory)


# ---- the check ------------------------------------------------------------------------------

Estimate = Callable[[argparse.Namespace], Work]


def _over(work: Work, limits: Limits) -> str | None:
    """``"memory"`` or ``"time"`` when ``work`` exceeds ``limits`` (memory first), else None."""
    if limits.memory is not None and work.bytes > limits.memory:
        return "memory"
    if work.seconds(limits.gpu) > limits.seconds:
        return "time"
    return None


def _measure(work: Work, what: str, limits: Limits) -> float:
    return work.bytes if what == "memory" else work.seconds(limits.gpu)


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        if len(value) > 8:  # a long list on one line: its ends and its length
            return f"{','.join(_text(v) for v in value[:3])},...,{_text(value[-1])} ({len(value)} values)"
        return ",".join(_text(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _with(args: argparse.Namespace, dest: str, value: Any) -> argparse.Namespace:
    trial = copy.copy(args)
    setattr(trial, dest, value)
    return trial


def _safe(estimate: Estimate, args: argparse.Namespace) -> Work | None:
    try:
        return estimate(args)
    except (ValueError, TypeError, ZeroDivisionError, OverflowError, KeyError):
        return None


def _capped(value: Any, cap: float) -> Any:
    """``value`` with every number above ``cap`` lowered to it (a list keeps its order, once each)."""
    if isinstance(value, (list, tuple)):
        kind = type(value)
        return kind(dict.fromkeys(type(v)(min(v, cap)) for v in value))
    return type(value)(min(value, cap))


def _largest_fitting(args: argparse.Namespace, dest: str, estimate: Estimate, limits: Limits, what: str,
                     low: float) -> float | None:
    """The largest cap on ``dest`` (bisected from ``low``, which fits) under which the run fits."""
    value = getattr(args, dest)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None  # names (datasets, encodings): no number to bound
    high = float(max(values))
    integer = all(isinstance(v, int) for v in values)

    def fits(cap: float) -> bool:
        work = _safe(estimate, _with(args, dest, _capped(value, int(cap) if integer else cap)))
        return work is not None and _over(work, limits) is None

    if not fits(low):
        return None
    for _ in range(80):
        if (high - low <= 1) if integer else (high - low <= 1e-3 * max(abs(high), 1.0)):
            break
        mid = math.floor((low + high) / 2) if integer else (low + high) / 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return int(low) if integer else low


def _lowest(value: Any) -> float:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(min(numbers)) if numbers else 1.0


def _flag_of(entry: str | tuple[str, str]) -> tuple[str, str]:
    if isinstance(entry, tuple):
        return entry
    return entry, "--" + entry.replace("_", "-")


def size_error(args: argparse.Namespace, flags: Sequence[str | tuple[str, str]], estimate: Estimate,
               defaults: Callable[[str], Any], *, device: str | None = None, allow: bool | None = None,
               describe: Callable[[argparse.Namespace], str] | None = None) -> str | None:
    """Why the run asked for by ``args`` is refused as too large, in one line, or None.

    Args:
        flags: the command's size flags, by ``dest`` (the flag is ``--`` + dest with dashes) or as
            ``(dest, flag)``.
        estimate: the run's :class:`Work` from the arguments.
        defaults: ``dest -> default`` (:func:`defaults_of` of the command's ``add_arguments``); the
            flag named is the one whose default shrinks the estimate most.
        device: default ``args.device`` (``auto``: the CPU's limits, or CUDA's when the CPU's are
            exceeded and torch sees a GPU).
        allow: default ``args.allow_large``; True skips the check.
        describe: the run in words for the message (``"1000 steps at batch 32 x 128 tokens"``).
    """
    allow = getattr(args, "allow_large", False) if allow is None else allow
    if allow:
        return None
    device = getattr(args, "device", None) if device is None else device
    work = estimate(args)
    limits = limits_for(None if device in (None, "auto") else str(device))
    what = _over(work, limits)
    if what is not None and device == "auto" and not limits.gpu:
        import torch

        if torch.cuda.is_available():  # auto runs on the GPU: its limits apply
            limits = limits_for("cuda")
            what = _over(work, limits)
    if what is None:
        return None
    culprit, gain = None, 1.0
    for entry in flags:
        dest, flag = _flag_of(entry)
        value, default = getattr(args, dest, None), defaults(dest)
        if value is None or value == default:  # a default of None is the command's own choice
            continue
        trial = _safe(estimate, _with(args, dest, default))
        if trial is None:
            continue
        ratio = _measure(work, what, limits) / max(_measure(trial, what, limits), 1e-300)
        if ratio > gain:
            culprit, gain = (dest, flag), ratio
    limit_text = _limit_text(what, limits)
    estimate_text = _estimate_text(work, what, limits)
    run = "the run" if describe is None else f"the run ({describe(args)})"
    if culprit is None:
        names = ", ".join(_flag_of(e)[1] for e in flags)
        return (f"{run} would need {estimate_text}, over {limit_text}; lower the sizes ({names}), or add {ALLOW_FLAG} "
                "to run it anyway")
    dest, flag = culprit
    value = getattr(args, dest)
    default = defaults(dest)
    bound = _largest_fitting(args, dest, estimate, limits, what, 1.0 if default is None else _lowest(default))
    fits = "" if bound is None else f"; {'values up to' if isinstance(value, (list, tuple)) else 'at most'} about {_text(bound)} fit"
    return (f"{flag} {_text(value)}: {run} would need {estimate_text}, over {limit_text}{fits} (lower {flag}, or add "
            f"{ALLOW_FLAG} to run it anyway)")


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.0f} hours" if hours < 1e6 else f"{hours:.1e} hours"


def _limit_text(what: str, limits: Limits) -> str:
    if what == "memory":
        return f"the limit of {_gib(limits.memory or 0)} ({MEMORY_SHARE:.0%} of {limits.where}'s memory)"
    return f"the limit of {HOURS_LIMIT:.0f} hours"


def _estimate_text(work: Work, what: str, limits: Limits) -> str:
    if what == "memory":
        return f"about {_gib(work.bytes)} of memory"
    speed = GPU_FLOPS if limits.gpu else CPU_FLOPS
    return (f"about {_hours(work.seconds(limits.gpu))} of work on {limits.where} ({work.flops:.1e} floating-point "
            f"operations at {speed:.0e} a second and {work.calls:.1e} model calls)")


def defaults_of(add_arguments: Callable[[argparse.ArgumentParser], None]) -> Callable[[str], Any]:
    """``dest -> default`` of the parser that ``add_arguments`` builds (a private parser)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return parser.get_default


def add_allow_large(parser: argparse.ArgumentParser) -> None:
    """The one override of the policy: ``--allow-large``."""
    parser.add_argument(ALLOW_FLAG, action="store_true",
                        help=f"run even when the size estimate says the run needs more than {MEMORY_SHARE * 100:.0f}%% of "
                             f"the device's memory or more than {HOURS_LIMIT:.0f} hours of work")  # %%: argparse formats help


__all__ = [
    "ALLOW_FLAG", "CALL_SECONDS", "CPU_FLOPS", "GPU_FLOPS", "HOURS_LIMIT", "Limits", "MEMORY_SHARE", "Work",
    "add_allow_large", "decoding", "defaults_of", "limits_for", "scoring", "sequence", "size_error", "transformer",
]
