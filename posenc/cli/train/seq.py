"""``posenc train seq``: train a causal LM with one position encoding on text or a synthetic task.

::

    posenc train seq --encoding alibi                           # bytes of CPython's pydoc text
    posenc train seq --encoding rope --data my.txt --seq-len 256
    posenc train seq --encoding t5 --task reverse --length 16   # evaluated at 16, 32, 64
    posenc train seq --encoding peg1d --peg-blocks 0,1          # causal 1D PEG after blocks 0 and 1
    posenc train seq --encoding rope --layer-schedule irope     # every 4th layer NoPE with Llama 4's temperature
    posenc train seq --encoding rope --layer-schedule local_global --schedule-option 'global={"base": 1e6}'
    torchrun --standalone --nproc_per_node 2 --no-python posenc train seq --encoding fire --out runs/fire

Text: next-byte prediction on windows of ``--seq-len`` bytes; the final evaluation reports bits
per byte on the held-out tail (last 10%) at each ``--eval-lens`` (default 1x, 2x, 4x the training
length), on ``--eval-tokens`` tokens per length. Task: sizes uniform in ``[1, --length]``; the final
evaluation reports exact match on examples of size exactly each ``--eval-lens`` (default L, 2L, 4L).
Training goes through :class:`posenc.training.trainer.Trainer`: progress bar, ``metrics.jsonl`` and
atomic checkpoints in ``--out``, ``--resume``, DDP under ``torchrun``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..argtypes import int_list, key_value, nonnegative_int, positive_int
from ..options import (
    FEATURE_MAP_HELP,
    FEATURE_MAPS,
    add_encoding_arguments,
    add_model_arguments,
    add_optim_arguments,
    add_run_arguments,
    encoding_error,
    encoding_option_error,
    out_dir_error,
    train_config,
)
from ..sizes import Work, decoding, defaults_of, scoring, sequence, size_error, transformer
from ...training.report import format_table
from . import run_checked, run_dir_error, write_results

# the synthetic tasks of posenc.seq.tasks (kept here so --help needs no import of the modality)
TASK_NAMES = ("copy", "reverse", "sort", "addition", "recall")
# the keys of each layer schedule (posenc.seq.layer_schedule), named here without torch
LAYER_SCHEDULES = {"irope": ("interval", "nope_layers", "temperature", "floor_scale", "attn_scale"),
                   "local_global": ("pattern", "global_layers", "local", "global", "global_encoding")}

PROG = "posenc train seq"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_encoding_arguments(parser, what="a registered seq encoding (posenc list --modality seq)", example="symmetric=true")
    parser.add_argument("--feature-map", choices=FEATURE_MAPS, default=None, help=FEATURE_MAP_HELP)
    parser.add_argument("--share-encoding", choices=("auto", "yes", "no"), default="auto",
                        help="one encoding instance for all layers or one per layer (auto: see posenc.seq.models)")
    parser.add_argument("--peg-blocks", type=int_list(minimum=0), default=None,
                        help="peg1d: blocks (0-based) after which the causal 1D PEG is applied (default 0)")
    parser.add_argument("--layer-schedule", choices=tuple(LAYER_SCHEDULES), default=None,
                        help="different encodings per layer: irope (every 4th layer NoPE with Llama 4's temperature; "
                             "--encoding for the others) or local_global (Gemma's local and global RoPE bases)")
    parser.add_argument("--schedule-option", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                        help="a key of the layer schedule (JSON value), e.g. interval=2, temperature=false, "
                             "'global={\"base\": 1e6}'; repeatable (posenc.seq.layer_schedule)")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--task", default=None, choices=TASK_NAMES, help="a synthetic task instead of text")
    data.add_argument("--data", default=None, help="a UTF-8 text file (default: CPython's pydoc text)")
    parser.add_argument("--seq-len", type=positive_int, default=128, help="text: training window in bytes")
    parser.add_argument("--length", type=positive_int, default=16, help="task: largest training size")
    parser.add_argument("--num-symbols", type=positive_int, default=64, help="task: symbol alphabet")
    parser.add_argument("--eval-lens", type=int_list(minimum=1), default=None,
                        help="comma-separated evaluation lengths (default 1x, 2x, 4x the training length)")
    parser.add_argument("--eval-tokens", type=positive_int, default=16384, help="text: tokens scored per evaluation length")
    parser.add_argument("--eval-examples", type=positive_int, default=256, help="task: examples per evaluation length")
    add_optim_arguments(parser, steps=1000, batch_size=32, lr=1e-3, weight_decay=0.01)
    add_model_arguments(parser, dim=128, depth=4, heads=4)
    parser.add_argument("--max-len", type=positive_int, default=None,
                        help="length the encoding is built for (learned tables); default the longest evaluation")
    add_run_arguments(parser)
    parser.add_argument("--sample-tokens", type=nonnegative_int, default=0, help="text: bytes to generate after training (greedy)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (before anything is built), or None."""
    error = encoding_error(args.encoding, ("seq",), model="the causal LM", bidirectional=False,
                           feature_map=getattr(args, "feature_map", None))
    if error is None:
        error = encoding_option_error(args.encoding, args.encoding_option)
    if error is not None:
        return error
    if args.data is not None and not Path(args.data).is_file():
        return f"--data: text file {args.data!r} does not exist"
    if args.dim % args.heads:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads})"
    if args.peg_blocks is not None:
        if args.encoding != "peg1d":
            return f"--peg-blocks is for --encoding peg1d (got --encoding {args.encoding})"
        if any(b >= args.depth for b in args.peg_blocks):
            return (f"--peg-blocks {','.join(map(str, args.peg_blocks))}: block indices must be below "
                    f"--depth {args.depth}")
    error = _schedule_error(args)
    if error is not None:
        return error
    if args.task is not None and args.sample_tokens:
        return "--sample-tokens is for text; a task run reports exact match instead"
    error = _other_data_error(args)
    if error is not None:
        return error
    if args.task is not None:
        from ...seq.tasks import make_task

        try:
            task = make_task(args.task, num_symbols=args.num_symbols)
            for n in [args.length, *(args.eval_lens or [4 * args.length])]:
                task.max_total_length(n)
        except ValueError as exc:
            return f"--task {args.task}: {exc}"
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments), describe=describe)
    if error is None and args.task is None:
        error = _text_error(args)
    if error is not None:
        return error
    return out_dir_error(args.out, args.resume) or run_dir_error(args.out)


