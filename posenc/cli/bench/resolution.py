"""``posenc bench resolution``: train a small ViT per vision encoding at one image size, evaluate
it at larger ones.

::

    posenc bench resolution --out runs/resolution                 # the default comparison
    posenc bench resolution --encodings peg,rope2d_mixed --seeds 0,1,2 --steps 1500

Task: scikit-learn's digits (16 pixels) at seeded random positions on an ``S = --img-size``
canvas (see :mod:`posenc.vision.data`), patch ``--patch``; one ViT (width 64, 4 blocks, 4 heads)
per encoding and seed, trained for ``--steps`` steps (800) with the same data order, initial seed
and recipe, seeds 0 and 1 by default. The default run costs about 1,200 CPU-seconds of training
(0.1 s per step on one core), about 10 minutes on a quiet 2-core machine. Each model is then
tested on the held-out digits at ``S`` and at each ``--scales`` factor of it (default 1, 1.5, 2):

``scale`` (the headline; CPVT's and RoPE-ViT's protocol)
    the same test images resized, so the digit grows with the image and the patch grid grows
    from ``S/p`` to ``2S/p`` per side. Learned 2D resamples its table (bicubic, like timm);
    sinusoidal, RoPE and PEG follow the larger grid; DINOv3's RoPE spans the same normalised box
    in finer steps (it interpolates where axial and mixed RoPE extrapolate).
``grow``
    the digit keeps its size on a larger canvas: the positions outgrow the trained range while
    the patches look as in training (for DINOv3's RoPE: the digit shrinks inside its box).

Output: a table of mean accuracy per encoding and size (over ``--seeds``, with the spread when
there are several), the drop from ``S`` to the largest size, CPU seconds of training; the
direction CPVT and RoPE-ViT report (PEG and mixed RoPE keep accuracy at larger sizes better than
learned with resampling) checked on the measured numbers; with ``--out``: ``resolution.json``
(every run) and ``resolution.png`` (accuracy against size, one line per encoding, one panel per
mode).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path

from ..argtypes import device_name, int_list, positive_float, positive_float_list, positive_int
from ..errors import usage_error
from ..outputs import out_error, save_figure, write_json_file
from ..sizes import Work, add_allow_large, defaults_of, size_error, transformer
from ...training.report import format_table
from .caveats import CHANCE_MARGIN, at_chance, print_warnings

PROG = "posenc bench resolution"

DEFAULT_ENCODINGS = ("learned2d", "sincos2d", "axial", "peg", "rope2d_axial", "rope2d_mixed", "rope2d_dinov3")
MODES = ("scale", "grow")
# The claim checked: these hold accuracy at larger sizes better than the baseline.
CLAIM_BASELINE = "learned2d"
CLAIM_BETTER = ("peg", "rope2d_mixed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encodings", default=",".join(DEFAULT_ENCODINGS),
                        help=f"comma-separated vision or seq encodings, or 'none' (default {','.join(DEFAULT_ENCODINGS)})")
    parser.add_argument("--img-size", type=positive_int, default=32, help="training canvas side S (default 32)")
    parser.add_argument("--digit-size", type=positive_int, default=16, help="digit side on the training canvas (default 16)")
    parser.add_argument("--task", default="class", help="'class' (10 classes) or 'where' (class and quadrant, 40)")
    parser.add_argument("--patch", type=positive_int, default=4, help="patch side (default 4)")
    parser.add_argument("--scales", type=positive_float_list, default=[1.0, 1.5, 2.0],
                        help="evaluation sizes as factors of S (default 1,1.5,2)")
    parser.add_argument("--modes", default="scale,grow", help="evaluation modes: scale, grow or both (default both)")
    parser.add_argument("--steps", type=positive_int, default=800, help="training steps per model (default 800)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="examples per batch")
    parser.add_argument("--lr", type=positive_float, default=2e-3, help="peak learning rate")
    parser.add_argument("--dim", type=positive_int, default=64, help="model width")
    parser.add_argument("--depth", type=positive_int, default=4, help="transformer blocks")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads (must divide --dim)")
    parser.add_argument("--repeats", type=positive_int, default=10, help="placements per training digit (default 10)")
    parser.add_argument("--seeds", type=int_list(minimum=0), default=[0, 1],
                        help="comma-separated seeds; results are averaged (default 0,1)")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for resolution.json and resolution.png")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_allow_large(parser)


SIZE_FLAGS = ("steps", "batch_size", "img_size", "scales", "seeds", "repeats", "dim", "depth", "patch")
OUTPUTS = ("resolution.json", "resolution.png")
DIGITS = 1797  # scikit-learn's digits: about 80% for training, 20% for testing


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): per seed and encoding, the training steps of a ViT and
    its accuracy on the held-out digits at every size and mode; the canvases made in memory."""
    encodings = len([n for n in args.encodings.split(",") if n])
    modes = len([m for m in args.modes.split(",") if m])
    dim = args.dim * math.sqrt(16 / 24)  # mlp_ratio 2 where the cost model's MLP is 4x wide

    def tokens(size: float) -> int:
        return int(size // args.patch) ** 2 + 1

    train = transformer(args.batch_size, tokens(args.img_size), dim, args.depth, steps=args.steps)
    tests = Work()
    for scale in args.scales:
        tests = tests + transformer(DIGITS // 5, tokens(args.img_size * scale), dim, args.depth, train=False) * modes
    data = Work(bytes=4 * DIGITS * args.repeats * args.img_size ** 2)
    return (train + tests) * (encodings * len(args.seeds)) + data


def check(args: argparse.Namespace) -> str | None:
    from ..models.vit import DIGIT_TASKS as TASKS, vit_encoding_error as check_encoding

    names = [n for n in args.encodings.split(",") if n]
    if not names:
        return "--encodings: give at least one encoding"
    if len(set(names)) != len(names):
        return f"--encodings: {args.encodings!r} names an encoding twice"
    for name in names:
        error = check_encoding(name, "--encodings")
        if error is not None:
            return error
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        return f"--modes: expected scale, grow or both; got {args.modes!r}"
    if args.task not in TASKS:
        return f"--task: unknown task {args.task!r}; choose from {', '.join(TASKS)}"
    for name in ("img_size", "digit_size", "patch", "steps", "batch_size", "dim", "depth", "heads", "repeats"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    if args.lr <= 0:
        return f"--lr must be positive, got {args.lr}"
    if args.dim % args.heads:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads})"
    if args.digit_size > args.img_size:
        return f"--digit-size ({args.digit_size}) must not exceed --img-size ({args.img_size})"
    if args.task == "where" and args.img_size < args.digit_size + 2:
        return f"--task where needs --img-size >= --digit-size + 2; got {args.img_size} and {args.digit_size}"
    if args.img_size % args.patch:
        return f"--img-size {args.img_size} is not divisible by --patch {args.patch}"
    for scale in args.scales:
        size = int(round(args.img_size * scale))
        if size % args.patch:
            return f"--scales: {scale:g} x --img-size {args.img_size} = {size} is not divisible by --patch {args.patch}"
    return size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments)) or out_error(args.out, OUTPUTS)


