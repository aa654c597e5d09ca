"""A reader for the UEA/UCR ``.ts`` time-series format, in plain Python and numpy.

The format (https://www.timeseriesclassification.com, sktime's ``load_from_tsfile``):

* ``#`` (and ARFF-style ``%``) lines are comments; blank lines are skipped.
* A header of ``@key value`` lines (keys are case-insensitive): ``@problemName``,
  ``@timeStamps true|false``, ``@missing true|false``, ``@univariate true|false``,
  ``@dimensions N``, ``@equalLength true|false``, ``@seriesLength N``,
  ``@classLabel true <label> <label> ...`` or ``@classLabel false``, ``@targetLabel true|false``
  (regression), then ``@data``.
* After ``@data`` one case per line: its dimensions separated by ``:``, the values of a
  dimension by ``,``, and the class label (or regression target) as the last ``:`` field.
  ``?`` is a missing value (read as NaN). Cases may differ in length (``@equalLength false``);
  within one case a shorter dimension is padded with NaN to the longest.

Read strictly, so that nothing is silently changed on the way in: a value is a plain decimal
number in ASCII (``1``, ``-2.5``, ``.5``, ``3e-4``) that is finite in float32 (``inf``, ``1e999``
or ``1e39`` would be stored as infinity; ``1_000`` and non-ASCII digits, which Python's ``float``
accepts, are refused too); ``?`` (or ``NaN``) only under ``@missing true``; header integers are
ASCII digits. The file is decoded as UTF-8 (``encoding=`` for another), strictly: a byte that
does not decode is an error naming its line rather than a replacement character (which would
merge two different labels into one class); a leading byte-order mark is skipped.
Time-stamped files (``@timeStamps true``) are refused with a clear error. Any malformed line
raises :class:`TsFormatError`, whose message starts with ``<file>:<line>:``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

_BOOL_KEYS = ("timestamps", "missing", "univariate", "equallength", "targetlabel")
_INT_KEYS = ("dimensions", "serieslength")
_KNOWN_KEYS = _BOOL_KEYS + _INT_KEYS + ("problemname", "classlabel", "data")
# A plain decimal number, ASCII only: Python's float() also takes "1_000", "inf", "nan" and
# non-ASCII digits, none of which the format has.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[0-9]+")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class TsFormatError(ValueError):
    """A malformed ``.ts`` file: the message names the file and the line."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}")
        self.source, self.line = source, line


@dataclass
class TsData:
    """The contents of one ``.ts`` file.

    Attributes:
        series: one float32 array ``[C, T_i]`` per case (``T_i`` may differ; NaN = missing).
        labels: the class label of each case as written (strings), or None without labels.
        targets: the regression target of each case (``@targetLabel true``), or None.
        class_labels: the labels the header declares (``@classLabel true ...``), or None.
        problem_name: ``@problemName``, or None.
        header: every header value by lower-case key (booleans and integers parsed).
    """

    series: list[np.ndarray]
    labels: list[str] | None = None
    targets: np.ndarray | None = None
    class_labels: list[str] | None = None
    problem_name: str | None = None
    header: dict = field(default_factory=dict)

    @property
    def num_channels(self) -> int:
        return self.series[0].shape[0] if self.series else 0

    @property
    def lengths(self) -> np.ndarray:
        return np.array([s.shape[1] for s in self.series], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.series)


def _parse_bool(source: str, line_no: int, key: str, value: str) -> bool:
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise TsFormatError(source, line_no, f"@{key} must be true or false; got {value.strip()!r}")
    return v == "true"


def _parse_number(source: str, line_no: int, tok: str, what: str, hint: str = "") -> float:
    """``tok`` as a finite number that float32 holds, or a TsFormatError naming ``what``."""
    if not _NUMBER.fullmatch(tok):
        raise TsFormatError(source, line_no, f"{what}: {tok!r} is not a number (a plain ASCII decimal such as -2.5e3{hint})")
    value = float(tok)
    if not abs(value) <= _FLOAT32_MAX:
        raise TsFormatError(source, line_no, f"{what}: {tok} is outside the float32 range (|x| <= 3.4e38)")
    return value


def _parse_values(source: str, line_no: int, text: str, dim: int, missing: bool | None) -> np.ndarray:
    values = []
    for tok in text.split(","):
        tok = tok.strip()
        if tok == "?" or tok.lower() == "nan":
            if not missing:
                declared = "@missing false" if missing is False else "no @missing true in the header"
                raise TsFormatError(source, line_no, f"dimension {dim}: a missing value {tok!r} with {declared}")
            values.append(np.nan)
            continue
        if tok.startswith("("):
            raise TsFormatError(source, line_no, "time-stamped values '(t,v)' are not supported (@timeStamps true)")
        values.append(_parse_number(source, line_no, tok, f"dimension {dim}", "; '?' for a missing value"))
    return np.asarray(values, dtype=np.float64)


