"""An append-only JSONL log of a bench's finished units, so a killed run continues where it stopped.

Each line is one finished unit: ``{"unit": id, "config": key, ...result}``. A unit is done when a
line with its id and the current configuration key is in the file; lines of another
configuration are kept but not used. A line is appended, flushed and fsynced as soon as its
unit finishes; a run killed while writing leaves at most one partial last line, which
:meth:`UnitLog.load` drops (the file is rewritten atomically without it) before anything is
appended after it.

Every other line is read as someone else's JSON (:mod:`posenc.training.json_input`) and checked
before any is used: an object with a string ``unit`` and ``config``, and whatever the bench's
``check`` says of its values. A line that fails is a :class:`UnitLogError` naming the file, the
line number and what is wrong (a tampered log never reaches the report as a wrong number).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from ...training.json_input import MAX_JSON_BYTES, parse_json
from ...training.report import write_atomic

Check = Callable[[Mapping[str, Any]], "str | None"]


class UnitLogError(ValueError):
    """A line of a unit log that cannot be used; the message names the file and the line."""


def config_key(config: Mapping[str, Any]) -> str:
    """A short stable fingerprint of a JSON-serialisable configuration."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def line_problem(item: Any) -> str | None:
    """What makes ``item`` no unit-log line (an object with a string ``unit`` and ``config``), or None."""
    if not isinstance(item, dict):
        return f"the line is a JSON {type(item).__name__}, not an object"
    for key in ("unit", "config"):
        if not isinstance(item.get(key), str) or not item[key]:
            return f"{key!r} must be a non-empty string; got {item.get(key)!r}"
    return None


class UnitLog:
    """The units finished so far in ``path`` (created on the first :meth:`append`); ``check``: the
    bench's rule for a line's values (``item -> problem or None``)."""

    def __init__(self, path: str | os.PathLike, check: Check | None = None) -> None:
        self.path = Path(path)
        self.check = check
        self.lines: list[dict] = []
        self.numbers: list[int] = []  # the file's line number of each of ``lines``
        self.dropped = 0  # the partial last line of a killed run, when there is one

    def _refuse(self, number: int, item: Any, problem: str) -> UnitLogError:
        unit = f" (unit {item['unit']!r})" if isinstance(item, dict) and isinstance(item.get("unit"), str) else ""
        return UnitLogError(f"{self.path} line {number}{unit}: {problem}; fix or delete that line (its unit then "
                            "runs again), or resume into a new --out")

    def refuse(self, index: int, problem: str) -> UnitLogError:
        """The error for ``lines[index]``, naming the file and its line (for what the bench's plan
        knows of a line: the splits it reports)."""
        return self._refuse(self.numbers[index], self.lines[index], problem)

    def load(self) -> "UnitLog":
        """Read the file (if any) and check every line; drop a partial last line (a run killed while
        writing); returns self. :class:`UnitLogError` names the first line that cannot be used."""
        self.lines, self.numbers, self.dropped = [], [], 0
        if self.path.is_symlink():
            raise UnitLogError(f"{self.path} is a symbolic link; a unit log is never read or written through one")
        if not self.path.exists():
            return self
        if self.path.stat().st_size > MAX_JSON_BYTES:
            raise UnitLogError(f"{self.path} is larger than the {MAX_JSON_BYTES} bytes a unit log may have")
        raw = self.path.read_bytes()
        chunks = raw.split(b"\n")
        cut = bool(raw) and not raw.endswith(b"\n")  # the last chunk was being written when the run died
        good: list[bytes] = []
        for number, line in enumerate(chunks, start=1):
            if not line.strip():
                continue
            try:
                item = parse_json(line, f"{self.path} line {number}")
            except ValueError as exc:
                if cut and number == len(chunks):
                    self.dropped += 1
                    continue
                raise UnitLogError(f"{exc}; fix or delete that line, or resume into a new --out") from None
            problem = line_problem(item)
            if problem is None and self.check is not None:
                problem = self.check(item)
            if problem is not None:
                raise self._refuse(number, item, problem)
            self.lines.append(item)
            self.numbers.append(len(good) + 1 if cut else number)  # a rewritten file has no blank lines
            good.append(line)
        if self.dropped or cut:
            text = b"".join(line + b"\n" for line in good)
            write_atomic(self.path, lambda f: f.write(text))
        return self

    def done(self, key: str) -> dict[str, dict]:
        """Unit id -> its result, for the lines of configuration ``key`` (the last line wins)."""
        return {item["unit"]: item for item in self.lines if item["config"] == key}

    def append(self, item: Mapping[str, Any]) -> None:
        """Append one finished unit, durably (never through a symbolic link, even one placed
        during the run: the file is opened with ``O_NOFOLLOW``)."""
        problem = line_problem(dict(item))
        if problem is not None:
            raise ValueError(f"a unit log line needs a string 'unit' and 'config': {problem}")
        if self.path.is_symlink():
            raise UnitLogError(f"{self.path} is a symbolic link; a unit log is never written through one")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(dict(item), sort_keys=True) + "\n"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise UnitLogError(f"{self.path} cannot be appended to: {exc.strerror or type(exc).__name__}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.lines.append(json.loads(line))
        self.numbers.append(self.numbers[-1] + 1 if self.numbers else 1)


__all__ = ["UnitLog", "UnitLogError", "config_key", "line_problem"]