def run(args: argparse.Namespace) -> int:
    error = check(args)
    if error is not None:
        return usage_error(PROG, error)
    result = measure(args)
    result["warnings"] = warnings_of(result)
    print(render(result))
    print_warnings(result["warnings"])
    if args.out is not None:
        out = Path(args.out)
        write_json_file(out, "resolution.json", result)
        plotted = plot(result, out / "resolution.png")
        print(f"\nwritten: {out / 'resolution.json'}" + (f", {out / 'resolution.png'}" if plotted else ""))
    return 0


# ----------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict:
    """Train and evaluate every (encoding, seed); the JSON-ready result."""
    import torch

    from ...training.report import Progress
    from ...training.trainer import TrainConfig
    from ...vision.classify import accuracy, eval_sizes, train_vit, vit_config
    from ...vision.data import DigitsCanvas, digits_at_size

    names = [n for n in args.encodings.split(",") if n]
    modes = [m for m in args.modes.split(",") if m]
    sizes = eval_sizes(args.img_size, args.scales)
    runs = []
    bar = Progress(len(names) * len(args.seeds), "models", enabled=not args.no_progress)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        for seed in args.seeds:
            data = dict(canvas_size=args.img_size, digit_size=args.digit_size, task=args.task, seed=seed)
            train = DigitsCanvas("train", repeats=args.repeats, **data)
            test = DigitsCanvas("test", **data)
            sets = {
                mode: {s: test if s == args.img_size else digits_at_size(test, s, mode) for s in sizes} for mode in modes
            }
            for name in names:
                bar.note = f"{name} seed {seed}"
                config = vit_config(name, img_size=args.img_size, patch_size=args.patch, in_chans=1,
                                    num_classes=train.num_classes, dim=args.dim, depth=args.depth,
                                    num_heads=args.heads, mlp_ratio=2.0)
                train_config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                           warmup_steps=max(1, args.steps // 10), seed=seed, device=args.device,
                                           progress=False, log_every=0)
                cpu, wall = time.process_time(), time.perf_counter()
                model, metrics, _ = train_vit(config, train, {}, train_config)
                train_cpu, train_wall = time.process_time() - cpu, time.perf_counter() - wall
                model.eval()
                acc: dict[str, dict[str, float | None]] = {}
                for mode in modes:
                    acc[mode] = {}
                    for size, data_set in sets[mode].items():
                        try:
                            acc[mode][str(size)] = accuracy(model, data_set)
                        except ValueError as exc:  # an encoding that refuses a new grid
                            print(f"{name} at {size} ({mode}): refused: {exc}", file=sys.stderr)
                            acc[mode][str(size)] = None
                runs.append({
                    "encoding": name, "seed": seed, "train_loss": metrics["train_loss"],
                    "params": sum(p.numel() for p in model.parameters()),
                    "train_cpu_s": round(train_cpu, 2), "train_wall_s": round(train_wall, 2), "accuracy": acc,
                })
                bar.update(1)
    finally:
        bar.close()
    return {
        "benchmark": "resolution",
        "config": {k: v for k, v in vars(args).items() if k not in ("handler", "accepts_extra")},
        "train_size": args.img_size, "sizes": sizes, "modes": modes, "encodings": names,
        "chance": 1 / train.num_classes,
        "runs": runs, "summary": summarize(runs, names, modes, sizes, 1 / train.num_classes),
        "wall_s": round(time.perf_counter() - wall0, 1), "cpu_s": round(time.process_time() - cpu0, 1),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
    }


