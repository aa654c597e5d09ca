"""``posenc bench extrapolation``: train short, test long (the ALiBi paper's experiment, small).

::

    posenc bench extrapolation --out runs/extrap
    posenc bench extrapolation --encodings rope,alibi --train-len 64 --eval-lens 64,128,256 --steps 200
    posenc bench extrapolation --task reverse --train-len 8 --eval-lens 8,16,32
    posenc bench extrapolation --feature-map elu --task recall --encodings none,sinusoidal,rope,sine_spe,conv_spe
    posenc bench extrapolation --encodings nope,peg1d,rope --train-len 64 --eval-lens 64,128,256

One small causal LM per encoding (same seed, same data order) is trained on byte windows of
CPython's pydoc text at ``--train-len``, then scored on the held-out tail (last 10%) at each
``--eval-lens``: **bits per byte** (mean next-byte cross-entropy in bits, over every position
of ``--eval-tokens`` tokens cut into non-overlapping windows of that length; byte-level
perplexity is ``2 ** bpb``). With ``--task`` the models learn a synthetic task at sizes up to
``--train-len`` and report exact match at each size in ``--eval-lens``.

Every model is built with ``max_len = --train-len`` (the training length): an encoding with a
table of positions (learned absolute, TUPE) has no row for a longer position, so those cells are
reported as ``n/a`` (``null`` in the JSON) rather than interpolated. Any registered sequence
encoding may be named; ``peg1d`` (the 1D PEG, an input encoding between blocks) is a causal depthwise convolution after
the first block (:mod:`posenc.seq.peg1d`), which has no table and runs at any length.

``--feature-map elu|favor`` trains every model on linear attention with that feature map
(:mod:`posenc.common.linear_attention`) instead of softmax: then only encodings on the input or
on q and k run (none, sinusoidal, learned, RoPE, SPE, peg1d), and the SPE encodings (defined for linear
attention only) become available; any other is refused before training.

Outputs (with ``--out``): ``extrapolation.txt`` (the table), ``extrapolation.json`` and
``extrapolation.png`` (one line per encoding, x = evaluation length, log y).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..argtypes import device_name, int_list, positive_float, positive_int, seed_value
from ..errors import usage_error
from ..options import FEATURE_MAPS, SEQ_TASKS
from ..outputs import out_error, save_figure, write_file, write_json_file
from ..sizes import Work, add_allow_large, defaults_of, scoring, sequence, size_error, transformer
from ...training.report import format_table, hook_text

PROG = "posenc bench extrapolation"
DEFAULT_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "t5", "kerple", "fire", "nope")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated encoding names")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encodings", type=_names, default=list(DEFAULT_ENCODINGS),
                        help=f"comma-separated encodings (default {','.join(DEFAULT_ENCODINGS)}); 'none' for no encoding")
    parser.add_argument("--feature-map", choices=FEATURE_MAPS, default=None,
                        help="train on linear attention with this feature map (default: softmax attention)")
    parser.add_argument("--task", default=None, help="a synthetic task (copy, reverse, sort, addition, recall) instead of text")
    parser.add_argument("--train-len", type=positive_int, default=None,
                        help="training length: bytes per window, or the largest task size with --task (default: 128; with --task 8)")
    parser.add_argument("--eval-lens", type=int_list(minimum=1), default=None,
                        help="evaluation lengths (default 128,256,512,1024; with --task 8,16,32)")
    parser.add_argument("--steps", type=positive_int, default=None, help="training steps per model (default 500; task 1500)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="examples per batch")
    parser.add_argument("--lr", type=positive_float, default=2e-3, help="peak learning rate")
    parser.add_argument("--dim", type=positive_int, default=128, help="model width")
    parser.add_argument("--depth", type=positive_int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads (must divide --dim)")
    parser.add_argument("--eval-tokens", type=positive_int, default=16384, help="text: tokens scored per evaluation length")
    parser.add_argument("--eval-examples", type=positive_int, default=256, help="task: examples per evaluation size")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the data, the initialisation and dropout")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for extrapolation.{txt,json,png}")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_allow_large(parser)


SIZE_FLAGS = ("steps", "batch_size", "train_len", "eval_lens", "eval_tokens", "eval_examples", "dim", "depth")
OUTPUTS = ("extrapolation.txt", "extrapolation.json", "extrapolation.png")


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): per encoding, the training steps and the scoring at every
    length (a task example of size n is taken as 3n + 4 tokens)."""
    task = args.task is not None
    train_len = args.train_len or (8 if task else 128)
    eval_lens = args.eval_lens or ([8, 16, 32] if task else [128, 256, 512, 1024])
    steps = args.steps or (1500 if task else 500)
    vocab = 64 if task else 256
    tokens = (lambda n: 3 * n + 4) if task else (lambda n: n)
    train = transformer(args.batch_size, tokens(train_len), args.dim, args.depth, vocab=vocab, steps=steps)
    if task:
        scored = sequence([transformer(args.eval_examples, tokens(n), args.dim, args.depth, vocab=vocab, train=False)
                        for n in eval_lens])
    else:
        scored = sequence([scoring(args.eval_tokens, n, args.dim, args.depth) for n in eval_lens])
    return (train + scored) * len(args.encodings)


