"""``posenc train seq``: train a causal LM with one position encoding on text or a synthetic task.

::

    posenc train seq --encoding alibi                           # bytes of CPython's pydoc text
    posenc train seq --encoding rope --data my.txt --seq-len 256
    posenc train seq --encoding t5 --task reverse --length 16   # evaluated at 16, 32, 64
    posenc train seq --encoding peg1d --peg-blocks 0,1          # causal 1D PEG after blocks 0 and 1
    torchrun --standalone --nproc_per_node 2 -m posenc.cli train seq --encoding fire --out runs/fire

Text: next-byte prediction on windows of ``--seq-len`` bytes; the final evaluation reports bits
per byte on the held-out tail (last 10%) at each ``--eval-lens`` (default 1x, 2x, 4x the training
length), on ``--eval-tokens`` tokens per length. Task: sizes uniform in ``[1, --length]``; the final
evaluation reports exact match on examples of size exactly each ``--eval-lens`` (default L, 2L, 4L).
Training goes through :class:`posenc.training.trainer.Trainer`: progress bar, ``metrics.jsonl`` and
atomic checkpoints in ``--out``, ``--resume``, DDP under ``torchrun``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from . import FEATURE_MAP_HELP, RESUME_WITHOUT_OUT, add_run_arguments, attention_kind_error, run_checked
from ..argtypes import int_list, key_value
from ..bench.report import format_table
from ..common.registry import get

PROG = "posenc train seq"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encoding", required=True, help="a registered encoding (posenc list --modality seq) or 'none'")
    parser.add_argument("--encoding-option", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                        help="constructor argument of the encoding (JSON value), e.g. symmetric=true; repeatable")
    parser.add_argument("--feature-map", choices=("elu", "favor"), default=None, help=FEATURE_MAP_HELP)
    parser.add_argument("--share-encoding", choices=("auto", "yes", "no"), default="auto",
                        help="one encoding instance for all layers or one per layer (auto: see posenc.seq.models)")
    parser.add_argument("--peg-blocks", type=int_list(minimum=0), default=None,
                        help="peg1d: blocks (0-based) after which the causal 1D PEG is applied (default 0)")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--task", default=None, help="a synthetic task: copy, reverse, sort, addition, recall")
    data.add_argument("--data", default=None, help="a UTF-8 text file (default: CPython's pydoc text)")
    parser.add_argument("--seq-len", type=int, default=128, help="text: training window in bytes (default 128)")
    parser.add_argument("--length", type=int, default=16, help="task: largest training size (default 16)")
    parser.add_argument("--num-symbols", type=int, default=64, help="task: symbol alphabet (default 64)")
    parser.add_argument("--eval-lens", type=int_list(minimum=1), default=None,
                        help="comma-separated evaluation lengths (default 1x, 2x, 4x the training length)")
    parser.add_argument("--eval-tokens", type=int, default=16384, help="text: tokens scored per evaluation length")
    parser.add_argument("--eval-examples", type=int, default=256, help="task: examples per evaluation length")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: a tenth of --steps")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--max-len", type=int, default=None,
                        help="length the encoding is built for (learned tables); default the longest evaluation")
    add_run_arguments(parser)
    parser.add_argument("--sample-tokens", type=int, default=0, help="text: bytes to generate after training (greedy)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (before anything is built), or None."""
    from ..seq.tasks import TASKS

    if args.encoding != "none":
        try:
            get(args.encoding)
        except KeyError as exc:
            return f"--encoding: {exc.args[0]}"
    error = attention_kind_error(args.encoding, getattr(args, "feature_map", None))
    if error is not None:
        return error
    if args.task is not None and args.task not in TASKS:
        return f"--task: unknown task {args.task!r}; choose from {', '.join(TASKS)}"
    if args.data is not None and not Path(args.data).is_file():
        return f"--data: text file {args.data!r} does not exist"
    for name in ("steps", "batch_size", "seq_len", "length", "num_symbols", "eval_tokens", "eval_examples",
                 "dim", "depth", "heads", "sample_tokens", "checkpoint_every", "eval_every"):
        value = getattr(args, name)
        low = 0 if name in ("sample_tokens", "checkpoint_every", "eval_every") else 1
        if value < low:
            return f"--{name.replace('_', '-')} must be {'>= 0' if low == 0 else 'positive'}, got {value}"
    if args.dim % args.heads:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads})"
    if args.lr <= 0:
        return f"--lr must be positive, got {args.lr}"
    if not 0 <= args.dropout < 1:
        return f"--dropout must be in [0, 1), got {args.dropout}"
    if args.warmup_steps is not None and args.warmup_steps < 0:
        return f"--warmup-steps must be >= 0, got {args.warmup_steps}"
    if args.max_len is not None and args.max_len < 1:
        return f"--max-len must be positive, got {args.max_len}"
    if args.resume and args.out is None:
        return RESUME_WITHOUT_OUT
    if args.encoding == "none" and args.encoding_option:
        return "--encoding-option needs an encoding (got --encoding none)"
    if args.peg_blocks is not None:
        if args.encoding != "peg1d":
            return f"--peg-blocks is for --encoding peg1d (got --encoding {args.encoding})"
        if any(b >= args.depth for b in args.peg_blocks):
            return (f"--peg-blocks {','.join(map(str, args.peg_blocks))}: block indices must be below "
                    f"--depth {args.depth}")
    if args.task is not None and args.sample_tokens:
        return "--sample-tokens is for text; a task run reports exact match instead"
    return None


