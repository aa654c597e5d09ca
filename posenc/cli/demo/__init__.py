"""``posenc demo``: a short tour that trains reference models on built-in data under several
encodings and prints the comparison.

Each modality contributes a part: a module in :mod:`posenc.cli.demo` that defines

* ``TITLE``: the heading printed above the part's table;
* ``add_arguments(parser)``: the part's own options (named ``--<part>-...``);
* ``check(args) -> str | None``: what is wrong with those options, checked before anything trains;
* ``run(args) -> list[dict]``: train and evaluate, one result row per encoding;
* ``figure(rows, args)``: the part's figure (matplotlib; None without it), written by ``--plots DIR``
  as ``DIR/<part>.png`` after the part runs (the conventions of :mod:`posenc.cli.plots`).

``PARTS`` lists them in the order the demo runs them. The shared options (``--steps``,
``--seed``, ``--device``, ``--out``, ``--no-progress``) are defined here; a part may scale
``--steps`` to its own budget.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path
from types import ModuleType

from ..argtypes import device_name, positive_int, seed_value
from ..catalog import suggest
from ..errors import usage_error
from ..options import out_dir_error
from ..outputs import out_error, write_json_file
from ..sizes import Work, add_allow_large, defaults_of, size_error, transformer
from ...training.report import format_table

PROG = "posenc demo"

Row = dict[str, object]

# part -> module. Each modality adds its own line.
PARTS: dict[str, str] = {
    "seq": "posenc.cli.demo.seq",

    "vision": "posenc.cli.demo.vision",

    "graph": "posenc.cli.demo.graph",

    "timeseries": "posenc.cli.demo.timeseries",
}


def part_module(part: str) -> ModuleType:
    return importlib.import_module(PARTS[part])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts to run, from {', '.join(PARTS)}")
    parser.add_argument("--steps", type=positive_int, default=500, help="training steps per model (default 500)")
    parser.add_argument("--eval-windows", type=positive_int, default=256, help="validation examples per evaluation")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the data, the initialisation and dropout")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for metrics, checkpoints and results.json")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="write one figure per part into DIR (seq.png, vision.png, ...; needs matplotlib)")
    add_allow_large(parser)
    for part in PARTS:
        part_module(part).add_arguments(parser)


SIZE_FLAGS = ("steps", "eval_windows", "graph_per_class")
MAX_TS_STEPS = 200  # the time-series part trains min(--steps, 200) steps


def estimate(args: argparse.Namespace) -> Work:
    """The demo's work (posenc.cli.sizes): each part's models at its sizes (:mod:`.seq`: width 64,
    depth 2, 64 bytes; :mod:`.vision`: width 48, depth 3, 65 tokens; :mod:`.graph`: CSL graphs of
    41 nodes, 3/5 of the steps; :mod:`.timeseries`: a ConvTran on 150 steps)."""
    parts = [p for p in args.parts.split(",") if p]
    work = Work()
    if "seq" in parts:
        count = len(args.seq_encodings.split(","))
        model = transformer(32, 64, 64, 2, vocab=256, steps=args.steps)
        scored = transformer(args.eval_windows, 128, 64, 2, vocab=256, train=False, steps=2)
        work = work + (model + scored) * count
    if "vision" in parts:
        count = len([n for n in args.vision_encodings.split(",") if n])
        work = work + transformer(64, 65, 48, 3, steps=args.steps) * count
    if "graph" in parts:
        graphs = 10 * args.graph_per_class
        count = len(args.graph_encodings.split(","))
        work = work + (transformer(10, 41, 64, 3, steps=max(1, args.steps * 3 // 5))
                       + transformer(graphs, 41, 64, 3, train=False)) * count
    if "timeseries" in parts:
        count = len(args.ts_encodings.split(","))
        work = work + transformer(16, 150, 16, 1, steps=min(args.steps, MAX_TS_STEPS)) * count
    return work


TIMING_NOTE = ("train_s is wall-clock seconds on this machine: it depends on the machine's load as much as on "
               "the encoding (load average {load})")


def model_done(part: str, row: Row) -> None:
    """The progress line of one trained model: its part, encoding, time and scores."""
    scores = ", ".join(f"{k} {v}" for k, v in row.items() if k not in ("encoding", "hook", "train_s", "steps"))
    print(f"  {part}: {row['encoding']} trained in {row['train_s']} s" + (f"; {scores}" if scores else ""), flush=True)


def _load_average() -> str:
    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except (OSError, AttributeError):  # not a POSIX system
        return "unknown"


def _table(rows: list[Row]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return format_table(cols, [[r.get(c, "") for c in cols] for r in rows])


def _argument_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (checked before any training), or None."""
    unknown = [p for p in args.parts.split(",") if p and p not in PARTS]
    if unknown:
        hints = "".join(suggest(p, list(PARTS)) for p in unknown)
        return f"--parts: unknown part(s) {', '.join(unknown)}{hints}; choose from {', '.join(PARTS)}"
    if args.steps <= 0:
        return f"--steps must be positive, got {args.steps}"
    if args.eval_windows <= 0:
        return f"--eval-windows must be positive, got {args.eval_windows}"
    for part in (p for p in args.parts.split(",") if p):
        error = part_module(part).check(args)
        if error is not None:
            return error
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    if error is not None:
        return error
    parts = [p for p in args.parts.split(",") if p]
    return (out_dir_error(args.out, False) or out_error(args.out, ["results.json"])
            or out_error(args.plots, [f"{p}.png" for p in parts], flag="--plots"))


def _save_plot(module: ModuleType, part: str, rows: list[Row], args: argparse.Namespace) -> None:
    from ..outputs import save_figure

    fig = module.figure(rows, args)
    if fig is not None:  # None: matplotlib is missing, and the part said so on stderr
        print(f"figure written to {save_figure(fig, args.plots, f'{part}.png', dpi=120)}", flush=True)


def run(args: argparse.Namespace) -> int:
    error = _argument_error(args)
    if error is not None:
        return usage_error(PROG, error)
    parts = [p for p in args.parts.split(",") if p]
    results = {}
    for part in parts:
        module = part_module(part)
        print(f"\n== {module.TITLE}", flush=True)
        rows = module.run(args)
        results[part] = rows
        print(_table(rows), flush=True)
        if args.plots is not None:
            _save_plot(module, part, rows, args)
    print("\n" + TIMING_NOTE.format(load=_load_average()))
    if args.out is not None:
        path = write_json_file(Path(args.out), "results.json", results)
        print(f"\nresults written to {path}")
    return 0
