"""One writer for every file a ``posenc`` command writes, and one check of ``--out`` before work.

:func:`out_error` runs before anything is built: the run directory is made (a parent that is a
file, a directory that cannot be created or written into is one line naming ``--out``), and the
files the command will write must not be there as symbolic links (planted, or dangling: a write
would land where the link points) nor as anything but plain files. :func:`write_file`,
:func:`write_json_file` and :func:`save_figure` (a plot, rendered in memory first) are the only
ways a command writes: each refuses a name that is a path, a link in its place and a directory
that resolves elsewhere, then writes atomically (a temporary file beside it renamed over it, so
a link placed during the run is replaced, never followed).
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from ..training.report import write_atomic, write_json


class OutputRefused(ValueError):
    """A file a command would write is not a plain file inside its run directory."""


def _strerror(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def out_error(out: str | os.PathLike | None, names: Iterable[str] = (), *, flag: str = "--out",
              create: bool = True) -> str | None:
    """Why ``out`` cannot take the command's files ``names``, in one line naming ``flag``, or None.
    With ``create`` the directory is made here (so that a directory that cannot be made is found
    before any work); a probe file tells whether it can be written into (root included)."""
    if out is None:
        return None
    path = Path(out)
    shown = str(out)
    if path.is_symlink():
        return f"{flag} {shown!r} is a symbolic link; give the directory itself"
    if path.exists() and not path.is_dir():
        return f"{flag} {shown!r} exists and is not a directory"
    ancestor = path.absolute()
    while not ancestor.exists():
        if ancestor.is_symlink():  # dangling link on the way
            return f"{flag} {shown!r}: {str(ancestor)!r} is a dangling symbolic link"
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{flag} {shown!r}: {str(ancestor)!r} is a file, not a directory"
    for name in names:
        target = path / name
        if target.is_symlink():
            return (f"{flag} {shown!r} holds {name} as a symbolic link (to {os.readlink(target)!r}); a run never writes "
                    "through a link: remove it, or choose another directory")
        if target.exists() and not target.is_file():
            return f"{flag} {shown!r} holds {name}, which is not a plain file; remove it, or choose another directory"
    if not create:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{flag} {shown!r} cannot be created: {_strerror(exc)}"
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"{flag} {shown!r} is not writable: {_strerror(exc)}"
    return None


def _target(out: str | os.PathLike, name: str) -> Path:
    """``out/name`` if writing there stays inside ``out``; :class:`OutputRefused` otherwise."""
    if not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise OutputRefused(f"output name {name!r} must be a plain file name inside the run directory")
    directory = Path(out)
    if directory.is_symlink():
        raise OutputRefused(f"{directory} is a symbolic link; a run writes only into the directory itself")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    if target.is_symlink():
        raise OutputRefused(f"{target} is a symbolic link (to {os.readlink(target)!r}); a run never writes through a "
                            "link")
    if target.exists() and not target.is_file():
        raise OutputRefused(f"{target} exists and is not a plain file")
    if os.path.realpath(target.parent) != os.path.realpath(directory):  # pragma: no cover - a plain name stays
        raise OutputRefused(f"{target} resolves outside {directory}")
    return target


def write_file(out: str | os.PathLike, name: str, data: bytes | str) -> Path:
    """Write ``data`` (text as UTF-8) as ``out/name``, atomically; see the module docstring."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return write_atomic(_target(out, name), lambda f: f.write(payload))


def write_json_file(out: str | os.PathLike, name: str, data: Any) -> Path:
    """``data`` as indented JSON (NaN and infinities as ``null``) in ``out/name``."""
    return write_json(_target(out, name), data)


def save_figure(fig, out: str | os.PathLike, name: str, **savefig: Any) -> Path:
    """A matplotlib figure as ``out/name`` (rendered in memory, then :func:`write_file`)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=savefig.pop("format", Path(name).suffix.lstrip(".") or "png"), **savefig)
    return write_file(out, name, buffer.getvalue())


__all__ = ["OutputRefused", "out_error", "save_figure", "write_file", "write_json_file"]
