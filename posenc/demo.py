"""``posenc demo``: a short tour that trains reference models on built-in data under several
encodings and prints the comparison.

Each modality contributes a part (a function ``(args) -> list of result rows``) to ``PARTS``; the
demo runs the parts asked for, in order, and prints one table per part.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from .bench.report import format_table
from .common.registry import get
from .common.trainer import TrainConfig, Trainer

Row = dict[str, object]


def _seq_part(args: argparse.Namespace) -> list[Row]:
    """Byte-level causal LM on CPython's pydoc text: one hook point per encoding, and a look at
    twice the training length."""
    from .seq.data import ByteWindows, pydoc_corpus, split_text
    from .seq.models import CausalLM

    train_len = 64
    eval_lens = (train_len, 2 * train_len)
    train_text, valid_text = split_text(pydoc_corpus())
    train = ByteWindows(train_text, train_len)
    valid = {n: ByteWindows(valid_text, n) for n in eval_lens}
    rows = []
    for name in args.seq_encodings.split(","):
        encoding = None if name == "none" else name
        torch.manual_seed(args.seed)
        model = CausalLM(256, dim=64, depth=2, num_heads=4, encoding=encoding, max_len=max(eval_lens))

        def loss_fn(m, batch):
            x, y = batch
            loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
            return loss, {}

        def evaluate(m) -> dict[str, float]:
            out = {}
            device = next(m.parameters()).device
            with torch.no_grad():
                for n, ds in valid.items():
                    count = min(len(ds), args.eval_windows)
                    x = torch.stack([ds[i][0] for i in range(count)]).to(device)
                    y = torch.stack([ds[i][1] for i in range(count)]).to(device)
                    out[f"bpb@{n}"] = F.cross_entropy(m(x).flatten(0, 1), y.flatten()).item() / math.log(2)
            return out

        config = TrainConfig(
            steps=args.steps, batch_size=32, lr=3e-3, warmup_steps=max(1, args.steps // 10), seed=args.seed,
            progress=not args.no_progress, log_every=max(1, args.steps // 5), device=args.device,
            out_dir=None if args.out is None else str(Path(args.out) / "seq" / name),
        )
        start = time.perf_counter()
        metrics = Trainer(model, train, loss_fn, config, eval_fn=evaluate).fit()
        rows.append(
            {
                "encoding": name,
                "hook": _hook_of(model),
                "train_s": round(time.perf_counter() - start, 1),
                **{k: round(v, 3) for k, v in metrics.items() if k.startswith("bpb@")},
            }
        )
    return rows


def _hook_of(model) -> str:
    enc = model.encoder.encoding
    return "-" if enc is None else ",".join(sorted(h.value for h in enc.hooks))


PARTS: dict[str, tuple[str, Callable[[argparse.Namespace], list[Row]]]] = {
    "seq": ("Sequence: byte-level causal LM on pydoc text (bits per byte, lower is better)", _seq_part),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts to run, from {', '.join(PARTS)}")
    parser.add_argument("--steps", type=int, default=500, help="training steps per model (default 500)")
    parser.add_argument("--seq-encodings", default="none,sinusoidal,rope,alibi,erpe",
                        help="encodings for the sequence part")
    parser.add_argument("--eval-windows", type=int, default=256, help="validation windows per length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--out", default=None, help="directory for metrics, checkpoints and results.json")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _table(rows: list[Row]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return format_table(cols, [[r.get(c, "") for c in cols] for r in rows])


def _argument_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (checked before any training), or None."""
    unknown = [p for p in args.parts.split(",") if p and p not in PARTS]
    if unknown:
        return f"--parts: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}"
    if args.steps <= 0:
        return f"--steps must be positive, got {args.steps}"
    if args.eval_windows <= 0:
        return f"--eval-windows must be positive, got {args.eval_windows}"
    for name in args.seq_encodings.split(","):
        if name != "none":
            try:
                get(name)
            except KeyError as exc:
                return f"--seq-encodings: {exc.args[0]}"
    return None


def run(args: argparse.Namespace) -> int:
    error = _argument_error(args)
    if error is not None:
        print(f"posenc demo: {error}", file=sys.stderr)
        return 2
    parts = [p for p in args.parts.split(",") if p]
    results = {}
    for part in parts:
        title, fn = PARTS[part]
        print(f"\n== {title}", flush=True)
        rows = fn(args)
        results[part] = rows
        print(_table(rows), flush=True)
    if args.out is not None:
        path = Path(args.out) / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))
        print(f"\nresults written to {path}")
    return 0
