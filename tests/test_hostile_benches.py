"""Hostile input, round three (issue 51): the commands (benches, train, demo, extend).

* One size policy (:mod:`posenc.cli.sizes`): every command lists its size flags and estimates its
  run; an absurd size is refused before any work with one line naming the flag, the value, the
  estimate and the limit (and the largest value that fits); ``--allow-large`` lifts it; the
  defaults pass.
* One writer (:mod:`posenc.cli.outputs`): nothing is written through a link planted in ``--out``
  (dangling or not), and an ``--out`` that cannot be written (its parent a file) is one line and
  exit 2 before any work; plots go through the same writer.
* Code from a path the user gave is announced on stderr before it is imported."""

from __future__ import annotations

import argparse
import importlib
import os
import textwrap

import pytest

from posenc import cli
from posenc.cli import sizes
from posenc.cli.outputs import OutputRefused, out_error, save_figure, write_file, write_json_file


def one_line(argv, capsys, *fragments):
    """The command exits 2 with one line on stderr holding every fragment."""
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def commands() -> dict[tuple[str, ...], str]:
    """Every command that runs a model -> its module."""
    table = {(group, name): module for group, (_, entries) in cli.command_groups().items()
             for name, (module, _) in entries.items()}
    table.update({(name,): module for name, (module, _) in cli.COMMANDS.items()})
    return table


# ---- one size policy -----------------------------------------------------------------------------


@pytest.mark.parametrize("words, module", sorted(commands().items()), ids=lambda v: "-".join(v) if isinstance(v, tuple) else "")
def test_every_command_declares_its_sizes_and_takes_allow_large(words, module):
    mod = importlib.import_module(module)
    assert mod.SIZE_FLAGS and callable(mod.estimate), module
    parser = argparse.ArgumentParser()
    mod.add_arguments(parser)
    dests = {a.dest for a in parser._actions}
    assert "allow_large" in dests, module
    assert set(dict(sizes._flag_of(f) for f in mod.SIZE_FLAGS)) <= dests, module


DEFAULT_RUNS = [
    ["train", "seq", "--encoding", "rope"],
    ["train", "seq", "--encoding", "rope", "--task", "copy"],
    ["train", "vision", "--encoding", "peg"],
    ["train", "vision", "--encoding", "rope3d", "--video"],
    ["train", "graph", "--dataset", "csl", "--encoding", "lap"],
    ["train", "graph", "--dataset", "molecules", "--encoding", "rwse"],
    ["train", "timeseries", "--encoding", "tape+erpe"],
    ["demo"],
    ["bench", "attention"],
    ["bench", "attention", "--encodings", "all", "--seq-lens", "512,1024,2048,4096"],
    ["bench", "generate"],
    ["bench", "models"],
    ["bench", "models", "--lm-encodings", "all"],
    ["bench", "extrapolation"],
    ["bench", "extrapolation", "--task", "copy"],
    ["bench", "length-generalization"],
    ["bench", "length-generalization", "--full"],
    ["bench", "context-extension"],
    ["bench", "resolution"],
    ["bench", "graph-pe"],
    ["bench", "spline"],
    ["bench", "hf"],
    ["bench", "timeseries"],
    ["tune"],
]


def _module_of(argv):
    words = tuple(w for w in argv[:2] if not w.startswith("-"))
    table = commands()
    return importlib.import_module(table.get(words) or table[words[:1]])


def _parsed(argv) -> argparse.Namespace:
    args, _ = cli.build_parser(argv).parse_known_args(argv)
    return args


@pytest.mark.parametrize("argv", DEFAULT_RUNS, ids=" ".join)
def test_the_default_runs_pass_the_policy(argv):
    mod = _module_of(argv)
    args = _parsed(argv)
    if argv[:2] == ["bench", "length-generalization"]:
        args.device = "cpu"
        mod._resolve(args)  # its names first (the policy runs in it: a refusal is a ValueError)
    assert sizes.size_error(args, mod.SIZE_FLAGS, mod.estimate, sizes.defaults_of(mod.add_arguments),
                            device="cpu") is None


