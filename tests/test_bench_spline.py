"""``posenc bench spline``: a tiny run writes the table, JSON and PNG; bad input exits 2."""

from __future__ import annotations

import json

import pytest
import torch

from posenc import cli
from posenc.cli.bench.spline import DEFAULT_MODELS

TINY = ["--steps", "2", "--dim", "16", "--depth", "2", "--heads", "2", "--batch-size", "4", "--length", "8",
        "--eval-curves", "6", "--control-points", "4", "--no-progress"]


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    assert torch.get_num_threads() == before  # the bench restores torch's thread count


def test_tiny_run_writes_table_json_and_png(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bench", "spline", *TINY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "spline.json").read_text())
    assert data["metric"] == "mse" and data["config"]["length"] == 8 and data["config"]["scales"] == [1, 2, 4]
    assert [r["model"] for r in data["results"]] == list(DEFAULT_MODELS)
    params = [r["params"] for r in data["results"]]
    assert max(params) - min(params) <= 16  # same skeleton: the baselines' query vector (dim 16) at most
    for r in data["results"]:
        assert set(r["mse"]) == {"1", "longer", "finer"}
        assert set(r["mse"]["longer"]) == set(r["mse"]["finer"]) == {"2", "4"}
        assert all(v >= 0 for v in [r["mse"]["1"], *r["mse"]["longer"].values(), *r["mse"]["finer"].values()])
    # the reference: each curve's variance, per coordinate (about 0.35 for these curves at 8 points)
    assert 0.1 < data["mean_point_mse"]["1"] < 1.0
    table = (out / "spline.txt").read_text()
    assert table.splitlines()[0] in printed
    header = table.splitlines()[1].split()
    assert header[:3] == ["model", "params", "1x"] and header[-1] == "train_s"
    assert "longer" in header and "finer" in header
    assert [line.split()[0] for line in table.splitlines()[3:8]] == [*DEFAULT_MODELS, "mean-point"]
    png = (out / "spline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_spline_encoder_variant_and_scales(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["bench", "spline", *TINY, "--models", "spline+sinusoidal,rope", "--scales", "1,3", "--out", str(out)]
    assert cli.main(argv) == 0
    data = json.loads((out / "spline.json").read_text())
    assert [r["kind"] for r in data["results"]] == ["spline, sinusoidal in the encoder only",
                                                     "positional autoencoder, rope encoding"]
    assert set(data["results"][0]["mse"]["longer"]) == {"3"}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--models", "spline,alibis"], "--models: 'alibis' is not 'spline', 'spline+ENCODING' nor a registered encoding (did you mean 'alibi'?)"),
        (["--models", "spline+nothing"], "'spline+nothing' is not 'spline', 'spline+ENCODING' nor a registered encoding"),
        (["--models", "alibi,alibi"], "--models: a name is repeated"),
        (["--models", "fire"], "--models fire: encoding 'fire' is defined for causal attention only"),
        (["--dim", "30", "--heads", "4"], "--dim (30) must be divisible by --heads (4)"),
        (["--control-points", "3"], "--control-points (3) must be at least --degree + 1 (4)"),
        (["--lr", "0"], "argument --lr: expected a positive number, got '0'"),
        (["--scales", "1,0"], "--scales"),
        (["--length", "0"], "--length"),
    ],
)
def test_bad_arguments_exit_2(argv, needle, capsys):
    assert cli.main(["bench", "spline", *argv]) == 2
    err = capsys.readouterr().err
    assert "error" in err and needle in err and "Traceback" not in err
