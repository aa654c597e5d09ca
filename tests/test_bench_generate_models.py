"""The generate and models benchmarks at tiny sizes (no timing assertions): every row runs and
reports, the outputs are written, bad arguments exit 2."""

from __future__ import annotations

import importlib.util
import json

import pytest

from posenc import cli
import torch

from posenc.cli.bench import models as models_bench
from posenc.cli.bench import models_units
from posenc.cli.bench.generate import GenerateBenchConfig, causal_encodings
from posenc.cli.bench.generate_report import Cell, GenerateResult, Row, ratios
from posenc.cli.bench.generate_rows import Decoder, estimate_bytes, measure_cells_round_robin


def test_causal_encodings_split_by_cache_support():
    ok, refused = causal_encodings()
    assert {"rope", "alibi", "t5", "deberta", "transformer_xl", "tupe"} <= set(ok)
    assert {"rope_dynamic_ntk", "rope_longrope"} <= set(refused)
    assert not set(ok) & set(refused)


def test_bench_generate_tiny_writes_every_row(tmp_path, capsys):
    argv = ["bench", "generate", "--contexts", "8,16", "--batches", "1,2", "--dim", "16", "--depth", "1", "--heads", "2",
            "--vocab", "32", "--decode-tokens", "2", "--repeats", "1", "--warmup", "0", "--encodings", "rope,alibi,tupe",
            "--no-progress", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "generate.json").read_text())
    names = [(r["impl"], r["name"]) for r in data["rows"]]
    assert names[:3] == [("posenc", "rope"), ("posenc", "alibi"), ("posenc", "tupe")]
    for row in data["rows"]:
        assert row["error"] is None
        assert [(c["context"], c["batch"]) for c in row["cells"]] == [(8, 1), (8, 2), (16, 1), (16, 2)]
        for cell in row["cells"]:
            assert cell["error"] is None, cell["error"]
            assert cell["prefill_ms"] > 0 and cell["tokens_per_s"] > 0
            assert cell["cache_mb"] > 0
    assert data["ratios"]["posenc:rope"]["8/1"] == 1.0
    text = (tmp_path / "generate.txt").read_text()
    assert text.startswith("cached decoding") and "cache held after the last round" in text
    assert "batch 2" in capsys.readouterr().out


def test_x_rope_pairs_the_rounds_of_round_robin_cells():
    """``x rope`` is the median over rounds of RoPE's step over the row's when both decoded in the
    same rounds, and the ratio of their tokens/s (their medians) when the rows ran one after
    another."""
    def cell(times, round_robin=True):
        c = Cell(8, 1, step_ms=sorted(times)[1], step_times_ms=times, round_robin=round_robin)
        c.tokens_per_s = 1e3 / c.step_ms
        return c

    rope = Row("rope", "posenc", [cell([10.0, 40.0, 40.0]), cell([10.0, 40.0, 40.0], round_robin=False)])
    rope.cells[1].context = 16
    alibi = Row("alibi", "posenc", [cell([20.0, 20.0, 80.0]), cell([20.0, 20.0, 80.0], round_robin=False)])
    alibi.cells[1].context = 16
    got = ratios(GenerateResult(config={}, rows=[rope, alibi], notes=[]))["posenc:alibi"]
    assert got["8/1"] == 0.5  # half RoPE's speed in every round; the medians (40 / 20) would say 2
    assert got["16/1"] == 2.0


def test_the_cache_table_gives_megabytes_and_the_ratio_to_rope():
    from posenc.cli.bench.generate_report import cache_table

    def row(name, impl, mbs):
        return Row(name, impl, [Cell(t, 1, cache_mb=mb, error=None if mb else "failed") for t, mb in zip((8, 16), mbs)])

    result = GenerateResult(config={"contexts": [8, 16], "batches": [1], "decode_tokens": 2},
                            rows=[row("rope", "posenc", [1.0, 4.0]), row("llama (rope)", "transformers", [0.5, 2.0]),
                                  row("alibi", "posenc", [1.0, None])], notes=[])
    lines = cache_table(result).splitlines()
    assert lines[0].startswith("cache held after the last round") and "2 decoded tokens" in lines[0]
    assert lines[1].split() == ["name", "impl", "MB@8/b1", "MB@16/b1", "x", "rope@16/b1"]
    assert lines[3].split() == ["rope", "posenc", "1.00", "4.00", "1.00"]
    assert lines[4].split() == ["llama", "(rope)", "transformers", "0.50", "2.00", "0.50"]
    assert lines[5].split() == ["alibi", "posenc", "1.00", "-", "-"]  # a failed cell has no figure


