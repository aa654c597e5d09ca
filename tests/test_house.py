"""The house rules, read from the source: ``common`` and ``training`` import no modality, and no
modality imports another (shared primitives live in ``common``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "posenc"
MODALITIES = ("seq", "vision", "graph", "timeseries")


def _posenc_imports(path: Path) -> set[str]:
    """The ``posenc`` subpackages a file imports (absolute or relative), e.g. {"common", "seq"}."""
    package = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]  # ("posenc", "seq")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                parts = base + (node.module.split(".") if node.module else [])
                if not node.module:  # from .. import x: x may itself be a subpackage
                    parts = base + [node.names[0].name]
            else:
                parts = (node.module or "").split(".")
            if parts[:1] == ["posenc"] and len(parts) > 1:
                found.add(parts[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "posenc" and len(parts) > 1:
                    found.add(parts[1])
    return found


@pytest.mark.parametrize("package", ["common", "training"])
def test_the_core_and_the_trainer_import_no_modality(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _posenc_imports(path) & set(MODALITIES)
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}"


@pytest.mark.parametrize("modality", MODALITIES)
def test_no_modality_imports_another(modality):
    for path in sorted((ROOT / modality).rglob("*.py")):
        bad = _posenc_imports(path) & (set(MODALITIES) - {modality})
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}"


def test_the_reader_sees_relative_imports():
    assert _posenc_imports(ROOT / "seq" / "models.py") >= {"common"}
    assert "training" in _posenc_imports(ROOT / "timeseries" / "classify.py")


def test_import_posenc_is_lazy_and_the_registry_still_sees_every_modality():
    import subprocess
    import sys

    code = (
        "import sys, posenc\n"
        "assert 'timm' not in sys.modules and 'posenc.vision' not in sys.modules and 'posenc.graph' not in sys.modules\n"
        "names = {i.modality for i in posenc.available()}\n"
        "assert names == {'seq', 'vision', 'graph', 'timeseries'}, names\n"
        "assert 'timm' not in sys.modules  # the vision encodings need no timm; its integration loads on use\n"
        "assert posenc.seq.CausalLM and posenc.vision.replace_position_encoding\n"
        "assert 'timm' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("package, other", [("train", "bench"), ("bench", "train")])
def test_train_and_bench_never_import_each_other(package, other):
    """They share posenc.options, posenc.argtypes and posenc.report instead."""
    for path in sorted((ROOT / package).rglob("*.py")):
        assert other not in _posenc_imports(path), f"{path.relative_to(ROOT.parent)} imports posenc.{other}"


@pytest.mark.parametrize("package", ["common", "training", *MODALITIES])
def test_the_library_never_imports_the_command_line(package):
    command_line = {"cli", "train", "bench", "demo", "demo_parts", "options", "argtypes"}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _posenc_imports(path) & command_line
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}"
