"""Every command-line misuse is one line on stderr and exit status 2: no traceback, no usage
dump, nothing trained or written first."""

from __future__ import annotations

import os
import subprocess
import sys


from posenc.cli import main


def _misuses(tmp: str) -> list[tuple[list[str], str]]:
    full = os.path.join(tmp, "full")
    return [
        (["bogus"], "invalid choice: 'bogus'"),
        (["train", "seq", "--encoding", "rope", "--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
        (["train", "seq", "--encoding", "rope", "--lr", "nan"], "argument --lr: expected a positive number, got 'nan'"),
        (["train", "seq", "--encoding", "rope", "--batch-size", "1e6"], "argument --batch-size: expected a positive integer"),
        (["train", "seq", "--encoding", "rope", "--dim", "30", "--heads", "4"], "--dim (30) must be divisible by --heads (4)"),
        (["train", "seq", "--encoding", "lap"], "'lap' is a graph encoding; the causal LM takes seq encodings"),
        (["train", "seq", "--encoding", "rope", "--resume"], "--resume needs --out"),
        (["train", "seq", "--encoding", "rope", "--out", os.path.join(tmp, "a_file")], "exists and is not a directory"),
        (["train", "seq", "--encoding", "rope", "--out", full], "already holds files"),
        (["train", "seq", "--encoding", "rope", "--seed", "-1"], "argument --seed: expected a seed in [0, 2**32)"),
        (["train", "seq", "--encoding", "rope", "--device", "bogus"], "argument --device: expected auto, cpu, cuda, cuda:N, mps or xpu, got 'bogus'"),
        (["train", "vision", "--encoding", "erpe"], "'erpe' is a timeseries encoding; a ViT takes vision or seq encodings"),
        (["train", "vision", "--encoding", "alibi"], "'alibi' is defined for causal attention only; a ViT attends both ways"),
        (["train", "graph", "--dataset", "csl", "--encoding", "rope"], "'rope' is a seq encoding; the GPS graph transformer"),
        (["train", "graph", "--dataset", os.path.join(tmp, "missing.pt"), "--encoding", "none"], "does not exist"),
        (["train", "graph", "--dataset", "csl", "--dataset-module", "x:y", "--encoding", "none"], "not allowed with"),
        (["train", "timeseries", "--encoding", "alibi"], "'alibi' is defined for causal attention only"),
        (["train", "timeseries", "--encoding", "lap"], "'lap' is a graph encoding; the ConvTran classifier takes"),
        (["train", "timeseries", "--threads", "-1"], "argument --threads: expected a non-negative integer"),
        (["demo", "--out", full], "already holds files"),
        (["train", "seq", "--encoding", "rope", "--task", "copy", "--length", "100000"], "--length 100000: the run"),
        (["train", "seq", "--encoding", "rope", "--dim", "100000000"], "(lower --dim, or add --allow-large"),
        (["train", "vision", "--encoding", "peg", "--img-size", "4096"], "(lower --img-size, or add --allow-large"),
        (["train", "seq", "--encoding", "rope", "--task", "copy", "--length", "3", "--lr", "1e30", "--steps", "20",
          "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4", "--no-progress", "--eval-examples", "4"],
         "training diverged: training loss is nan"),
    ]


def test_each_misuse_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "metrics.jsonl").write_text("{}\n")
    for argv, needle in _misuses(str(tmp_path)):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (argv, captured.err)
        assert "Traceback" not in captured.err and captured.out == "", argv
    assert (tmp_path / "full" / "metrics.jsonl").read_text() == "{}\n"  # untouched


def test_a_graph_run_prints_no_third_party_warning(tmp_path):
    argv = [sys.executable, "-m", "posenc.cli", "train", "graph", "--dataset", "csl", "--encoding", "none", "--steps", "1",
            "--csl-per-class", "3", "--csl-test-per-class", "1", "--batch-size", "4", "--dim", "8", "--depth", "1",
            "--heads", "2", "--no-progress"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "warn" not in done.stderr.lower(), done.stderr
