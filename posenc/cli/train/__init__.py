"""``posenc train MODALITY``: one module per modality, each with ``add_arguments(parser)`` and
``run(args) -> int`` (see :mod:`posenc.cli`). They train that modality's reference model through
:class:`posenc.training.trainer.Trainer`, so every one has checkpoints, resumption, progress and
``torchrun`` data parallelism, and they share the option vocabulary of :mod:`posenc.cli.options`.

Every run directory (``--out``) ends with the same files: ``metrics.jsonl`` and ``checkpoint.pt``
(the trainer) and ``results.json`` (:func:`write_results`): ``command``, ``encoding``,
``model_config`` (the reference model's constructor arguments, enough to rebuild it),
``train_config`` (the trainer's settings), ``steps``, ``train_loss``, ``metrics`` (the final
evaluation, ``null`` where a model refused a size) and command-specific fields.

Runs never clobber: a non-empty ``--out`` is refused unless ``--resume`` continues the run there,
and a resumed run must keep the options that shape training (``--steps``, ``--batch-size``,
``--lr``, ...): the learning-rate schedule depends on them, so changing them would not continue the
same run. To train longer, start a new run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from ..options import FLAGS

RESULTS_FILE = "results.json"


def run_checked(
    prog: str,
    args: argparse.Namespace,
    check: Callable[[argparse.Namespace], str | None],
    train: Callable[[argparse.Namespace], int],
    errors: tuple[type[BaseException], ...] = (ValueError, TypeError),
    flags: Mapping[str, str] | None = None,
) -> int:
    """Check the arguments, then train; a problem found by ``check`` or raised as one of
    ``errors`` while building and training (bad encoding options, unreadable data, ...) is printed
    as ``prog: error: ...`` on one line and exits with 2. A resumed run whose options differ from
    its checkpoint's is reported with the flags (``flags``: TrainConfig field -> flag, over
    :data:`posenc.cli.options.FLAGS`)."""
    from ...training.trainer import ResumeMismatch

    error = check(args)
    if error is None:
        try:
            return train(args)
        except FloatingPointError as exc:  # the trainer stops on a non-finite loss
            error = f"training diverged: {exc} (lower --lr, or check the data for NaN)"
        except ResumeMismatch as exc:
            flag = {**FLAGS, **(flags or {})}.get(exc.field, f"--{exc.field.replace('_', '-')}")
            error = (f"--resume: the run in {args.out} was made with {flag} {exc.saved}, this one asks for "
                     f"{exc.requested}; resume with the run's options, or train into a new --out")
        except errors as exc:
            error = " ".join(str(exc).split())
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


def write_results(out: str | None, record: Mapping[str, Any]) -> Path | None:
    """Write ``record`` as ``out/results.json`` (atomically; nothing without ``--out``)."""
    from ...common.report import write_json

    if out is None:
        return None
    path = write_json(Path(out) / RESULTS_FILE, dict(record))
    print(f"results written to {path}")
    return path
