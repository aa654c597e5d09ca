"""The attention benchmark at tiny sizes (no timing assertions), its CPU memory tracker, timing
loop and background load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import posenc
from posenc import cli
from posenc.cli.bench import attention as bench_attention
from posenc.cli.bench.attention import (
    BASELINE, DEFAULT_ENCODINGS, AttentionBenchConfig, BenchResult, GrowthResult, Row, candidates, config_from_args,
    encoding_names, render, render_growth, run_benchmark,
)
from posenc.cli.bench.load import background_load
from posenc.cli.bench.memory import MB, CPUPeakMemory, peak_memory_bytes, peak_of_events
from posenc.training.report import format_table
from posenc.cli.bench.timing import paired_ratio, time_interleaved

TINY = ["--seq-len", "32", "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1", "--warmup", "0"]
REQUIRED = {"name", "impl", "ms", "ratio", "peak_mb"}


def _check_row(row: dict) -> None:
    assert REQUIRED <= set(row)
    if row["error"] is None:
        assert row["ms"] > 0 and row["ratio"] > 0 and row["peak_mb"] >= 0
        assert isinstance(row["path"], str) and row["path"]
    else:
        assert isinstance(row["error"], str) and row["error"]
        assert row["ms"] is None or row["peak_mb"] is None


def test_bench_attention_writes_json_with_a_row_per_encoding(tmp_path, capsys):
    path = tmp_path / "bench.json"
    argv = ["bench", "attention", *TINY, "--no-peers", "--no-progress", "--encodings", "all", "--json", str(path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert {"config", "rows"} <= set(data)
    cfg = data["config"]
    assert (cfg["seq_len"], cfg["batch"], cfg["heads"], cfg["head_dim"], cfg["repeats"], cfg["warmup"]) == (32, 1, 2, 8, 1, 0)
    rows = data["rows"]
    registered = encoding_names()[1:]  # the 1D encodings (seq and time series)
    assert [r["name"] for r in rows] == [BASELINE, "none", *registered]
    assert [r["impl"] for r in rows] == ["torch"] + ["posenc"] * (len(registered) + 1)
    for row in rows:
        _check_row(row)
    base, none = rows[0], rows[1]
    assert base["error"] is None and base["ratio"] == 1.0 and base["path"] == "sdpa"
    assert none["error"] is None and none["path"] == "sdpa"
    by_name = {r["name"]: r for r in rows}
    expected_paths = {"rope": "sdpa", "sinusoidal": "sdpa", "alibi": "dense", "erpe": "sdpa+prob_bias"}
    for name, kernel_path in expected_paths.items():
        if name in by_name:
            assert by_name[name]["error"] is None, by_name[name]["error"]
            assert by_name[name]["path"] == kernel_path
    for name in [BASELINE, "none", *registered]:
        assert name in out


def test_bench_attention_encoding_subset_under_background_load(tmp_path, capsys):
    path = tmp_path / "bench.json"
    argv = ["bench", "attention", *TINY, "--no-peers", "--no-progress", "--encodings", "rope,alibi",
            "--background-load", "--plans", "--json", str(path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert [r["name"] for r in data["rows"]] == [BASELINE, "rope", "alibi"]
    assert data["config"]["background_load"] == "1 busy process"
    load = data["config"]["load_average"]
    assert load is None or (len(load) == 3 and all(v >= 0 for v in load))
    assert "background load: 1 busy process; load average at the end: " in out
    plans = out.split("\nplans:\n", 1)[1].splitlines()
    for row in data["rows"]:
        line = next(p for p in plans if p.startswith(f"  {row['name']}: "))
        assert line.startswith(f"  {row['name']}: {row['path']}")
        if row["reason"]:
            assert line.endswith(f" -- {row['reason']}")


def _parse(argv: list[str]):
    return cli.build_parser(argv).parse_args(argv)


def test_default_encodings_are_registered_and_all_is_the_registry():
    registered = encoding_names()
    assert set(DEFAULT_ENCODINGS) <= set(registered)
    assert AttentionBenchConfig().rows == DEFAULT_ENCODINGS
    assert config_from_args(_parse(["bench", "attention"])).rows == DEFAULT_ENCODINGS
    assert config_from_args(_parse(["bench", "attention", "--encodings", "all"])).rows == tuple(registered)
    assert config_from_args(_parse(["bench", "attention", "--encodings", "rope,none"])).rows == ("rope", "none")
    args = _parse(["bench", "attention"])
    assert (args.repeats, args.warmup, args.seq_lens, args.background_processes) == (5, 1, None, 0)


def test_failing_rows_are_reported_not_fatal(monkeypatch):
    def broken(config, name):
        raise RuntimeError(f"cannot build {name}")

    monkeypatch.setattr(bench_attention, "_posenc_unit", broken)
    config = AttentionBenchConfig(seq_len=16, batch=1, heads=2, head_dim=8, repeats=1, warmup=0, encodings=("rope",), peers=False)
    result = run_benchmark(config, progress=False)
    base, rope = result.rows
    assert base.ratio == 1.0
    assert rope.ms is None and rope.error == "RuntimeError: cannot build rope"
    assert "FAILED" in bench_attention.render(result)


def test_missing_peers_are_noted_and_skipped(monkeypatch):
    monkeypatch.setattr(
        bench_attention, "PEERS",
        {"x-transformers": ("posenc_no_such_peer_a", "x-transformers"), "attention-smithy": ("posenc_no_such_peer_b", "attention-smithy")},
    )
    notes: list[str] = []
    rows = candidates(AttentionBenchConfig(encodings=("none",), peers=True), notes)
    assert [c.name for c in rows] == [BASELINE, "none"]
    assert len(notes) == 2 and all("not installed" in n for n in notes)


@pytest.mark.parametrize("impl, module", [("x-transformers", "x_transformers"), ("attention-smithy", "attention_smithy")])
def test_peer_rows_run_when_installed(impl, module, monkeypatch):
    pytest.importorskip(module)
    monkeypatch.setattr(bench_attention, "PEERS", {impl: bench_attention.PEERS[impl]})
    config = AttentionBenchConfig(seq_len=32, batch=1, heads=2, head_dim=16, repeats=1, warmup=0, encodings=("none",))
    result = run_benchmark(config, progress=False)
    peers = [r for r in result.rows if r.impl == impl]
    assert [r.name for r in peers] == [f"{impl} rope", f"{impl} alibi"]
    for row in peers:
        assert row.error is None, row.error
        assert row.ms > 0 and row.peak_mb > 0


def test_config_validation_names_the_argument():
    with pytest.raises(ValueError, match="seq_len"):
        AttentionBenchConfig(seq_len=0)
    with pytest.raises(ValueError, match="dtype"):
        AttentionBenchConfig(dtype="float64")
    with pytest.raises(ValueError, match="unknown encoding"):
        AttentionBenchConfig(encodings=("no_such_encoding",))


def test_path_column_uses_the_attention_plan(monkeypatch):
    class FakePlan:
        path, reason, chunk_rows, label = "dense", "because the test says so", 7, "dense+fake"

    calls = []

    def plan(self, x, *, mask=None, q_pos=None, kv_pos=None, context=None):
        calls.append((tuple(x.shape), mask))
        return FakePlan()

    monkeypatch.setattr(posenc.MultiheadAttention, "plan", plan, raising=False)
    config = AttentionBenchConfig(seq_len=16, batch=1, heads=2, head_dim=8, repeats=1, warmup=0,
                                  encodings=("alibi",), peers=False)
    result = run_benchmark(config, progress=False)
    base, alibi = result.rows
    assert (alibi.path, alibi.reason, alibi.chunk_rows) == ("dense+fake", "because the test says so", 7)
    assert calls and calls[0][0] == (1, 16, 16) and calls[0][1].causal
    assert base.path == "sdpa" and base.reason
    text = render(result, plans=True)
    assert "  alibi: dense+fake (chunk 7 rows) -- because the test says so" in text.splitlines()


# --- --seq-lens: parsing, the growth table, the plot ---------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("0,16", "positive integers"), ("16,abc", "integers"), ("32,16", "increasing"), ("16,16", "increasing"),
    ("", "positive integers"),
])
def test_seq_lens_rejects_bad_values(value, expected, capsys):
    assert cli.main(["bench", "attention", "--seq-lens", value, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--seq-lens" in err and repr(value) in err and expected in err


def test_seq_lens_parses_and_excludes_seq_len(capsys):
    assert _parse(["bench", "attention", "--seq-lens", "1024, 2048,4096"]).seq_lens == [1024, 2048, 4096]
    assert cli.main(["bench", "attention", "--seq-len", "64", "--seq-lens", "16,32", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--seq-len and --seq-lens" in err


def _fake_growth() -> GrowthResult:
    cfg = dict(batch=1, heads=2, head_dim=8, dim=16, device="cpu", dtype="float32", torch="x", threads=1,
               warmup=0, background_load="off", load_average=None, cpu_count=2)
    numbers = {  # name -> [(ms, peak MB) at T=100, 200, 400]
        BASELINE: [(10.0, 4.0), (20.0, 8.0), (40.0, 16.0)],
        "alibi": [(10.0, 2.0), (40.0, 8.0), (160.0, 32.0)],
        "broken": [(5.0, 1.0), (None, None), (None, None)],
    }
    results = []
    for i, t in enumerate((100, 200, 400)):
        rows = [Row(name, "posenc", ms=v[i][0], peak_mb=v[i][1]) for name, v in numbers.items()]
        results.append(BenchResult({**cfg, "seq_len": t, "repeats": 3}, rows, []))
    common = {**cfg, "seq_lens": [100, 200, 400], "repeats_per_length": [3, 3, 3]}
    return GrowthResult(common, results)


def test_growth_table_from_known_numbers():
    result = _fake_growth()
    growth = {g.name: g for g in result.growth()}
    assert growth["alibi"].time_growth == [1.0, 4.0, 16.0]
    assert growth["alibi"].memory_growth == [1.0, 4.0, 16.0]
    assert growth[BASELINE].time_growth == [1.0, 2.0, 4.0]
    assert growth["broken"].time_growth == [1.0, None, None]
    lines = render_growth(result).splitlines()
    header = next(line for line in lines if line.startswith("name"))
    assert header.split() == ["name", "impl", "ms@100", "ms@200", "ms@400", "ms", "200/100", "ms", "400/100",
                              "MB@100", "MB@200", "MB@400", "MB", "200/100", "MB", "400/100"]
    alibi = next(line for line in lines if line.startswith("alibi ")).split()
    assert alibi == ["alibi", "posenc", "10.00", "40.00", "160.00", "4.00", "16.00",
                     "2.0", "8.0", "32.0", "4.00", "16.00"]
    broken = next(line for line in lines if line.startswith("broken ")).split()
    assert broken == ["broken", "posenc", "5.00", "-", "-", "-", "-", "1.0", "-", "-", "-", "-"]
    data = result.to_json()
    assert [len(g["ms"]) for g in data["growth"]] == [3, 3, 3] and len(data["lengths"]) == 3


def test_seq_lens_writes_json_with_every_length_and_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "growth.json"
    argv = ["bench", "attention", "--seq-lens", "16,32", "--batch", "1", "--heads", "2", "--head-dim", "8",
            "--encodings", "none,alibi", "--no-peers", "--repeats", "1", "--warmup", "0", "--no-progress",
            "--json", str(path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["config"]["seq_lens"] == [16, 32]
    assert [r["config"]["seq_len"] for r in data["lengths"]] == [16, 32]
    for length in data["lengths"]:
        assert [r["name"] for r in length["rows"]] == [BASELINE, "none", "alibi"]
    assert [g["name"] for g in data["growth"]] == [BASELINE, "none", "alibi"]
    assert all(g["time_growth"][0] == 1.0 for g in data["growth"])
    png = tmp_path / "growth.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "growth with T" in out and "ms 32/16" in out and str(png) in out


# --- background load -----------------------------------------------------------------------------


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie left to an init that does not reap counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        except OSError:
            state = None
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux_only
def test_background_load_runs_a_process_for_the_block_only():
    with background_load(True) as load:
        assert load.description == "1 busy process" and len(load.pids) == 1
        proc = load.processes[0]
        time.sleep(0.2)
        assert proc.poll() is None  # still spinning
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)  # a session of its own, like another terminal's
    assert proc.poll() is not None
    with background_load(False) as load:
        assert load.processes == [] and load.description == "off"


@linux_only
def test_background_load_is_stopped_after_an_exception():
    with pytest.raises(RuntimeError, match="inside"):
        with background_load(True, processes=2) as load:
            procs = list(load.processes)
            assert load.description == "2 busy processes"
            raise RuntimeError("inside the block")
    assert all(p.poll() is not None for p in procs)


@linux_only
def test_background_load_exits_when_its_parent_dies_without_cleanup():
    # A parent that leaves without running the finally (os._exit): the child notices it is orphaned.
    load_py = Path(bench_attention.__file__).with_name("load.py")
    script = (
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('load', {str(load_py)!r})\n"
        "m = sys.modules['load'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "cm = m.background_load(True); load = cm.__enter__()\n"
        "print(load.pids[0], flush=True)\n"
        "os._exit(0)\n"
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    child = int(parent.stdout.split()[0])
    try:
        assert _gone(child), f"busy process {child} outlived its parent"
    finally:
        if not _gone(child, timeout=0):
            os.kill(child, 9)


# --- the CPU memory tracker --------------------------------------------------------------------


def test_cpu_tracker_sees_a_64mb_temporary():
    def step():
        tmp = torch.empty(16 * MB, dtype=torch.float32)  # 16 Mi floats = 64 MB
        tmp.fill_(1.0)
        total = tmp.sum()
        del tmp
        return total

    peak = peak_memory_bytes(step, "cpu")
    assert peak >= 64 * MB
    assert peak < 66 * MB


def test_cpu_tracker_small_step_reports_little():
    keep = torch.randn(4 * MB)  # 16 MB that exists before the step, and is freed inside it

    def step():
        nonlocal keep
        keep = None
        return torch.randn(256).sum()

    assert peak_memory_bytes(step, "cpu") < MB // 4


def test_cpu_tracker_counts_autograd_and_frees():
    x = torch.randn(512, 512, requires_grad=True)  # 1 MB
    with CPUPeakMemory() as mem:
        y = (x @ x).relu()  # 1 MB live
        y.sum().backward()  # grads and temporaries, 1 MB each
        del y
    assert 2 * MB <= mem.peak_bytes <= 8 * MB
    assert mem.allocated_bytes >= mem.peak_bytes
    assert mem.peak_mb == mem.peak_bytes / MB


def test_peak_of_events_ignores_frees_of_older_blocks():
    events = [(1, 10, 100), (2, 99, -500), (3, 11, 50), (4, 10, -100), (5, 12, 20), (6, 11, -50)]
    assert peak_of_events(events) == (150, 170)
    # without addresses every free counts
    assert peak_of_events([(1, -1, 100), (2, -1, -100), (3, -1, 30)]) == (100, 130)


def test_held_bytes_counts_each_storage_once_and_never_a_module():
    from posenc.common.decoding_state import DecodingState
    from posenc.cli.bench.memory import held_bytes
    from posenc.seq.models import CausalLM

    base = torch.zeros(1000)  # 4000 bytes
    holder = type("Holder", (), {"__slots__": ("a",)})()
    holder.a = base[10:20]  # a view: the whole storage is held
    cycle: list = [base]
    cycle.append(cycle)
    tree = {"views": (base, base[:5]), "slot": holder, "cycle": cycle, "other": [torch.zeros(3, dtype=torch.float64)],
            "model": torch.nn.Linear(100, 100)}  # a module's 40 KB of weights are not the cache's
    assert held_bytes(tree) == 4000 + 24
    assert held_bytes(torch.zeros(2, 3)) == 24 and held_bytes(None) == 0 and held_bytes([1, "a", 2.0]) == 0
    assert held_bytes([[[base]]], max_depth=2) == 0 and held_bytes([[[base]]], max_depth=3) == 4000
    # posenc's cache: each layer's keys, values and positions at their capacity
    model = CausalLM(32, 16, 2, 2, encoding="rope", max_len=64).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 32, (1, 10)), cache=cache, decoding_state=DecodingState(len(cache)))
        model(torch.randint(0, 32, (1, 1)), cache=cache, decoding_state=None)  # grows the buffers past 10
    want = sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer._k, layer._v, layer._pos))
    assert want > 2 * (2 * 11 * 8 * 4 + 11 * 8)  # the capacity doubled: more than the 11 tokens use
    assert held_bytes(cache) == want


def test_peak_memory_rejects_other_devices():
    with pytest.raises(ValueError, match="device"):
        peak_memory_bytes(lambda: None, "meta")


# --- timing and tables -------------------------------------------------------------------------


def test_time_interleaved_round_robin_and_failures():
    order: list[str] = []

    def make(name):
        return lambda: order.append(name)

    def broken():
        order.append("c")
        raise RuntimeError("boom")

    steps = {"a": make("a"), "b": make("b"), "c": broken}
    results = time_interleaved(steps, repeats=3, warmup=1, device=torch.device("cpu"), progress=False)
    assert len(results["a"].times_ms) == 3 and len(results["b"].times_ms) == 3
    assert results["a"].median_ms is not None
    assert results["c"].error == "RuntimeError: boom" and results["c"].median_ms is None
    assert order.count("c") == 1  # dropped after its failure
    assert order[:3] == ["a", "b", "c"] and order[3:5] == ["b", "a"]  # the order rotates per round
    with pytest.raises(ValueError, match="repeats"):
        time_interleaved(steps, repeats=0, warmup=0, device=torch.device("cpu"))


def test_paired_ratio_compares_round_by_round():
    # the baseline's second round fell in a slow phase that the row's second round missed: the
    # ratio of the medians (20 / 40) reads the row twice as fast, the rounds say twice as slow
    row, base = [20.0, 20.0, 80.0], [10.0, 40.0, 40.0]
    assert paired_ratio(row, base) == 2.0
    assert paired_ratio(base, base) == 1.0
    # rounds that do not pair (a row stopped part-way): the ratio of the medians
    assert paired_ratio([10.0, 20.0], [5.0]) == 3.0
    assert paired_ratio([], base) is None and paired_ratio(row, []) is None
    assert paired_ratio([1.0, 2.0], [0.0, 0.0]) is None


def test_format_table_aligns_columns():
    text = format_table(["name", "ms"], [["a", "1.00"], ["longer", "10.50"]], align="lr")
    lines = text.splitlines()
    assert lines[0] == "name       ms"
    assert lines[2] == "a        1.00"
    assert lines[3] == "longer  10.50"
    with pytest.raises(ValueError, match="row 0"):
        format_table(["a", "b"], [["x"]])


# --- linear-attention rows (issue 11) ---------------------------------------------------------


def test_linear_rows_run_on_the_linear_path_beside_the_softmax_rows():
    config = AttentionBenchConfig(seq_len=24, batch=1, heads=2, head_dim=8, repeats=1, warmup=0, encodings=("none",),
                                  peers=False, linear_encodings=("none", "sine_spe", "rope"), feature_map="favor")
    result = run_benchmark(config, progress=False)
    names = [r.name for r in result.rows]
    assert names == ["sdpa (bare causal)", "none", "none (linear favor)", "sine_spe (linear favor)", "rope (linear favor)"]
    for row in result.rows[2:]:
        assert row.error is None and row.path == "linear" and row.ms > 0, row
    assert AttentionBenchConfig().linear_rows == ("none", "sine_spe", "conv_spe")  # beside the default rows
    assert AttentionBenchConfig(encodings=("rope",)).linear_rows == ()  # named rows only


def test_linear_rows_refuse_encodings_linear_attention_cannot_run(capsys):
    assert cli.main(["bench", "attention", "--linear-encodings", "alibi", "--no-progress"]) == 2
    assert "not encodings of linear attention: 'alibi'" in capsys.readouterr().err
    assert cli.main(["bench", "attention", "--encodings", "sine_spe", "--no-progress"]) == 2
    assert "unknown encoding(s) 'sine_spe'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="feature_map must be one of"):
        AttentionBenchConfig(feature_map="relu")
