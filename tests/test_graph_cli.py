"""``posenc train graph``: bad arguments exit 2 with a clear message; a tiny run writes a
checkpoint and resumes from it."""

from __future__ import annotations

import json

import pytest
import torch
from torch_geometric.data import Data

from posenc.cli import main

from .cli_helpers import interrupted_at

TINY = ["--dim", "8", "--depth", "1", "--heads", "2", "--no-progress"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--dataset", "csl", "--encoding", "rotary"], "--encoding: unknown encoding 'rotary'"),
        (["--dataset", "csl", "--encoding", "rope"], "--encoding: 'rope' is a seq encoding; the GPS graph transformer takes graph encodings"),
        (["--dataset", "csl", "--encoding", "lap", "--lap-k", "0"], "argument --lap-k: expected a positive integer, got '0'"),
        (["--dataset", "csl", "--encoding", "none", "--dim", "30", "--heads", "4"], "--dim (30) must be divisible by --heads (4)"),
        (["--dataset", "csl", "--encoding", "none", "--csl-per-class", "5", "--csl-test-per-class", "5"],
         "--csl-test-per-class (5) must be below --csl-per-class (5)"),
        (["--dataset", "csl", "--encoding", "none", "--task", "node"], "--task node: dataset 'csl' has one target per graph"),
        (["--dataset", "csl", "--encoding", "none", "--resume"], "--resume needs --out"),
        (["--dataset", "csl", "--encoding", "none", "--csl-per-class", "3", "--csl-test-per-class", "1", "--batch-size", "50"],
         "--batch-size 50 exceeds the 20 training graphs"),
        (["--dataset", "no/such/file.pt", "--encoding", "none"], "--dataset: file 'no/such/file.pt' does not exist (the built-in datasets: csl, molecules)"),
    ],
)
def test_bad_arguments_exit_2(capsys, argv, message):
    assert main(["train", "graph", *argv, "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err


def test_bad_choice_exits_2(capsys):
    assert main(["train", "graph", "--dataset", "csl", "--encoding", "lap", "--local", "gcn"]) == 2
    assert "--local: invalid choice: 'gcn'" in capsys.readouterr().err


def _steps_logged(out_dir) -> list[int]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(ln)["step"] for ln in lines if json.loads(ln)["split"] == "train"]


def test_tiny_csl_run_checkpoints_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "graph", "--dataset", "csl", "--encoding", "rwse", "--walk-length", "4", "--csl-per-class", "3",
            "--csl-test-per-class", "1", "--batch-size", "4", "--out", str(out), *TINY]
    with interrupted_at(5):  # Ctrl-C after step 5: the checkpoint of step 4 stays
        assert main([*argv, "--steps", "6", "--checkpoint-every", "2"]) == 130
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 4 and ckpt["model_config"]["encoding"] == "rwse"
    assert main([*argv, "--steps", "6", "--checkpoint-every", "2", "--resume"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["steps"] == 6 and 0.0 <= result["test_accuracy"] <= 1.0
    assert result["command"] == "train graph" and result["model_config"]["encoding"] == "rwse"
    assert "test_accuracy" in result["metrics"] and result["train_config"]["steps"] == 6
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 6
    assert json.loads((out / "results.json").read_text())["steps"] == 6
    assert "final evaluation, accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("encoding", ["rrwp", "maglap", "stable_pe"])
def test_every_graph_encoding_trains(tmp_path, encoding):
    """The encodings whose structure a transform precomputes beyond LapPE, RWSE and landmark
    distances (RRWP's pairs, the magnetic Laplacian's eigenvectors, SPE's eigenpairs) get it: a
    tiny CSL run ends with a score, where before it stopped at the missing attribute."""
    out = tmp_path / "run"
    argv = ["train", "graph", "--dataset", "csl", "--encoding", encoding, "--csl-per-class", "3",
            "--csl-test-per-class", "1", "--batch-size", "4", "--steps", "2", "--out", str(out), *TINY]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["model_config"]["encoding"] == encoding and 0.0 <= result["test_accuracy"] <= 1.0


def test_recomputed_batch_norm_statistics_score_a_copy(tmp_path, capsys):
    base = ["train", "graph", "--dataset", "csl", "--encoding", "none", "--csl-per-class", "3", "--csl-test-per-class",
            "1", "--batch-size", "4", "--steps", "4", "--eval-every", "2", *TINY]
    assert main([*base, "--out", str(tmp_path / "running")]) == 0
    assert "final evaluation, accuracy" in capsys.readouterr().out
    assert main([*base, "--bn-stats", "recomputed", "--out", str(tmp_path / "recomputed")]) == 0
    assert "final evaluation, BatchNorm statistics recomputed over the training graphs" in capsys.readouterr().out
    running, recomputed = (torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["model"]
                           for name in ("running", "recomputed"))
    # the same training: scoring (twice during it, once at the end) left the model's statistics alone
    assert running.keys() == recomputed.keys() and all(torch.equal(running[k], recomputed[k]) for k in running)
    assert any(k.endswith("running_mean") for k in running)
    results = {name: json.loads((tmp_path / name / "results.json").read_text()) for name in ("running", "recomputed")}
    assert results["running"]["bn_stats"] == "running" and results["recomputed"]["bn_stats"] == "recomputed"


def test_tiny_molecule_run_reports_mae(tmp_path, capsys):
    argv = ["train", "graph", "--dataset", "molecules", "--encoding", "lap", "--lap-k", "3", "--molecules-limit", "40",
            "--cache-dir", str(tmp_path / "cache"), "--batch-size", "8", "--steps", "2", "--out", str(tmp_path / "run"), *TINY]
    assert main(argv) == 0
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result["metric"] == "mae" and result["val_mae"] > 0 and result["test_mae"] > 0
    assert "penalized logP" in result["target"] or "Crippen" in result["target"]
    assert "mean absolute error" in capsys.readouterr().out


def test_user_dataset_node_task_with_spd(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(10):
        n = 4 + i % 3
        ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
        graphs.append(Data(x=torch.randn(n, 2, generator=g), edge_index=torch.cat([ring, ring.flip(0)], 1),
                           y=torch.randint(0, 3, (n,), generator=g), num_nodes=n))
    path = tmp_path / "graphs.pt"
    torch.save(graphs, path)
    out = tmp_path / "run"
    assert main(["train", "graph", "--dataset", str(path), "--encoding", "spd", "--task", "node", "--batch-size", "4",
                 "--steps", "2", "--out", str(out), *TINY]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["metric"] == "accuracy" and 0.0 <= result["test_accuracy"] <= 1.0
    # a graph-level task on per-node targets is refused clearly
    assert main(["train", "graph", "--dataset", str(path), "--encoding", "none", "--steps", "1", *TINY]) == 2
    assert "the graph task needs one y per graph (use --task node" in capsys.readouterr().err


def test_demo_part_checks_its_arguments():
    import argparse

    from posenc.cli.demo import graph as part

    ok = argparse.Namespace(graph_encodings="none,lap,rwse,spd", graph_per_class=15)
    assert part.check(ok) is None
    bad = argparse.Namespace(graph_encodings="none,rope", graph_per_class=15)
    assert part.check(bad) == ("--graph-encodings: 'rope' is a seq encoding; the GPS graph transformer takes graph encodings "
                                "(posenc list --modality graph)")
    assert "unknown encoding 'lapx'" in part.check(argparse.Namespace(graph_encodings="lapx", graph_per_class=15))
    assert part.check(argparse.Namespace(graph_encodings="lap", graph_per_class=2)) == "--graph-per-class must be at least 3, got 2"