def _schedule_error(args: argparse.Namespace) -> str | None:
    """What is wrong with --layer-schedule and --schedule-option that needs no torch, or None."""
    if args.layer_schedule is None:
        return "--schedule-option needs --layer-schedule" if args.schedule_option else None
    if args.encoding in ("none", "peg1d"):
        return (f"--layer-schedule needs --encoding of the attention (what its RoPE or local layers use); got "
                f"{args.encoding}")
    keys = LAYER_SCHEDULES[args.layer_schedule]
    unknown = sorted({key for key, _ in args.schedule_option} - set(keys))
    if unknown:
        return f"--schedule-option {', '.join(unknown)}: {args.layer_schedule} takes {', '.join(keys)}"
    return None


# flags read for one kind of data only: given with the other kind they were ignored without a word
# (--length 100000 without --task trained the default text run), so they are refused
TASK_ONLY = {"length": "the largest training size", "num_symbols": "the symbol alphabet",
             "eval_examples": "examples per evaluation length"}
TEXT_ONLY = {"seq_len": "the training window in bytes", "eval_tokens": "tokens scored per evaluation length"}


def _other_data_error(args: argparse.Namespace) -> str | None:
    """A task flag set without --task, or a text flag set with it, in one line; or None."""
    defaults = defaults_of(add_arguments)
    for dest, what in (TEXT_ONLY if args.task is not None else TASK_ONLY).items():
        value = getattr(args, dest)
        if value == defaults(dest):
            continue
        flag = "--" + dest.replace("_", "-")
        if args.task is not None:
            return (f"{flag} {value}: a text setting ({what}), but --task {args.task} trains on a synthetic task, "
                    f"which does not read it (drop {flag}; a task's size is --length)")
        return (f"{flag} {value}: a task setting ({what}), but no --task is given and a text run does not read it "
                f"(add --task NAME, or drop {flag}; text takes --seq-len)")
    return None


