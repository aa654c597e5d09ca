"""``posenc bench graph-pe`` at tiny sizes: the table, JSON, the guarded child process and bad
arguments (no timing assertions)."""

from __future__ import annotations

import json

import torch

from posenc import cli
from posenc.cli.bench import graph_pe

TINY = ["--graphs", "12", "--nodes", "150", "--edges", "400", "--lap-k", "3", "--walk-length", "5",
        "--repeats", "1", "--no-progress", "--threads", "1"]


def test_bench_graph_pe_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "res"
    assert cli.main(["bench", "graph-pe", *TINY, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads((out / "graph_pe.json").read_text())
    assert (out / "graph_pe.txt").read_text().strip() in text
    assert data["config"]["graphs"] == 12 and data["config"]["walk_length"] == 5
    rows = data["rows"]
    assert {(r["workload"], r["encoding"]) for r in rows} == {
        (w, e) for w in ("molecules", "large") for e in ("LapPE", "RWSE")
    }
    for r in rows:
        if r["impl"].startswith("posenc"):
            assert r["error"] is None and r["wall_s"] > 0
            if not r["impl"].endswith("per graph"):
                assert r["speedup"] is not None and r["speedup"] > 0
    checks = {r["impl"]: r["check"] for r in rows}
    assert checks["posenc random_walk_se_batch, whole Batch"].startswith("max |diff|")
    diff = float(checks["posenc random_walk_se_batch, whole Batch"].split()[-1])
    assert diff < 1e-5  # equal to PyG's values
    fit = checks["posenc laplacian_pe_batch, whole Batch"].split()[-1]
    agree, total = map(int, fit.split("/"))
    assert agree == total > 0
    assert "speed-up vs PyG" in text


def test_guarded_child_reports_timeouts_and_results():
    data = graph_pe.random_graph(30, 60, seed=1)
    status, wall, _, out = graph_pe.run_guarded(graph_pe.pyg_rwse_one, (data, 4), timeout=60, memory_gb=8)
    assert status == "ok" and wall > 0 and out.shape == (30, 4)
    status, _, _, _ = graph_pe.run_guarded(graph_pe.pyg_rwse_one, (data, 4), timeout=1e-3, memory_gb=8)
    assert status == "timeout"
    status, _, _, _ = graph_pe.run_guarded(graph_pe.pyg_rwse_one, (data, 4), timeout=60, memory_gb=1e-6)
    assert status in ("memory", "ok")  # a fast child may finish before the first memory poll


def test_bench_helpers():
    data = graph_pe.random_graph(50, 100, seed=0)
    assert data.edge_index.shape == (2, 200)
    keys = set(map(tuple, data.edge_index.T.tolist()))
    assert all((v, u) in keys and u != v for u, v in keys)
    graphs, source = graph_pe.molecule_graphs(5)
    assert len(graphs) == 5 and all(g.num_nodes >= 2 for g in graphs) and source
    e = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    r = 2 ** -0.5  # path P3, normalised Laplacian: eigenvalues 0, 1, 2
    vecs = torch.tensor([[0.5, -r], [-r, 0.0], [0.5, r]], dtype=torch.float64)  # for 2 and 1
    assert graph_pe.laplacian_residual(e, 3, vecs, torch.tensor([2.0, 1.0])) < 1e-6
    assert graph_pe.laplacian_residual(e, 3, vecs, torch.tensor([1.0, 1.0])) > 0.1


def test_bench_graph_pe_bad_arguments(capsys, tmp_path):
    assert cli.main(["bench", "graph-pe", "--graphs", "0"]) == 2
    assert "--graphs" in capsys.readouterr().err
    assert cli.main(["bench", "graph-pe", "--workloads", "tiny"]) == 2
    assert "--workloads" in capsys.readouterr().err
    assert cli.main(["bench", "graph-pe", "--nodes", "4", "--edges", "10", "--no-progress"]) == 2
    assert "--edges" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("x")
    assert cli.main(["bench", "graph-pe", "--out", str(f), "--no-progress"]) == 2


def test_bench_graph_pe_background_load(tmp_path, capsys, monkeypatch):
    started = []
    real = graph_pe.background_load

    def recording(enabled, processes=1):
        cm = real(enabled, processes)

        class Wrapper:
            def __enter__(self):
                load = cm.__enter__()
                started.append(load)
                return load

            def __exit__(self, *exc):
                return cm.__exit__(*exc)

        return Wrapper()

    monkeypatch.setattr(graph_pe, "background_load", recording)
    out = tmp_path / "res"
    args = [*TINY, "--workloads", "molecules", "--graphs", "4"]
    assert cli.main(["bench", "graph-pe", *args, "--background-load", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    env = json.loads((out / "graph_pe.json").read_text())["environment"]
    assert env["background_load"] == "1 busy process"
    assert len(env["load_average"]) == 3
    assert "background load: 1 busy process; load average at the end:" in text
    assert started[0].count == 1 and all(p.poll() is not None for p in started[0].processes)  # stopped
    assert cli.main(["bench", "graph-pe", *args]) == 0
    assert "background load: off" in capsys.readouterr().out
