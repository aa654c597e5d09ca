"""``posenc bench hf``: a Hugging Face Llama with posenc encodings, against its own SDPA model.

::

    posenc bench hf --out runs/hf
    posenc bench hf --variants hf,identity,alibi --steps 300 --train-len 256 --device cuda

One ``transformers.LlamaForCausalLM`` per variant (same seed, same data order; 4 layers, 256 wide,
4 heads by default), trained on byte windows of CPython's pydoc text at ``--train-len``:

* ``hf``: the model as Hugging Face ships it, its own RoPE, ``attn_implementation="sdpa"`` (the
  reference for speed);
* ``identity``: the same RoPE expressed in posenc
  (:func:`posenc.integrations.transformers.swap_position_encoding`), attention by posenc's core;
* any registered sequence encoding (default ``alibi``, ``fire``, ``kerple``, ``t5``), swapped in.

Reported per variant: training tokens/s and its ratio to ``hf`` (the slowdown: targets 1.1x for
``identity``, 1.6x for the score biases), cached greedy generation tokens/s (``generate`` with
Hugging Face's ``DynamicCache``), and bits per byte on the held-out tail (last 10%) at 1x, 2x and
4x the training length (``--eval-factors``). The variants run one after another in one process;
re-run on a quiet machine for timings you quote.

Outputs (with ``--out``): ``hf.txt`` (the table), ``hf.json`` and ``hf.png`` (bits per byte per
length, and training tokens/s).

This module is the command: its arguments, their checks (variant names against the registry's
snapshot, :mod:`posenc.cli.catalog`), the size estimate, the table and the plot, all without
torch; :mod:`.hf_variants` builds, trains and measures each variant.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

from ..argtypes import device_name, int_list, positive_float, positive_int, seed_value
from ..catalog import entries
from ..errors import unknown_name, usage_error
from ..outputs import out_error, write_file, write_json_file
from ..sizes import Work, add_allow_large, decoding, defaults_of, scoring, sequence, size_error, transformer
from ...training.report import format_table, optional

PROG = "posenc bench hf"
REFERENCE = "hf"
IDENTITY = "identity"
DEFAULT_VARIANTS = (REFERENCE, IDENTITY, "alibi", "fire", "kerple", "t5")
DTYPE_NAMES = ("float32", "bfloat16")
BF16_NEEDS_CUDA = "--dtype bfloat16 runs on CUDA only (autocast); use float32 on the CPU"


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated variant names")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variants", type=_names, default=list(DEFAULT_VARIANTS),
                        help=f"comma-separated: '{REFERENCE}' (Hugging Face's own RoPE, sdpa), 'identity' (that RoPE "
                             f"through posenc) or registered sequence encodings (default {','.join(DEFAULT_VARIANTS)})")
    parser.add_argument("--steps", type=positive_int, default=300, help="training steps per model (default 300)")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="sequences per training step (default: %(default)s)")
    parser.add_argument("--train-len", type=positive_int, default=256, help="bytes per training window (default 256)")
    parser.add_argument("--eval-factors", type=int_list(minimum=1), default=[1, 2, 4],
                        help="evaluation lengths as multiples of --train-len (default 1,2,4)")
    parser.add_argument("--eval-tokens", type=positive_int, default=16384, help="tokens scored per evaluation length")
    parser.add_argument("--gen-batch", type=positive_int, default=4, help="prompts generated at once (default 4)")
    parser.add_argument("--gen-tokens", type=positive_int, default=128, help="new tokens per prompt (default 128)")
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate (default: %(default)s)")
    parser.add_argument("--dim", type=positive_int, default=256, help="model width (default: %(default)s)")
    parser.add_argument("--depth", type=positive_int, default=4, help="layers (default: %(default)s)")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads (default: %(default)s)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                        help="training dtype: float32, or bfloat16 autocast on CUDA")
    parser.add_argument("--seed", type=seed_value, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for hf.{txt,json,png}")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_allow_large(parser)


SIZE_FLAGS = ("steps", "batch_size", "train_len", "eval_factors", "eval_tokens", "gen_batch", "gen_tokens", "dim",
              "depth")
OUTPUTS = ("hf.txt", "hf.json", "hf.png")


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): per variant, the training steps, the scoring at every
    length, and the cached generation (two warm-up tokens, then ``--gen-tokens``)."""
    train = transformer(args.batch_size, args.train_len, args.dim, args.depth, vocab=256, steps=args.steps)
    scored = sequence([scoring(args.eval_tokens, f * args.train_len, args.dim, args.depth, batch=args.batch_size)
                    for f in args.eval_factors])
    generated = decoding(args.gen_batch, 32, args.gen_tokens + 2, args.dim, args.depth)
    return (train + scored + generated) * len(args.variants)


def variant_error(name: str) -> str | None:
    """Why ``name`` is not a variant (one line, the closest names for a misspelt one), or None. The
    swap's refusals that a name decides (linear attention only, between blocks) are read from the
    registry's snapshot, before anything is built."""
    if name in (REFERENCE, IDENTITY):
        return None
    found = next((e for e in entries() if e.name == name), None)
    if found is None:
        choices = [REFERENCE, IDENTITY, *(e.name for e in entries("seq"))]
        return unknown_name("variant", name, choices, listing="posenc list --modality seq")
    if found.modality != "seq":
        return (f"{name!r} is not '{REFERENCE}', '{IDENTITY}' or a registered sequence encoding (it is a "
                f"{found.modality} encoding)")
    if found.linear_only:
        return f"{name!r} is defined for linear attention only; Hugging Face models use softmax attention"
    if found.between_blocks:
        return f"{name!r} sits between blocks; the swap puts an encoding on the input or in every attention layer"
    return None