def read_ts_lines(lines: Iterable[str], source: str = "<string>") -> TsData:
    """Parse ``.ts`` content given as lines; ``source`` names it in errors."""
    header: dict = {}
    class_labels: list[str] | None = None
    has_labels = has_targets = False
    in_data = False
    series: list[np.ndarray] = []
    labels: list[str] = []
    targets: list[float] = []
    dims: int | None = None
    line_no = 0
    for line_no, raw in enumerate(lines, start=1):
        if line_no == 1:
            raw = raw.removeprefix("\ufeff")  # a UTF-8 byte-order mark (Windows editors write one)
        line = raw.strip()
        if not line or line.startswith(("#", "%")):
            continue
        if not in_data:
            if not line.startswith("@"):
                raise TsFormatError(source, line_no, f"expected a header line '@key value' before @data; got {line[:40]!r}")
            key, _, value = line[1:].partition(" ")
            key = key.lower()
            if key not in _KNOWN_KEYS:
                raise TsFormatError(source, line_no, f"unknown header key @{key}")
            if key == "data":
                in_data = True
                dims = header.get("dimensions")
                if header.get("univariate") and dims not in (None, 1):
                    raise TsFormatError(source, line_no, f"@univariate true contradicts @dimensions {dims}")
                if header.get("univariate"):
                    dims = 1
                if header.get("timestamps"):
                    raise TsFormatError(source, line_no, "time-stamped files (@timeStamps true) are not supported")
                if has_labels and has_targets:
                    raise TsFormatError(source, line_no, "@classLabel true and @targetLabel true cannot both be set")
            elif key in _BOOL_KEYS:
                header[key] = _parse_bool(source, line_no, key, value)
                has_targets = has_targets or (key == "targetlabel" and header[key])
            elif key in _INT_KEYS:
                if not _INTEGER.fullmatch(value.strip()):
                    raise TsFormatError(source, line_no, f"@{key} must be an integer; got {value.strip()!r}")
                header[key] = int(value.strip())
                if header[key] <= 0:
                    raise TsFormatError(source, line_no, f"@{key} must be positive; got {header[key]}")
            elif key == "problemname":
                header[key] = value.strip()
            elif key == "classlabel":
                parts = value.split()
                if not parts:
                    raise TsFormatError(source, line_no, "@classLabel needs true (followed by the labels) or false")
                has_labels = _parse_bool(source, line_no, key, parts[0])
                if has_labels:
                    if len(parts) < 2:
                        raise TsFormatError(source, line_no, "@classLabel true must list the class labels")
                    class_labels = parts[1:]
                elif len(parts) > 1:
                    raise TsFormatError(source, line_no, "@classLabel false takes no labels")
                header[key] = has_labels
            continue

        fields = line.split(":")
        label = None
        if has_labels or has_targets:
            if len(fields) < 2:
                raise TsFormatError(source, line_no, "expected the series followed by ':<label>'")
            label = fields.pop().strip()
            if not label:
                raise TsFormatError(source, line_no, "the class label is empty")
        if dims is None:
            dims = len(fields)  # no @dimensions: the first case decides
        if len(fields) != dims:
            raise TsFormatError(source, line_no, f"expected {dims} dimension(s) separated by ':'; got {len(fields)}")
        channels = []
        for d, text in enumerate(fields):
            if not text.strip():
                raise TsFormatError(source, line_no, f"dimension {d} is empty (an empty series)")
            channels.append(_parse_values(source, line_no, text, d, header.get("missing")))
        length = max(len(c) for c in channels)
        if header.get("equallength") and header.get("serieslength") and length != header["serieslength"]:
            raise TsFormatError(
                source, line_no, f"@equalLength true with @seriesLength {header['serieslength']}, but this case has length {length}"
            )
        case = np.full((dims, length), np.nan, dtype=np.float32)
        for d, c in enumerate(channels):
            case[d, : len(c)] = c
        if has_labels:
            if class_labels is not None and label not in class_labels:
                raise TsFormatError(source, line_no, f"class label {label!r} is not among the declared {class_labels}")
            labels.append(label)
        elif has_targets:
            targets.append(_parse_number(source, line_no, label, "the regression target"))
        series.append(case)
    if not in_data:
        raise TsFormatError(source, line_no, "no @data line: not a .ts file")
    if not series:
        raise TsFormatError(source, line_no, "no cases after @data")
    if header.get("equallength") and len({s.shape[1] for s in series}) > 1:
        raise TsFormatError(source, line_no, "@equalLength true, but the cases differ in length")
    return TsData(
        series=series,
        labels=labels if has_labels else None,
        targets=np.asarray(targets, dtype=np.float64) if has_targets else None,
        class_labels=class_labels,
        problem_name=header.get("problemname"),
        header=header,
    )


def _decoded_lines(f, source: str, encoding: str):
    """The lines of the binary file ``f`` decoded strictly: a line that does not decode is a
    TsFormatError naming it and the byte (a replacement character would merge labels)."""
    for line_no, raw in enumerate(f, start=1):
        try:
            yield raw.decode(encoding)
        except UnicodeDecodeError as exc:
            byte = raw[exc.start : exc.start + 1].hex()
            raise TsFormatError(
                source, line_no, f"byte 0x{byte} at column {exc.start + 1} is not valid {encoding}; re-save the file "
                f"as UTF-8, or pass its encoding (read_ts(path, encoding='latin-1'))"
            ) from None


def read_ts(path: str | os.PathLike, encoding: str = "utf-8") -> TsData:
    """Read a ``.ts`` file (UTF-8 unless ``encoding`` says otherwise, decoded strictly; a leading
    byte-order mark is skipped). Raises :class:`TsFormatError` on malformed content and
    FileNotFoundError for a missing file."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        return read_ts_lines(_decoded_lines(f, path, encoding), source=path)


def read_ts_text(text: str, source: str = "<string>") -> TsData:
    """Parse ``.ts`` content from a string."""
    return read_ts_lines(text.splitlines(), source=source)