@pytest.mark.parametrize("argv", [["--encodings", "rope_longrope"], ["--contexts", "16,8"], ["--batches", "0"]])
def test_bench_generate_rejects_bad_arguments(argv, capsys):
    assert cli.main(["bench", "generate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and argv[0] in err


class _LoggingDecoder(Decoder):
    """Records its calls in a shared log; ``fail_at``: the decode step (counted over all rounds)
    that raises."""

    def __init__(self, name, log, fail_at=None):
        super().__init__(torch.nn.Identity())
        self.name, self.log, self.fail_at, self.steps = name, log, fail_at, 0

    def prefill(self, tokens):
        self.log.append((self.name, "prefill"))
        return [], torch.zeros(tokens.shape[0], 4)

    def step(self, token, cache):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("boom")
        return cache + [1], torch.zeros(token.shape[0], 4)

    def rewind(self, cache, length):
        self.log.append((self.name, "round"))
        return []


def test_decode_rounds_run_round_robin_and_a_failing_row_leaves_the_others_running():
    log = []
    cfg = GenerateBenchConfig(contexts=(8,), batches=(1,), decode_tokens=2, repeats=2, warmup=1)
    decoders = {"a": _LoggingDecoder("a", log), "b": _LoggingDecoder("b", log, fail_at=3), "c": _LoggingDecoder("c", log)}
    cells = measure_cells_round_robin(decoders, torch.zeros(1, 8, dtype=torch.long), cfg)
    rounds = [name for name, what in log if what == "round"]
    # every row's round r before any row's round r + 1; b fails in its second round and leaves
    assert rounds == ["a", "b", "c", "a", "b", "c", "a", "c"]
    assert [name for name, what in log if what == "prefill"] == ["a", "a", "b", "b", "c", "c"]  # prefills: row by row
    assert "boom" in cells["b"].error and cells["b"].tokens_per_s is None
    for name in ("a", "c"):
        assert cells[name].error is None and len(cells[name].step_times_ms) == 2 and cells[name].tokens_per_s > 0


def test_generate_memory_estimate_grows_linearly_with_the_context():
    cfg = GenerateBenchConfig()
    a, b = estimate_bytes(cfg, 1024, 8), estimate_bytes(cfg, 2048, 8)
    assert 1.9 < b / a < 2.1
    with pytest.raises(ValueError, match="dim"):
        GenerateBenchConfig(dim=30, heads=4)


def test_bench_models_tiny_eager(tmp_path):
    argv = ["bench", "models", "--models", "lm,gps", "--batch", "1", "--seq-len", "8", "--graphs", "2", "--repeats", "1",
            "--warmup", "0", "--no-compile", "--no-progress", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "models.json").read_text())
    pairs = [(r["pair"], r["impl"]) for r in data["rows"]]
    peers = importlib.util.find_spec("x_transformers") is not None  # the bench extra; CI's test extra lacks it
    assert ("lm/rope", "posenc") in pairs and (("lm/rope", "x-transformers") in pairs) == peers
    assert ("gps/rwse", "posenc") in pairs and ("gps/rwse", "torch_geometric") in pairs
    for row in data["rows"]:
        assert row["error"] is None, row["error"]
        assert row["ms"] > 0 and row["peak_mb"] >= 0 and row["graph_breaks"] is None
    assert all(r["vs_peer"] > 0 for r in data["rows"] if r["impl"] == "posenc" and (peers or r["pair"].startswith("gps")))



def test_bench_models_lm_encodings_option(tmp_path, capsys):
    """--lm-encodings picks the lm pair's encodings; one x-transformers lacks has the posenc row alone."""
    argv = ["bench", "models", "--models", "lm", "--lm-encodings", "t5,rope", "--batch", "1", "--seq-len", "8",
            "--repeats", "1", "--warmup", "0", "--no-compile", "--no-progress", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    rows = json.loads((tmp_path / "models.json").read_text())["rows"]
    assert [r["impl"] for r in rows if r["pair"] == "lm/t5"] == ["posenc"]
    assert {r["pair"] for r in rows} == {"lm/t5", "lm/rope"}
    assert all(r["error"] is None and r["ms"] > 0 for r in rows)
    capsys.readouterr()
    assert cli.main(["bench", "models", "--lm-encodings", "t5,sine_spe"]) == 2
    assert "--lm-encodings: 'sine_spe' runs on linear attention only" in capsys.readouterr().err
    names = models_bench.lm_encoding_names()
    assert {"deberta", "transformer_xl", "erpe_vector", "none"} <= set(names) and "sine_spe" not in names
    assert models_bench._lm_encodings("all") == names
    with pytest.raises(ValueError, match="lm_encodings must be some of .*; got foo"):
        models_bench.ModelsBenchConfig(lm_encodings=("foo",))


def test_bench_models_vit_encodings_option(tmp_path, capsys):
    """--vit-encodings picks the vit pair's encodings: one timm has keeps its peer row, the others
    (PEG, no encoding) have the posenc row alone; video and linear-only encodings are refused by name."""
    argv = ["bench", "models", "--models", "vit", "--vit-encodings", "peg,none,learned2d", "--batch", "1",
            "--repeats", "1", "--warmup", "0", "--no-compile", "--no-progress", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    rows = json.loads((tmp_path / "models.json").read_text())["rows"]
    assert [r["impl"] for r in rows if r["pair"] == "vit/peg"] == ["posenc"]
    assert [r["impl"] for r in rows if r["pair"] == "vit/none"] == ["posenc"]
    assert {r["impl"] for r in rows if r["pair"] == "vit/learned2d"} == {"posenc", "timm"}
    assert all(r["error"] is None and r["ms"] > 0 for r in rows)
    # every vit row ran in the same rounds: each posenc row has its ratio to the none row, which is 1 to itself
    assert [r["vs_none"] for r in rows if r["pair"] == "vit/none"] == [1.0]
    assert all(r["vs_none"] > 0 for r in rows if r["impl"] == "posenc")
    assert all(r["vs_none"] is None for r in rows if r["impl"] != "posenc")
    capsys.readouterr()
    for bad, said in (("sincos3d", "'sincos3d' is a video encoding"), ("conv_spe2d", "runs on linear attention only"),
                      ("rope", "'rope' is a seq encoding"), ("pegg", "unknown encoding 'pegg' (did you mean 'peg'?)")):
        assert cli.main(["bench", "models", "--vit-encodings", bad]) == 2
        assert "--vit-encodings: " in (err := capsys.readouterr().err) and said in err, err
    names = models_bench.vit_encoding_names()
    assert {"none", "peg", "sincos2d", "axial", "relbias2d", "rope2d_dinov3", *models_bench.VIT_ENCODINGS} <= set(names)
    assert not {"sincos3d", "rope3d", "axial3d", "conv_spe2d"} & set(names)
    assert models_bench._vit_encodings("all") == names
    with pytest.raises(ValueError, match="vit_encodings must be some of .*; got foo"):
        models_bench.ModelsBenchConfig(vit_encodings=("foo",))


def test_bench_models_gps_encodings_option(tmp_path, capsys):
    """--gps-encodings all: a GPS row per graph encoding and none, each with its structure
    precomputed; RWSE alone keeps the PyG row; other modalities' encodings are refused by name."""
    names = models_bench.gps_encoding_names()
    assert {"none", "lap", "rwse", "landmark", "maglap", "rrwp", "spd", "stable_pe"} == set(names)
    argv = ["bench", "models", "--models", "gps", "--gps-encodings", "all", "--graphs", "2", "--repeats", "1",
            "--warmup", "0", "--no-compile", "--no-progress", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    rows = json.loads((tmp_path / "models.json").read_text())["rows"]
    assert {r["pair"] for r in rows} == {f"gps/{e}" for e in names}
    assert {r["impl"] for r in rows if r["pair"] == "gps/rwse"} == {"posenc", "torch_geometric"}
    assert all(r["impl"] == "posenc" for r in rows if r["pair"] != "gps/rwse")
    assert all(r["error"] is None and r["ms"] > 0 for r in rows), [r["error"] for r in rows]
    assert [r["vs_none"] for r in rows if r["pair"] == "gps/none"] == [1.0]
    capsys.readouterr()
    for bad, said in (("rope", "'rope' is a seq encoding; the gps pair takes graph encodings"),
                      ("lapp", "unknown encoding 'lapp' (did you mean 'lap'")):
        assert cli.main(["bench", "models", "--gps-encodings", bad]) == 2
        assert "--gps-encodings: " in (err := capsys.readouterr().err) and said in err, err
    with pytest.raises(ValueError, match="nodes must be more than 8 for lap"):
        models_bench.ModelsBenchConfig(models=("gps",), gps_encodings=("lap",), nodes=8)


@pytest.mark.parametrize("encoding", ["lap", "landmark", "maglap", "rrwp", "spd", "stable_pe"])
def test_bench_models_gps_rows_feed_their_encoding(encoding):
    """Each gps row builds its model with that encoding and the structure it reads, and its step
    reaches it: the encoding's parameters get a nonzero gradient from the row's loss."""
    cfg = models_bench.ModelsBenchConfig(models=("gps",), gps_encodings=(encoding,), graphs=2)
    unit = models_units.posenc_gps(cfg, encoding)
    loss = unit.loss_of(unit.apply(unit.model))
    loss.backward()
    grads = [p.grad for p in unit.model.encoding.parameters() if p.requires_grad]
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads)


_FAKE_AUTHORS_MODEL = '''
import torch
from torch import nn
from Models.helper import width


class ConvTran(nn.Module):
    def __init__(self, config, num_classes):
        super().__init__()
        _, channels, _ = config["Data_shape"]
        assert config["Fix_pos_encode"] == "tAPE" and config["Rel_pos_encode"] == "eRPE"
        self.out = nn.Linear(channels, num_classes * width())

    def forward(self, x):
        return self.out(x.mean(-1))[:, : self.out.out_features // width()]
'''


def test_bench_models_convtran_peer_comes_from_a_named_checkout(tmp_path, capsys):
    """The peer row imports Models/model.py from --convtran-repo (a stand-in here: the authors'
    repository is not in the test environment), and leaves sys.path and sys.modules as they were."""
    import sys

    repo = tmp_path / "ConvTran"
    (repo / "Models").mkdir(parents=True)
    (repo / "Models" / "helper.py").write_text("def width():\n    return 1\n")
    (repo / "Models" / "model.py").write_text(_FAKE_AUTHORS_MODEL)
    path_before = list(sys.path)
    out = tmp_path / "out"
    argv = ["bench", "models", "--models", "convtran", "--convtran-repo", str(repo), "--repeats", "1", "--warmup", "0",
            "--no-compile", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    rows = {r["impl"]: r for r in json.loads((out / "models.json").read_text())["rows"]}
    assert set(rows) == {"posenc", "authors"} and all(r["error"] is None and r["ms"] > 0 for r in rows.values())
    assert rows["posenc"]["vs_peer"] > 0
    assert sys.path == path_before and not any(k.split(".")[0] == "Models" for k in sys.modules)

    capsys.readouterr()
    assert cli.main(["bench", "models", "--models", "convtran", "--convtran-repo", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --convtran-repo: convtran_repo must be a checkout" in err[0] and "nowhere" in err[0]


def test_bench_models_bfloat16_runs_under_autocast_and_refuses_a_missing_device(tmp_path, capsys, monkeypatch):
    """--dtype bfloat16 runs each step's forward pass under torch.autocast (the models' outputs are
    bfloat16; weights stay float32) and says so; a bad --device or a missing CUDA is one line."""

    seen = []
    posenc_lm = models_units.posenc_lm

    def spy(cfg, encoding):
        unit = posenc_lm(cfg, encoding)
        apply = unit.apply
        unit.apply = lambda m: seen.append((apply(m).dtype, next(m.parameters()).dtype)) or apply(m)
        return unit

    monkeypatch.setattr(models_units, "posenc_lm", spy)
    argv = ["bench", "models", "--models", "lm", "--dtype", "bfloat16", "--batch", "1", "--seq-len", "8",
            "--repeats", "1", "--warmup", "0", "--no-compile", "--no-progress", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "models.json").read_text())
    assert data["config"]["dtype"] == "bfloat16" and data["config"]["device"] == "cpu"
    assert all(r["error"] is None and r["ms"] > 0 for r in data["rows"])
    assert seen and set(seen) == {(torch.bfloat16, torch.float32)}
    assert "bfloat16 autocast on cpu" in (tmp_path / "models.txt").read_text()
    capsys.readouterr()

    assert cli.main(["bench", "models", "--device", "tpu"]) == 2
    assert "--device: expected cpu, cuda or cuda:N, got 'tpu'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N; got 'auto'"):
        models_bench.ModelsBenchConfig(device="auto")
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16; got 'float16'"):
        models_bench.ModelsBenchConfig(dtype="float16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "models", "--models", "lm", "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["posenc bench models: error: device 'cuda' was requested but torch.cuda.is_available() is False"]


@pytest.mark.parametrize("bench", ["attention", "generate", "models"])
def test_every_timing_bench_checks_its_device_alike(bench, capsys, monkeypatch):
    """One check for the three benches: a name that is not cpu, cuda or cuda:N (auto, mps, tpu) is one
    argparse line; CUDA asked for where torch sees none is one line before anything is built (generate
    raised a driver traceback, attention refused cuda:0); the configs refuse the same names."""
    from posenc.cli.bench import attention as attention_bench
    from posenc.cli.bench import generate as generate_bench

    for bad in ("auto", "mps", "tpu"):
        assert cli.main(["bench", bench, "--device", bad]) == 2
        assert f"--device: expected cpu, cuda or cuda:N, got '{bad}'" in capsys.readouterr().err
    config = {"attention": attention_bench.AttentionBenchConfig, "generate": generate_bench.GenerateBenchConfig,
              "models": models_bench.ModelsBenchConfig}[bench]
    with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N; got 'mps'"):
        config(device="mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1"):
        assert cli.main(["bench", bench, "--device", device, "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"posenc bench {bench}: error: device '{device}' was requested but torch.cuda.is_available() is False"]


def test_bench_models_ratios_pair_rounds_within_a_model():
    """vs_peer and vs_none are medians of per-round ratios among rows of one model's rounds."""
    from types import SimpleNamespace

    from posenc.cli.bench.models_run import Row, _paired_ratios
    from posenc.cli.bench.models_units import Candidate

    def member(pair, impl, times):
        cand, row = Candidate(pair, "ViT" if impl == "posenc" else "peer", impl, lambda: None), Row(pair, "m", impl)
        row.ms = sorted(times)[len(times) // 2]
        return cand, row, f"{pair} {impl}", SimpleNamespace(times_ms=times)

    built = [member("vit/none", "posenc", [10.0, 20.0, 40.0]), member("vit/peg", "posenc", [15.0, 40.0, 40.0]),
             member("vit/learned2d", "posenc", [20.0, 20.0, 20.0]), member("vit/learned2d", "timm", [10.0, 40.0, 20.0])]
    members = [(c, r, k) for c, r, k, _ in built]
    _paired_ratios(members, {k: t for _, _, k, t in built})
    none, peg, learned, timm = (r for _, r, _, _ in built)
    assert none.vs_none == 1.0 and none.vs_peer is None
    assert peg.vs_none == 1.5 and peg.vs_peer is None  # rounds: 1.5, 2.0, 1.0
    assert learned.vs_none == 1.0 and learned.vs_peer == 1.0  # none: 2.0, 1.0, 0.5; timm: 2.0, 0.5, 1.0
    assert timm.vs_none is None and timm.vs_peer is None
