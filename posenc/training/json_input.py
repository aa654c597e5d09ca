"""Reading JSON that someone else wrote: ``config.json``, ``results.json``, ``metrics.jsonl``.

Whatever is wrong with the file (missing, too large, not UTF-8, not JSON, nested deeper than
Python's parser recurses, a number of more digits than Python converts) is one ``ValueError``
naming the file, never a codec message, a ``RecursionError`` or a traceback from inside ``json``.
NaN and infinities, which ``json`` accepts as extensions, are kept: the caller's value checks
(:mod:`posenc.common.checks`) refuse them where they matter, naming the key.

::

    record = read_json(run_dir / "results.json")
    for line_number, row in read_json_lines(run_dir / "metrics.jsonl"):
        ...
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

__all__ = ["MAX_JSON_BYTES", "parse_json", "read_json", "read_json_lines"]

# Configs and results are kilobytes; metrics logs of long runs a few megabytes. A file above this
# is refused before it is read (a planted multi-gigabyte file would otherwise be read whole).
MAX_JSON_BYTES = 256 * 2**20


def parse_json(text: str | bytes, where: str) -> Any:
    """The JSON value in ``text`` (UTF-8 when bytes); a ValueError ``where: ...`` when it is not one."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where} is not readable JSON: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not readable JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ValueError(f"{where} is not readable JSON: {' '.join(str(exc).split())}") from None


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ValueError(f"{path} is {size} bytes, larger than the {max_bytes} a JSON file of posenc may have")
        with open(path, "rb") as f:
            return f.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"{path} cannot be read: {exc.strerror or type(exc).__name__}") from None


def read_json(path: str | os.PathLike, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the file ``path``; one ValueError naming the file otherwise."""
    path = Path(path)
    return parse_json(_read_bytes(path, max_bytes), str(path))


def read_json_lines(path: str | os.PathLike, *, max_bytes: int = MAX_JSON_BYTES) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of the JSON-lines file ``path``; a line
    that is not JSON is one ValueError naming the file and the line."""
    path = Path(path)
    for number, line in enumerate(_read_bytes(path, max_bytes).split(b"\n"), start=1):
        if line.strip():
            yield number, parse_json(line, f"{path} line {number}")
