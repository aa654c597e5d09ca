"""The README's Python example runs as written, and its two commands are the CI command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_examples_run():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks[:2]:  # the plan example, then the attention example
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)
        if "h_next" in namespace:
            break
    assert namespace["h_next"].shape == (1, 1, 512)
    assert namespace["y"].shape == (1, 1024, 512)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).strip().splitlines()
    assert len(first) == 2
    assert first[0].endswith("posenc demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert first[1] in ci


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_every_readme_python_block_runs_on_its_own():
    blocks = _blocks("python")
    assert len(blocks) >= 10
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), {})
        except Exception as exc:  # pragma: no cover - the message names the block
            raise AssertionError(f"README python block {i} fails: {type(exc).__name__}: {exc}\n{block}") from exc


def test_every_readme_posenc_command_is_a_valid_command_line():
    """Each ``posenc ...`` line of the README's shell blocks parses (command, options, values),
    without running the work; the torchrun lines start the same console script."""
    import shlex

    from posenc.cli import build_parser

    lines = [ln.split("  #")[0].strip() for block in _blocks("bash") for ln in block.splitlines()]
    commands = [ln for ln in lines if ln.startswith("posenc ")]
    assert len(commands) >= 20
    for line in commands:
        argv = shlex.split(line)[1:]
        args = build_parser(argv).parse_args(argv)
        assert callable(args.handler), line


def test_every_docs_page_python_block_runs():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert {p.stem for p in pages} >= {"training", "seq", "vision", "graph", "timeseries"}
    for page in pages:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)):
            try:
                exec(compile(block, f"{page.name} python block {i}", "exec"), {})
            except Exception as exc:  # pragma: no cover - the message names the block
                raise AssertionError(f"{page.name} python block {i} fails: {type(exc).__name__}: {exc}") from exc


def test_the_cpu_only_commands_are_the_two_commands_after_the_cpu_torch():
    """A machine without a GPU has its own pair: the CPU-only torch from PyTorch's wheel index under
    the pins of constraints.txt, then exactly commands 1 and 2 (CI keeps command 2 as it is)."""
    blocks = _blocks("bash")
    first, cpu = blocks[0].strip().splitlines(), blocks[1].strip().splitlines()
    step = ("python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt torch torchvision "
            "--index-url https://download.pytorch.org/whl/cpu && ")
    assert cpu == [line.replace("python3 -m venv .venv && ", step) for line in first]
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins


def test_the_readme_stands_alone():
    """Every link of the README points inside the repository, and the references page it names
    cites every registered encoding's paper."""
    from posenc.cli.catalog import names

    text = (ROOT / "README.md").read_text()
    assert "../" not in text and "shared/" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
    references = (ROOT / "docs" / "references.md").read_text()
    missing = [name for name in names() if f"`{name}`" not in references]
    assert not missing, f"docs/references.md does not describe {missing}"
    assert "mkdocs build --strict" in text


def test_importing_the_library_prints_no_warning():
    """Every modality and the PyG-based graph modules import with warnings as errors (PyG's import
    calls torch.jit.script, which warns on torch 2.14: posenc.graph.pyg imports it quietly)."""
    import subprocess
    import sys

    code = ("import posenc\n"
            "posenc.available()\n"
            "import posenc.graph.gps, posenc.graph.transforms, posenc.graph.datasets\n"
            "from posenc.graph import AddLaplacianPE, GPSLayer\n")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0 and not done.stderr, done.stderr
