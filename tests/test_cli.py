"""The ``posenc`` command line: list, argument errors, lazily imported subcommands."""

from __future__ import annotations

import pytest

import posenc
from posenc import cli


def _first_column(text: str) -> list[str]:
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
    return [line.split()[0] for line in lines[rule + 1:]
            if line.strip() and not line.startswith(" ") and not line.endswith(("encoding", "encodings"))]


def test_list_shows_every_registered_encoding(capsys):
    assert cli.main(["list", "--wide"]) == 0
    out = capsys.readouterr().out
    names = [info.name for info in posenc.available()]
    assert names, "the registry is empty"
    assert _first_column(out) == names
    header = out.splitlines()[0].split()
    assert header == ["name", "modality", "hooks", "causal-only", "paper"]
    for info in posenc.available():
        assert info.paper in out


def test_list_fits_100_columns_with_each_paper_under_its_row(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= cli.LIST_WIDTH
    assert _first_column(out) == [info.name for info in posenc.available()]
    words = " ".join(line.strip() for line in out.splitlines() if line.startswith("    "))
    for info in posenc.available():
        assert " ".join(info.paper.split()) in words


def test_list_filters_by_modality(capsys):
    assert cli.main(["list", "--modality", "seq"]) == 0
    out = capsys.readouterr().out
    assert _first_column(out) == [info.name for info in posenc.available("seq")]


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "required"),
        (["frobnicate"], "invalid choice"),
        (["list", "--modality", "nope"], "--modality"),
        (["list", "--bogus"], "unrecognized arguments"),
        (["bench"], "required"),
        (["bench", "nope"], "invalid choice"),
        (["bench", "attention", "--seq-len", "0"], "--seq-len"),
        (["bench", "attention", "--batch", "two"], "--batch"),
        (["bench", "attention", "--warmup", "-1"], "--warmup"),
        (["bench", "attention", "--dtype", "float64"], "--dtype"),
        (["bench", "attention", "--device", "tpu"], "--device"),
        (["bench", "attention", "--encodings", "rope,no_such_encoding"], "'no_such_encoding'"),
        (["bench", "attention", "--json", "/no/such/dir/out.json"], "--json"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, needle, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and needle in err


def test_help_and_version_exit_0(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("list", "bench", "demo"):
        assert command in out
    assert cli.main(["bench", "--help"]) == 0
    assert "attention" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert posenc.__version__ in capsys.readouterr().out


def test_unavailable_subcommand_module_exits_2_and_leaves_others_working(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "demo", ("posenc._no_such_module_", "demo"))
    assert cli.main(["demo", "--anything", "goes"]) == 2
    err = capsys.readouterr().err
    assert "posenc demo: error: not available" in err and "posenc._no_such_module_" in err
    # The broken module is only imported for its own subcommand.
    assert cli.main(["list"]) == 0
    # Building the full parser (every subcommand) still works.
    assert cli.build_parser() is not None


def test_new_group_entries_become_subcommands(monkeypatch, capsys):
    monkeypatch.setitem(cli.TRAIN_COMMANDS, "seq", ("posenc._no_such_trainer_", "train a sequence model"))
    assert cli.main(["train", "--help"]) == 0
    assert "seq" in capsys.readouterr().out
    assert cli.main(["train", "seq"]) == 2
    assert "posenc train seq: error: not available" in capsys.readouterr().err


def test_command_path():
    assert cli._command_path(["bench", "attention", "--seq-len", "8"]) == ("bench", "attention")
    assert cli._command_path(["list", "--modality", "seq"]) == ("list",)
    assert cli._command_path(["--version"]) == ()
