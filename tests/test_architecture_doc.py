"""docs/architecture.md's "add an encoding in one file" runs as written, and the encoding it adds
is served by every CPU kernel path with the formula's values and a gradient for its width."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

CHECK = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    q = torch.randn(2, 4, 12, 8, dtype=torch.float64, requires_grad=True)
    enc = posenc.build("gaussian_bias_example", num_heads=4, width=3.0).double()
    i = torch.arange(12.0, dtype=torch.float64)
    d = i[:, None] - i[None, :]
    bias = -(d * d) / (2 * 3.0 ** 2)
    scores = (q @ q.transpose(-1, -2)) * 8 ** -0.5 + bias
    scores = scores.masked_fill(d < 0, float("-inf"))
    want = torch.softmax(scores, -1) @ q
    for backend in ("auto", "dense", "math"):
        enc.zero_grad()
        out = posenc.attend(q, q, q, q_pos=torch.arange(12), kv_pos=torch.arange(12), encoding=enc,
                            mask=causal, backend=backend)
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
        out.sum().backward()
        assert enc.log_width.grad is not None and enc.log_width.grad.abs().sum() > 0, backend
    assert "gaussian_bias_example" in {e.name for e in posenc.available()}
    print("CHECKED")
''')


def test_the_worked_example_adds_an_encoding_every_path_serves():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    # its own process: the example registers a name, which a second registration would refuse
    done = subprocess.run([sys.executable, "-c", blocks[0] + CHECK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "score bias off CUDA" in done.stdout and "CHECKED" in done.stdout
