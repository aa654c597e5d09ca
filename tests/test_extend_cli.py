"""``posenc extend RUN_DIR`` and ``posenc bench context-extension``: tiny runs end to end, and
every misuse exits 2 with one clear line."""

from __future__ import annotations

import json

import pytest

from posenc import cli

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4", "--no-progress"]


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "rope"
    argv = ["train", "seq", "--encoding", "rope", "--seq-len", "16", "--steps", "3", "--eval-tokens", "64",
            "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    return out


def test_extend_switches_fine_tunes_and_writes_its_own_results(rope_run, tmp_path, capsys):
    out = tmp_path / "yarn"
    argv = ["extend", str(rope_run), "--method", "yarn", "--factor", "2", "--finetune-steps", "2", "--eval-tokens", "64",
            "--option", "beta_fast=16", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    record = json.loads((out / "results.json").read_text())
    assert record["method"] == "yarn" and record["factor"] == 2.0 and record["original_max_len"] == 16
    assert record["options"] == {"beta_fast": 16} and record["finetune_len"] == 32
    assert set(record["zero_shot"]) == {"16", "32", "64"} and all(0 < v < 9 for v in record["finetuned"].values())
    assert record["zero_shot"] != record["before"]  # the switch changed the model
    assert (out / "checkpoint.pt").is_file()
    assert "yarn x2" in capsys.readouterr().out
    assert cli.main(argv) == 2  # never over a previous result
    assert "already holds results.json" in capsys.readouterr().err


def test_method_none_reproduces_the_run(rope_run, tmp_path):
    out = tmp_path / "none"
    assert cli.main(["extend", str(rope_run), "--method", "none", "--eval-lens", "16,48", "--eval-tokens", "64",
                     "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "results.json").read_text())
    assert record["zero_shot"] == record["before"] and record["finetuned"] is None


def test_extend_refuses_what_it_cannot_extend(rope_run, tmp_path, capsys):
    task = tmp_path / "task"
    assert cli.main(["train", "seq", "--encoding", "rope", "--task", "copy", "--length", "3", "--steps", "1",
                     "--eval-examples", "4", "--out", str(task), *TINY]) == 0
    alibi = tmp_path / "alibi"
    assert cli.main(["train", "seq", "--encoding", "alibi", "--seq-len", "16", "--steps", "1", "--eval-tokens", "32",
                     "--out", str(alibi), *TINY]) == 0
    capsys.readouterr()
    cases = [
        ([str(task), "--method", "yarn"], "not a text run"),
        ([str(alibi), "--method", "yarn"], "has no rotary layer"),
        ([str(tmp_path / "missing"), "--method", "yarn"], "must be a directory of posenc train seq --out"),
        ([str(rope_run), "--method", "linear", "--factor", "0.5", "--out", str(tmp_path / "x")], "factor must be"),
        ([str(rope_run), "--method", "linear", "--option", "beta_fast=3", "--out", str(tmp_path / "y")], "unknown option"),
        ([str(rope_run), "--method", "rotate"], "invalid choice"),
    ]
    for argv, needle in cases:
        assert cli.main(["extend", *argv, "--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert "error" in err and needle in err, (argv, err)


def test_context_extension_bench_writes_table_json_and_png(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "context-extension", "--steps", "2", "--finetune-steps", "1", "--dim", "16", "--heads", "2",
            "--depth", "1", "--batch-size", "4", "--eval-lens", "16,32", "--train-len", "16", "--eval-tokens", "64",
            "--methods", "none,pi,yarn,longrope", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    data = json.loads((out / "context_extension.json").read_text())
    assert [r["method"] for r in data["results"]] == ["none", "linear", "yarn", "longrope"]
    assert data["config"]["factor"] == 2.0
    for r in data["results"]:
        assert set(r["zero_shot"]) == set(r["finetuned"]) == {"16", "32"}
    assert (out / "context_extension.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "raw extrapolation" in (out / "context_extension.txt").read_text()
    assert cli.main(["bench", "context-extension", "--methods", "none,rotate"]) == 2
    assert "--methods: method must be one of" in capsys.readouterr().err
