"""``posenc bench resolution``: a tiny run writes the table, JSON and plot; the summary and the
direction check follow the numbers; bad arguments exit 2."""

from __future__ import annotations

import json

import pytest

from posenc.cli.bench.resolution import direction, summarize
from posenc.cli import main


def test_tiny_resolution_bench_writes_table_json_and_png(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["bench", "resolution", "--encodings", "learned2d,peg", "--steps", "2", "--dim", "16", "--depth", "1",
            "--heads", "2", "--repeats", "1", "--batch-size", "32", "--scales", "1,2", "--seeds", "0,1",
            "--no-progress", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "scale@32" in printed and "scale@64" in printed and "grow@64" in printed
    assert "\nlearned2d " in printed and "\npeg " in printed and "+-" in printed  # two seeds: a spread
    result = json.loads((out / "resolution.json").read_text())
    assert result["sizes"] == [32, 64] and result["modes"] == ["scale", "grow"]
    assert [(r["encoding"], r["seed"]) for r in result["runs"]] == [("learned2d", 0), ("peg", 0), ("learned2d", 1), ("peg", 1)]
    for r in result["runs"]:
        for mode in ("scale", "grow"):
            assert set(r["accuracy"][mode]) == {"32", "64"}
            assert all(0 <= v <= 1 for v in r["accuracy"][mode].values())
    # at the training size both modes test the very same images
    assert all(r["accuracy"]["scale"]["32"] == r["accuracy"]["grow"]["32"] for r in result["runs"])
    assert (out / "resolution.png").stat().st_size > 5000


def test_summary_and_direction_follow_the_measured_numbers():
    def run(name, seed, a32, a64):
        return {"encoding": name, "seed": seed, "accuracy": {"scale": {"32": a32, "64": a64}}}

    runs = [run("learned2d", 0, 0.9, 0.5), run("learned2d", 1, 0.8, 0.5), run("peg", 0, 0.9, 0.8),
            run("peg", 1, 0.9, 0.6), run("rope2d_mixed", 0, 0.9, 0.2), run("rope2d_mixed", 1, 0.9, None)]
    summary = summarize(runs, ["learned2d", "peg", "rope2d_mixed"], ["scale"], [32, 64], chance=0.1)
    learned = summary["scale"]["learned2d"]
    assert learned["32"]["mean"] == pytest.approx(0.85) and learned["32"]["std"] == pytest.approx(0.0707, abs=1e-4)
    assert learned["change"] == pytest.approx(-0.35)
    assert learned["kept"] == pytest.approx((0.5 - 0.1) / (0.85 - 0.1))
    assert summary["scale"]["peg"]["change"] == pytest.approx(-0.2)
    assert summary["scale"]["peg"]["kept"] == pytest.approx((0.7 - 0.1) / (0.9 - 0.1))
    assert summary["scale"]["rope2d_mixed"]["64"]["mean"] is None  # a refused size is not averaged away
    result = {"summary": summary, "sizes": [32, 64], "train_size": 32, "chance": 0.1}
    lines = direction(result)
    assert lines == ["peg vs learned2d: at 64: 75% vs 53%, agrees"]  # rope2d_mixed refused 64: no verdict
    summary["scale"]["peg"]["64"]["mean"] = 0.4
    assert direction(result) == ["peg vs learned2d: at 64: 38% vs 53%, disagrees"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--encodings", "peg,rope4d"], "--encodings: unknown encoding 'rope4d'"),
        (["--encodings", "peg,sincos3d"], "--encodings: 'sincos3d' is a 3D (video) encoding"),
        (["--encodings", "peg,peg"], "names an encoding twice"),
        (["--img-size", "30"], "--img-size 30 is not divisible by --patch 4"),
        (["--scales", "1,1.1"], "--scales: 1.1 x --img-size 32 = 35 is not divisible by --patch 4"),
        (["--modes", "zoom"], "--modes: expected scale, grow or both; got 'zoom'"),
        (["--task", "where", "--img-size", "16"], "--task where needs --img-size >= --digit-size + 2"),
    ],
)
def test_resolution_bench_bad_arguments_exit_2(extra, message, capsys, tmp_path):
    assert main(["bench", "resolution", *extra, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
