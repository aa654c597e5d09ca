"""``posenc train seq``: argument errors exit 2, a tiny run writes checkpoints and resumes."""

from __future__ import annotations

import json

import pytest
import torch

from posenc import cli
from posenc.cli.train.seq import TASK_NAMES

from .cli_helpers import interrupted_at

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4", "--no-progress"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--encoding", "rotary"], "--encoding: unknown encoding 'rotary'"),
        (["--encoding", "rope", "--task", "parity"], "argument --task: invalid choice: 'parity' (choose from 'copy', 'reverse'"),
        (["--encoding", "rope", "--task", "copy", "--data", "x.txt"], "not allowed with argument"),
        (["--encoding", "rope", "--data", "/no/such/file.txt"], "--data: text file '/no/such/file.txt' does not exist"),
        (["--encoding", "rope", "--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
        (["--encoding", "rope", "--dim", "30", "--heads", "4"], "--dim (30) must be divisible by --heads (4)"),
        (["--encoding", "rope", "--resume"], "--resume needs --out"),
        (["--encoding", "rope", "--eval-lens", "8,x"], "--eval-lens"),
        (["--encoding", "rope", "--encoding-option", "base"], "--encoding-option"),
        (["--encoding", "none", "--encoding-option", "base=10"], "--encoding-option needs an encoding"),
        (["--steps", "3"], "--encoding"),
        (["--encoding", "sine_spe"], "sine_spe is defined for linear attention only"),
        (["--encoding", "alibi", "--feature-map", "elu"], "score bias of alibi cannot apply"),
        (["--encoding", "rope", "--feature-map", "relu"], "--feature-map"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, needle, capsys):
    assert cli.main(["train", "seq", *argv]) == 2
    err = capsys.readouterr().err
    assert "error" in err and needle in err


def test_bad_encoding_option_and_task_length_are_reported_as_errors(capsys):
    assert cli.main(["train", "seq", "--encoding", "rope", "--encoding-option", "bass=3", "--steps", "1", *TINY]) == 2
    assert "'rope' takes no option 'bass' (did you mean 'base'?)" in capsys.readouterr().err
    argv = ["train", "seq", "--encoding", "rope", "--task", "recall", "--length", "8", "--num-symbols", "10", *TINY]
    assert cli.main(argv) == 2
    assert "recall: length=16 pairs need distinct keys, but num_symbols=10" in capsys.readouterr().err


def test_task_run_checkpoints_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "seq", "--encoding", "alibi", "--task", "copy", "--length", "3", "--eval-examples", "8",
            "--out", str(out), *TINY]
    with interrupted_at(5):  # Ctrl-C after step 5; the checkpoint of step 4 stays
        assert cli.main([*base, "--steps", "6", "--checkpoint-every", "2"]) == 130
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 4 and ckpt["model_config"]["encoding"] == "alibi"
    # the same command again would clobber the run; more steps would change its schedule
    assert cli.main([*base, "--steps", "6", "--checkpoint-every", "2"]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert cli.main([*base, "--steps", "8", "--checkpoint-every", "2", "--resume"]) == 2
    assert "made with --steps 6, this one asks for 8" in capsys.readouterr().err
    assert cli.main([*base, "--steps", "6", "--checkpoint-every", "2", "--resume"]) == 0
    text = capsys.readouterr().out
    assert "exact match" in text and "alibi on task copy" in text
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 6
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # the line of step 5 (after the checkpoint) was dropped on resume and written again once
    assert [r["step"] for r in lines if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in lines if r["split"] == "eval"] == [6]
    result = json.loads((out / "results.json").read_text())
    assert result["metric"] == "exact_match" and set(result["eval"]) == {"3", "6", "12"}
    assert result["command"] == "train seq" and result["train_config"]["steps"] == 6
    assert set(result["metrics"]) == {"exact_match@3", "exact_match@6", "exact_match@12"}
    assert all(0 <= v <= 1 for v in result["eval"].values())


def test_text_run_on_a_user_file_with_options_and_sample(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    argv = ["train", "seq", "--encoding", "alibi", "--encoding-option", "symmetric=false", "--data", str(data),
            "--seq-len", "16", "--eval-lens", "16,32", "--eval-tokens", "64", "--steps", "3",
            "--sample-tokens", "5", "--out", str(tmp_path / "out"), *TINY]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "bits per byte" in text and "greedy sample" in text
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["metric"] == "bits_per_byte" and set(result["eval"]) == {"16", "32"} and len(result["sample"]) >= 64
    assert all(0 < v < 9 for v in result["eval"].values())


def test_linear_attention_run_records_its_feature_map(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "seq", "--encoding", "conv_spe", "--feature-map", "elu", "--task", "copy", "--length", "3",
            "--eval-examples", "4", "--steps", "2", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    config = json.loads((out / "results.json").read_text())["model_config"]
    assert config["feature_map"] == "elu" and config["encoding"] == "conv_spe"


def test_task_names_on_the_command_line_are_the_tasks():
    from posenc.seq.tasks import TASKS

    assert TASK_NAMES == tuple(TASKS)
