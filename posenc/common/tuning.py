"""Choices between two correct kernels whose order depends on the machine, and where they come
from: an environment variable, a measurement by ``posenc tune`` kept in a file the user can see
and delete, or a default that holds on every CPU measured. :func:`posenc.common.planning.decide`
asks here; nothing else does."""

from __future__ import annotations

import functools
import json
import os
import platform
import warnings
from pathlib import Path
from typing import Literal

import torch

BiasBackward = Literal["flash", "explicit"]
BIAS_BACKWARDS: tuple[str, ...] = ("flash", "explicit")
#: The environment variable that chooses the backward of a constant bias on CPU (see
#: :func:`constant_bias_backward`).
BIAS_BACKWARD_VARIABLE = "POSENC_BIAS_BACKWARD"
#: Where ``posenc tune`` writes its measurement (default ``~/.cache/posenc/tune.json``).
TUNE_FILE_VARIABLE = "POSENC_TUNE_FILE"
#: Without either: the written-out backward, whose worst case on the CPUs measured is the smaller
#: (a few percent slower on one family, where SDPA's flash backward with a bias is several times
#: slower on another).
DEFAULT_CONSTANT_BIAS_BACKWARD: BiasBackward = "explicit"


def tune_file() -> Path:
    """The file ``posenc tune`` writes and the plan reads: :data:`TUNE_FILE_VARIABLE`, else
    ``~/.cache/posenc/tune.json``. Deleting it restores the default."""
    return Path(os.environ.get(TUNE_FILE_VARIABLE) or Path.home() / ".cache" / "posenc" / "tune.json")


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    """The CPU's model name, read once: the plan asks for the key at every training call."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return model


def machine_key() -> str:
    """What a measurement holds for: the CPU model, torch's version and its thread count (which
    may change while the process runs, so it is read each time)."""
    return f"{_cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


@functools.lru_cache(maxsize=4)
def _tuned(path: str, stamp: tuple[int, int], key: str) -> BiasBackward | None:
    """The choice measured for ``key`` in the tune file at ``path`` (read again when it changes)."""
    try:
        record = json.loads(Path(path).read_text()[:1_000_000])
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("machines"), dict):
        warnings.warn(f"{path}: not a posenc tune file; ignored (run `posenc tune` again, or delete it)", stacklevel=3)
        return None
    entry = record["machines"].get(key)  # another machine's (or thread count's) measurement: not this one's
    choice = entry.get("constant_bias_backward") if isinstance(entry, dict) else None
    return choice if choice in BIAS_BACKWARDS else None


def constant_bias_backward() -> tuple[BiasBackward, str]:
    """The backward of the chunked ``dense`` path for a constant bias on CPU, and where the choice
    comes from. SDPA's CPU flash backward with a bias or the written-out one: which is faster
    depends on the CPU, so: :data:`BIAS_BACKWARD_VARIABLE` where set (``flash`` or ``explicit``),
    else what ``posenc tune`` measured on this machine (:func:`tune_file`, :func:`machine_key`),
    else :data:`DEFAULT_CONSTANT_BIAS_BACKWARD`. ``posenc bench attention --plans`` prints it."""
    # Under torch.compile the choice is read once at trace time and baked into the graph: the
    # file's stat is not traceable, and a recompile after `posenc tune` is not worth a guard.
    if torch.compiler.is_compiling():
        return _constant_bias_backward_at_trace()
    return _constant_bias_backward()


def _constant_bias_backward() -> tuple[BiasBackward, str]:
    """:func:`constant_bias_backward` outside a trace."""
    value = os.environ.get(BIAS_BACKWARD_VARIABLE, "").strip()
    if value:
        if value not in BIAS_BACKWARDS:
            raise ValueError(f"{BIAS_BACKWARD_VARIABLE} must be one of {', '.join(BIAS_BACKWARDS)} (or unset); got {value!r}")
        return value, f"{BIAS_BACKWARD_VARIABLE}={value}"  # type: ignore[return-value]
    path = tune_file()
    try:
        stat = path.stat()
    except OSError:
        stat = None
    if stat is not None:
        tuned = _tuned(str(path), (stat.st_mtime_ns, stat.st_size), machine_key())
        if tuned is not None:
            return tuned, f"measured on this machine by posenc tune ({path})"
    return DEFAULT_CONSTANT_BIAS_BACKWARD, (f"the default for a constant bias on CPU (`posenc tune` measures this "
                                            f"machine; {BIAS_BACKWARD_VARIABLE} sets it)")


@torch._dynamo.assume_constant_result
def _constant_bias_backward_at_trace() -> tuple[BiasBackward, str]:
    return _constant_bias_backward()