ABSURD = [
    (["train", "seq", "--encoding", "rope", "--task", "copy", "--length", "100000"], "--length 100000"),
    (["train", "seq", "--encoding", "rope", "--task", "copy", "--eval-lens", "100000"], "--eval-lens 100000"),
    (["train", "seq", "--encoding", "rope", "--steps", "1000000000"], "--steps 1000000000"),
    (["train", "vision", "--encoding", "peg", "--steps", "1000000000"], "--steps 1000000000"),
    (["train", "graph", "--dataset", "csl", "--encoding", "lap", "--epochs", "100000000"], "--epochs 100000000"),
    (["train", "timeseries", "--epochs", "1000000000"], "--epochs 1000000000"),
    (["demo", "--steps", "1000000000"], "--steps 1000000000"),
    (["bench", "attention", "--repeats", "1000000000"], "--repeats 1000000000"),
    (["bench", "attention", "--seq-len", "10000000"], "--seq-len 10000000"),
    (["bench", "generate", "--decode-tokens", "1000000"], "--decode-tokens 1000000"),
    (["bench", "generate", "--repeats", "1000000000"], "--repeats 1000000000"),
    (["bench", "generate", "--warmup", "1000000000"], "--warmup 1000000000"),
    (["bench", "models", "--graphs", "1000000000"], "--graphs 1000000000"),
    (["bench", "models", "--repeats", "1000000000"], "--repeats 1000000000"),
    (["bench", "extrapolation", "--steps", "1000000000"], "--steps 1000000000"),
    (["bench", "length-generalization", "--seeds", "1000000"], "--seeds 1000000"),
    (["bench", "context-extension", "--finetune-steps", "1000000000"], "--finetune-steps 1000000000"),
    (["bench", "resolution", "--steps", "1000000000"], "--steps 1000000000"),
    (["bench", "graph-pe", "--repeats", "1000000000"], "--repeats 1000000000"),
    (["bench", "spline", "--scales", "1000000000"], "--scales 1000000000"),
    (["bench", "hf", "--gen-tokens", "1000000000"], "--gen-tokens 1000000000"),
    (["bench", "timeseries", "--seeds", ",".join(map(str, range(100000)))], "--seeds 0,1,2"),
    (["tune", "--repeats", "1000000000", "--dry-run"], "--repeats 1000000000"),
]


@pytest.mark.parametrize("argv, fragment", ABSURD, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else "")
def test_absurd_sizes_are_refused_before_any_work_naming_the_flag_the_estimate_and_the_limit(argv, fragment, capsys):
    err = one_line([*argv, "--device", "cpu"] if "--device" in _flags(argv) else argv, capsys, fragment,
                   "--allow-large", "over the limit of")
    assert ("hours of work" in err) or ("GiB of memory" in err), err


def _flags(argv) -> set[str]:
    parser = argparse.ArgumentParser()
    _module_of(argv).add_arguments(parser)
    return {s for a in parser._actions for s in a.option_strings}


def test_allow_large_lifts_the_refusal_and_the_bound_is_the_largest_value_that_fits():
    argv = ["bench", "generate", "--decode-tokens", "1000000"]
    mod = _module_of(argv)
    args = _parsed(argv)
    defaults = sizes.defaults_of(mod.add_arguments)
    error = sizes.size_error(args, mod.SIZE_FLAGS, mod.estimate, defaults, device="cpu")
    bound = int(error.split("at most about ")[1].split(" fit")[0])
    assert sizes.size_error(argparse.Namespace(**{**vars(args), "decode_tokens": bound}), mod.SIZE_FLAGS, mod.estimate,
                            defaults, device="cpu") is None
    assert sizes.size_error(argparse.Namespace(**{**vars(args), "decode_tokens": bound + 1}), mod.SIZE_FLAGS,
                            mod.estimate, defaults, device="cpu") is not None
    assert sizes.size_error(_parsed([*argv, "--allow-large"]), mod.SIZE_FLAGS, mod.estimate, defaults) is None


def test_the_policy_names_the_flag_that_grew_the_run_and_a_known_bound():
    limit = sizes.HOURS_LIMIT * 3600 * sizes.CPU_FLOPS  # operations that fit

    def estimate(args):
        return sizes.Work(flops=args.a * args.b * 1e9)

    defaults = {"a": 1, "b": 1}.get
    args = argparse.Namespace(a=10, b=10**9, allow_large=False, device="cpu")
    error = sizes.size_error(args, ("a", "b"), estimate, defaults)
    assert error.startswith("--b 1000000000: the run would need about"), error
    assert f"at most about {int(limit // (10 * 1e9))} fit" in error, error
    assert sizes.size_error(argparse.Namespace(a=1, b=1, allow_large=False, device="cpu"), ("a", "b"), estimate,
                            defaults) is None


def test_memory_is_checked_against_the_machine():
    def estimate(args):
        return sizes.Work(bytes=args.n * 2**30)

    limits = sizes.limits_for("cpu")
    if limits.memory is None:
        pytest.skip("this system does not say how much memory it has")
    args = argparse.Namespace(n=10**7, allow_large=False, device="cpu")
    error = sizes.size_error(args, ("n",), estimate, {"n": 1}.get)
    assert "GiB of memory" in error and "80% of cpu's memory" in error
    assert f"at most about {int(limits.memory // 2**30)} fit" in error, error


