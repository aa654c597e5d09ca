"""``posenc bench context-extension``: extend a RoPE LM trained at 128 bytes, zero-shot and after a
short fine-tune, with every context extension.

::

    posenc bench context-extension --out runs/ctx            # about 10 minutes on 2 CPU cores
    posenc bench context-extension --steps 200 --finetune-steps 10 --eval-lens 128,512

One RoPE causal LM is trained on byte windows of CPython's pydoc text at ``--train-len`` (128).
Then, for each method -- raw extrapolation (``none``), position interpolation (``linear``),
NTK-aware (``ntk``), dynamic NTK, YaRN, Llama 3 and LongRoPE -- a copy of it is switched with
:func:`posenc.seq.extend_context` (``factor = max(--eval-lens) / --train-len``, ``L0 =
--train-len``, each method's defaults otherwise; LongRoPE without searched factor lists uses
ones inside ``L0`` and ``s^(2k/(r-2))`` beyond, see :class:`posenc.seq.LongRoPE`), scored in bits
per byte on the held-out tail at each ``--eval-lens``, fine-tuned for ``--finetune-steps`` steps
at the target length (the longest evaluation length; the same steps, data and seed for every
method, ``none`` included) and scored again.

Outputs (with ``--out``): ``context_extension.txt``, ``.json`` and ``.png`` (bits per byte against
length, zero-shot and fine-tuned side by side).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

from ..argtypes import device_name, int_list, nonnegative_int, positive_float, positive_int, seed_value
from ..errors import usage_error
from ..outputs import out_error, save_figure, write_file, write_json_file
from ..sizes import Work, add_allow_large, defaults_of, scoring, sequence, size_error, transformer
from ...training.report import format_table

PROG = "posenc bench context-extension"
BENCH_METHODS = ("none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope")
LABELS = {"none": "raw extrapolation", "linear": "PI (linear)", "ntk": "NTK-aware", "dynamic_ntk": "dynamic NTK",
          "yarn": "YaRN", "llama3": "Llama 3", "longrope": "LongRoPE"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-len", type=positive_int, default=128, help="training window in bytes (default 128)")
    parser.add_argument("--eval-lens", type=int_list(minimum=1), default=[128, 256, 512, 1024],
                        help="evaluation lengths; the longest is the target (default 128,256,512,1024)")
    parser.add_argument("--steps", type=positive_int, default=600, help="training steps of the base model (default 600)")
    parser.add_argument("--finetune-steps", type=nonnegative_int, default=100, help="fine-tuning steps per method (default 100; 0: none)")
    parser.add_argument("--finetune-batch", type=positive_int, default=4, help="fine-tuning batch (default 4)")
    parser.add_argument("--finetune-lr", type=positive_float, default=5e-4, help="fine-tuning learning rate (default 5e-4)")
    parser.add_argument("--methods", default=",".join(BENCH_METHODS),
                        help=f"comma-separated methods (default {','.join(BENCH_METHODS)})")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="examples per batch")
    parser.add_argument("--lr", type=positive_float, default=2e-3, help="peak learning rate")
    parser.add_argument("--dim", type=positive_int, default=128, help="model width")
    parser.add_argument("--depth", type=positive_int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads (must divide --dim)")
    parser.add_argument("--eval-tokens", type=positive_int, default=16384, help="tokens scored per evaluation length")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the data, the initialisation and dropout")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for context_extension.{txt,json,png}")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_allow_large(parser)


SIZE_FLAGS = ("steps", "batch_size", "train_len", "eval_lens", "eval_tokens", "finetune_steps", "finetune_batch", "dim",
              "depth")
OUTPUTS = ("context_extension.txt", "context_extension.json", "context_extension.png")


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): the base model's training, then per method the scoring at
    every length and, with a fine-tune, its steps at the longest length and the scoring again."""
    methods = len([m for m in args.methods.split(",") if m.strip()])
    base = transformer(args.batch_size, args.train_len, args.dim, args.depth, vocab=256, steps=args.steps)
    scored = sequence([scoring(args.eval_tokens, n, args.dim, args.depth) for n in args.eval_lens])
    tune = Work()
    if args.finetune_steps:
        tune = transformer(args.finetune_batch, max(args.eval_lens), args.dim, args.depth, vocab=256,
                           steps=args.finetune_steps) + scored
    return base + (scored + tune) * methods


def _check(args: argparse.Namespace) -> str | None:
    from ...seq.context import canonical_method

    try:
        args.method_list = [canonical_method(m.strip()) for m in args.methods.split(",") if m.strip()]
    except ValueError as exc:
        return f"--methods: {exc}"
    if not args.method_list or len(set(args.method_list)) != len(args.method_list):
        return f"--methods: give distinct method names, got {args.methods!r}"
    if args.finetune_steps < 0:
        return f"--finetune-steps must be >= 0, got {args.finetune_steps}"
    for name in ("lr", "finetune_lr"):
        if not getattr(args, name) > 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        return f"--dim ({args.dim}) / --heads ({args.heads}) must be an even head size"
    if max(args.eval_lens) < args.train_len:
        return f"--eval-lens: the longest ({max(args.eval_lens)}) must reach past --train-len ({args.train_len})"
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    if error is not None:
        return error
    return out_error(args.out, OUTPUTS)


