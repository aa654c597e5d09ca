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
    encoding the classifier takes, the input encoding first (``tape+erpe``; ``erpe+tape`` is
    refused, so one model has one name). Checked from the catalog, nothing is built."""
    from ..catalog import entry

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
    if len(parts) == 2:
        first, second = (entry(p).hooks for p in parts)
        if "input" not in first and "input" in second:
            raise argparse.ArgumentTypeError(
                f"{text!r}: the input encoding comes first, as in tape+erpe; write {parts[1]}+{parts[0]}")
    return text


def encoding_options_error(spec: str, options, flag: str = "--encoding-option") -> str | None:
    """Why the ``KEY=VALUE`` pairs (``NAME.KEY`` for one part of a combination) do not fit the
    encoding ``spec``, or None; the same rule as :func:`posenc.timeseries.convtran.build_encodings`,
    read from the catalog before anything is built."""
    from ..catalog import option_error

    if not options:
        return None
    if spec == "none":
        return f"{flag} needs an encoding (got --encoding none)"
    parts = [p.strip() for p in spec.split("+")]
    for key, _ in options:
        part, dot, arg = key.rpartition(".")
        if not dot:
            if len(parts) != 1:
                return f"{flag} {key}: with the combination {spec!r}, name the part ({parts[0]}.{key}=...)"
            part, arg = parts[0], key
        if part not in parts:
            return f"{flag} {key}: {part!r} is not a part of the encoding {spec!r}"
        error = option_error(part, [arg])
        if error is not None:
            return f"{flag}: {error}"
    return None


def bundled_dataset_names() -> list[str]:
    """The datasets the sktime wheel bundles (folders holding ``NAME_TRAIN.ts`` and
    ``NAME_TEST.ts``), found without importing sktime or torch, so that a misspelt name is refused
    at once. :func:`posenc.timeseries.datasets.bundled_datasets` keeps those with class labels."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sktime")
    roots = [] if spec is None else list(spec.submodule_search_locations or [])
    found = set()
    for root in roots:
        folder = Path(root) / "datasets" / "data"
        if folder.is_dir():
            found |= {sub.name for sub in folder.iterdir()
                      if (sub / f"{sub.name}_TRAIN.ts").is_file() and (sub / f"{sub.name}_TEST.ts").is_file()}
    return sorted(found)


def dataset_error(text: str, flag: str = "--dataset") -> str | None:
    """Why ``text`` names no dataset (neither a file or folder nor a bundled name; the closest
    names), or None. A file or folder is read, and checked, when the run starts."""
    import os

    from ..errors import unknown_name

    if os.path.exists(text):
        return None
    names = bundled_dataset_names()
    if text in names:
        return None
    if not names:
        return (f"{flag}: {text!r} is no file or folder, and no bundled datasets are installed "
                "(pip install 'posenc[data]' for sktime's)")
    return f"{flag}: {unknown_name('dataset', text, names)} (a bundled name, a folder or a NAME_TRAIN.ts file)"


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


# the size flags of a ConvTran run (posenc.cli.sizes), and a dataset for the estimate: bundled
# ones hold tens to hundreds of series of 29 to 1,000 steps; one read from a folder is unknown
CONVTRAN_SIZE_FLAGS = ("epochs", "steps", "batch_size", "dim", "ff_dim")
SERIES, SERIES_LENGTH = 400, 200


def convtran_work(args: argparse.Namespace, runs: int = 1):
    """The work of ``runs`` ConvTran trainings and tests with these options (posenc.cli.sizes):
    ``--steps``, or ``--epochs`` over the training series, of one block whose attention is
    ``--dim`` wide and whose feed-forward ``--ff-dim``."""
    from ..sizes import transformer

    steps = args.steps or args.epochs * max(1, -(-SERIES // args.batch_size))
    width = (args.dim + args.ff_dim) / 2  # the cost model's block: attention and a 4x MLP of one width
    train = transformer(args.batch_size, SERIES_LENGTH, width, 1, steps=steps)
    test = transformer(SERIES, SERIES_LENGTH, width, 1, train=False)
    return (train + test) * runs