# ---- one writer ----------------------------------------------------------------------------------

WRITERS = [
    (["bench", "generate", "--contexts", "8", "--batches", "1", "--encodings", "rope", "--no-peers",
      "--decode-tokens", "1", "--repeats", "1", "--warmup", "0", "--dim", "16", "--depth", "1", "--heads", "2"],
     "generate.png"),
    (["bench", "models", "--models", "lm", "--lm-encodings", "rope", "--no-compile", "--repeats", "1", "--warmup", "0",
      "--batch", "1", "--seq-len", "8"], "models.txt"),
    (["bench", "attention", "--encodings", "alibi", "--no-peers", "--seq-len", "16", "--batch", "1", "--heads", "2",
      "--head-dim", "8", "--repeats", "1", "--warmup", "0", "--linear-encodings", "off"], "attention.txt"),
    (["bench", "extrapolation", "--encodings", "rope", "--steps", "1", "--dim", "16", "--depth", "1", "--heads", "2",
      "--train-len", "16", "--eval-lens", "16", "--eval-tokens", "32"], "extrapolation.png"),
    (["bench", "context-extension", "--steps", "1", "--finetune-steps", "0", "--methods", "none", "--train-len", "16",
      "--eval-lens", "16,32", "--eval-tokens", "64", "--dim", "16", "--depth", "1", "--heads", "2"],
     "context_extension.png"),
    (["bench", "spline", "--models", "spline", "--steps", "1", "--scales", "1", "--eval-curves", "4", "--dim", "16",
      "--heads", "2", "--depth", "1"], "spline.png"),
    (["bench", "resolution", "--encodings", "sincos2d", "--steps", "1", "--seeds", "0", "--scales", "1", "--dim", "16",
      "--depth", "1", "--heads", "2", "--repeats", "1"], "resolution.png"),
    (["bench", "hf", "--variants", "hf", "--steps", "1", "--dim", "16", "--depth", "1", "--heads", "2",
      "--train-len", "16", "--eval-factors", "1", "--eval-tokens", "32", "--gen-tokens", "1", "--gen-batch", "1"],
     "hf.png"),
    (["bench", "length-generalization", "--tasks", "copy", "--encodings", "nope", "--seeds", "1", "--lm-encodings",
      "none", "--steps", "1", "--eval-examples", "2"], "length_generalization.png"),
    (["bench", "length-generalization", "--tasks", "copy", "--encodings", "nope", "--seeds", "1", "--lm-encodings",
      "none", "--steps", "1", "--eval-examples", "2"], "units.jsonl"),
    (["bench", "timeseries", "--seeds", "0", "--encodings", "none", "--datasets", "BasicMotions"], "timeseries.png"),
    (["bench", "graph-pe", "--graphs", "2", "--nodes", "8", "--edges", "16", "--repeats", "1", "--workloads",
      "molecules"], "graph_pe.json"),
    # a train command refuses a --out holding anything unless --resume: there, the link is named
    (["train", "seq", "--encoding", "rope", "--steps", "1", "--dim", "16", "--depth", "1", "--heads", "2", "--resume"],
     "checkpoint.pt"),
    (["train", "seq", "--encoding", "rope", "--steps", "1", "--dim", "16", "--depth", "1", "--heads", "2", "--resume"],
     "results.json"),
]


@pytest.mark.parametrize("dangling", [False, True], ids=["planted", "dangling"])
@pytest.mark.parametrize("argv, name", WRITERS, ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else v)
def test_a_link_in_out_is_refused_before_any_work_and_never_written_through(argv, name, dangling, tmp_path, capsys):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    if not dangling:
        victim.write_text("keep me")
    os.symlink(victim, out / name)
    one_line([*argv, "--out", str(out), "--no-progress"], capsys, "--out", name, "symbolic link")
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_text() == "keep me"


WRITE_COMMANDS = sorted({tuple(argv[:2]) for argv, _ in WRITERS}) + [("demo",), ("train", "vision"),
                                                                    ("train", "graph"), ("train", "timeseries")]
REQUIRED = {("train", "seq"): ["--encoding", "rope"], ("train", "vision"): ["--encoding", "peg"],
            ("train", "graph"): ["--dataset", "csl", "--encoding", "lap"]}


