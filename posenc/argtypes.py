"""Argument types shared by the ``posenc`` subcommands (``type=`` callables for argparse).

Each raises :class:`argparse.ArgumentTypeError` with what was expected and what was given;
argparse prefixes the argument's name, and the command exits with 2.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Callable


def _bound_words(minimum: float) -> str:
    return "positive" if minimum > 0 else "non-negative"


def int_list(*, minimum: int = 1, allow_empty: bool = False) -> Callable[[str], list[int]]:
    """Comma-separated integers ``>= minimum`` (1: positive, 0: non-negative)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if (not values and not allow_empty) or any(v < minimum for v in values):
            raise argparse.ArgumentTypeError(f"expected {_bound_words(minimum)} integers, got {text!r}")
        return values

    return parse


def positive_float_list(text: str) -> list[float]:
    """Comma-separated finite numbers ``> 0``, at least one."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def key_value(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with a JSON value; a bare word (``pairing=interleaved``) stays a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def positive_float(text: str) -> float:
    """A finite number ``> 0``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def dropout_rate(text: str) -> float:
    """A probability in ``[0, 1)``."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value
