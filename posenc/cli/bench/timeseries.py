"""``posenc bench timeseries``: the encoding ablation of the ConvTran-style classifier.

Every encoding (default ``tape+erpe``, ``sinusoidal``, ``learned``, ``none``) is trained on every
dataset (default the bundled BasicMotions and JapaneseVowels) with several seeds, through one
model (:class:`posenc.timeseries.convtran.ConvTranClassifier`) and ConvTran's settings. Printed:
mean, standard deviation, min and max of the test accuracy per (dataset, encoding), beside the
published ConvTran (tAPE+eRPE) accuracy; written to ``--out``: ``timeseries.json`` (every run),
``timeseries.png`` (mean and spread per encoding).

Only the final model of each run is tested, once: nothing is selected on the test split.
Encodings in the default list that are not registered in this installation are skipped with a
note; asking for one explicitly is an error. ``--threads`` follows the one policy of
:mod:`posenc.common.threads`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from ..errors import usage_error
from ..outputs import out_error, save_figure, write_json_file
from ..sizes import add_allow_large, defaults_of, size_error
from ...training.report import format_table

PROG = "posenc bench timeseries"

DEFAULT_DATASETS = ("BasicMotions", "JapaneseVowels")
DEFAULT_ENCODINGS = ("tape+erpe", "sinusoidal", "learned", "none")
# ConvTran's published test accuracy (tAPE + eRPE), Foumani et al. 2023, Table (see REFERENCES).
PUBLISHED = {"BasicMotions": 1.000, "JapaneseVowels": 0.989, "Epilepsy": 0.986, "ERing": 0.963, "NATOPS": 0.939, "Libras": 0.928}


def _names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return names


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        seeds = ()
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 such as 0,1,2; got {text!r}")
    return tuple(dict.fromkeys(seeds))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..models.convtran import add_convtran_arguments

    parser.add_argument("--datasets", type=_names, default=DEFAULT_DATASETS,
                        help=f"bundled names or .ts folders (default: {','.join(DEFAULT_DATASETS)})")
    parser.add_argument("--encodings", type=_names, default=None,
                        help=f"encoding specs (default: {','.join(DEFAULT_ENCODINGS)})")
    parser.add_argument("--seeds", type=_seeds, default=(0, 1, 2), help="default: 0,1,2")
    add_convtran_arguments(parser)
    parser.add_argument("--device", default="cpu", help="default: %(default)s")
    parser.add_argument("--out", default=None, help="directory for timeseries.json and timeseries.png")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_allow_large(parser)


SIZE_FLAGS = ("seeds", "datasets", "encodings", "epochs", "steps", "batch_size", "dim", "ff_dim")
OUTPUTS = ("timeseries.json", "timeseries.png")


def estimate(args: argparse.Namespace):
    """The run's work (posenc.cli.sizes): one ConvTran run per dataset, encoding and seed."""
    from ..models.convtran import convtran_work

    runs = len(args.datasets) * len(args.encodings or DEFAULT_ENCODINGS) * len(args.seeds)
    return convtran_work(args, runs)


def _check(args: argparse.Namespace) -> tuple[str | None, list[str], list[str]]:
    """(error, encodings to run, notes)."""
    from ..catalog import names
    from ..models.convtran import check_convtran_args, dataset_error, encoding_spec

    error = check_convtran_args(args)
    for dataset in args.datasets:
        error = error or dataset_error(dataset, "--datasets")
    if error is not None:
        return error, [], []
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments)) or out_error(args.out, OUTPUTS)
    if error is not None:
        return error, [], []
    notes: list[str] = []
    explicit = args.encodings is not None
    encodings = []
    for spec in (args.encodings if explicit else DEFAULT_ENCODINGS):
        if not explicit:
            missing = [n for n in spec.split("+") if n != "none" and n not in names()]
            if missing:
                notes.append(f"skipped {spec}: {', '.join(missing)} is not registered in this installation")
                continue
        try:
            encoding_spec(spec)
        except argparse.ArgumentTypeError as exc:
            return f"--encodings: {exc}", [], []
        encodings.append(spec)
    return None, encodings, notes


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (dataset, encoding): mean, std (sample; 0 for one run), min, max of the accuracy."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["encoding"]), []).append(r)
    rows = []
    for (dataset, encoding), rs in groups.items():
        accs = [r["test_accuracy"] for r in rs]
        rows.append({
            "dataset": dataset, "encoding": encoding, "runs": len(rs), "mean": statistics.fmean(accs),
            "std": statistics.stdev(accs) if len(accs) > 1 else 0.0, "min": min(accs), "max": max(accs),
            "seconds_per_run": statistics.fmean(r["train_seconds"] for r in rs),
            "published": PUBLISHED.get(dataset) if encoding == "tape+erpe" else None,
        })
    return rows


