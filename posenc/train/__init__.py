"""``posenc train MODALITY``: one module per modality, each with ``add_arguments(parser)`` and
``run(args) -> int`` (see :mod:`posenc.cli`). They train that modality's reference model through
:class:`posenc.training.trainer.Trainer`, so every one has checkpoints, resumption, progress bars
and ``torchrun`` data parallelism."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

RESUME_WITHOUT_OUT = "--resume needs --out (the checkpoint lives there)"
FEATURE_MAP_HELP = ("train on linear attention with this feature map (default: softmax attention); only encodings "
                    "on the input or on q and k run on it, and SPE runs only on it")


def attention_kind_error(encoding: str, feature_map: str | None) -> str | None:
    """Why ``--encoding`` cannot run on the attention ``--feature-map`` asks for, or None
    (:func:`posenc.common.plan.check_attention_kind` is the rule)."""
    from ..common.encoding import class_needs
    from ..common.plan import check_attention_kind
    from ..common.registry import get

    if encoding == "none":
        return None
    try:
        check_attention_kind(class_needs(get(encoding).cls), feature_map, encoding)
    except (KeyError, ValueError) as exc:
        hint = " (--feature-map elu or favor)" if feature_map is None else ""
        return f"--encoding: {exc.args[0]}{hint}"
    return None


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every ``posenc train`` command shares: seed, device, output, resumption,
    checkpoint and evaluation intervals, progress bar."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--out", default=None, help="directory for metrics.jsonl, checkpoint.pt and results.json")
    parser.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end)")
    parser.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: at the end)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run_checked(
    prog: str,
    args: argparse.Namespace,
    check: Callable[[argparse.Namespace], str | None],
    train: Callable[[argparse.Namespace], int],
    errors: tuple[type[BaseException], ...] = (ValueError, TypeError),
) -> int:
    """Check the arguments, then train; a problem found by ``check`` or raised as one of
    ``errors`` while building and training (bad encoding options, unreadable data, ...) is printed
    as ``prog: error: ...`` and exits with 2."""
    error = check(args)
    if error is None:
        try:
            return train(args)
        except errors as exc:
            error = str(exc)
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2
