"""The one error path of the ``posenc`` commands: a problem is one line, ``PROG: error: ...``, on
stderr, and the command exits with 2 (argparse's convention for bad input).

:func:`usage_error` prints such a line; :func:`run_checked` checks a command's arguments, runs it,
and reports the problems it may raise the same way; :func:`unknown_name` is the message for a
misspelt name (an encoding, a task, a dataset, a part, a bench): the closest names, not all of them.
:func:`code_notice` is the one line printed before code a user named is imported.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Mapping, Sequence

# TrainConfig field -> the flag that sets it (the groups of :mod:`posenc.cli.options`), for messages
# about a run (resume mismatches)
FLAGS = {"steps": "--steps", "batch_size": "--batch-size", "lr": "--lr", "weight_decay": "--weight-decay",
         "warmup_steps": "--warmup-steps", "min_lr_ratio": "--min-lr-ratio", "grad_clip": "--grad-clip",
         "world_size": "the number of processes (torchrun --nproc_per_node)"}


def usage_error(prog: str, message: str) -> int:
    """Print ``prog: error: message`` (on one line) to stderr; return 2, the exit status."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def code_notice(prog: str, flag: str, where: str) -> None:
    """One line on stderr before a command imports code a user named (``flag``: from ``where``):
    that code runs with the user's permissions, so it never runs without a word."""
    print(f"{prog}: note: {flag}: importing and running the Python code of {where}", file=sys.stderr, flush=True)


def unknown_name(what: str, name: str, choices: Sequence[str], *, listing: str | None = None) -> str:
    """``unknown WHAT 'NAME' (did you mean 'X'?)``; without a close name, where to find them all
    (``listing``, e.g. ``posenc list``) or, for a short list, the names themselves."""
    from .catalog import suggest

    hint = suggest(name, choices)
    if hint:
        return f"unknown {what} {name!r}{hint}"
    if listing is not None:
        return f"unknown {what} {name!r}; {listing} names them all"
    return f"unknown {what} {name!r}; choose from {', '.join(choices)}"


def run_checked(
    prog: str,
    args: argparse.Namespace,
    check: Callable[[argparse.Namespace], str | None],
    work: Callable[[argparse.Namespace], int],
    errors: tuple[type[BaseException], ...] = (ValueError, TypeError),
    flags: Mapping[str, str] | None = None,
) -> int:
    """Check the arguments, then run ``work``; a problem found by ``check`` (before torch is
    imported: the checks read the registry's snapshot, :mod:`posenc.cli.catalog`) or raised as one of
    ``errors`` while building and training (bad encoding options, unreadable data, ...) is printed
    as ``prog: error: ...`` on one line and exits with 2. A resumed run whose options differ from
    its checkpoint's is reported with the flags (``flags``: TrainConfig field -> flag, over
    :data:`FLAGS`). Benches pass ``errors=()``: an exception while measuring
    is a bug to see in full, not bad input."""
    error = check(args)
    if error is not None:  # before anything imports torch
        return usage_error(prog, error)
    from ..training.trainer import ResumeMismatch

    try:
        return work(args)
    except FloatingPointError as exc:  # the trainer stops on a non-finite loss
        error = f"training diverged: {exc} (lower --lr, or check the data for NaN)"
    except ResumeMismatch as exc:
        flag = {**FLAGS, **(flags or {})}.get(exc.field, f"--{exc.field.replace('_', '-')}")
        error = (f"--resume: the run in {args.out} was made with {flag} {exc.saved}, this one asks for "
                 f"{exc.requested}; resume with the run's options, or train into a new --out")
    except errors as exc:
        error = str(exc)
    return usage_error(prog, error)