def run(args: argparse.Namespace) -> int:
    import torch

    error = _check(args)
    if error is not None:
        return usage_error(PROG, error)
    from ...seq.byte_lm import bits_per_byte_at, train_on_bytes
    from ...seq.context import extend_context
    from ...seq.data import pydoc_corpus, split_text
    from ...seq.models import CausalLM

    start = time.perf_counter()
    train_text, valid_text = split_text(pydoc_corpus())
    lens = sorted(set(args.eval_lens))
    target = lens[-1]
    factor = target / args.train_len
    progress = not args.no_progress
    torch.manual_seed(args.seed)
    base = CausalLM(256, args.dim, args.depth, args.heads, encoding="rope", max_len=target)
    if progress:
        print(f"base RoPE model at {args.train_len} bytes:", file=sys.stderr, flush=True)
    base_loss = train_on_bytes(base, train_text, args.train_len, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                         seed=args.seed, device=args.device, progress=progress)
    base = base.cpu()
    rows = []
    for method in args.method_list:
        model = copy.deepcopy(base)
        extend_context(model, method, factor=1.0 if method == "none" else factor, original_max_len=args.train_len)
        zero = bits_per_byte_at(model, valid_text, lens, args.eval_tokens)
        tuned = None
        if args.finetune_steps:
            if progress:
                print(f"{method}: fine-tune at {target}", file=sys.stderr, flush=True)
            train_on_bytes(model, train_text, target, steps=args.finetune_steps, batch_size=args.finetune_batch,
                     lr=args.finetune_lr, seed=args.seed + 1, device=args.device, progress=progress)
            tuned = bits_per_byte_at(model.cpu(), valid_text, lens, args.eval_tokens)
        rows.append({"method": method, "label": LABELS[method],
                     "zero_shot": {str(n): v for n, v in zero.items()},
                     "finetuned": None if tuned is None else {str(n): v for n, v in tuned.items()}})
    total = time.perf_counter() - start
    table = _table(rows, lens, args.finetune_steps)
    what = (f"bits per byte on held-out pydoc text; one RoPE LM trained at {args.train_len} bytes ({args.steps} steps, "
            f"final loss {base_loss:.3f}), extended by factor {factor:g} (L0 = {args.train_len}); "
            f"fine-tune: {args.finetune_steps} steps at {target} bytes, batch {args.finetune_batch}; lower is better")
    print(f"\n{what}\n{table}\ntotal {total:.0f} s")
    if args.out is not None:
        out = Path(args.out)
        write_file(out, "context_extension.txt", f"{what}\n{table}\n")
        config = {k: getattr(args, k) for k in ("train_len", "eval_lens", "steps", "finetune_steps", "finetune_batch",
                                                "finetune_lr", "batch_size", "lr", "dim", "depth", "heads",
                                                "eval_tokens", "seed")}
        config["factor"] = factor
        write_json_file(out, "context_extension.json",
                        {"config": config, "base_loss": base_loss, "results": rows, "total_s": round(total, 1)})
        _plot(rows, lens, args.train_len, out / "context_extension.png")
        print(f"written to {out}/context_extension.{{txt,json,png}}")
    return 0


def _table(rows: list[dict], lens: list[int], finetune_steps: int) -> str:
    headers = ["method"] + [f"0-shot@{n}" for n in lens] + ([f"tuned@{n}" for n in lens] if finetune_steps else [])
    body = []
    for r in rows:
        line = [r["label"]] + [f"{r['zero_shot'][str(n)]:.3f}" for n in lens]
        if finetune_steps:
            line += [f"{r['finetuned'][str(n)]:.3f}" for n in lens]
        body.append(line)
    return format_table(headers, body, align="l" + "r" * (len(headers) - 1))


def _plot(rows: list[dict], lens: list[int], train_len: int, path: Path) -> None:
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None

    from ..plots import legend_outside, note, overlapping, series_style

    panels = [("zero_shot", "zero-shot")] + ([("finetuned", "after the fine-tune")] if rows[0]["finetuned"] else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels) + 2.0, 4.2), sharey=True, squeeze=False,
                             layout="constrained")
    notes = []
    for ax, (key, title) in zip(axes[0], panels):
        for i, r in enumerate(rows):
            ax.plot(lens, [r[key][str(n)] for n in lens], label=r["label"], **series_style(i))
        lines = {r["label"]: [r[key][str(n)] for n in lens] for r in rows}
        notes += [f"{title}: {text}" for text in overlapping(lines, lens, 0.0005)]
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(n) for n in lens])
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel(f"evaluation length (trained at {train_len})")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("bits per byte")
    legend_outside(fig, [axes[0][0]])
    note(fig, notes)  # e.g. every method at factor 1 is plain RoPE
    save_figure(fig, path.parent, path.name, dpi=120)
    plt.close(fig)


__all__ = ["BENCH_METHODS", "add_arguments", "run"]