@pytest.mark.parametrize("words", WRITE_COMMANDS, ids=" ".join)
def test_an_out_under_a_file_is_one_line_before_any_work(words, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    one_line([*words, *REQUIRED.get(words, []), "--out", str(afile / "run"), "--no-progress"], capsys,
             "--out", "is a file, not a directory")


def test_the_writer_refuses_links_names_that_are_paths_and_writes_atomically(tmp_path):
    out = tmp_path / "run"
    assert write_file(out, "a.txt", "one").read_text() == "one"
    assert write_file(out, "a.txt", b"two").read_bytes() == b"two"
    assert write_json_file(out, "r.json", {"x": float("nan")}).read_text() == '{\n  "x": null\n}\n'
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, out / "b.txt")
    os.symlink(tmp_path / "nowhere", out / "c.txt")
    for name in ("b.txt", "c.txt"):
        with pytest.raises(OutputRefused, match="symbolic link"):
            write_file(out, name, "x")
    assert victim.read_text() == "keep me" and not (tmp_path / "nowhere").exists()
    for name in ("../escape.txt", "sub/x.txt", "", ".."):
        with pytest.raises(OutputRefused, match="plain file name"):
            write_file(out, name, "x")
    assert not (tmp_path / "escape.txt").exists()
    (out / "d.txt").mkdir()
    with pytest.raises(OutputRefused, match="not a plain file"):
        write_file(out, "d.txt", "x")
    linked = tmp_path / "linked"
    os.symlink(out, linked)
    with pytest.raises(OutputRefused, match="symbolic link"):
        write_file(linked, "e.txt", "x")


def test_plots_share_the_writer(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path, "p.png", dpi=50)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    victim = tmp_path / "victim.png"
    os.symlink(victim, tmp_path / "q.png")
    with pytest.raises(OutputRefused, match="symbolic link"):
        save_figure(fig, tmp_path, "q.png")
    plt.close(fig)
    assert not victim.exists()


def test_out_error_names_what_is_wrong(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "is a file, not a directory" in out_error(afile / "run" / "deeper")
    assert "exists and is not a directory" in out_error(afile)
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    assert "symbolic link" in out_error(tmp_path / "dangling")
    assert "dangling symbolic link" in out_error(tmp_path / "dangling" / "run")
    assert out_error(tmp_path / "new" / "run", ["x.txt"]) is None and (tmp_path / "new" / "run").is_dir()
    (tmp_path / "new" / "run" / "x.txt").mkdir()
    assert "not a plain file" in out_error(tmp_path / "new" / "run", ["x.txt"])
    if os.path.isdir("/proc/self"):  # a directory nobody can create a file in, root included
        assert "cannot be created" in out_error("/proc/self/posenc-run") or "not writable" in out_error(
            "/proc/self/posenc-run")


# ---- code from a user-given path -----------------------------------------------------------------


# a stand-in for the authors' ConvTran checkout's Models/model.py (scripts/hostile_audit_cli.py uses it too)
CONVTRAN = textwrap.dedent("""\
    import sys
    import torch
    print("user code ran", file=sys.stderr)

    class ConvTran(torch.nn.Module):
        def __init__(self, config, num_classes):
            super().__init__()
            self.head = torch.nn.Linear(config["Data_shape"][1] * config["Data_shape"][2], num_classes)

        def forward(self, x):
            return self.head(x.flatten(1))
    """)


def test_the_convtran_repo_is_announced_before_its_code_runs(tmp_path, capsys):
    from posenc.cli.bench.models import ModelsBenchConfig
    from posenc.cli.bench.models_units import authors_convtran

    (tmp_path / "Models").mkdir()
    (tmp_path / "Models" / "__init__.py").write_text("")
    (tmp_path / "Models" / "model.py").write_text(CONVTRAN)
    cfg = ModelsBenchConfig(models=("convtran",), convtran_repo=str(tmp_path), series=2, series_len=8)
    unit = authors_convtran(cfg)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"posenc bench models: note: --convtran-repo: importing and running the Python code of "
                      f"{tmp_path.resolve() / 'Models' / 'model.py'}")
    assert err[1] == "user code ran"  # the notice came first
    assert unit.loss_of(unit.apply(unit.model)).ndim == 0


