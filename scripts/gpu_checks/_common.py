"""Shared by the GPU check scripts: the device they run on and a PASS/FAIL line per check.

``POSENC_CHECK_DEVICE`` names the device (``cuda`` by default); ``cpu`` is the dry run that
scripts/gpu_checks.sh --dry-run makes on a machine without a GPU, to catch a broken check before
it costs device time. ``POSENC_CHECK_SMALL=1`` shrinks the sizes for that dry run.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

import torch

DEVICE = torch.device(os.environ.get("POSENC_CHECK_DEVICE", "cuda"))
SMALL = os.environ.get("POSENC_CHECK_SMALL") == "1"
failures = 0


def check(name: str, fn: Callable[[], object]) -> None:
    """Run one check; print PASS, or FAIL with the first line of the error (the traceback to stderr)."""
    global failures
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except Exception as exc:  # every failure is reported, the rest still run
        failures += 1
        print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", flush=True)
        traceback.print_exc(file=sys.stderr)


def finish() -> None:
    sys.exit(1 if failures else 0)
