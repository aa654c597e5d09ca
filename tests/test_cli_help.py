"""Every ``--help`` shows each default once, and every error starts with ``PROG: error:``."""

from __future__ import annotations

import argparse
import re

import pytest

from posenc import cli

DEFAULT = re.compile(r"(?:^|[(;,]) *default[: ]")


def _command_paths() -> list[tuple[str, ...]]:
    paths = [("list",)] + [(name,) for name in cli.COMMANDS]
    for group, (_, table) in cli.command_groups().items():
        paths += [(group, name) for name in table]
    return paths


def _subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = cli.build_parser(list(path))
    for word in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


@pytest.mark.parametrize("path", _command_paths(), ids=" ".join)
def test_every_default_is_shown_once(path):
    parser = _subparser(path)
    formatter = parser._get_formatter()
    assert any(a.option_strings for a in parser._actions if a.dest != "help"), f"{path}: no options (not loaded?)"
    for action in parser._actions:
        if not action.option_strings or action.help is argparse.SUPPRESS:
            continue
        text = formatter._expand_help(action) if action.help else ""
        flag = action.option_strings[-1]
        assert len(DEFAULT.findall(text)) <= 1, f"posenc {' '.join(path)} {flag}: {text!r}"
        if cli.shows_default(action) or (action.nargs != 0 and action.default not in (None, argparse.SUPPRESS)
                                         and action.default != []):
            assert DEFAULT.search(text), f"posenc {' '.join(path)} {flag} has default {action.default!r} but " \
                                         f"its help does not show it: {text!r}"
    assert "default: True" not in parser.format_help() and "default: False" not in parser.format_help()


@pytest.mark.parametrize("argv", [
    ["demo", "--parts", "audio"],
    ["demo", "--ts-dataset", "Nope"],
    ["bench", "graph-pe", "--nodes", "3", "--edges", "10"],
    ["bench", "timeseries", "--datasets", "Nope"],
    ["bench", "attention", "--seq-len", "8", "--seq-lens", "8,16"],
    ["bench", "resolution", "--encodings", "rope4d"],
    ["bench", "spline", "--models", "splin"],
    ["bench", "extrapolation", "--encodings", "rop"],
    ["extend", "/nonexistent-run", "--method", "pi"],
    ["train", "seq", "--encoding", "rop"],
    ["train", "vision", "--encoding", "graphormer"],
    ["train", "timeseries", "--encoding", "tap+erpe"],
    ["train", "graph", "--dataset", "csl", "--encoding", "lapp"],
])
def test_every_error_is_one_line_starting_with_prog_error(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    prog = "posenc " + " ".join(argv[:2] if argv[0] in ("bench", "train") else argv[:1])
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: "), err
