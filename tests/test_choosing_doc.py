"""docs/choosing.md rests on committed results: every link it gives reaches a file of the
repository, and every row of its guides either cites a result under results/ or says there is no
evidence yet and names the command that would produce it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "choosing.md"
LINK = re.compile(r'href="([^"]+)"|\]\(([^)#\s]+)\)')
COMMAND = re.compile(r"`(posenc |python scripts/|mkdir -p results/[^`]*python scripts/|for e in )")


def _links(text: str) -> list[str]:
    return [a or b for a, b in LINK.findall(text)]


def _guide_rows(text: str) -> list[list[str]]:
    """The body rows of the "if you need | use | rests on | how sure" tables, split into cells."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("| if you need |"):
            inside = True
        elif not line.startswith("|"):
            inside = False
        elif inside and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def test_every_link_of_the_guide_reaches_a_file():
    links = [t for t in _links(PAGE.read_text()) if not t.startswith("http")]
    assert any(t.startswith("../results/") for t in links)
    missing = [t for t in links if not (PAGE.parent / t).resolve().exists()]
    assert not missing, f"docs/choosing.md links to missing files: {missing}"


def test_every_row_cites_a_result_or_the_command_that_would_give_one():
    rows = _guide_rows(PAGE.read_text())
    assert len(rows) >= 30
    for row in rows:
        assert len(row) == 4, row
        text = " ".join(row)
        if "no evidence yet" in row[1]:
            assert COMMAND.search(text) or "needs a memory column" in text, f"no command for: {row[0]}"
        else:
            cites = any(t.startswith("../results/") for t in _links(text)) or re.search(r"\[[SV]\d\]", text)
            assert cites or "by construction" in text, f"no result cited for: {row[0]}"
