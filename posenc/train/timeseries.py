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

from ..argtypes import dropout_rate, nonnegative_int, positive_float, positive_int
from ..options import add_encoding_arguments, add_run_arguments, encoding_error, out_dir_error
from . import run_checked, write_results

PROG = "posenc train timeseries"
# the encodings the classifier takes: its own, and seq encodings that attend both ways
MODALITIES = ("timeseries", "seq")

_DEFAULT_ENCODING = "tape+erpe"


def encoding_spec(text: str) -> str:
    """argparse type: ``none``, a registered name, or ``input+attention``: each part must be an
    encoding the classifier takes (checked from the registry, nothing is built)."""
    text = text.strip()
    if text == "none":
        return text
    parts = [p.strip() for p in text.split("+")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected a name, 'none' or input+attention such as tape+erpe; got {text!r}")
    for part in parts:
        error = encoding_error(part, MODALITIES, model="the ConvTran classifier", bidirectional=True, flag="")
        if error is not None:
            raise argparse.ArgumentTypeError(error.lstrip(": "))
    return text


def add_model_arguments(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """Model and training options shared by ``train`` and ``bench`` (ConvTran's defaults)."""
    p = prefix
    parser.add_argument(f"--{p}epochs", type=positive_int, default=100, help="training epochs (default: %(default)s)")
    parser.add_argument(f"--{p}steps", type=positive_int, default=None, help="optimizer steps (overrides --epochs)")
    parser.add_argument(f"--{p}batch-size", type=positive_int, default=16, help="default: %(default)s")
    parser.add_argument(f"--{p}lr", type=positive_float, default=1e-3, help="constant learning rate (default: %(default)s)")
    parser.add_argument(f"--{p}dim", type=positive_int, default=16, help="embedding width (default: %(default)s)")
    parser.add_argument(f"--{p}heads", type=positive_int, default=8, help="attention heads (default: %(default)s)")
    parser.add_argument(f"--{p}ff-dim", type=positive_int, default=256, help="feed-forward width (default: %(default)s)")
    parser.add_argument(f"--{p}dropout", type=dropout_rate, default=0.01, help="default: %(default)s")
    parser.add_argument(f"--{p}attn-scale", choices=("d_model", "head_dim"), default="d_model",
                        help="scores scaled by d_model**-0.5 (ConvTran) or head_dim**-0.5 (default: %(default)s)")
    parser.add_argument(f"--{p}normalize", choices=("none", "channel"), default="none",
                        help="none (ConvTran's default) or per-channel z-score with training statistics")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="BasicMotions",
                        help="bundled dataset name, a folder with NAME_TRAIN.ts/NAME_TEST.ts, or a NAME_TRAIN.ts file "
                             "(default: %(default)s)")
    add_encoding_arguments(parser, what="a timeseries or bidirectional seq encoding, or input+attention such as "
                           "tape+erpe (posenc list --modality timeseries)", default=_DEFAULT_ENCODING,
                           example="erpe.variant=vector", spec_type=encoding_spec)
    add_model_arguments(parser)
    parser.add_argument("--threads", type=nonnegative_int, default=1,
                        help="torch CPU threads; 0 keeps torch's default (1 is the fastest for these tiny models on CPU)")
    add_run_arguments(parser, checkpoint_help="steps between checkpoints (0: every 10 epochs)")


def settings_from_args(args: argparse.Namespace, encoding: str, seed: int):
    from ..timeseries.classify import ClassifierSettings

    return ClassifierSettings(
        encoding=encoding, dim=args.dim, num_heads=args.heads, ff_dim=args.ff_dim, dropout=args.dropout,
        attn_scale=args.attn_scale, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=seed,
        encoding_options=dict(getattr(args, "encoding_option", []) or []) or None,
    )


def check_model_args(args: argparse.Namespace, *, prefix: str = "") -> str | None:
    if args.dim % args.heads:
        return f"--{prefix}dim ({args.dim}) must be divisible by --{prefix}heads ({args.heads})"
    return None


def check(args: argparse.Namespace) -> str | None:
    error = check_model_args(args)
    if error is None and args.encoding == "none" and args.encoding_option:
        error = "--encoding-option needs an encoding (got --encoding none)"
    return error or out_dir_error(args.out, args.resume)


def run(args: argparse.Namespace) -> int:
    from ..timeseries.ts_format import TsFormatError

    return run_checked(PROG, args, check, _train, (ValueError, TypeError, TsFormatError, OSError),
                       flags={"steps": "--epochs/--steps (steps)"})


def _train(args: argparse.Namespace) -> int:
    import torch

    from ..timeseries.classify import classifier_config, train_classifier
    from ..timeseries.datasets import load_dataset

    try:
        train, test = load_dataset(args.dataset, normalize=args.normalize)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--dataset: {exc}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = settings_from_args(args, args.encoding, args.seed)
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