def _mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals or len(vals) != len(values):
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def _above_chance(accuracy: float | None, chance: float) -> bool:
    return accuracy is not None and accuracy >= chance + CHANCE_MARGIN


def warnings_of(result: dict) -> list[str]:
    """One line per (mode, encoding) whose accuracy at the training size is at chance: its
    "kept" share and direction verdict are left out (see :mod:`.caveats`)."""
    size, chance = str(result["sizes"][0]), result["chance"]
    out = []
    for mode, rows in result["summary"].items():
        for name, row in rows.items():
            text = at_chance(f"{name} ({mode}) at {size}px", row[size]["mean"], chance,
                             advice="train longer: more --steps or --repeats")
            if text is not None:
                out.append(text)
    return out


def summarize(runs: list[dict], names: list[str], modes: list[str], sizes: list[int], chance: float) -> dict:
    """Per mode and encoding: mean/std accuracy per size; ``change``, the accuracy at the last size
    minus the first; ``kept``, the share of the first size's accuracy above ``chance`` that is left
    at the last size (``(last - chance) / (first - chance)``), which compares models that start
    from different accuracies; None when the first is at chance (within
    :data:`~.caveats.CHANCE_MARGIN`), where the share divides by nearly zero."""
    out: dict[str, dict] = {}
    for mode in modes:
        out[mode] = {}
        for name in names:
            mine = [r for r in runs if r["encoding"] == name]
            row: dict[str, object] = {}
            for s in sizes:
                mean, std = _mean_std([r["accuracy"][mode][str(s)] for r in mine])
                row[str(s)] = {"mean": mean, "std": std}
            first, last = row[str(sizes[0])]["mean"], row[str(sizes[-1])]["mean"]
            row["change"] = None if first is None or last is None else last - first
            row["kept"] = None if last is None or not _above_chance(first, chance) else (last - chance) / (first - chance)
            out[mode][name] = row
    return out


def direction(result: dict, mode: str = "scale") -> list[str]:
    """Lines saying, at each size above S, whether PEG and mixed RoPE keep more of their accuracy
    above chance than learned with resampling, as CPVT and RoPE-ViT report."""
    summary, sizes, chance = result["summary"].get(mode, {}), result["sizes"], result["chance"]

    def kept(row: dict, size: int) -> float | None:
        first, now = row[str(sizes[0])]["mean"], row[str(size)]["mean"]
        return None if now is None or not _above_chance(first, chance) else (now - chance) / (first - chance)

    base = summary.get(CLAIM_BASELINE)
    if base is None or len(sizes) < 2:
        return []
    lines = []
    for name in CLAIM_BETTER:
        row = summary.get(name)
        if row is None:
            continue
        parts = []
        for size in sizes[1:]:
            mine, theirs = kept(row, size), kept(base, size)
            if mine is None or theirs is None:
                continue
            verdict = "agrees" if mine > theirs else "disagrees"
            parts.append(f"at {size}: {100 * mine:.0f}% vs {100 * theirs:.0f}%, {verdict}")
        if parts:
            lines.append(f"{name} vs {CLAIM_BASELINE}: " + "; ".join(parts))
    return lines


