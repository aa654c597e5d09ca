"""``posenc tune``: it measures both backwards of a constant bias, keeps the faster per machine in
the tune file, and the plan then takes it; it refuses what it must not write."""

from __future__ import annotations

import json

import pytest
import torch

import posenc
from posenc.cli import main
from posenc.common.tuning import BIAS_BACKWARDS, machine_key

SMALL = ["tune", "--batch", "1", "--heads", "2", "--seq-len", "32", "--head-dim", "8", "--repeats", "1"]


def test_tune_writes_this_machines_choice_and_the_plan_takes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("POSENC_BIAS_BACKWARD", raising=False)
    path = tmp_path / "sub" / "tune.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"machines": {"another CPU": {"constant_bias_backward": "flash"}}}))
    # the key holds the thread count: measure with this process's, which the plan below runs with
    assert main([*SMALL, "--threads", str(torch.get_num_threads()), "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "flash" in out and "explicit" in out and "<- chosen" in out and str(path) in out
    record = json.loads(path.read_text())
    entry = record["machines"][machine_key()]
    assert entry["constant_bias_backward"] in BIAS_BACKWARDS and set(entry["median_ms"]) == set(BIAS_BACKWARDS)
    assert record["machines"]["another CPU"] == {"constant_bias_backward": "flash"}  # other machines kept
    monkeypatch.setenv("POSENC_TUNE_FILE", str(path))
    q, pos = torch.randn(1, 2, 16, 8, requires_grad=True), torch.arange(16)[None]
    plan = posenc.plan(q, q, q, q_pos=pos, kv_pos=pos, encoding=posenc.build("alibi", num_heads=2), mask=posenc.AttentionMask(causal=True))
    assert plan.bias_backward == entry["constant_bias_backward"] and "measured on this machine" in plan.reason
    assert "POSENC_BIAS_BACKWARD" not in __import__("os").environ  # the measurement put the variable back


def test_tune_dry_run_writes_nothing(tmp_path, capsys):
    assert main([*SMALL, "--dry-run", "--file", str(tmp_path / "tune.json")]) == 0
    assert not (tmp_path / "tune.json").exists()


def test_tune_refuses_a_link_a_foreign_file_and_an_absurd_size(tmp_path, capsys):
    target = tmp_path / "elsewhere.json"
    link = tmp_path / "tune.json"
    link.symlink_to(target)
    with pytest.raises(SystemExit, match="is a symbolic link; refusing"):
        main([*SMALL, "--file", str(link)])
    assert not target.exists()
    foreign = tmp_path / "notes.json"
    foreign.write_text('["a list"]')
    with pytest.raises(SystemExit, match="is not a posenc tune file"):
        main([*SMALL, "--file", str(foreign)])
    assert foreign.read_text() == '["a list"]'
    assert main(["tune", "--seq-len", "1000000", "--dry-run"]) == 2
    err = capsys.readouterr().err  # the size policy (posenc.cli.sizes) names the flag and the estimate
    assert "--seq-len 1000000: the run would need" in err and "--allow-large" in err
