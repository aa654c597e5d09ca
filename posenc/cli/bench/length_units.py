"""The rules a line of ``posenc bench length-generalization``'s ``units.jsonl`` must meet before a
resumed run uses it (:class:`.unit_log.UnitLog`'s ``check``).

A unit id names what the line holds: ``task/TASK/ENCODING/SEED`` or ``lm/ENCODING/SEED``; the
line's ``kind``, ``task``, ``encoding`` and ``seed`` must say the same (a line edited to another
encoding would fill one row twice and leave another empty, and the run would call itself
complete). Its numbers must be what a unit can produce: exact match in ``[0, 1]``, bits per byte
finite and non-negative, a finite training loss, non-negative seconds. :func:`check_planned`
adds what the plan knows: every split (or scoring length) the report reads is there.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from ...common.checks import is_number


def _number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def _expected(unit: str) -> dict | str:
    """What the unit id says the line holds, or the problem with the id."""
    parts = unit.split("/")
    if parts[0] == "task" and len(parts) == 4:
        expected = {"kind": "task", "task": parts[1], "encoding": parts[2]}
    elif parts[0] == "lm" and len(parts) == 3:
        expected = {"kind": "lm", "encoding": parts[1]}
    else:
        return f"unit {unit!r} is neither task/TASK/ENCODING/SEED nor lm/ENCODING/SEED"
    if not parts[-1].isdigit():
        return f"unit {unit!r} does not end in a seed (a non-negative integer)"
    return {**expected, "seed": int(parts[-1])}


def _scores(item: Mapping[str, Any], key: str, low: float, high: float | None) -> str | None:
    scores = item.get(key)
    if not isinstance(scores, dict) or not scores:
        return f"{key} must be a non-empty object of scores; got {scores!r}"
    for name, value in scores.items():
        if not _number(value) or value < low or (high is not None and value > high):
            what = f"in [{low:g}, {high:g}]" if high is not None else f"finite and >= {low:g}"
            return f"{key}[{name!r}] must be a number {what}; got {value!r}"
    return None


def check_line(item: Mapping[str, Any]) -> str | None:
    """What is wrong with one line (already an object with a string ``unit``), or None."""
    expected = _expected(item["unit"])
    if isinstance(expected, str):
        return expected
    for key, want in expected.items():
        got = item.get(key)
        if got != want or isinstance(got, bool):
            return f"{key} is {got!r} but the unit id says {want!r}"
    if not _number(item.get("train_loss")):
        return f"train_loss must be a finite number; got {item.get('train_loss')!r}"
    for key in ("train_s", "eval_s"):
        if key in item and not (_number(item[key]) and item[key] >= 0):
            return f"{key} must be a finite number >= 0; got {item[key]!r}"
    if expected["kind"] == "task":
        return _scores(item, "exact_match", 0.0, 1.0)
    problem = _scores(item, "bpb", 0.0, None)
    if problem is None and not all(k.isdigit() for k in item["bpb"]):
        return f"bpb must be keyed by scoring lengths (digits); got {sorted(item['bpb'])}"
    return problem


# what two lines of one unit and configuration may disagree on: the time it took (a unit run twice,
# as by two runs sharing one --out); a score that differs makes the report's choice silent
TIMINGS = ("train_s", "eval_s")


def check_repeat(earlier: Mapping[str, Any], item: Mapping[str, Any], earlier_line: int) -> str | None:
    """What ``item`` says otherwise than ``earlier`` (line ``earlier_line``), a line of the same
    unit and configuration, other than its timings; or None."""
    for key in sorted(set(earlier) | set(item), key=str):
        if key not in TIMINGS and earlier.get(key) != item.get(key):
            return (f"{key} is {item.get(key)!r} but line {earlier_line} of the same unit and configuration says "
                    f"{earlier.get(key)!r} (two runs of one unit must agree)")
    return None


def check_planned(item: Mapping[str, Any], needed: Iterable[str]) -> str | None:
    """What the report would miss in a line of a planned unit: the splits (task) or scoring lengths
    (LM) ``needed``, as keys of its scores; None when all are there."""
    key = "exact_match" if item.get("kind") == "task" else "bpb"
    missing = [n for n in needed if n not in item.get(key, {})]
    if missing:
        return f"{key} lacks {', '.join(map(repr, missing))}, which this configuration scores"
    return None


__all__ = ["TIMINGS", "check_line", "check_planned", "check_repeat"]
