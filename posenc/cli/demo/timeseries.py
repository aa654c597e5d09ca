"""The time-series part of ``posenc demo``: the ConvTran-style classifier on the bundled GunPoint
dataset (UCR: the x position of an actor's hand over 150 frames, drawing a gun or pointing), with
tAPE+eRPE against no position encoding.

GunPoint is where the two part ways among the datasets sktime bundles. Measured at the demo's
settings (200 steps, ConvTran's defaults otherwise, one thread; test accuracy for seeds 0, 1, 2, 3):
tape+erpe 0.987, 0.953, 0.987, 0.893 against none 0.493, 0.840, 0.493, 0.493 -- without positions
the model is at chance for most seeds, since the two classes differ in when the hand moves. On
BasicMotions (the earlier default) both score 1.000; on JapaneseVowels (seeds 0, 1) 0.984, 0.986
against 0.981, 0.984 and on ItalyPowerDemand 0.956, 0.955 against 0.946, 0.946; on ArrowHead both
swing with the seed (0.663, 0.577 against 0.463, 0.726)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

TITLE = "Time series: ConvTran-style classifier on GunPoint (test accuracy, higher is better)"

Row = dict[str, object]

# GunPoint has 50 training series: 3 steps of 16 per epoch; 200 steps are about 67 epochs.
MAX_STEPS = 200
DATASET = "GunPoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ts-encodings", default="tape+erpe,none",
                        help="encodings for the time-series part ('none', names, or input+attention pairs)")
    parser.add_argument("--ts-dataset", default=DATASET, help="bundled dataset of the time-series part")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with this part's arguments, or None."""
    from ..errors import unknown_name
    from ..models.convtran import bundled_dataset_names, encoding_spec

    for spec in args.ts_encodings.split(","):
        try:
            encoding_spec(spec)
        except argparse.ArgumentTypeError as exc:
            return f"--ts-encodings: {exc}"
    if args.ts_dataset not in bundled_dataset_names():  # found without torch
        return f"--ts-dataset: {unknown_name('bundled dataset', args.ts_dataset, bundled_dataset_names())}"
    return None


def run(args: argparse.Namespace) -> list[Row]:
    """Train one classifier per encoding for ``min(--steps, 200)`` steps and test it."""
    from ...timeseries.datasets import load_dataset

    train, test = load_dataset(args.ts_dataset)
    steps = min(args.steps, MAX_STEPS)
    return [_train_one(spec, train, test, steps, args) for spec in args.ts_encodings.split(",")]


def _train_one(spec: str, train, test, steps: int, args: argparse.Namespace) -> Row:
    from ...timeseries.classify import ClassifierSettings, train_classifier

    start = time.perf_counter()
    _, metrics = train_classifier(
        train, test, ClassifierSettings(encoding=spec, seed=args.seed), steps=steps, device=args.device,
        progress=not args.no_progress,
        out_dir=None if args.out is None else str(Path(args.out) / "timeseries" / spec.replace("+", "_")),
    )
    from . import model_done

    row = {"encoding": spec, "steps": steps, "train_s": round(time.perf_counter() - start, 1),
           "test_accuracy": round(metrics["test_accuracy"], 3)}
    model_done("timeseries", row)
    return row


def figure(rows: list[Row], args: argparse.Namespace, chance: float | None = None):
    """Test accuracy per encoding (bars, the axis from 0 to 1, chance = 1 / classes marked; read
    from the dataset's header when not given); None without matplotlib."""
    from ..plots import bar_chart
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None
    if chance is None:
        classes = class_count(args.ts_dataset)
        chance = None if not classes else 1 / classes
    fig = bar_chart(plt, rows, ["test_accuracy"], ["test accuracy"], accuracy=True, ylabel="test accuracy",
                    chance=chance, title=f"ConvTran-style classifier on {args.ts_dataset}")
    plt.close(fig)  # out of pyplot's list; the caller saves it
    return fig


def class_count(dataset: str) -> int | None:
    """The number of classes a bundled dataset declares (``@classLabel true A B ...`` in its
    ``_TRAIN.ts`` header), read without loading it; None when it cannot be read."""
    import importlib.util

    spec = importlib.util.find_spec("sktime")
    for root in ([] if spec is None else list(spec.submodule_search_locations or [])):
        path = Path(root) / "datasets" / "data" / dataset / f"{dataset}_TRAIN.ts"
        if not path.is_file():
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split()
                if words and words[0].lower() == "@classlabel":
                    return len(words) - 2 if len(words) > 2 and words[1].lower() == "true" else None
                if words and words[0].lower() == "@data":
                    return None
    return None