def _text_error(args: argparse.Namespace) -> str | None:
    """Why the text cannot give the windows asked for (read before anything is built), or None."""
    from ...seq.data import load_corpus, split_text

    try:
        train_text, valid_text = split_text(load_corpus(args.data))
    except (OSError, ValueError, RuntimeError) as exc:  # unreadable, empty, or no pydoc_data
        return f"--data: {exc}"
    train_size, size = len(train_text.encode("utf-8")), len(valid_text.encode("utf-8"))
    if train_size < args.seq_len + 1:
        return (f"--seq-len {args.seq_len}: the training text (the first 90%) has {train_size} bytes, fewer than one "
                "window needs")
    for n in args.eval_lens or [args.seq_len, 2 * args.seq_len, 4 * args.seq_len]:
        windows = (size - n - 1) // n + 1 if size >= n + 1 else 0
        needed = -(-args.eval_tokens // n)
        if windows < needed:
            return (f"--eval-lens {n}: the held-out text (the last 10%) has {size} bytes, {windows} windows of {n}; "
                    f"--eval-tokens {args.eval_tokens} needs {needed} (lower --eval-lens or --eval-tokens, or give a "
                    "longer --data)")
    return None


# the size flags of the policy (posenc.cli.sizes), by how much of the run each one drives
SIZE_FLAGS = ("steps", "batch_size", "seq_len", "length", "eval_lens", "eval_tokens", "eval_examples", "dim", "depth",
              "num_symbols", "max_len", "sample_tokens")


def _task_tokens(n: int) -> int:
    """A generous length of a task example of size ``n`` (question, separator and answer; addition
    has two operands and a carry)."""
    return 3 * n + 4


def _lengths(args: argparse.Namespace) -> tuple[int, list[int]]:
    """The training length and the evaluation lengths, in tokens."""
    base = args.length if args.task is not None else args.seq_len
    lens = args.eval_lens or [base, 2 * base, 4 * base]
    if args.task is not None:
        return _task_tokens(base), [_task_tokens(n) for n in lens]
    return base, list(lens)


def _vocab(args: argparse.Namespace) -> int:
    return args.num_symbols + 8 if args.task is not None else 256  # a task's symbols and its markers


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): ``--steps`` training steps, each evaluation (at the end,
    and every ``--eval-every`` steps) at every length, and the greedy sample."""
    vocab = _vocab(args)
    train_len, lens = _lengths(args)
    if args.task is not None:
        one_eval = sequence([transformer(args.eval_examples, n, args.dim, args.depth, vocab=vocab, train=False)
                          for n in lens])
    else:
        one_eval = sequence([scoring(args.eval_tokens, n, args.dim, args.depth, vocab=vocab) for n in lens])
    evaluations = 1 + (args.steps // args.eval_every if args.eval_every else 0)
    table = Work(bytes=4 * 4 * (args.max_len or 0) * args.dim)  # a learned table and its optimizer state
    train = transformer(args.batch_size, train_len, args.dim, args.depth, vocab=vocab, steps=args.steps)
    sample = decoding(1, 64, args.sample_tokens, args.dim, args.depth, vocab=vocab) if args.sample_tokens else Work()
    return train + one_eval * evaluations + sample + table


def describe(args: argparse.Namespace) -> str:
    train_len, lens = _lengths(args)
    return (f"{args.steps} steps at batch {args.batch_size} x {train_len} tokens, width {args.dim}, depth {args.depth}, "
            f"{_vocab(args)} embedding rows, evaluated at {max(lens)} tokens")


def run(args: argparse.Namespace) -> int:
    return run_checked(PROG, args, check, _train)


def _train(args: argparse.Namespace) -> int:
    import torch

    from ...seq.byte_lm import next_byte_loss
    from ...seq.data import ByteWindows, eval_windows, load_corpus, split_text
    from ...seq.evaluation import bits_per_byte, task_eval_set, task_exact_match
    from ...seq.models import CausalLM
    from ...seq.tasks import TaskDataset, make_task, task_loss
    from ...training.trainer import Trainer

    options = dict(args.encoding_option)
    share = {"auto": None, "yes": True, "no": False}[args.share_encoding]
    if args.task is not None:
        task = make_task(args.task, num_symbols=args.num_symbols)
        eval_lens = args.eval_lens or [args.length, 2 * args.length, 4 * args.length]
        for n in eval_lens:
            task.check_length(n)
        vocab = task.vocab_size
        needed = max(task.max_total_length(n) for n in [args.length, *eval_lens])
        num_examples = max(args.batch_size, min(args.steps * args.batch_size, 200_000))
        train = TaskDataset(task, num_examples, args.length, seed=args.seed)
        eval_sets = {n: task_eval_set(task, n, args.eval_examples, seed=10_000 + args.seed + n) for n in eval_lens}
        metric = "exact_match"
        loss_fn = task_loss

        def evaluate(model) -> dict[str, float]:
            return {f"exact_match@{n}": task_exact_match(model, s) for n, s in eval_sets.items()}
    else:
        text = load_corpus(args.data)
        train_text, valid_text = split_text(text)
        eval_lens = args.eval_lens or [args.seq_len, 2 * args.seq_len, 4 * args.seq_len]
        vocab = ByteWindows.vocab_size
        needed = max([args.seq_len, *eval_lens])
        train = ByteWindows(train_text, args.seq_len)
        eval_sets = {n: eval_windows(valid_text, n, args.eval_tokens) for n in eval_lens}
        metric = "bits_per_byte"
        loss_fn = next_byte_loss

        def evaluate(model) -> dict[str, float]:
            return {f"bits_per_byte@{n}": bits_per_byte(model, *s) for n, s in eval_sets.items()}

    max_len = args.max_len or needed
    model_config = {
        "vocab_size": vocab, "dim": args.dim, "depth": args.depth, "num_heads": args.heads,
        "encoding": None if args.encoding == "none" else args.encoding, "max_len": max_len,
        "dropout": args.dropout, "share_encoding": share, "encoding_options": options,
        "feature_map": getattr(args, "feature_map", None),
    }
    if args.encoding == "peg1d":
        model_config["peg_blocks"] = list(args.peg_blocks or [0])
    if args.layer_schedule is not None:  # its values are checked when the model is built (one line)
        model_config["layer_schedule"] = {"schedule": args.layer_schedule, **dict(args.schedule_option)}
    torch.manual_seed(args.seed)
    model = CausalLM(**model_config)
    config = train_config(args)
    trainer = Trainer(model, train, loss_fn, config, eval_fn=evaluate, model_config=model_config)
    metrics = trainer.fit()
    if not trainer.is_main:
        return 0
    source = f"task {args.task}" if args.task is not None else (args.data or "pydoc text")
    params = sum(p.numel() for p in model.parameters())
    print(f"\n{args.encoding} on {source}: {params / 1e6:.2f}M parameters, {trainer.step} steps, "
          f"final train loss {metrics['train_loss']:.4f}")
    what = "exact match (fraction of answers fully right)" if metric == "exact_match" else "bits per byte (lower is better)"
    print(f"final evaluation, {what}:")
    print(format_table(["length", metric], [[n, f"{metrics[f'{metric}@{n}']:.4f}"] for n in eval_lens], align="rr"))
    result = {"command": "train seq", "encoding": args.encoding, "model_config": model_config,
              "train_config": config.to_dict(), "steps": trainer.step, "train_loss": metrics["train_loss"],
              "metrics": {f"{metric}@{n}": metrics[f"{metric}@{n}"] for n in eval_lens},
              "source": source, "metric": metric, "eval": {str(n): metrics[f"{metric}@{n}"] for n in eval_lens},
              # what posenc extend needs to score the run again: the text and the training length
              "train_data": ({"kind": "task", "task": args.task, "length": args.length} if args.task is not None else
                             {"kind": "text", "path": None if args.data is None else str(Path(args.data).resolve()),
                              "seq_len": args.seq_len})}
    if args.sample_tokens:
        prompt = torch.tensor([list(valid_text.encode("utf-8")[:64])], device=trainer.device)
        model.eval()
        sample = model.generate(prompt, args.sample_tokens, greedy=True)
        result["sample"] = bytes(sample[0].tolist()).decode("utf-8", errors="replace")
        print("greedy sample:\n" + result["sample"])
    write_results(args.out, result)
    return 0
