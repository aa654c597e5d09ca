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
