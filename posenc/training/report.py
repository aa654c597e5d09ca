"""What the commands show and write: text tables, progress, results files, optional packages.

Shared by ``posenc train``, ``posenc bench``, ``posenc demo`` and ``posenc extend`` (none of them
imports another for these), the :class:`~posenc.training.trainer.Trainer` and its checkpoints
(atomic writes) and the integrations (:func:`optional`). It imports no torch: ``posenc list``
prints its table with it.

* :func:`format_table`: an aligned text table.
* :class:`Progress`: a bar redrawn in place on a terminal; plain lines at most every few seconds
  when the stream is redirected to a file or a pipe (no carriage returns in logs).
* :func:`write_json`: a results file written atomically, never through a symbolic link.
* :func:`optional`: import an optional package or raise :class:`MissingExtra`, one line naming
  the extra that installs it; commands check before any work is done.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, Callable, Sequence, TextIO


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """An aligned text table: a header line, a rule, one line per row.

    Args:
        headers: column titles.
        rows: cells (converted with ``str``); every row has ``len(headers)`` cells.
        align: one letter per column, ``"l"`` (left) or ``"r"`` (right); default all left.
            Trailing spaces are stripped, so a long last column costs nothing.
    """
    ncol = len(headers)
    align = "l" * ncol if align is None else align
    if len(align) != ncol or set(align) - {"l", "r"}:
        raise ValueError(f"align must be {ncol} letters 'l' or 'r' (one per column); got {align!r}")
    cells = [[str(c) for c in headers]]
    for i, row in enumerate(rows):
        if len(row) != ncol:
            raise ValueError(f"row {i} has {len(row)} cells; expected {ncol} (one per header)")
        cells.append([str(c) for c in row])
    widths = [max(len(r[j]) for r in cells) for j in range(ncol)]

    def line(row: list[str]) -> str:
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths).rstrip()
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


class Progress:
    """Progress on ``stream`` (default stderr): a bar redrawn in place on a terminal, and a plain
    line at most every ``every`` seconds (and at the end) when the stream is not a terminal."""

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        initial: int = 0,
        every: float = 5.0,
    ) -> None:
        self.total, self.desc, self.done = max(1, total), desc, initial
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.every = every
        self._last = time.monotonic()
        self._start = self._last
        self._start_done = initial
        self.note = ""

    def _rate(self) -> str:
        elapsed = time.monotonic() - self._start
        n = self.done - self._start_done
        if n <= 0 or elapsed <= 0:
            return ""
        left = (self.total - self.done) * elapsed / n
        return f" {elapsed:.0f}s elapsed, ~{left:.0f}s left"

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if note:
            self.note = note
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            width = 30
            filled = int(width * min(self.done, self.total) / self.total)
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.desc} [{bar}] {self.done}/{self.total} {self.note}".ljust(100)[:120])
            self.stream.flush()
        elif now - self._last >= self.every or self.done >= self.total:
            pct = 100 * self.done / self.total
            self.stream.write(f"{self.desc}: {self.done}/{self.total} ({pct:.0f}%){self._rate()} {self.note}".rstrip() + "\n")
            self.stream.flush()
            self._last = now

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _json_safe(value: Any) -> Any:
    """NaN and infinities become ``null`` (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file (0o666 less the umask): every
    file of a run directory gets it, whether written directly or renamed from a temporary file
    (which ``tempfile`` creates 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Write a file atomically: ``write(f)`` fills a temporary file beside ``path`` (flushed and
    fsynced), which then gets the mode of an ordinary new file (:func:`file_mode`) and is renamed
    over ``path``. A reader sees the old file or the new one, never a partial one; a symbolic link
    at ``path`` is replaced, never written through; on any failure the temporary file is removed
    and ``path`` is untouched. The one writer of checkpoints, configs and results files."""
    path = Path(path)
    directory = path.parent.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return path


def _fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename durable (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (:func:`write_atomic`); NaN and
    infinities become ``null``."""
    text = json.dumps(_json_safe(data), indent=2) + "\n"
    return write_atomic(path, lambda f: f.write(text.encode("utf-8")))


class MissingExtra(ImportError):
    """An optional package is not installed; the message is one line naming the extra."""


# optional package -> the extra of posenc that installs it
EXTRAS = {"matplotlib": "plot", "sklearn": "data", "sktime": "data", "rdkit": "data",
          "x_transformers": "bench", "attention_smithy": "smithy", "transformers": "hf"}


def optional(module: str, what: str) -> ModuleType:
    """Import the optional ``module`` needed for ``what``, or raise :class:`MissingExtra` saying how
    to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        extra = EXTRAS.get(module.split(".")[0])
        how = f"pip install 'posenc[{extra}]'" if extra else f"pip install {module.split('.')[0]}"
        raise MissingExtra(f"{what} needs {module.split('.')[0]}, which is not installed ({how})") from None


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None after one line on stderr saying
    the plot is skipped and how to get it (the tables and JSON are written all the same)."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        print("note: matplotlib is not installed, so no plot is drawn (pip install 'posenc[plot]')", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def hook_text(hooks, between_blocks: bool = False) -> str:
    """The hooks as ``posenc list``, the README and the demo name them: ``input``, ``qk``, ...;
    ``input (between blocks)`` for an input encoding added between blocks (PEG)."""
    text = ",".join(sorted(str(getattr(h, "value", h)) for h in hooks)) or "-"
    return text.replace("input", "input (between blocks)") if between_blocks else text
