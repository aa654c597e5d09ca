"""``posenc bench extrapolation``: a tiny run writes the table, JSON and PNG; bad input exits 2."""

from __future__ import annotations

import json

import pytest

import posenc
from posenc import cli
from posenc.cli.bench.extrapolation import DEFAULT_ENCODINGS

TINY = ["--steps", "3", "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4", "--no-progress"]
SEQ = {i.name for i in posenc.available("seq")}


def _run(tmp_path, capsys, *argv):
    out = tmp_path / "out"
    assert cli.main(["bench", "extrapolation", *argv, "--out", str(out), *TINY]) == 0
    return out, capsys.readouterr().out


def test_text_run_writes_table_json_and_png(tmp_path, capsys):
    out, printed = _run(tmp_path, capsys, "--encodings", "sinusoidal,alibi", "--train-len", "16",
                        "--eval-lens", "16,32,64", "--eval-tokens", "128")
    data = json.loads((out / "extrapolation.json").read_text())
    assert data["metric"] == "bits_per_byte"
    assert data["config"]["train_len"] == 16 and data["config"]["eval_lens"] == [16, 32, 64]
    assert [r["encoding"] for r in data["results"]] == ["sinusoidal", "alibi"]
    assert [r["hooks"] for r in data["results"]] == ["input", "score_bias"]
    for r in data["results"]:
        assert set(r["eval"]) == {"16", "32", "64"} and all(0 < v < 9 for v in r["eval"].values())
    table = (out / "extrapolation.txt").read_text()
    assert "bits per byte" in table and table in printed + "\n"
    header = table.splitlines()[1].split()
    assert header == ["encoding", "hooks", "@16", "@32", "@64", "train_s"]
    png = (out / "extrapolation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_task_run_reports_exact_match(tmp_path, capsys):
    out, printed = _run(tmp_path, capsys, "--encodings", "rope", "--task", "reverse", "--train-len", "3",
                        "--eval-lens", "3,6", "--eval-examples", "8")
    data = json.loads((out / "extrapolation.json").read_text())
    assert data["metric"] == "exact_match" and data["config"]["task"] == "reverse"
    assert all(0 <= v <= 1 for v in data["results"][0]["eval"].values())
    assert "exact match on task reverse" in printed


@pytest.mark.skipif("learned" not in SEQ, reason="learned absolute positions are not registered")
def test_learned_positions_are_na_past_their_table(tmp_path, capsys):
    out, printed = _run(tmp_path, capsys, "--encodings", "learned", "--train-len", "16", "--eval-lens", "16,32",
                        "--eval-tokens", "64")
    row = json.loads((out / "extrapolation.json").read_text())["results"][0]
    assert row["eval"]["16"] is not None and row["eval"]["32"] is None
    assert "n/a beyond its 16 positions" in row["note"] and "n/a" in printed


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--encodings", "rope,rotary"], "--encodings: unknown encoding 'rotary'"),
        (["--encodings", "rope,rope"], "--encodings: a name is repeated"),
        (["--encodings", "rope", "--task", "parity"], "--task: unknown task 'parity'"),
        (["--encodings", "rope", "--train-len", "0"], "--train-len"),
        (["--encodings", "rope", "--eval-lens", "128,x"], "--eval-lens"),
        (["--encodings", "rope", "--dim", "30", "--heads", "4"], "--dim (30) must be divisible by --heads (4)"),
        (["--encodings", "rope,alibi", "--feature-map", "elu"], "score bias of alibi cannot apply"),
        (["--encodings", "sine_spe"], "sine_spe is defined for linear attention only"),
        (["--encodings", "rope", "--feature-map", "relu"], "--feature-map"),
    ],
)
def test_bad_arguments_exit_2(argv, needle, capsys):
    assert cli.main(["bench", "extrapolation", *argv]) == 2
    err = capsys.readouterr().err
    assert "error" in err and needle in err


def test_default_encodings_are_the_issue_list_and_missing_ones_fail_up_front(capsys):
    assert DEFAULT_ENCODINGS == ("sinusoidal", "learned", "rope", "alibi", "t5", "kerple", "fire", "nope")
    missing = [n for n in DEFAULT_ENCODINGS if n not in SEQ]
    if not missing:
        pytest.skip("every default encoding is registered")
    assert cli.main(["bench", "extrapolation", "--steps", "1"]) == 2
    assert f"not registered: {', '.join(missing)}" in capsys.readouterr().err


def test_linear_attention_runs_with_spe_and_says_so(tmp_path, capsys):
    out, printed = _run(tmp_path, capsys, "--encodings", "none,conv_spe,sine_spe", "--feature-map", "favor",
                        "--task", "recall", "--train-len", "3", "--eval-lens", "3,6", "--eval-examples", "8")
    data = json.loads((out / "extrapolation.json").read_text())
    assert data["config"]["feature_map"] == "favor"
    assert [r["hooks"] for r in data["results"]] == ["-", "qk", "qk"]
    assert all(0 <= v <= 1 for r in data["results"] for v in r["eval"].values())
    assert "linear attention, feature map favor" in printed


def test_log_axis_ticks_read_distinct_numbers_even_on_a_narrow_range():
    from posenc.cli.bench.extrapolation import log_ticks

    ticks, labels = log_ticks(2.05, 2.09)
    assert len(set(labels)) == len(labels) == 5 and labels[0] == "2.05" and labels[-1] == "2.09"
    assert ticks[0] == 2.05 and abs(ticks[-1] - 2.09) < 1e-12
    assert all(b / a == pytest.approx(ticks[1] / ticks[0]) for a, b in zip(ticks, ticks[1:]))  # even on a log axis
    assert log_ticks(1.5, 4.6)[1] == ["1.5", "2.0", "2.6", "3.5", "4.6"]
    with pytest.raises(ValueError, match="0 < low <= high"):
        log_ticks(0.0, 1.0)
