"""One thread policy (posenc.common.threads): its default, set_threads for library users, and
--threads on every command that runs a model, applied before the command imports torch."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc import cli
from posenc.common import threads

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_user_setting(monkeypatch):
    for variable in threads.THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize("cores, others, expected", [
    (1, 0, 1), (2, 0, 2), (2, 1, 1), (2, 5, 1), (8, 3, 5), (64, 0, 64),
    (1, None, 1), (2, None, 1), (8, None, 7),  # no count to read: one fewer than the cores
])
def test_the_default_is_the_cores_other_processes_leave(monkeypatch, no_user_setting, cores, others, expected):
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(threads, "other_running", lambda: others)
    assert threads.default_threads() == expected


def test_other_running_reads_the_runnable_count_less_the_asking_thread(monkeypatch, tmp_path):
    """``/proc/loadavg``'s fourth field counts runnable tasks, the asking thread included; the
    median of three reads leaves out a process passing by; no file: None."""
    import builtins

    reads = iter(["0.50 0.40 0.30 3/412 999\n", "0.50 0.40 0.30 1/412 999\n", "0.50 0.40 0.30 2/412 999\n"])
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/loadavg":
            target = tmp_path / "loadavg"
            target.write_text(next(reads))
            return real_open(target, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    assert threads.other_running() == 1  # counts 2, 0, 1 -> median 1

    def no_file(path, *args, **kwargs):
        if path == "/proc/loadavg":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_file)
    assert threads.other_running() is None


@pytest.mark.parametrize("value, expected", [("3", 3), ("1", 1), (" 2 ", 2), ("0", 7), ("many", 7), ("", 7)])
def test_a_users_omp_num_threads_is_the_default_when_it_is_a_count(monkeypatch, value, expected):
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    monkeypatch.setattr(threads, "other_running", lambda: 1)
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert threads.default_threads() == expected


def test_usable_cores_follows_the_affinity():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this system")
    assert threads.usable_cores() == len(os.sched_getaffinity(0))


def test_resolve_threads(monkeypatch, no_user_setting):
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads, "other_running", lambda: 1)
    assert threads.resolve_threads(None) == 3
    assert threads.resolve_threads(0) is None  # torch's own default, untouched
    assert threads.resolve_threads(3) == 3
    assert threads.resolve_threads(9) == 4  # never more than the usable cores
    with pytest.raises(ValueError, match="threads must be >= 0"):
        threads.resolve_threads(-1)
    with pytest.raises(TypeError, match="threads must be an int"):
        threads.resolve_threads(True)
    with pytest.raises(TypeError, match="threads must be an int"):
        threads.resolve_threads(2.0)


def test_using_threads_sets_torch_and_the_variables_then_puts_them_back(monkeypatch, no_user_setting):
    before = torch.get_num_threads()
    monkeypatch.setenv("MKL_NUM_THREADS", "5")
    target = 1 if before != 1 else 2
    with threads.using_threads(target) as count:
        assert count == target and torch.get_num_threads() == target
        assert all(os.environ[v] == str(target) for v in threads.THREAD_VARIABLES)
    assert torch.get_num_threads() == before
    assert "OMP_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "5"


def test_zero_leaves_torch_alone(no_user_setting):
    before = torch.get_num_threads()
    with threads.using_threads(0) as count:
        assert count is None and torch.get_num_threads() == before
        assert "OMP_NUM_THREADS" not in os.environ


def _run(code: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in threads.THREAD_VARIABLES}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=environ)


def test_set_threads_before_torch_is_imported_sizes_torch_when_it_loads():
    done = _run("import sys, posenc\n"
                "assert posenc.set_threads(1) == 1 and 'torch' not in sys.modules\n"
                "import torch\n"
                "print(torch.get_num_threads())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


def test_set_threads_after_torch_is_imported_sets_it_at_once():
    done = _run("import torch, posenc\n"
                "torch.set_num_threads(1)\n"
                "print(posenc.set_threads(2), torch.get_num_threads())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(min(2, threads.usable_cores()))] * 2


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser (all modules imported), by its words: 'train seq', 'demo', ..."""
    parser = cli.build_parser(None)
    found = {}

    def walk(p: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[" ".join(words)] = p
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*words, name))

    walk(parser, ())
    return found


def test_every_command_that_runs_a_model_takes_threads():
    parsers = _command_parsers()
    from posenc.cli.bench import BENCHMARKS

    expected = {"demo", "extend", *(f"train {m}" for m in cli.TRAIN_COMMANDS), *(f"bench {b}" for b in BENCHMARKS)}
    assert expected <= set(parsers), sorted(expected - set(parsers))
    for words in expected:
        options = {s for a in parsers[words]._actions for s in a.option_strings}
        assert "--threads" in options, f"posenc {words} has no --threads"
    assert "--threads" not in {s for a in parsers["list"]._actions for s in a.option_strings}


@pytest.mark.parametrize("argv, expected", [(["--threads", "1"], 1), (["--threads", "2"], 2), ([], None)])
def test_main_applies_threads_before_the_command_runs_and_restores_after(monkeypatch, no_user_setting, argv, expected):
    import posenc.cli.train.seq as command

    seen = {}

    def fake_run(args):
        seen["torch"], seen["omp"] = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
        return 0

    monkeypatch.setattr(command, "run", fake_run)
    monkeypatch.setattr(threads, "usable_cores", lambda: 3)
    monkeypatch.setattr(threads, "other_running", lambda: 1)  # the default: 2
    before = torch.get_num_threads()
    assert cli.main(["train", "seq", "--encoding", "rope", *argv]) == 0
    want = 2 if expected is None else expected
    assert seen == {"torch": want, "omp": str(want)}
    assert torch.get_num_threads() == before and "OMP_NUM_THREADS" not in os.environ


def test_bad_threads_is_one_line_before_torch():
    done = _run("import contextlib, io, sys\n"
                "from posenc.cli import main\n"
                "err = io.StringIO()\n"
                "with contextlib.redirect_stderr(err):\n"
                "    rc = main(['train', 'vision', '--encoding', 'peg', '--threads', '-2'])\n"
                "print(rc, 'torch' in sys.modules)\n"
                "print(err.getvalue().strip())\n")
    assert done.returncode == 0, done.stderr
    first, message = done.stdout.strip().split("\n")
    assert first == "2 False"
    assert "argument --threads: expected a non-negative integer, got '-2'" in message