def test_a_dataset_module_is_announced_before_its_code_runs(tmp_path, capsys, monkeypatch):
    from posenc.cli.train import graph as tg

    (tmp_path / "my_graphs_issue51.py").write_text(textwrap.dedent("""\
        import sys
        import torch
        from torch_geometric.data import Data
        print("user code ran", file=sys.stderr)

        def graphs():
            ring = torch.tensor([[0, 1, 2], [1, 2, 0]])
            return [Data(edge_index=ring, y=torch.tensor([i % 2]), num_nodes=3) for i in range(6)]
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    args = argparse.Namespace(dataset=None, dataset_module="my_graphs_issue51:graphs", task="graph", seed=0)
    task = tg.load_task(args)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("posenc train graph: note: --dataset-module: importing and running the Python code of module "
                      "'my_graphs_issue51'")
    assert err[1] == "user code ran" and len(task.graphs) == 6


# ---- round three's audit (scripts/hostile_audit.py): what it found ----------------------------------


@pytest.mark.parametrize("argv, fragment", [
    (["--length", "100000"], "--length 100000: a task setting (the largest training size), but no --task is given"),
    (["--num-symbols", "9"], "--num-symbols 9: a task setting"),
    (["--eval-examples", "7"], "--eval-examples 7: a task setting"),
    (["--task", "copy", "--seq-len", "100000"], "--seq-len 100000: a text setting (the training window in bytes), but "
                                                "--task copy trains on a synthetic task"),
    (["--task", "copy", "--eval-tokens", "99"], "--eval-tokens 99: a text setting"),
])
def test_train_seq_refuses_a_flag_its_data_does_not_read(argv, fragment, capsys):
    """``--length 100000`` without --task was ignored without a word: the default text run trained."""
    one_line(["train", "seq", "--encoding", "rope", *argv], capsys, fragment)


def test_train_seq_takes_each_datas_own_flags():
    from posenc.cli.train import seq

    for argv in (["--task", "copy", "--length", "8", "--num-symbols", "9", "--eval-examples", "7"],
                 ["--seq-len", "64", "--eval-tokens", "512"]):
        assert seq._other_data_error(_parsed(["train", "seq", "--encoding", "rope", *argv])) is None


def test_length_generalization_sizes_its_jobs_by_their_processes(monkeypatch, capsys):
    """``--jobs 1000000`` started a worker process (torch and a model each) for every unit at once."""
    monkeypatch.setattr(sizes, "_physical_memory", lambda: 8 * 2**30)
    err = one_line(["bench", "length-generalization", "--jobs", "1000000", "--device", "cpu"], capsys,
                   "--jobs 1000000: the run would need about", "GiB of memory", "--allow-large")
    bound = int(err.split("at most about ")[1].split(" fit")[0])
    assert 1 <= bound < 20, err
    from posenc.cli.bench import length_budget

    args = _parsed(["bench", "length-generalization", "--tasks", "copy", "--encodings", "rope", "--lm-encodings", "none",
                    "--seeds", "2", "--jobs", "1000000"])
    args.device = "cpu"
    importlib.import_module("posenc.cli.bench.length_generalization")._resolve(args)
    sizes_given = dict(budget=(250, 200, 16), small_model={"dim": 64, "depth": 2, "heads": 4, "lr": 1e-3},
                       lm_eval_lens=(128,))
    alone = length_budget.estimate(argparse.Namespace(**{**vars(args), "jobs": 1}), **sizes_given)
    many = length_budget.estimate(args, **sizes_given)
    # two units: two workers whatever --jobs says, each with its process and its unit's peak
    assert many.bytes == 2 * (length_budget.WORKER_BYTES + alone.bytes) and many.flops == alone.flops


@pytest.mark.parametrize("words", [("bench", "generate"), ("bench", "attention")])
def test_long_repeats_is_a_cap_that_asks_for_no_more_work(words):
    mod = _module_of(list(words))
    capped = _parsed([*words, "--long-repeats", "1000000000"])
    at_repeats = _parsed([*words, "--long-repeats", str(capped.repeats)])  # the most it can ask: --repeats rounds
    assert mod.estimate(capped) == mod.estimate(at_repeats)
    assert sizes.size_error(capped, mod.SIZE_FLAGS, mod.estimate, sizes.defaults_of(mod.add_arguments),
                            device="cpu") is None


def test_a_missing_convtran_repo_is_named_by_its_flag(tmp_path, capsys):
    (tmp_path / "Models").mkdir()  # a directory without Models/model.py
    for repo in (tmp_path / "nowhere", tmp_path):
        one_line(["bench", "models", "--models", "convtran", "--convtran-repo", str(repo)], capsys,
                 "--convtran-repo: convtran_repo must be a checkout", str(repo))


def test_a_dataset_module_that_cannot_be_imported_is_named_by_its_flag(capsys):
    code = cli.main(["train", "graph", "--dataset-module", "no_such_module_issue51:graphs", "--encoding", "lap"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 2 and ": note: --dataset-module:" in err[0], err
    assert err[1].startswith("posenc train graph: error: --dataset-module no_such_module_issue51:graphs: dataset entry "
                             "point 'no_such_module_issue51:graphs': module 'no_such_module_issue51' cannot be imported"), err