def _resolve(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, or None: all decided without torch (nothing is built
    before this passes; ``--device auto`` with bfloat16 is checked once torch says where it runs)."""
    for name in args.variants:
        error = variant_error(name)
        if error is not None:
            return f"--variants: {error}"
    if len(set(args.variants)) != len(args.variants):
        return f"--variants: a name is repeated in {','.join(args.variants)}"
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads}) into an even head width (RoPE pairs)"
    if len(set(args.eval_factors)) != len(args.eval_factors):
        return f"--eval-factors: a factor is repeated in {args.eval_factors}"
    if args.dtype == "bfloat16" and not args.device.startswith(("cuda", "auto")):
        return BF16_NEEDS_CUDA
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    if error is not None:
        return error
    return out_error(args.out, OUTPUTS)


def _table(rows: list[dict], lengths: list[int]) -> str:
    reference = next((r for r in rows if r["variant"] == REFERENCE), None)

    def ratio(r: dict, key: str) -> str:
        if reference is None or not r[key]:
            return "-"
        return f"{reference[key] / r[key]:.2f}x"

    headers = ["variant", "train tok/s", "vs hf", "generate tok/s", "vs hf", *[f"bpb@{n}" for n in lengths]]
    body = [[r["variant"], f"{r['train_tokens_per_s']:.0f}", ratio(r, "train_tokens_per_s"),
             f"{r['generate_tokens_per_s']:.0f}", ratio(r, "generate_tokens_per_s"),
             *[f"{r['bits_per_byte'][str(n)]:.3f}" for n in lengths]] for r in rows]
    return format_table(headers, body, align="l" + "r" * (4 + len(lengths)))


def _plot(rows: list[dict], lengths: list[int], args: argparse.Namespace) -> bytes | None:
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None
    from ..plots import bar_labels, legend_outside, note, overlapping, series_style

    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.2), layout="constrained")
    for i, r in enumerate(rows):
        left.plot(lengths, [r["bits_per_byte"][str(n)] for n in lengths], label=r["variant"], **series_style(i))
    left.set_xscale("log", base=2)
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.axvline(args.train_len, color="grey", linestyle=":", linewidth=1)
    left.set_xlabel(f"evaluation length (trained at {args.train_len})")
    left.set_ylabel("bits per byte")
    left.set_title("held-out pydoc text")
    legend_outside(fig, [left])
    lines = {r["variant"]: [r["bits_per_byte"][str(n)] for n in lengths] for r in rows}
    note(fig, overlapping(lines, lengths, 0.0005), "bits per byte on top of each other")
    left.grid(True, alpha=0.3)
    bars = right.bar([r["variant"] for r in rows], [r["train_tokens_per_s"] for r in rows], color="tab:blue")
    bar_labels(right, bars, [r["train_tokens_per_s"] for r in rows], "{:,.0f}")
    right.set_ylabel("training tokens / s")
    right.set_title(f"Llama {args.depth}x{args.dim}, {args.heads} heads")
    right.tick_params(axis="x", rotation=30)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    return buffer.getvalue()


def run(args: argparse.Namespace) -> int:
    """Train and measure every variant, print the table, write the outputs: 0, or 2 on bad input."""
    error = _resolve(args)
    if error is not None:
        return usage_error(PROG, error)
    optional("transformers", PROG)
    from ...seq.data import pydoc_corpus, split_text
    from .hf_variants import device_of, measure_variant

    device = device_of(args.device)
    if args.dtype == "bfloat16" and device.type != "cuda":  # --device auto found no GPU
        return usage_error(PROG, BF16_NEEDS_CUDA)
    train_text, valid_text = split_text(pydoc_corpus())
    lengths = [f * args.train_len for f in args.eval_factors]
    start = time.perf_counter()
    rows = [measure_variant(args, variant, train_text, valid_text, device, swap=variant != REFERENCE)
            for variant in args.variants]
    table = _table(rows, lengths)
    what = (f"Hugging Face Llama ({args.depth} layers, {args.dim} wide, {args.heads} heads) on pydoc bytes, "
            f"{args.steps} steps at {args.train_len}, {device.type}, {args.dtype}; 'vs hf' is the slowdown against "
            "Hugging Face's own sdpa model (lower is better)")
    print(f"\n{what}\n{table}")
    total = time.perf_counter() - start
    print(f"total {total:.0f} s")
    if args.out is not None:
        out = Path(args.out)
        write_file(out, "hf.txt", f"{what}\n{table}\n")
        config = {k: getattr(args, k) for k in ("variants", "steps", "batch_size", "train_len", "eval_factors",
                                                "eval_tokens", "gen_batch", "gen_tokens", "lr", "dim", "depth",
                                                "heads", "dtype", "seed")}
        write_json_file(out, "hf.json", {"config": {**config, "device": device.type}, "results": rows,
                                     "total_s": round(total, 1)})
        png = _plot(rows, lengths, args)
        if png is not None:
            write_file(out, "hf.png", png)
        print(f"written to {out}/hf.{{txt,json,png}}")
    return 0


__all__ = ["DEFAULT_VARIANTS", "add_arguments", "estimate", "run", "variant_error"]
