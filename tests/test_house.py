"""The house rules, read from the source: ``common`` and ``training`` import no modality, the
parts several modalities share live in ``primitives``, which imports only ``common`` (and ``common``
never imports it), no modality imports another, the library never imports the
command line (``posenc/cli``) or the integrations (``posenc/integrations``), and inside the command
line ``train`` and ``bench`` never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "posenc"
MODALITIES = ("seq", "vision", "graph", "timeseries")


def _imported_names(path: Path) -> set[str]:
    """Every ``posenc`` name a file imports (absolute or relative, at the top or inside a function),
    absolute: in posenc/seq/alibi.py, ``from ..common.masks import AttentionMask`` is
    "posenc.common.masks.AttentionMask", ``from .. import vision`` is "posenc.vision", ``import
    posenc.graph`` is "posenc.graph". A name is a module or a name in one (the longest prefix that is)."""
    package = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]  # ("posenc", "seq")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                module = [*package[: len(package) - node.level + 1], *(node.module.split(".") if node.module else [])]
            else:
                module = node.module.split(".")
            found.update(".".join([*module, alias.name]) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "posenc"}


def _posenc_imports(path: Path, depth: int = 1) -> set[str]:
    """The ``posenc`` subpackages a file imports (absolute or relative), e.g. {"common", "seq"};
    with ``depth=2`` two levels deep, e.g. {"cli.bench", "training.report"}."""
    return {".".join(name.split(".")[1:1 + depth]) for name in _imported_names(path) if "." in name}


@pytest.mark.parametrize("package", ["common", "training"])
def test_the_core_and_the_trainer_import_no_modality(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _posenc_imports(path) & set(MODALITIES)
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}"


def test_the_primitives_import_only_the_core_and_the_core_never_imports_them():
    for path in sorted((ROOT / "primitives").rglob("*.py")):
        bad = _posenc_imports(path) - {"common", "primitives"}
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}"
    for path in sorted((ROOT / "common").rglob("*.py")):
        assert "primitives" not in _posenc_imports(path), f"{path.relative_to(ROOT.parent)} imports posenc.primitives"


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
    """They share posenc.cli.options, posenc.cli.argtypes and posenc.training.report instead."""
    for path in sorted((ROOT / "cli" / package).rglob("*.py")):
        imported = _posenc_imports(path, depth=2)
        assert f"cli.{other}" not in imported, f"{path.relative_to(ROOT.parent)} imports posenc.cli.{other}"


LIBRARY = ["common", "primitives", "training", *MODALITIES, "functional.py", "loading.py", "torch_attention.py"]


def _library_files(part: str) -> list[Path]:
    return [ROOT / part] if part.endswith(".py") else sorted((ROOT / part).rglob("*.py"))


@pytest.mark.parametrize("part", LIBRARY)
def test_the_library_never_imports_the_command_line_or_the_integrations(part):
    for path in _library_files(part):
        bad = _posenc_imports(path) & {"cli", "integrations"}
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}"


def test_the_integrations_never_import_the_command_line():
    for path in sorted((ROOT / "integrations").rglob("*.py")):
        assert "cli" not in _posenc_imports(path), f"{path.relative_to(ROOT.parent)} imports posenc.cli"


def test_the_package_root_holds_only_the_library_api():
    """The layers show in the layout: the root's loose modules are the library API; everything else
    lives in a folder (core, trainer, modalities, integrations, command line)."""
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert loose == ["__init__.py", "functional.py", "loading.py", "torch_attention.py"], loose
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(["cli", "common", "integrations", "primitives", "training", *MODALITIES]), folders


# the previous layout's paths, dropped in 0.1.0 (CHANGELOG.md) -> where each one lives now
OLD_PATHS = {"posenc.bench": "posenc.cli.bench", "posenc.train": "posenc.cli.train", "posenc.demo": "posenc.cli.demo",
             "posenc.demo_parts": "posenc.cli.demo", "posenc.argtypes": "posenc.cli.argtypes",
             "posenc.options": "posenc.cli.options", "posenc.report": "posenc.training.report",
             "posenc.common.report": "posenc.training.report", "posenc.common.plan": "posenc.common.planning",
             **{f"posenc.common.{name}": f"posenc.primitives.{name}"
                for name in ("rotary", "sinusoid", "spe", "shared_table", "derived")}}


@pytest.mark.parametrize("old, new", OLD_PATHS.items())
def test_old_import_paths_are_gone_the_changelog_names_them_and_the_new_ones_import(old, new):
    import importlib
    import sys

    import posenc

    assert not any(type(f).__module__.startswith(posenc.__name__) for f in sys.meta_path), "an import hook is back"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    changelog = (ROOT.parent / "CHANGELOG.md").read_text()
    assert f"`{old}`" in changelog and f"`{new}`" in changelog, f"CHANGELOG.md does not say {old} is now {new}"
    assert importlib.import_module(new).__name__ == new


def _module_name(path: Path) -> str:
    """posenc/seq/rope.py -> "posenc.seq.rope"; posenc/seq/__init__.py -> "posenc.seq"."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module under posenc -> the posenc modules it imports, at the top or inside a function
    (an imported name counts as the module that defines it)."""
    paths = {_module_name(path): path for path in ROOT.rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        targets = set()
        for name in _imported_names(path):
            while name not in paths:  # ends at "posenc" at the latest
                name = name.rpartition(".")[0]
            targets.add(name)
        graph[module] = targets - {module}
    return graph


def _an_import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, first module repeated at the end, or None when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            circle = visit(target)
            if circle:
                return circle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module)
        if circle:
            return circle
    return None


def test_no_import_circles():
    """No module imports, through any chain of imports, itself: every arrow points one way, and a
    shared piece lives in the module that owns it (not in a function-level import hiding the arrow)."""
    graph = _import_graph()
    # the reader sees function-level imports and names that are modules (``from . import x``)
    assert {"posenc.cli.bench.attention_units", "posenc.cli.bench.smithy_rows"} <= graph["posenc.cli.bench.attention"]
    assert "posenc.training.report" in graph["posenc.cli"]
    circle = _an_import_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_circle_finder_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _an_import_circle(graph) == ["a", "b", "c", "a"]
    assert _an_import_circle({"a": {"b"}, "b": set()}) is None


def test_the_shared_option_vocabulary_imports_no_modality():
    """posenc/cli/options.py is the vocabulary every command shares; what one model takes lives in
    posenc/cli/models (the ViT's grids, the ConvTran classifier's options)."""
    bad = _posenc_imports(ROOT / "cli" / "options.py") & set(MODALITIES)
    assert not bad, f"posenc/cli/options.py imports {sorted(bad)}"
