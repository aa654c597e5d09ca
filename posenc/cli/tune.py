"""``posenc tune``: measure, on this machine, the choices whose order depends on the CPU, and keep
the result where the plan reads it (:mod:`posenc.common.tuning`).

One choice today: the backward of the chunked dense path for a constant bias (ALiBi's fixed
slopes, a caller's float mask), SDPA's CPU flash backward or the written-out one. Each is timed
on a training step of causal self-attention with ALiBi (forward + backward, median of
``--repeats`` after a warm-up, the two alternating); the faster is written to the tune file under
this machine's key (CPU model, torch version, threads: measure with the ``--threads`` your runs
use), beside other machines' entries. Delete the file (or the entry) to return to the default;
``POSENC_BIAS_BACKWARD`` overrides both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from .argtypes import positive_int
from .sizes import Work, add_allow_large, defaults_of, size_error

_SHAPE_LIMIT = 1 << 27  # B * H * T * T: a step at most this large (one T x T score block at once is never built)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=positive_int, default=4, metavar="B", help="default: 4")
    parser.add_argument("--heads", type=positive_int, default=8, metavar="H", help="default: 8")
    parser.add_argument("--seq-len", type=positive_int, default=1024, metavar="T", help="default: 1024")
    parser.add_argument("--head-dim", type=positive_int, default=64, metavar="D", help="default: 64")
    parser.add_argument("--repeats", type=positive_int, default=5, metavar="N", help="timed steps per choice (default: 5)")
    parser.add_argument("--file", type=Path, default=None, metavar="PATH",
                        help="the tune file to update (default: $POSENC_TUNE_FILE or ~/.cache/posenc/tune.json)")
    parser.add_argument("--dry-run", action="store_true", help="measure and print; write nothing")
    add_allow_large(parser)


SIZE_FLAGS = ("batch", "heads", "seq_len", "head_dim", "repeats")


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): a causal ALiBi step, forward and backward (about
    ``12 B H T^2 D`` operations), for both choices, the warm-up and ``--repeats`` rounds."""
    b, h, t, d = args.batch, args.heads, args.seq_len, args.head_dim
    steps = 2 * (1 + args.repeats)
    return Work(12 * b * h * t * t * d * steps, steps, 4 * 12 * b * h * t * d)  # q, k, v, outputs and grads


def _step_ms(choice: str, q, k, v, encoding, mask) -> float:
    import torch

    import posenc

    os.environ["POSENC_BIAS_BACKWARD"] = choice
    q.grad = k.grad = v.grad = None
    pos = torch.arange(q.shape[2])[None]
    start = time.perf_counter()
    posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=encoding, mask=mask, backend="dense").sum().backward()
    return (time.perf_counter() - start) * 1e3


def _write(path: Path, key: str, entry: dict) -> None:
    """Update ``path``'s entry for ``key``, atomically; a link or a file that is not a tune file
    is refused, not overwritten."""
    if path.is_symlink():
        raise SystemExit(f"posenc tune: --file {path} is a symbolic link; refusing to write through it")
    record: dict = {"machines": {}}
    if path.exists():
        try:
            record = json.loads(path.read_text()[:1_000_000])
            if not isinstance(record, dict) or not isinstance(record.get("machines"), dict):
                raise ValueError("no 'machines' table")
        except ValueError as err:
            raise SystemExit(f"posenc tune: {path} is not a posenc tune file ({err}); delete it or pass --file") from None
    record["machines"][key] = entry
    from .outputs import write_json_file  # the one writer: a temporary file of its own, never a link

    write_json_file(path.parent, path.name, record)


def run(args: argparse.Namespace) -> int:
    b, h, t, d = args.batch, args.heads, args.seq_len, args.head_dim
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments), device="cpu")
    if error is not None:
        print(f"posenc tune: error: {error}", file=sys.stderr)
        return 2
    if b * h * t * t > _SHAPE_LIMIT:
        print(f"posenc tune: --batch {b} --heads {h} --seq-len {t} is {b * h * t * t:,} score elements a step; "
              f"the limit is {_SHAPE_LIMIT:,}", file=sys.stderr)
        return 2
    import torch

    import posenc
    from posenc.common.tuning import BIAS_BACKWARD_VARIABLE, machine_key, tune_file

    path = args.file if args.file is not None else tune_file()
    saved = os.environ.pop(BIAS_BACKWARD_VARIABLE, None)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, generator=gen).requires_grad_() for _ in range(3))
    encoding, mask = posenc.build("alibi", num_heads=h), posenc.AttentionMask(causal=True)
    times: dict[str, list[float]] = {"flash": [], "explicit": []}
    try:
        for choice in times:  # warm-up
            _step_ms(choice, q, k, v, encoding, mask)
        for _ in range(args.repeats):
            for choice in times:
                times[choice].append(_step_ms(choice, q, k, v, encoding, mask))
    finally:
        os.environ.pop(BIAS_BACKWARD_VARIABLE, None)
        if saved is not None:
            os.environ[BIAS_BACKWARD_VARIABLE] = saved
    median = {choice: statistics.median(ms) for choice, ms in times.items()}
    best = min(median, key=median.get)
    key = machine_key()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"machine: {key}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"ALiBi training step, B={b} H={h} T={t} D={d}, causal, median of {args.repeats}:")
    for choice, ms in median.items():
        print(f"  {choice:<8} backward {ms:8.1f} ms  {ms / median[best]:.2f}x{'  <- chosen' if choice == best else ''}")
    if args.dry_run:
        return 0
    _write(path, key, {"constant_bias_backward": best, "shape": [b, h, t, d],
                       "median_ms": {c: round(ms, 2) for c, ms in median.items()}, "load_average": list(load),
                       "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    print(f"written to {path} (delete it to return to the default; {BIAS_BACKWARD_VARIABLE} overrides it)")
    return 0
