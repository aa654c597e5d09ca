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