def run(args: argparse.Namespace) -> int:
    return run_checked(PROG, args, check, _train)


def _train(args: argparse.Namespace) -> int:
    from ..training.trainer import TrainConfig, Trainer
    from ..seq.data import ByteWindows, eval_windows, load_corpus, split_text
    from ..seq.evaluation import bits_per_byte, task_eval_set, task_exact_match
    from ..seq.models import CausalLM
    from ..seq.tasks import TaskDataset, make_task, masked_loss

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
        metric = "exact"

        def loss_fn(model, batch):
            tokens, targets, mask = batch
            return masked_loss(model(tokens), targets, mask), {}

        def evaluate(model) -> dict[str, float]:
            return {f"exact@{n}": task_exact_match(model, s) for n, s in eval_sets.items()}
    else:
        text = load_corpus(args.data)
        train_text, valid_text = split_text(text)
        eval_lens = args.eval_lens or [args.seq_len, 2 * args.seq_len, 4 * args.seq_len]
        vocab = ByteWindows.vocab_size
        needed = max([args.seq_len, *eval_lens])
        train = ByteWindows(train_text, args.seq_len)
        eval_sets = {n: eval_windows(valid_text, n, args.eval_tokens) for n in eval_lens}
        metric = "bpb"

        def loss_fn(model, batch):
            x, y = batch
            return F.cross_entropy(model(x).flatten(0, 1), y.flatten()), {}

        def evaluate(model) -> dict[str, float]:
            return {f"bpb@{n}": bits_per_byte(model, *s) for n, s in eval_sets.items()}

    max_len = args.max_len or needed
    model_config = {
        "vocab_size": vocab, "dim": args.dim, "depth": args.depth, "num_heads": args.heads,
        "encoding": None if args.encoding == "none" else args.encoding, "max_len": max_len,
        "dropout": args.dropout, "share_encoding": share, "encoding_options": options,
        "feature_map": getattr(args, "feature_map", None),
    }
    if args.encoding == "peg1d":
        model_config["peg_blocks"] = list(args.peg_blocks or [0])
    torch.manual_seed(args.seed)
    model = CausalLM(**model_config)
    config = TrainConfig(
        steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        warmup_steps=args.steps // 10 if args.warmup_steps is None else args.warmup_steps,
        seed=args.seed, device=args.device, out_dir=args.out, resume=args.resume,
        progress=not args.no_progress, log_every=max(1, min(50, args.steps // 10)),
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
    )
    trainer = Trainer(model, train, loss_fn, config, eval_fn=evaluate, model_config=model_config)
    metrics = trainer.fit()
    if not trainer.is_main:
        return 0
    source = f"task {args.task}" if args.task is not None else (args.data or "pydoc text")
    params = sum(p.numel() for p in model.parameters())
    print(f"\n{args.encoding} on {source}: {params / 1e6:.2f}M parameters, {trainer.step} steps, "
          f"final train loss {metrics['train_loss']:.4f}")
    what = "exact match (fraction of answers fully right)" if metric == "exact" else "bits per byte (lower is better)"
    print(f"final evaluation, {what}:")
    print(format_table(["length", metric], [[n, f"{metrics[f'{metric}@{n}']:.4f}"] for n in eval_lens], align="rr"))
    result = {"encoding": args.encoding, "source": source, "metric": metric, "steps": trainer.step,
              "train_loss": metrics["train_loss"], "eval": {str(n): metrics[f"{metric}@{n}"] for n in eval_lens},
              "model_config": model_config,
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
    if args.out is not None:
        path = Path(args.out) / "results.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"results written to {path}")
    return 0