def _resolve(args: argparse.Namespace) -> str | None:
    """Fill the defaults that depend on ``--task``; return what is wrong, or None."""
    from ..catalog import entry, names
    from ..errors import unknown_name

    if args.task is not None and args.task not in SEQ_TASKS:
        return f"--task: {unknown_name('task', args.task, SEQ_TASKS)}"
    for name in args.encodings:  # from the catalog: answered before torch loads
        if name != "none" and entry(name) is None:
            return f"--encodings: {unknown_name('encoding', name, names(), listing='posenc list --modality seq')}"
    if len(set(args.encodings)) != len(args.encodings):
        return f"--encodings: a name is repeated in {','.join(args.encodings)}"
    if args.dim % args.heads:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads})"
    feature_map = getattr(args, "feature_map", None)
    for name in args.encodings:  # the attention kind each encoding needs, before anything trains
        if name == "none":
            continue
        info = entry(name)
        refusal = info.softmax_error if feature_map is None else info.linear_error
        if refusal is not None:
            hint = "" if feature_map is None else f" (--feature-map {feature_map} runs linear attention)"
            return f"--encodings: {refusal}{hint}"
    task = args.task is not None
    args.train_len = args.train_len or (8 if task else 128)
    args.eval_lens = args.eval_lens or ([8, 16, 32] if task else [128, 256, 512, 1024])
    args.steps = args.steps or (1500 if task else 500)
    if not args.lr > 0:
        return f"--lr must be positive, got {args.lr}"
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    if error is not None:
        return error
    return out_error(args.out, OUTPUTS)


def run(args: argparse.Namespace) -> int:
    error = _resolve(args)
    if error is not None:
        return usage_error(PROG, error)
    start = time.perf_counter()
    rows = [_one(args, name) for name in args.encodings]
    metric = "exact_match" if args.task else "bits_per_byte"
    table = _table(rows, args.eval_lens)
    what = (f"exact match on task {args.task} (trained at sizes <= {args.train_len})" if args.task
            else f"bits per byte on held-out pydoc text (trained at {args.train_len} bytes; lower is better)")
    feature_map = getattr(args, "feature_map", None)
    what += "; softmax attention" if feature_map is None else f"; linear attention, feature map {feature_map}"
    print(f"\n{what}\n{table}")
    notes = [f"{r['encoding']}: {r['note']}" for r in rows if r.get("note")]
    for note in notes:
        print(f"note: {note}")
    total = time.perf_counter() - start
    print(f"total {total:.0f} s")
    if args.out is not None:
        out = Path(args.out)
        write_file(out, "extrapolation.txt", f"{what}\n{table}\n" + "".join(f"note: {n}\n" for n in notes))
        config = {k: getattr(args, k, None) for k in ("task", "train_len", "eval_lens", "steps", "batch_size", "lr",
                                                      "dim", "depth", "heads", "eval_tokens", "eval_examples", "seed",
                                                      "feature_map")}
        result = {"metric": metric, "config": config, "results": rows, "total_s": round(total, 1)}
        write_json_file(out, "extrapolation.json", result)
        _plot(rows, args, metric, out / "extrapolation.png")
        print(f"written to {out}/extrapolation.{{txt,json,png}}")
    return 0


