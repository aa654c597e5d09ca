"""``posenc extend RUN_DIR``: extend the context of a trained RoPE language model.

::

    posenc train seq --encoding rope --seq-len 128 --out runs/rope
    posenc extend runs/rope --method yarn --factor 4                        # zero-shot, bits per byte
    posenc extend runs/rope --method linear --factor 4 --finetune-steps 50  # PI, then a short fine-tune

Loads the run's checkpoint (``weights_only=True``) and model config, switches every rotary layer
to ``--method`` with :func:`posenc.seq.extend_context` (the training length ``--seq-len`` of the
run is the original length ``L0``), optionally fine-tunes at ``--finetune-len`` (default
``factor * L0``) for ``--finetune-steps`` steps, and reports bits per byte on the run's held-out
text at each ``--eval-lens`` (default ``L0, 2 L0, 4 L0`` and ``factor * L0``), before the switch,
after it, and after the fine-tune. Writes ``results.json`` (and, when fine-tuned, the trainer's
``checkpoint.pt`` and ``metrics.jsonl``) into ``--out``, by default ``RUN_DIR/extend-METHOD-xFACTOR``,
which must not hold a previous result. Text runs only (a task run reports exact match, not a
likelihood to extend).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..argtypes import device_name, int_list, key_value, nonnegative_int, positive_float, positive_int, seed_value
from ..errors import usage_error
from ..sizes import add_allow_large

PROG = "posenc extend"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..options import CONTEXT_METHOD_ALIASES, CONTEXT_METHODS

    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by posenc train seq --out (a text run)")
    parser.add_argument("--method", required=True, choices=(*CONTEXT_METHODS, *CONTEXT_METHOD_ALIASES),
                        help="context extension (pi = linear; none = plain RoPE, i.e. raw extrapolation)")
    parser.add_argument("--factor", type=positive_float, default=None, help="context scale s >= 1 (default 4; none: 1)")
    parser.add_argument("--option", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                        help="a parameter of the method (JSON value), e.g. beta_fast=16; repeatable")
    parser.add_argument("--finetune-steps", type=nonnegative_int, default=0, help="steps of fine-tuning after the switch (default 0)")
    parser.add_argument("--finetune-len", type=positive_int, default=None, help="fine-tuning window in bytes (default factor * L0)")
    parser.add_argument("--lr", type=positive_float, default=2e-4, help="fine-tuning learning rate (default 2e-4)")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="fine-tuning batch (default 8)")
    parser.add_argument("--eval-lens", type=int_list(minimum=1), default=None,
                        help="evaluation lengths (default L0, 2 L0, 4 L0 and factor * L0)")
    parser.add_argument("--eval-tokens", type=positive_int, default=16384, help="tokens scored per evaluation length")
    parser.add_argument("--out", default=None, help="output directory (default RUN_DIR/extend-METHOD-xFACTOR)")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the data, the initialisation and dropout")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_allow_large(parser)  # the size policy's override (posenc.cli.sizes)


SIZE_FLAGS = ("finetune_steps", "finetune_len", "batch_size", "eval_lens", "eval_tokens", "factor")


def estimate(args: argparse.Namespace):
    """The run's work (posenc.cli.sizes): the scoring at every length before and after the switch,
    and the fine-tune with its scoring. The run's width, depth and training length come from its
    checkpoint (``model_dim``, ``model_depth``, ``train_len``; :func:`run` adds them)."""
    from ..sizes import Work, scoring, sequence, transformer

    dim, depth, l0 = getattr(args, "model_dim", 128), getattr(args, "model_depth", 4), getattr(args, "train_len", 128)
    target = int(round((args.factor or 4.0) * l0))
    eval_lens = args.eval_lens or sorted({l0, 2 * l0, 4 * l0, target})
    scored = sequence([scoring(args.eval_tokens, n, dim, depth) for n in eval_lens])
    tune = Work()
    if args.finetune_steps:
        tune = transformer(args.batch_size, args.finetune_len or target, dim, depth, vocab=256,
                           steps=args.finetune_steps) + scored
    return scored * 2 + tune


def _fail(message: str) -> int:
    return usage_error(PROG, message)


def _out_error(out: Path) -> str | None:
    """Why ``--out`` cannot take the results, or None; creates it (so that a directory that cannot
    be made is found before any evaluation). A link anywhere in the run directory's files is
    refused: a write through it would land outside."""
    if out.is_symlink():
        return f"--out {str(out)!r} is a symbolic link; give the directory itself"
    if os.path.lexists(out) and not out.is_dir():
        return f"--out {str(out)!r} exists and is not a directory"
    for name in ("results.json", "checkpoint.pt", "metrics.jsonl"):
        if os.path.lexists(out / name):
            what = "a symbolic link" if (out / name).is_symlink() else "a file"
            return f"--out {str(out)!r} already holds {name} ({what}); choose another --out"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--out {str(out)!r} cannot be created: {exc.strerror or type(exc).__name__}"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"--out {str(out)!r} is not writable"
    return None


def _text_error(train_text: str, valid_text: str, eval_lens: list[int], eval_tokens: int,
                finetune_len: int | None) -> str | None:
    """Why the run's text cannot give the windows asked for, or None (checked before evaluating)."""
    size = len(valid_text.encode("utf-8"))
    for n in eval_lens:
        windows = (size - n - 1) // n + 1 if size >= n + 1 else 0
        needed = -(-eval_tokens // n)
        if windows < needed:
            return (f"--eval-lens {n}: the held-out text has {size} bytes, {windows} windows of {n}; --eval-tokens "
                    f"{eval_tokens} needs {needed} (lower --eval-lens or --eval-tokens, or train on a longer text)")
    if finetune_len is not None and len(train_text.encode("utf-8")) < finetune_len + 1:
        return (f"--finetune-len {finetune_len}: the training text has {len(train_text.encode('utf-8'))} bytes, "
                f"fewer than one window needs")
    return None


def run(args: argparse.Namespace) -> int:
    from ...common.checks import check_int
    from ..outputs import write_json_file
    from ..sizes import defaults_of, size_error
    from ...seq.byte_lm import bits_per_byte_at, train_on_bytes
    from ...seq.context import canonical_method, plan_extension, rotary_layers
    from ...seq.data import load_corpus, split_text
    from ...seq.models import CausalLM
    from ...training.vocabulary import read_results
    from ...training.checkpoint import load_checkpoint
    from ...training.pretrained import build_from_config, first_line, load_state_checked

    run_dir = Path(args.run_dir)
    results_path, ckpt_path = run_dir / "results.json", run_dir / "checkpoint.pt"
    if not run_dir.is_dir() or not results_path.is_file() or not ckpt_path.is_file():
        return _fail(f"RUN_DIR {str(run_dir)!r} must be a directory of posenc train seq --out, with results.json and "
                     "checkpoint.pt")
    method = canonical_method(args.method)
    factor = args.factor if args.factor is not None else (1.0 if method == "none" else 4.0)
    for name in ("finetune_steps", "eval_tokens", "batch_size"):
        if getattr(args, name) < (0 if name == "finetune_steps" else 1):
            return _fail(f"--{name.replace('_', '-')} must be {'>= 0' if name == 'finetune_steps' else 'positive'}")
    if not args.lr > 0:
        return _fail(f"--lr must be positive, got {args.lr}")
    try:
        results = read_results(results_path)
    except (OSError, ValueError) as exc:
        return _fail(f"{results_path}: not a readable results file ({exc})")
    data = results.get("train_data") if isinstance(results, dict) else None
    if not isinstance(data, dict) or data.get("kind") != "text":
        return _fail(f"{results_path}: not a text run of posenc train seq (posenc extend scores bits per byte; "
                     "task runs and runs written before this command have no train_data record)")
    try:
        l0 = check_int("train_data.seq_len", data.get("seq_len"), minimum=1)
    except (TypeError, ValueError) as exc:
        return _fail(f"{results_path}: {exc}")
    out = Path(args.out) if args.out else run_dir / f"extend-{method}-x{factor:g}"
    error = _out_error(out)
    if error is not None:
        return _fail(error)
    target = int(round(factor * l0))
    if args.finetune_steps and (args.finetune_len or target) < 2:  # refused before any evaluation runs
        return _fail(f"--finetune-len must be at least 2, got {args.finetune_len or target}")
    eval_lens = args.eval_lens or sorted({l0, 2 * l0, 4 * l0, target})
    try:
        ckpt = load_checkpoint(ckpt_path)
        model_config = ckpt.get("model_config")
        if not isinstance(model_config, dict):
            raise ValueError(f"{ckpt_path} has no model_config")
        dim, depth = model_config.get("dim", 128), model_config.get("depth", 4)
        if isinstance(dim, int) and isinstance(depth, int):  # else the model's own check names the key
            sized = argparse.Namespace(**vars(args), model_dim=dim, model_depth=depth, train_len=l0)
            error = size_error(sized, SIZE_FLAGS, estimate, defaults_of(add_arguments))
            if error is not None:
                return _fail(error)
        model = build_from_config(CausalLM, model_config, f"{ckpt_path}: model_config")
        load_state_checked(model, ckpt.get("model"), str(ckpt_path))
        if not rotary_layers(model):
            raise ValueError(f"the run's model (encoding {model_config.get('encoding')!r}) has no rotary layer")
        text = load_corpus(data.get("path"))
    except (OSError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        return _fail(f"{run_dir}: {first_line(exc)}")
    train_text, valid_text = split_text(text)
    error = _text_error(train_text, valid_text, eval_lens, args.eval_tokens,
                        (args.finetune_len or target) if args.finetune_steps else None)
    if error is not None:
        return _fail(f"{run_dir}: {error}")
    try:  # every scaling checked before any evaluation runs
        planned = plan_extension(model, method, factor=factor, original_max_len=l0, **dict(args.option))
    except (TypeError, ValueError) as exc:
        return _fail(str(exc))
    before = bits_per_byte_at(model, valid_text, eval_lens, args.eval_tokens)
    for layer, scaling in planned:
        layer.set_scaling(scaling)
    after = bits_per_byte_at(model, valid_text, eval_lens, args.eval_tokens)
    tuned, loss = None, None
    if args.finetune_steps:
        length = args.finetune_len or target
        loss = train_on_bytes(model, train_text, length, steps=args.finetune_steps, batch_size=args.batch_size, lr=args.lr,
                        seed=args.seed, device=args.device, progress=not args.no_progress, out_dir=str(out),
                        model_config=model_config)
        tuned = bits_per_byte_at(model.cpu(), valid_text, eval_lens, args.eval_tokens)
    from ...training.report import format_table

    headers = ["length", "before", f"{method} x{factor:g}"] + ([f"+ {args.finetune_steps} steps"] if tuned else [])
    rows = [[n, f"{before[n]:.3f}", f"{after[n]:.3f}"] + ([f"{tuned[n]:.3f}"] if tuned else []) for n in eval_lens]
    print(f"bits per byte on the run's held-out text (trained at {l0} bytes; lower is better)")
    print(format_table(headers, rows, align="r" * len(headers)))
    record = {
        "run_dir": str(run_dir), "method": method, "factor": factor, "original_max_len": l0,
        "options": dict(args.option), "finetune_steps": args.finetune_steps,
        "finetune_len": (args.finetune_len or target) if args.finetune_steps else None,
        "before": {str(n): v for n, v in before.items()}, "zero_shot": {str(n): v for n, v in after.items()},
        "finetuned": None if tuned is None else {str(n): v for n, v in tuned.items()}, "finetune_loss": loss,
    }
    write_json_file(out, "results.json", record)  # the one writer: never through a link
    print(f"results written to {out / 'results.json'}")
    return 0
