"""``posenc train timeseries``: train the ConvTran-style classifier on a UEA/UCR dataset and
report its test accuracy.

::

    posenc train timeseries --dataset BasicMotions --encoding tape+erpe
    posenc train timeseries --dataset path/to/MyData_TRAIN.ts --encoding none --out runs/mine --resume

``--dataset`` is a dataset bundled in the sktime wheel (found offline), a folder holding
``NAME_TRAIN.ts`` and ``NAME_TEST.ts``, or a ``NAME_TRAIN.ts`` file. Defaults are ConvTran's
(embedding 16, 8 heads, feed-forward 256, dropout 0.01, 100 epochs, batch 16, lr 1e-3).
With ``--out`` the trainer writes ``metrics.jsonl`` and an atomic ``checkpoint.pt`` every 10
epochs; ``--resume`` continues from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import RESUME_WITHOUT_OUT
from ..argtypes import dropout_rate, positive_float, positive_int
from ..timeseries.ts_format import TsFormatError

_DEFAULT_ENCODING = "tape+erpe"


def encoding_spec(text: str) -> str:
    """argparse type: ``none``, a registered name, or ``input+attention`` (checked by building it)."""
    from ..timeseries.convtran import build_encodings

    try:
        build_encodings(text, dim=16, num_heads=8, max_len=8)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_model_arguments(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """Model and training options shared by ``train`` and ``bench`` (ConvTran's defaults)."""
    p = prefix
    parser.add_argument(f"--{p}epochs", type=positive_int, default=100, help="training epochs (default: %(default)s)")
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
    parser.add_argument("--encoding", type=encoding_spec, default=_DEFAULT_ENCODING,
                        help="'none', a registered encoding, or input+attention such as tape+erpe (default: %(default)s)")
    add_model_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 0 keeps torch's default (default: 1, the fastest for these tiny "
                             "models on CPU)")
    parser.add_argument("--out", default=None, help="directory for metrics.jsonl, checkpoint.pt and result.json")
    parser.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def settings_from_args(args: argparse.Namespace, encoding: str, seed: int):
    from ..timeseries.classify import ClassifierSettings

    return ClassifierSettings(
        encoding=encoding, dim=args.dim, num_heads=args.heads, ff_dim=args.ff_dim, dropout=args.dropout,
        attn_scale=args.attn_scale, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=seed,
    )


def check_model_args(args: argparse.Namespace, *, prefix: str = "") -> str | None:
    if args.dim % args.heads:
        return f"--{prefix}dim ({args.dim}) must be divisible by --{prefix}heads ({args.heads})"
    return None


def run(args: argparse.Namespace) -> int:
    import torch

    from ..timeseries.classify import train_classifier
    from ..timeseries.datasets import load_dataset

    error = check_model_args(args)
    if error is None and args.resume and args.out is None:
        error = RESUME_WITHOUT_OUT
    if error is None and args.threads < 0:
        error = f"--threads must be >= 0, got {args.threads}"
    if error is not None:
        print(f"posenc train timeseries: {error}", file=sys.stderr)
        return 2
    try:
        train, test = load_dataset(args.dataset, normalize=args.normalize)
    except (ValueError, TsFormatError, OSError) as exc:
        print(f"posenc train timeseries: --dataset: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = settings_from_args(args, args.encoding, args.seed)
    print(
        f"{args.dataset}: {len(train)} train / {len(test)} test series, {train.num_channels} channels, "
        f"length {min(s.shape[1] for s in train.series)}..{max(train.max_length, test.max_length)}, "
        f"{len(train.classes)} classes; encoding {args.encoding}",
        flush=True,
    )
    try:
        _, metrics = train_classifier(
            train, test, settings, device=args.device, out_dir=args.out, resume=args.resume,
            progress=not args.no_progress,
        )
    except ValueError as exc:
        if not args.resume:
            raise
        print(f"posenc train timeseries: --resume: {exc}", file=sys.stderr)  # a checkpoint of another model
        return 2
    print(f"test accuracy {metrics['test_accuracy']:.4f} (loss {metrics['test_loss']:.4f}) after "
          f"{int(metrics['steps'])} steps, {metrics['train_seconds']:.1f} s")
    if args.out is not None:
        path = os.path.join(args.out, "result.json")
        with open(path, "w") as f:
            json.dump({"dataset": args.dataset, "encoding": args.encoding, "settings": vars(settings), **metrics}, f, indent=2)
            f.write("\n")
        print(f"wrote {path}")
    return 0
