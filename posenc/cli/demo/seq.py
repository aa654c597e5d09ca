"""The sequence part of ``posenc demo``: a byte-level causal LM on CPython's pydoc text, one
encoding per hook point, evaluated at the training length and at twice it."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

TITLE = "Sequence: byte-level causal LM on pydoc text (bits per byte, lower is better)"

Row = dict[str, object]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-encodings", default="none,sinusoidal,rope,alibi,erpe",
                        help="encodings for the sequence part")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with this part's arguments, or None."""
    from ..catalog import names
    from ..errors import unknown_name

    for name in args.seq_encodings.split(","):
        if name != "none" and name not in names():  # the catalog: answered before torch loads
            return f"--seq-encodings: {unknown_name('encoding', name, names(), listing='posenc list')}"
    return None


def run(args: argparse.Namespace) -> list[Row]:
    """Byte-level causal LM on CPython's pydoc text: one hook point per encoding, and a look at
    twice the training length."""
    import torch
    import torch.nn.functional as F

    from ...seq.data import ByteWindows, pydoc_corpus, split_text
    from ...seq.models import CausalLM
    from . import model_done
    from ...training.trainer import TrainConfig, Trainer

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
                    out[f"bits_per_byte@{n}"] = F.cross_entropy(m(x).flatten(0, 1), y.flatten()).item() / math.log(2)
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
                **{k: round(v, 3) for k, v in metrics.items() if k.startswith("bits_per_byte@")},
            }
        )
        model_done("seq", rows[-1])
    return rows


def _hook_of(model) -> str:
    enc = model.encoder.encoding
    return "-" if enc is None else ",".join(sorted(h.value for h in enc.hooks))


def figure(rows: list[Row], args: argparse.Namespace):
    """Bits per byte per encoding at the training length and at twice it (grouped bars from 0, the
    uniform guess of 8 bits marked); None without matplotlib."""
    from ..plots import bar_chart
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None
    keys = [k for k in rows[0] if k.startswith("bits_per_byte@")] if rows else []
    fig = bar_chart(plt, rows, keys, [f"{k.split('@')[1]} bytes" for k in keys], accuracy=False,
                    ylabel="bits per byte (lower is better)", chance=8.0, chance_text="uniform guess: 8 bits",
                    title="byte-level LM on pydoc text, trained at 64 bytes, scored at 64 and 128")
    plt.close(fig)  # out of pyplot's list; the caller saves it
    return fig
