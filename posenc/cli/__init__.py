"""The ``posenc`` command line.

::

    posenc list [--modality M]          the registered encodings
    posenc bench attention [options]    attention benchmark (see posenc.cli.bench.attention)
    posenc demo [options]               see posenc.cli.demo
    posenc extend RUN_DIR [options]     context extension of a trained RoPE run (see posenc.cli.train.extend)
    posenc tune [options]               measure this machine's kernel choices (see posenc.cli.tune)

Subcommands other than ``list`` live in their own modules, each defining
``add_arguments(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``
(the exit status). A module is imported only when its subcommand is the one being run, so a
missing or broken module affects that subcommand alone: it then prints why and exits with 2.

Adding commands:

* ``posenc bench NAME``: a module in :mod:`posenc.cli.bench` and a line in ``posenc.cli.bench.BENCHMARKS``.
* ``posenc train MODALITY``: a module in :mod:`posenc.cli.train` and a line in :data:`TRAIN_COMMANDS`.
* a new group of subcommands: an entry in :func:`command_groups`; a single command: :data:`COMMANDS`.

Bad input exits with 2 (argparse's convention) and a message naming the argument.
Every command except ``list`` takes ``--threads`` (added here, applied by :func:`main` before the
command imports torch; see :mod:`posenc.common.threads`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import sys
from typing import Callable, Mapping, Sequence

# name -> (module, one-line help): commands taking no further subcommand.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("posenc.cli.demo", "a short demonstration of the encodings (see posenc.cli.demo)"),
    "extend": ("posenc.cli.train.extend", "extend the context of a trained RoPE run of posenc train seq (PI, NTK, YaRN, ...)"),
    "tune": ("posenc.cli.tune", "measure which kernel choices are faster on this machine and keep them for the plan"),
}

# modality -> (module, one-line help) for ``posenc train MODALITY``; the modules live in posenc.cli.train.
TRAIN_COMMANDS: dict[str, tuple[str, str]] = {
    "seq": ("posenc.cli.train.seq", "train a causal LM or sequence model on text or a synthetic task"),
    "vision": ("posenc.cli.train.vision", "train a ViT on digits placed on a canvas, an image folder or moving-digit videos (--video)"),
    "graph": ("posenc.cli.train.graph", "train a GPS-style graph transformer on CSL, molecules or a PyG dataset"),
    "timeseries": ("posenc.cli.train.timeseries", "train a ConvTran-style classifier on a UEA/UCR dataset"),
}


def command_groups() -> dict[str, tuple[str, Mapping[str, tuple[str, str]]]]:
    """group -> (help, {name: (module, help)}): the two-level commands (``posenc GROUP NAME``)."""
    from .bench import BENCHMARKS

    return {
        "bench": ("run a benchmark", BENCHMARKS),
        "train": ("train a small model with a position encoding", TRAIN_COMMANDS),
    }


Handler = Callable[[argparse.Namespace], int]


# help text that already names its default ("(default: 4)", "(default 4; none: 1)")
_SAYS_DEFAULT = re.compile(r"(?:^|[(;,]) *default[: ]")


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` should add ``(default: X)`` to ``action``: an option taking a value
    whose default is something (not None, not an empty list) and whose help does not already
    name it. Flags (``store_true``, ``--no-peers``) take no value; their default is the flag unset."""
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0:
        return False
    if isinstance(default, (list, tuple)) and not default:
        return False
    return not _SAYS_DEFAULT.search(action.help or "")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` once where there is a default to show (see :func:`shows_default`)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not shows_default(action):
            return action.help
        if isinstance(action.default, (list, tuple)):  # as it is typed: 0,1 rather than [0, 1]
            return f"{action.help or ''} (default: {','.join(map(str, action.default))})".lstrip()
        return f"{action.help or ''} (default: %(default)s)".lstrip()


class Parser(argparse.ArgumentParser):
    """argparse with two house rules: every ``--help`` shows the defaults, and a usage error is
    one line (``prog: error: ...``; ``--help`` shows the usage) with exit status 2."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse's hook; never returns
        self.exit(2, f"{self.prog}: error: {_with_suggestion(message)} (see {self.prog} --help)\n")


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<name>[^']*)' \(choose from (?P<choices>.*)\)$")


def _with_suggestion(message: str) -> str:
    """argparse's ``invalid choice: 'lst' (choose from ...)`` with the closest choices instead of all
    of them when one is close (``did you mean 'list'?``)."""
    from .catalog import suggest

    match = _INVALID_CHOICE.search(message)
    if match is None:
        return message
    choices = [c.strip().strip("'") for c in match["choices"].split(",")]
    hint = suggest(match["name"], choices)
    return message[: match.start()] + f"invalid choice: {match['name']!r}{hint}" if hint else message


def _unavailable(command: str, module: str, exc: BaseException) -> Handler:
    reason = f"{type(exc).__name__}: {exc}"

    def handler(args: argparse.Namespace) -> int:
        print(f"{command}: error: not available: module {module} could not be imported ({reason})", file=sys.stderr)
        return 2

    return handler


def _attach(subparsers, name: str, module: str, help: str, *, prog: str, load: bool) -> None:
    """Add the subcommand ``name`` served by ``module``; import the module only when ``load``."""
    parser = subparsers.add_parser(name, help=help, description=help)
    if not load:  # not the command being run: its options are never parsed
        return
    try:
        mod = importlib.import_module(module)
        add_arguments, run = mod.add_arguments, mod.run
    except Exception as exc:  # missing, broken, or without the add_arguments/run protocol
        parser.set_defaults(handler=_unavailable(prog, module, exc), accepts_extra=True)
        return
    add_arguments(parser)
    from .options import add_threads_argument

    add_threads_argument(parser)  # every command runs models: one thread policy (posenc.common.threads)
    parser.set_defaults(handler=run)


def _command_path(argv: Sequence[str]) -> tuple[str, ...]:
    """The leading words of ``argv`` (up to two, before any option): which subcommand runs."""
    words: list[str] = []
    for arg in argv:
        if arg.startswith("-") or len(words) == 2:
            break
        words.append(arg)
    return tuple(words)


LIST_WIDTH = 100  # posenc list fits this many columns unless --wide


def _add_list_arguments(parser: argparse.ArgumentParser) -> None:
    from ..common.registry import MODALITIES

    parser.add_argument("--modality", choices=MODALITIES, default=None, help="only encodings of this modality")
    parser.add_argument("--wide", action="store_true",
                        help=f"the paper as a column of one line each (default: under its row, wrapped to {LIST_WIDTH} columns)")


def _run_list(args: argparse.Namespace) -> int:
    """The table of :mod:`posenc.cli.catalog` (no torch: the registry's snapshot)."""
    import textwrap

    from .catalog import entries
    from ..training.report import format_table, hook_text

    infos = entries(args.modality)
    if not infos:
        print(f"no encodings registered for modality {args.modality!r}")
        return 0
    headers = ["name", "modality", "hooks", "causal-only", "paper"]
    cells = [[i.name, i.modality, hook_text(i.hooks, i.between_blocks), "yes" if i.causal_only else "no", i.paper]
             for i in infos]
    if args.wide:
        print(format_table(headers, cells))
    else:  # the paper under its row, wrapped: the table fits LIST_WIDTH columns
        table = format_table(headers[:-1], [row[:-1] for row in cells]).splitlines()
        print("\n".join(table[:2]))
        for line, row in zip(table[2:], cells):
            print(line)
            print(textwrap.fill(row[-1], LIST_WIDTH, initial_indent="    ", subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False))
    print(f"\n{len(infos)} encoding{'s' if len(infos) != 1 else ''}")
    return 0


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``posenc`` parser. With ``argv``, only the module of the subcommand it selects is
    imported; with None, every subcommand module is (unavailable ones get a stub)."""
    from .. import __version__

    path = None if argv is None else _command_path(argv)

    def wanted(*words: str) -> bool:
        return path is None or path[: len(words)] == words

    parser = Parser(prog="posenc", description="Positional encodings for transformers on one attention core.")
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("list", help="list the registered encodings", description="List the registered encodings.")
    _add_list_arguments(p)
    p.set_defaults(handler=_run_list)

    for group, (help, table) in command_groups().items():
        if not table:
            continue
        gp = sub.add_parser(group, help=help, description=help)
        gsub = gp.add_subparsers(dest=f"{group}_command", metavar="NAME", required=True)
        for name, (module, cmd_help) in table.items():
            _attach(gsub, name, module, cmd_help, prog=f"posenc {group} {name}", load=wanted(group, name))
    for name, (module, cmd_help) in COMMANDS.items():
        _attach(sub, name, module, cmd_help, prog=f"posenc {name}", load=wanted(name))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``posenc`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "accepts_extra", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse: 2 for bad input, 0 for --help / --version
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    from ..common.threads import using_threads

    try:
        # before the command imports torch; put back after it, for a caller in the same process
        with using_threads(args.threads) if hasattr(args, "threads") else contextlib.nullcontext():
            return int(args.handler(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