def render(rows: list[dict]) -> str:
    table = [
        [r["dataset"], r["encoding"], r["runs"], f"{r['mean']:.4f}", f"{r['std']:.4f}", f"{r['min']:.4f}",
         f"{r['max']:.4f}", "" if r["published"] is None else f"{r['published']:.3f}", f"{r['seconds_per_run']:.1f}"]
        for r in rows
    ]
    return format_table(
        ["dataset", "encoding", "runs", "mean acc", "std", "min", "max", "ConvTran paper", "s/run"], table,
        align="llrrrrrrr",
    )


def plot(rows: list[dict], runs: list[dict], path: str, chance: dict[str, float] | None = None) -> None:
    """Mean test accuracy per encoding (bars, std as error bars, each seed as a dot), one panel per
    dataset, on an axis from 0 to 1 with the chance level (``chance``: dataset -> 1 / classes) and
    the published ConvTran accuracy marked; the legend outside (:mod:`posenc.cli.plots`)."""
    from ..plots import accuracy_axis, bar_labels, chance_line, legend_outside
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets) + 2.2, 3.8), squeeze=False,
                             layout="constrained")
    for ax, dataset in zip(axes[0], datasets):
        these = [r for r in rows if r["dataset"] == dataset]
        xs = range(len(these))
        bars = ax.bar(xs, [r["mean"] for r in these], yerr=[r["std"] for r in these], color="#8fb3d9", capsize=4,
                      label="mean over seeds (bar: std)")
        bar_labels(ax, bars, [r["mean"] for r in these], tops=[max(r["max"], r["mean"] + r["std"]) for r in these])
        for x, r in zip(xs, these):
            accs = [run["test_accuracy"] for run in runs if run["dataset"] == dataset and run["encoding"] == r["encoding"]]
            ax.plot([x] * len(accs), accs, "k.", ms=5, label="one seed")
        if PUBLISHED.get(dataset) is not None:
            ax.axhline(PUBLISHED[dataset], color="#c44", ls="--", lw=1, label="ConvTran paper (tAPE+eRPE)")
        ax.set_xticks(list(xs), [r["encoding"] for r in these], rotation=20)
        accuracy_axis(ax, None, "test accuracy")
        if chance and chance.get(dataset) is not None:
            chance_line(ax, chance[dataset])
        ax.set_title(dataset)
    legend_outside(fig)
    save_figure(fig, os.path.dirname(path) or ".", os.path.basename(path), dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    error, encodings, notes = _check(args)
    if error is None and not encodings:
        error = "no encoding to run (every default encoding is unregistered)"
    if error is not None:
        return usage_error(PROG, error)
    import torch

    from ..models.convtran import convtran_settings
    from ...training.report import Progress
    from ...timeseries.classify import train_classifier
    from ...timeseries.datasets import load_dataset

    data = {}
    for name in args.datasets:
        try:
            data[name] = load_dataset(name, normalize=args.normalize)
        except (ValueError, OSError) as exc:
            return usage_error(PROG, f"--datasets: {exc}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    runs = []
    jobs = [(d, e, s) for d in args.datasets for e in encodings for s in args.seeds]
    bar = Progress(len(jobs), "runs", enabled=not args.no_progress)
    for dataset, encoding, seed in jobs:
        train, test = data[dataset]
        cpu = time.process_time()
        _, metrics = train_classifier(
            train, test, convtran_settings(args, encoding, seed), device=args.device, progress=False
        )
        runs.append({"dataset": dataset, "encoding": encoding, "seed": seed, "test_accuracy": metrics["test_accuracy"],
                     "test_loss": metrics["test_loss"], "train_loss": metrics["train_loss"],
                     "steps": int(metrics["steps"]), "train_seconds": metrics["train_seconds"],
                     "cpu_seconds": time.process_time() - cpu})
        bar.update(1, note=f"{dataset} {encoding} seed {seed}")
    bar.close()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rows = summarize(runs)
    print(render(rows))
    print(f"\n{len(runs)} runs, {args.epochs} epochs each; {wall:.0f} s wall, {cpu:.0f} s CPU (this process, "
          f"{torch.get_num_threads()} thread(s))")
    for note in notes:
        print(f"note: {note}")
    if args.out is not None:
        settings = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr", "dim", "heads", "ff_dim", "dropout",
                                                   "attn_scale", "normalize", "device")}
        settings["threads"] = torch.get_num_threads()
        result = {"settings": settings, "datasets": list(args.datasets), "encodings": encodings,
                  "seeds": list(args.seeds), "summary": rows, "runs": runs, "notes": notes,
                  "wall_seconds": wall, "cpu_seconds": cpu}
        json_path = write_json_file(args.out, "timeseries.json", result)
        png_path = os.path.join(args.out, "timeseries.png")
        plot(rows, runs, png_path, {name: 1 / len(data[name][0].classes) for name in data})
        print(f"wrote {json_path} and {png_path}")
    return 0
