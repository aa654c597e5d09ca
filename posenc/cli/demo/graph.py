"""The graph part of ``posenc demo``: a GPS-style graph transformer on CSL (Murphy et al. 2019),
ten classes of 4-regular circulant graphs that message passing alone cannot tell apart. Without an
encoding the model sits at chance (10%); Laplacian eigenvectors and random-walk return
probabilities separate the classes."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..argtypes import positive_int

TITLE = "Graph: GPS on CSL, 10 classes of 4-regular circulant graphs (test accuracy, chance = 0.10)"

Row = dict[str, object]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--graph-encodings", default="none,lap,rwse",
                        help="graph encodings for the graph part (from none, lap, rwse, spd)")
    parser.add_argument("--graph-per-class", type=positive_int, default=15,
                        help="CSL graphs per class for the graph part (a third of them test; default 15)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with this part's arguments, or None."""
    from ..options import encoding_error

    for name in args.graph_encodings.split(","):
        error = encoding_error(name, ("graph",), model="the GPS graph transformer", bidirectional=True,
                               flag="--graph-encodings")
        if error is not None:
            return error
    if args.graph_per_class < 3:
        return f"--graph-per-class must be at least 3, got {args.graph_per_class}"
    return None


def run(args: argparse.Namespace) -> list[Row]:
    """Train one small GPS per encoding on CSL; ``--steps`` is scaled by 3/5 (300 by default)."""
    import torch

    from ...graph.gps import GPS
    from ..train import graph as tg
    from . import model_done
    from ...training.trainer import TrainConfig, Trainer

    steps = max(1, args.steps * 3 // 5)
    per_class = args.graph_per_class
    ns = argparse.Namespace(dataset="csl", task="graph", seed=args.seed, csl_per_class=per_class,
                            csl_test_per_class=max(1, per_class // 3))
    rows = []
    for name in args.graph_encodings.split(","):
        task = tg.load_task(ns)
        task.graphs = tg.add_encoding_features(task.graphs, name, lap_k=8, walk_length=20)
        opts = {"lap": {"k": 8}, "rwse": {"walk_length": 20}}.get(name, {})
        torch.manual_seed(args.seed)
        model = GPS(task.in_dim, task.out_dim, dim=64, depth=3, num_heads=4,
                    encoding=None if name == "none" else name, encoding_options=opts)
        test = task.subset("test")
        config = TrainConfig(
            steps=steps, batch_size=10, lr=1e-3, warmup_steps=max(1, steps // 20), seed=args.seed,
            progress=not args.no_progress, log_every=max(1, steps // 5), device=args.device,
            out_dir=None if args.out is None else str(Path(args.out) / "graph" / name),
        )
        start = time.perf_counter()
        metrics = Trainer(model, task.subset("train"), tg.make_loss(task), config, collate_fn=tg.collate,
                          eval_fn=lambda m: {"test_accuracy": tg.evaluate_split(m, test, task)}).fit()
        hook = "-" if model.encoding is None else ",".join(sorted(h.value for h in model.encoding.hooks))
        rows.append({"encoding": name, "hook": hook, "train_s": round(time.perf_counter() - start, 1),
                     "test_accuracy": round(metrics["test_accuracy"], 3)})
        model_done("graph", rows[-1])
    return rows


def figure(rows: list[Row], args: argparse.Namespace):
    """Test accuracy per encoding on CSL (bars, the axis from 0 to 1, chance 0.1 marked); None
    without matplotlib."""
    from ..plots import bar_chart
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None
    fig = bar_chart(plt, rows, ["test_accuracy"], ["test accuracy"], accuracy=True, ylabel="test accuracy",
                    chance=0.1, title="GPS on CSL: 10 classes that message passing alone cannot tell apart")
    plt.close(fig)  # out of pyplot's list; the caller saves it
    return fig
