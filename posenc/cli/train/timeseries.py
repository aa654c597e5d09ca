"""``posenc train timeseries``: train the ConvTran-style classifier on a UEA/UCR dataset and
report its test accuracy.

::

    posenc train timeseries --dataset BasicMotions --encoding tape+erpe
    posenc train timeseries --dataset path/to/MyData_TRAIN.ts --encoding none --out runs/mine --resume

``--dataset`` is a dataset bundled in the sktime wheel (found offline), a folder holding
``NAME_TRAIN.ts`` and ``NAME_TEST.ts``, or a ``NAME_TRAIN.ts`` file. Defaults are ConvTran's
(embedding 16, 8 heads, feed-forward 256, dropout 0.01, 100 epochs, batch 16, lr 1e-3).
With ``--out`` the trainer writes ``metrics.jsonl``, an atomic ``checkpoint.pt`` every 10 epochs
(or every ``--checkpoint-every`` steps) and ``results.json``; ``--resume`` continues from it.
``--steps`` overrides ``--epochs``. Encodings: ``none``, a timeseries encoding, a seq encoding that
attends both ways, or ``input+attention`` such as ``tape+erpe``; ``--encoding-option`` passes
constructor arguments (``NAME.KEY=VALUE`` for one part of a combination).
"""

from __future__ import annotations

import argparse

from ..models.convtran import (
    CONVTRAN_DEFAULT_ENCODING,
    CONVTRAN_SIZE_FLAGS,
    add_convtran_arguments,
    check_convtran_args,
    convtran_settings,
    convtran_work,
    dataset_error,
    encoding_options_error,
    encoding_spec,
)
from ..options import add_encoding_arguments, add_run_arguments, out_dir_error
from ..sizes import defaults_of, size_error
from . import run_checked, run_dir_error, write_results

PROG = "posenc train timeseries"



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="BasicMotions",
                        help="bundled dataset name, a folder with NAME_TRAIN.ts/NAME_TEST.ts, or a NAME_TRAIN.ts file "
                             "(default: %(default)s)")
    add_encoding_arguments(parser, what="a timeseries or bidirectional seq encoding, or input+attention such as "
                           "tape+erpe (posenc list --modality timeseries)", default=CONVTRAN_DEFAULT_ENCODING,
                           example="erpe.variant=vector", spec_type=encoding_spec)
    add_convtran_arguments(parser)
    add_run_arguments(parser, checkpoint_help="steps between checkpoints (0: every 10 epochs)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (from the catalog and the files, before torch), or None."""
    error = (check_convtran_args(args) or encoding_options_error(args.encoding, args.encoding_option)
             or dataset_error(args.dataset))
    error = error or size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    return error or out_dir_error(args.out, args.resume) or run_dir_error(args.out)


SIZE_FLAGS = CONVTRAN_SIZE_FLAGS


def estimate(args: argparse.Namespace):
    """The run's work (posenc.cli.sizes): one ConvTran training and test."""
    return convtran_work(args)


def run(args: argparse.Namespace) -> int:
    # a malformed .ts file is a TsFormatError, a ValueError
    return run_checked(PROG, args, check, _train, (ValueError, TypeError, OSError),
                       flags={"steps": "--epochs/--steps (steps)"})


def _train(args: argparse.Namespace) -> int:
    from ...timeseries.classify import classifier_config, train_classifier
    from ...timeseries.datasets import load_dataset

    try:
        train, test = load_dataset(args.dataset, normalize=args.normalize)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--dataset: {exc}") from None
    settings = convtran_settings(args, args.encoding, args.seed)
    print(
        f"{args.dataset}: {len(train)} train / {len(test)} test series, {train.num_channels} channels, "
        f"length {min(s.shape[1] for s in train.series)}..{max(train.max_length, test.max_length)}, "
        f"{len(train.classes)} classes; encoding {args.encoding}",
        flush=True,
    )
    _, metrics = train_classifier(
        train, test, settings, steps=args.steps, device=args.device, out_dir=args.out, resume=args.resume,
        progress=not args.no_progress, checkpoint_every=args.checkpoint_every or None, eval_every=args.eval_every,
    )
    print(f"test accuracy {metrics['test_accuracy']:.4f} (loss {metrics['test_loss']:.4f}) after "
          f"{int(metrics['steps'])} steps, {metrics['train_seconds']:.1f} s")
    max_len = max(train.max_length, test.max_length)
    write_results(args.out, {
        "command": "train timeseries", "encoding": args.encoding,
        "model_config": classifier_config(settings, train, max_len),
        "train_config": {"epochs": args.epochs, "steps": int(metrics["steps"]), "batch_size": settings.batch_size,
                         "lr": settings.lr, "seed": settings.seed},
        "steps": int(metrics["steps"]), "train_loss": metrics["train_loss"],
        "metrics": {"test_accuracy": metrics["test_accuracy"], "test_loss": metrics["test_loss"]},
        "dataset": args.dataset, "settings": {k: v for k, v in vars(settings).items()},
        "train_seconds": metrics["train_seconds"],
    })
    return 0
