"""What a ``posenc bench length-generalization`` run costs, for the one size policy
(:mod:`posenc.cli.sizes`): every task model (its settings at the run's scale, the flags given
replacing the table's) trained and tested on every split, every byte LM trained and scored at
every length, times the seeds. Read from the flags alone (a flag left at None takes the value
the run would), so the policy can ask what a default would change."""

from __future__ import annotations

import argparse
from typing import Mapping, Sequence

from ..sizes import Work, scoring, sequence, transformer

# the size flags of the policy
SIZE_FLAGS = ("seeds", "steps", "batch_size", "train_len", "dim", "depth", "eval_examples", "lm_steps", "lm_batch_size",
              "lm_train_len", "lm_eval_lens", "eval_tokens", "jobs")
SPLITS = 5  # 1x, 2x, 4x and a task's variants (flip-flop's sparse and dense), at most
TASK_VOCAB = 64
WORKER_BYTES = 2**29  # a --jobs worker process: Python and torch, before its unit's model, about


def estimate(args: argparse.Namespace, *, budget: tuple[int, int, int], small_model: Mapping[str, object],
             lm_eval_lens: Sequence[int]) -> Work:
    """The run's work; ``args`` after the bench resolved its names (``tasks``, ``encodings``,
    ``lm_encodings`` lists). ``budget``: (task steps under ``uniform``, LM steps, LM batch);
    ``small_model``: the LM rows' model; ``lm_eval_lens``: the default scoring lengths (the
    bench's, by ``--full``)."""
    from .length_settings import TASK_SIZES, task_settings

    flags = {"train_len": args.train_len, "dim": args.dim, "depth": args.depth, "heads": args.heads,
             "steps": args.steps, "lr": args.lr, "batch_size": args.batch_size}
    small = {k: flags[k] if flags[k] is not None else v for k, v in small_model.items()}
    if args.scale == "uniform":
        flags = {**flags, **small, "steps": args.steps or budget[0]}
    work = Work()
    for name in args.tasks:
        s = task_settings(args.scale, name, default_len=TASK_SIZES[name][0], overrides=flags)
        longest = 4 * (2 * s.train_len + 2)  # the 4x split, question and answer (two tokens an item at most)
        train = transformer(s.batch_size, 2 * s.train_len + 2, s.dim, s.depth, vocab=TASK_VOCAB, steps=s.steps)
        tests = transformer(args.eval_examples, longest, s.dim, s.depth, vocab=TASK_VOCAB, train=False) * SPLITS
        work = work + (train + tests) * len(args.encodings)
    if args.lm_encodings:
        lens = args.lm_eval_lens or lm_eval_lens
        train = transformer(args.lm_batch_size or budget[2], args.lm_train_len, small["dim"], small["depth"], vocab=256,
                            steps=args.lm_steps or budget[1])
        scored = sequence([scoring(args.eval_tokens, n, small["dim"], small["depth"]) for n in lens])
        work = work + (train + scored) * len(args.lm_encodings)
    work = work * args.seeds
    units = args.seeds * (len(args.tasks) * len(args.encodings) + len(args.lm_encodings or ()))
    workers = min(getattr(args, "jobs", 1), units)
    if workers > 1:  # a worker process a unit in flight, each with torch and its unit (--jobs 1000000 spawned them)
        work = Work(work.flops, work.calls, workers * (WORKER_BYTES + work.bytes))
    return work


__all__ = ["SIZE_FLAGS", "estimate"]
