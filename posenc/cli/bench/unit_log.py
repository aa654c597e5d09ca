"""An append-only JSONL log of a bench's finished units, so a killed run continues where it stopped.

Each line is one finished unit: ``{"unit": id, "config": key, ...result}``. A unit is done when a
line with its id and the current configuration key is in the file; lines of another
configuration are kept but not used. A line is appended, flushed and fsynced as soon as its
unit finishes; a run killed while writing leaves at most one partial last line, which
:meth:`UnitLog.load` drops (the file is rewritten atomically without it) before anything is
appended after it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from ...training.report import write_atomic


def config_key(config: Mapping[str, Any]) -> str:
    """A short stable fingerprint of a JSON-serialisable configuration."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


class UnitLog:
    """The units finished so far in ``path`` (created on the first :meth:`append`)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.lines: list[dict] = []
        self.dropped = 0  # unreadable lines (a partial last line of a killed run)

    def load(self) -> "UnitLog":
        """Read the file (if any), dropping unreadable lines; returns self."""
        self.lines, self.dropped = [], 0
        if not self.path.exists():
            return self
        raw = self.path.read_bytes()
        good: list[bytes] = []
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                self.dropped += 1
                continue
            if not isinstance(item, dict) or "unit" not in item or "config" not in item:
                self.dropped += 1
                continue
            self.lines.append(item)
            good.append(line)
        if self.dropped or (raw and not raw.endswith(b"\n")):
            text = b"".join(line + b"\n" for line in good)
            write_atomic(self.path, lambda f: f.write(text))
        return self

    def done(self, key: str) -> dict[str, dict]:
        """Unit id -> its result, for the lines of configuration ``key`` (the last line wins)."""
        return {item["unit"]: item for item in self.lines if item["config"] == key}

    def append(self, item: Mapping[str, Any]) -> None:
        """Append one finished unit, durably."""
        if "unit" not in item or "config" not in item:
            raise ValueError("a unit log line needs 'unit' and 'config'")
        if self.path.is_symlink():
            raise ValueError(f"{self.path} is a symbolic link; a unit log is never written through one")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(dict(item), sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.lines.append(json.loads(line))


__all__ = ["UnitLog", "config_key"]
