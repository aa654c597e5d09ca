"""The documentation site builds with ``mkdocs build --strict`` (a broken docstring fails it), and
its API reference names every public module."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _public_modules() -> list[str]:
    out = []
    for path in sorted((ROOT / "posenc").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if "cli" in parts or any(p.startswith("_") for p in parts):
            continue  # the command line is documented by --help; private modules are not API
        out.append(".".join(parts))
    return out


def test_the_api_reference_names_every_public_module():
    pages = " ".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    missing = [m for m in _public_modules() if f"::: {m}\n" not in pages]
    assert not missing, f"modules without an API reference section in docs/api/: {missing}"


def _mkdocs() -> list[str] | None:
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        found = shutil.which("mkdocs")
        return None if found is None else [found]
    return [sys.executable, "-m", "mkdocs"]


def test_the_site_builds_strictly(tmp_path):
    command = _mkdocs()
    if command is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    done = subprocess.run([*command, "build", "--strict", "-q", "-d", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "seq" / "index.html").is_file()
