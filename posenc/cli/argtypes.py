"""Argument types shared by the ``posenc`` subcommands (``type=`` callables for argparse).

Each raises :class:`argparse.ArgumentTypeError` with what was expected and what was given;
argparse prefixes the argument's name, and the command exits with 2. The rules themselves are
those of :mod:`posenc.common.checks`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from typing import Callable

from ..common.checks import check_int, check_number


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


def _int(text: str, minimum: int, maximum: int | None = None, what: str = "") -> int:
    what = what or f"{_bound_words(minimum)} integer"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what}, got {text!r}") from None
    try:
        return check_int("value", value, minimum=minimum, maximum=maximum)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer ``>= 1``."""
    return _int(text, 1)


def nonnegative_int(text: str) -> int:
    """An integer ``>= 0``."""
    return _int(text, 0)


def seed_value(text: str) -> int:
    """A seed: an integer in ``[0, 2**32)`` (numpy's range)."""
    return _int(text, 0, 2**32 - 1, "seed in [0, 2**32)")


def device_name(text: str) -> str:
    """``auto`` or a device string (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ``xpu``), read as text:
    parsing an argument never imports torch (whether the device is there is asked when the
    command runs)."""
    if text == "auto" or re.fullmatch(r"cpu|(cuda|mps|xpu)(:[0-9]+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda, cuda:N, mps or xpu, got {text!r}")


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


def _float(text: str, minimum: float, strict: bool, what: str) -> float:
    try:
        return check_number("value", float(text), minimum=minimum, strict=strict)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what}, got {text!r}") from None


def positive_float(text: str) -> float:
    """A finite number ``> 0``."""
    return _float(text, 0.0, True, "positive number")


def nonnegative_float(text: str) -> float:
    """A finite number ``>= 0``."""
    return _float(text, 0.0, False, "non-negative number")


def dropout_rate(text: str) -> float:
    """A probability in ``[0, 1)``."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def json_path(text: str) -> str:
    """A file to write: its directory exists, and it is not itself a directory."""
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"directory {parent!r} of {text!r} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    return text


def out_directory(text: str) -> str:
    """A directory to write into: new, or an existing directory (not a file)."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    return text
