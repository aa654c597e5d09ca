"""Plain-text tables for the command line."""

from __future__ import annotations

from typing import Sequence


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