def _signed(value: float) -> str:
    return f"{100 * value:+.1f} pts"


def _cell(stat: dict) -> str:
    if stat["mean"] is None:
        return "refused"
    text = f"{100 * stat['mean']:.1f}"
    return text if stat["std"] is None else f"{text} +- {100 * stat['std']:.1f}"


def render(result: dict) -> str:
    sizes, modes = result["sizes"], result["modes"]
    cpu = {}
    for r in result["runs"]:
        cpu.setdefault(r["encoding"], []).append(r["train_cpu_s"])
    headers = ["encoding"]
    for mode in modes:
        headers += [f"{mode}@{s}" for s in sizes] + [f"{mode} change", "kept"]
    headers.append("train cpu s")
    rows = []
    for name in result["encodings"]:
        row = [name]
        for mode in modes:
            stats = result["summary"][mode][name]
            row += [_cell(stats[str(s)]) for s in sizes]
            change = stats["change"]
            row.append("-" if change is None else _signed(change))
            row.append("-" if stats["kept"] is None else f"{100 * stats['kept']:.0f}%")
        row.append(f"{statistics.fmean(cpu[name]):.0f}")
        rows.append(row)
    cfg = result["config"]
    seeds = cfg["seeds"]
    lines = [
        f"Top-1 accuracy (%) on held-out digits, trained at {result['train_size']}px (patch {cfg['patch']}, "
        f"{cfg['steps']} steps, dim {cfg['dim']}, depth {cfg['depth']}, task {cfg['task']}; "
        f"{'mean +- std over seeds ' + ','.join(map(str, seeds)) if len(seeds) > 1 else 'seed ' + str(seeds[0])})",
        "scale: the test image resized (digit grows with it); grow: larger canvas, digit unchanged",
        "",
        format_table(headers, rows, align="l" + "r" * (len(headers) - 1)),
    ]
    verdicts = direction(result)
    if verdicts:
        lines += ["", "Direction check (scale mode; CPVT and RoPE-ViT: PEG and mixed RoPE hold accuracy better "
                      f"than learned with resampling; accuracy kept above chance, (accuracy@size - chance) / "
                      f"(accuracy@S - chance), chance {100 * result['chance']:.1f}%):"] + [f"  {v}" for v in verdicts]
    lines.append(f"\nwall {result['wall_s']:.0f} s, process CPU {result['cpu_s']:.0f} s "
                 f"({result['machine']['threads']} torch threads)")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    """Accuracy against image size, one line per encoding, one panel per mode: the axis from 0 to 1
    with the chance level marked, the legend outside (:mod:`posenc.cli.plots`). False without
    matplotlib."""
    from ..plots import accuracy_axis, legend_outside, note, overlapping, series_style
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return False

    modes, sizes = result["modes"], result["sizes"]
    fig, axes = plt.subplots(1, len(modes), figsize=(4.8 * len(modes) + 1.6, 4), squeeze=False, sharey=True,
                             layout="constrained")
    notes = []
    for ax, mode in zip(axes[0], modes):
        lines = {}
        for i, name in enumerate(result["encodings"]):
            stats = result["summary"][mode][name]
            ys = [math.nan if stats[str(s)]["mean"] is None else stats[str(s)]["mean"] for s in sizes]
            ax.plot(sizes, ys, label=name, **series_style(i))
            lines[name] = ys
        notes += [f"{mode}: {text}" for text in overlapping(lines, sizes, 0.005)]
        ax.axvline(result["train_size"], color="gray", linestyle=":", linewidth=1)
        ax.set_xticks(sizes)
        ax.set_xlabel("test image side (pixels)")
        accuracy_axis(ax, result["chance"], "top-1 accuracy")
        ax.set_title({"scale": "image resized (digit scales)", "grow": "canvas grows (digit fixed)"}[mode])
        ax.grid(alpha=0.3)
    legend_outside(fig, [axes[0][0]])
    note(fig, notes, "on top of each other (within half a point)")
    fig.suptitle(f"ViT trained at {result['train_size']}px on digits (dotted: the training size)")
    save_figure(fig, path.parent, path.name, dpi=110)
    plt.close(fig)
    return True
