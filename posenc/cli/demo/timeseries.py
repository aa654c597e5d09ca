"""The time-series part of ``posenc demo``: the ConvTran-style classifier on the bundled
BasicMotions dataset (4 activities from a smartwatch's accelerometer and gyroscope), with tAPE+eRPE
against no position encoding."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

TITLE = "Time series: ConvTran-style classifier on BasicMotions (test accuracy, higher is better)"

Row = dict[str, object]

# BasicMotions has 40 training series: 2 steps of 16 per epoch; 200 steps are ConvTran's 100 epochs.
MAX_STEPS = 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ts-encodings", default="tape+erpe,none",
                        help="encodings for the time-series part ('none', names, or input+attention pairs)")
    parser.add_argument("--ts-dataset", default="BasicMotions", help="bundled dataset of the time-series part")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with this part's arguments, or None."""
    from ..errors import unknown_name
    from ..options import encoding_spec
    from ...timeseries.datasets import bundled_datasets

    for spec in args.ts_encodings.split(","):
        try:
            encoding_spec(spec)
        except argparse.ArgumentTypeError as exc:
            return f"--ts-encodings: {exc}"
    if args.ts_dataset not in bundled_datasets():
        return f"--ts-dataset: {unknown_name('bundled dataset', args.ts_dataset, bundled_datasets())}"
    return None


def run(args: argparse.Namespace) -> list[Row]:
    """Train one classifier per encoding for ``min(--steps, 200)`` steps and test it."""
    import torch

    from ...timeseries.datasets import load_dataset

    train, test = load_dataset(args.ts_dataset)
    steps = min(args.steps, MAX_STEPS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second OpenMP thread only adds waiting
    try:
        return [_train_one(spec, train, test, steps, args) for spec in args.ts_encodings.split(",")]
    finally:
        torch.set_num_threads(threads)


def _train_one(spec: str, train, test, steps: int, args: argparse.Namespace) -> Row:
    from ...timeseries.classify import ClassifierSettings, train_classifier

    start = time.perf_counter()
    _, metrics = train_classifier(
        train, test, ClassifierSettings(encoding=spec, seed=args.seed), steps=steps, device=args.device,
        progress=not args.no_progress,
        out_dir=None if args.out is None else str(Path(args.out) / "timeseries" / spec.replace("+", "_")),
    )
    return {"encoding": spec, "steps": steps, "train_s": round(time.perf_counter() - start, 1),
            "test_accuracy": round(metrics["test_accuracy"], 3)}