def _one(args: argparse.Namespace, name: str) -> dict:
    """Train one model with encoding ``name`` and evaluate it at every length."""
    from ...seq.byte_lm import bits_per_byte_at, train_on_bytes
    import torch

    from ...seq.data import ByteWindows, pydoc_corpus, split_text
    from ...seq.evaluation import task_eval_set, task_exact_match
    from ...seq.models import CausalLM
    from ...seq.tasks import make_task, train_on_task

    budget = dict(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, device=args.device,
                  progress=not args.no_progress)
    if args.task is not None:
        task = make_task(args.task)
        for n in args.eval_lens:
            task.check_length(n)
        vocab, max_len = task.vocab_size, task.max_total_length(args.train_len)

        def fit(model) -> float:
            return train_on_task(model, task, args.train_len, **budget)

        def score(model, n: int) -> float:
            return task_exact_match(model, task_eval_set(task, n, args.eval_examples, seed=10_000 + args.seed + n))
    else:
        train_text, valid_text = split_text(pydoc_corpus())
        vocab, max_len = ByteWindows.vocab_size, args.train_len

        def fit(model) -> float:
            return train_on_bytes(model, train_text, args.train_len, **budget)

        def score(model, n: int) -> float:
            return bits_per_byte_at(model, valid_text, [n], args.eval_tokens)[n]

    torch.manual_seed(args.seed)
    model = CausalLM(vocab, args.dim, args.depth, args.heads, encoding=None if name == "none" else name, max_len=max_len,
                     feature_map=getattr(args, "feature_map", None))
    if not args.no_progress:
        print(f"{name}:", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    train_loss = fit(model)
    train_s = time.perf_counter() - t0
    model.eval()
    values: dict[str, float | None] = {}
    note = None
    t0 = time.perf_counter()
    with torch.no_grad():
        for n in args.eval_lens:
            try:
                values[str(n)] = score(model, n)
            except ValueError as exc:  # a table of positions that ends at the training length
                if n <= max_len:
                    raise
                values[str(n)] = None
                note = note or f"n/a beyond its {max_len} positions ({exc})"
    encodings = model.encodings
    hooks = hook_text({h for e in encodings for h in e.hooks}, any(e.between_blocks for e in encodings))
    return {
        "encoding": name, "hooks": hooks, "train_loss": round(train_loss, 4),
        "train_s": round(train_s, 1), "eval_s": round(time.perf_counter() - t0, 1),
        "eval": values, **({"note": note} if note else {}),
    }


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _table(rows: list[dict], eval_lens: list[int]) -> str:
    headers = ["encoding", "hooks", *[f"@{n}" for n in eval_lens], "train_s"]
    body = [[r["encoding"], r["hooks"], *[_fmt(r["eval"][str(n)]) for n in eval_lens], r["train_s"]] for r in rows]
    return format_table(headers, body, align="ll" + "r" * (len(eval_lens) + 1))


def log_ticks(low: float, high: float, count: int = 5) -> tuple[list[float], list[str]]:
    """``count`` ticks spread evenly on a log axis over ``[low, high]``, labelled with as few
    decimals as keep every label distinct (fixed decimals made all labels of a narrow range equal)."""
    if not (0 < low <= high):
        raise ValueError(f"log ticks need 0 < low <= high; got low={low}, high={high}")
    if high / low < 1.0001:
        return [low], [f"{low:.3g}"]
    ticks = [low * (high / low) ** (i / (count - 1)) for i in range(count)]
    for decimals in range(1, 7):
        labels = [f"{t:.{decimals}f}" for t in ticks]
        if len(set(labels)) == len(labels):
            return ticks, labels
    return ticks, [f"{t:.6g}" for t in ticks]


def _plot(rows: list[dict], args: argparse.Namespace, metric: str, path: Path) -> None:
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None

    from ..plots import accuracy_axis, legend_outside, note, overlapping, series_style

    fig, ax = plt.subplots(figsize=(7.6, 4.4), layout="constrained")
    for i, r in enumerate(rows):
        pts = [(n, r["eval"][str(n)]) for n in args.eval_lens if r["eval"][str(n)] is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=r["encoding"], **series_style(i))
    ax.set_xscale("log", base=2)
    ax.set_xticks(args.eval_lens, [str(n) for n in args.eval_lens])
    if metric == "bits_per_byte":
        from matplotlib.ticker import NullFormatter

        values = [v for r in rows for v in r["eval"].values() if v is not None]
        ax.set_yscale("log")
        if values:
            ticks, labels = log_ticks(min(values), max(values))
            ax.set_yticks(ticks, labels)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("bits per byte (log scale)")
    else:  # exact match of the whole answer: chance is about 0
        accuracy_axis(ax, None, "exact match")
    ax.axvline(args.train_len, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(f"evaluation length (trained at {args.train_len}, dotted)")
    ax.set_title("Length extrapolation" + (f": {args.task}" if args.task else ": pydoc bytes"))
    legend_outside(fig)
    ax.grid(True, which="both", alpha=0.3)
    series = {r["encoding"]: [r["eval"][str(n)] for n in args.eval_lens] for r in rows}
    note(fig, overlapping(series, args.eval_lens, 0.005 if metric != "bits_per_byte" else 0.0005))
    save_figure(fig, path.parent, path.name, dpi=120)
    plt.close(fig)


__all__ = ["DEFAULT_ENCODINGS", "add_arguments", "run"]
