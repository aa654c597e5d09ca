"""The ConvTran-style classifier's options and rules (``posenc train timeseries``,
``posenc bench timeseries``, the demo's time-series part)."""

from __future__ import annotations

import argparse

from ..argtypes import dropout_rate, positive_float, positive_int
from ..options import encoding_error

# the encodings the classifier takes: its own, and seq encodings that attend both ways
CONVTRAN_MODALITIES = ("timeseries", "seq")
CONVTRAN_DEFAULT_ENCODING = "tape+erpe"


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
        error = encoding_error(part, CONVTRAN_MODALITIES, model="the ConvTran classifier", bidirectional=True, flag="")
        if error is not None:
            raise argparse.ArgumentTypeError(error.lstrip(": "))
    return text


def add_convtran_arguments(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
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


def check_convtran_args(args: argparse.Namespace, *, prefix: str = "") -> str | None:
    """The ConvTran options' cross rule: --dim divisible by --heads."""
    if args.dim % args.heads:
        return f"--{prefix}dim ({args.dim}) must be divisible by --{prefix}heads ({args.heads})"
    return None


def convtran_settings(args: argparse.Namespace, encoding: str, seed: int):
    """The :class:`~posenc.timeseries.classify.ClassifierSettings` of the ConvTran options."""
    from ...timeseries.classify import ClassifierSettings

    return ClassifierSettings(
        encoding=encoding, dim=args.dim, num_heads=args.heads, ff_dim=args.ff_dim, dropout=args.dropout,
        attn_scale=args.attn_scale, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=seed,
        encoding_options=dict(getattr(args, "encoding_option", []) or []) or None,
    )
