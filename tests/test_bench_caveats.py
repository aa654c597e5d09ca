"""Benches say when their settings are too small for the figures they print: one line on stderr
and ``"warnings"`` in the JSON."""

from __future__ import annotations

import json

import pytest

from posenc import cli
from posenc.cli.bench.attention import BASELINE, BenchResult, GrowthResult, Row
from posenc.cli.bench.caveats import CHANCE_MARGIN, MIN_TIMING_MS, at_chance, falling_growth, few_rounds, short_timing
from posenc.cli.bench.resolution import direction, summarize, warnings_of


def test_the_rules():
    assert few_rounds(5, 1, advice="a") is None and "2 timed rounds after 1" in few_rounds(2, 1, advice="a")
    assert short_timing("x", MIN_TIMING_MS, advice="a") is None and short_timing("x", None, advice="a") is None
    assert "0.50 ms, below" in short_timing("x", 0.5, advice="raise --seq-len")
    assert falling_growth("rope", [1, 2, 4], [1.0, 2.0, 3.9], advice="a") is None
    assert "T=4 faster than T=1" in falling_growth("rope", [1, 2, 4], [1.0, 1.5, 0.9], advice="a")
    assert at_chance("peg", 0.1 + CHANCE_MARGIN, 0.1, advice="a") is None
    assert "within 10 points of chance" in at_chance("peg", 0.15, 0.1, advice="a")


def _result(seq_len: int, base_ms: float, rope_ms: float) -> BenchResult:
    rows = [Row(BASELINE, "torch", ms=base_ms), Row("rope", "posenc", ms=rope_ms)]
    return BenchResult({"seq_len": seq_len}, rows, [])


def test_attention_warns_about_sub_millisecond_timings_and_falling_growth():
    assert _result(1024, 40.0, 50.0).warnings == []
    cold = BenchResult({"seq_len": 1024, "repeats": 1, "warmup": 0}, _result(1024, 40.0, 50.0).rows, [])
    assert len(cold.warnings) == 1 and "median of 1 timed round after 0 warm-up" in cold.warnings[0]
    fast = _result(128, 0.4, 0.5)
    assert len(fast.warnings) == 1 and "the baseline at T=128 takes 0.40 ms" in fast.warnings[0]
    assert fast.to_json()["warnings"] == fast.warnings
    growth = GrowthResult({}, [_result(128, 0.4, 0.6), _result(256, 0.9, 0.5)])
    warnings = growth.warnings
    assert len(warnings) == 2 and "time falls as T grows for rope" in warnings[1]
    assert growth.to_json()["warnings"] == warnings
    assert GrowthResult({}, [_result(1024, 40.0, 50.0), _result(2048, 80.0, 160.0)]).warnings == []


def test_bench_attention_prints_one_warning_line_and_writes_it_to_the_json(tmp_path, capsys):
    path = tmp_path / "a.json"
    argv = ["bench", "attention", "--seq-len", "16", "--batch", "1", "--heads", "2", "--head-dim", "8",
            "--encodings", "none", "--no-peers", "--linear-encodings", "off", "--repeats", "1", "--warmup", "0",
            "--no-progress", "--json", str(path)]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warned and "median of 1 timed round after 0 warm-up" in warned[0]
    assert json.loads(path.read_text())["warnings"] == [line.removeprefix("warning: ") for line in warned]


def test_resolution_at_chance_gives_no_kept_share_nor_verdict_and_says_so():
    def run(name, a32, a64):
        return {"encoding": name, "seed": 0, "accuracy": {"scale": {"32": a32, "64": a64}}}

    runs = [run("learned2d", 0.12, 0.16), run("peg", 0.9, 0.6), run("rope2d_mixed", 0.11, 0.2)]
    summary = summarize(runs, ["learned2d", "peg", "rope2d_mixed"], ["scale"], [32, 64], chance=0.1)
    assert summary["scale"]["learned2d"]["kept"] is None  # (0.16 - 0.1) / (0.12 - 0.1) would read "300%"
    assert summary["scale"]["peg"]["kept"] == pytest.approx((0.6 - 0.1) / (0.9 - 0.1))
    result = {"summary": summary, "sizes": [32, 64], "train_size": 32, "chance": 0.1}
    assert direction(result) == []  # the baseline learned2d is at chance: no verdict
    warnings = warnings_of(result)
    assert len(warnings) == 2 and warnings[0].startswith("learned2d (scale) at 32px: accuracy 12.0%")
    assert warnings[1].startswith("rope2d_mixed (scale)")
