"""One option vocabulary for every ``posenc`` command that builds or trains a model.

The train commands, the benches and the demo take their options from these groups, so the same
thing has the same flag, type, check and help everywhere; every ``--help`` shows the defaults
(:mod:`posenc.cli` uses argparse's defaults formatter). Values are checked while parsing by the
types of :mod:`posenc.cli.argtypes` (which apply the rules of :mod:`posenc.common.checks`): a bad value
is one line and exit status 2 before any work starts. Rules between options (``--dim`` divisible by
``--heads``) are checked by each command's ``check(args)``; :func:`encoding_error` is the one rule
for which encodings a command's model takes. What one model takes (the ViT's grids, the ConvTran
classifier's options) lives with it, in :mod:`posenc.cli.models`.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

from .argtypes import (
    device_name,
    dropout_rate,
    key_value,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    seed_value,
)
from .errors import unknown_name
from .sizes import add_allow_large

# the linear-attention feature maps (posenc.common.linear_attention.FEATURE_MAPS, named here without torch)
FEATURE_MAPS = ("elu", "favor")
# the context-extension methods and their other names (posenc.seq.context.METHODS and
# METHOD_ALIASES, named here without torch: ``posenc extend --help`` answers at once)
CONTEXT_METHODS = ("none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "proportional")
CONTEXT_METHOD_ALIASES = {"default": "none", "pi": "linear", "dynamic": "dynamic_ntk"}
# the synthetic tasks of posenc.seq.tasks.TASKS, named here without torch (the tests check they agree)
SEQ_TASKS = ("copy", "reverse", "sort", "addition", "recall")
RESUME_WITHOUT_OUT = "--resume needs --out (the checkpoint lives there)"
FEATURE_MAP_HELP = ("train on linear attention with this feature map (default: softmax attention); only encodings "
                    "on the input or on q and k run on it, and SPE runs only on it")


def add_encoding_arguments(parser: argparse.ArgumentParser, *, what: str, default: str | None = None,
                           example: str = "KEY=VALUE", spec_type=None) -> None:
    """``--encoding`` (required unless ``default``; parsed by ``spec_type`` when given) and
    ``--encoding-option`` (repeatable ``KEY=VALUE``, JSON values)."""
    parser.add_argument("--encoding", required=default is None, default=default, type=spec_type, help=f"{what}, or 'none'")
    parser.add_argument("--encoding-option", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                        help=f"constructor argument of the encoding (JSON value), e.g. {example}; repeatable")


def add_model_arguments(parser: argparse.ArgumentParser, *, dim: int, depth: int | None, heads: int,
                        dropout: float = 0.0) -> None:
    """``--dim``, ``--depth`` (when the model has a depth), ``--heads``, ``--dropout``."""
    parser.add_argument("--dim", type=positive_int, default=dim, help="model width")
    if depth is not None:
        parser.add_argument("--depth", type=positive_int, default=depth, help="transformer blocks")
    parser.add_argument("--heads", type=positive_int, default=heads, help="attention heads (must divide --dim)")
    parser.add_argument("--dropout", type=dropout_rate, default=dropout, help="dropout rate in [0, 1)")


def add_optim_arguments(parser: argparse.ArgumentParser, *, steps: int | None, batch_size: int | None, lr: float,
                        weight_decay: float, steps_help: str = "optimizer steps",
                        batch_help: str = "examples per batch and process") -> None:
    """``--steps``, ``--batch-size``, ``--lr``, ``--weight-decay``, ``--warmup-steps``."""
    parser.add_argument("--steps", type=positive_int, default=steps, help=steps_help)
    parser.add_argument("--batch-size", type=positive_int, default=batch_size, help=batch_help)
    parser.add_argument("--lr", type=positive_float, default=lr, help="peak learning rate (AdamW)")
    parser.add_argument("--weight-decay", type=nonnegative_float, default=weight_decay, help="AdamW weight decay")
    parser.add_argument("--warmup-steps", type=nonnegative_int, default=None,
                        help="linear warm-up before the cosine decay (default: min(100, steps // 10))")


def add_run_arguments(parser: argparse.ArgumentParser, *, checkpoint_help: str = "steps between checkpoints "
                      "(0: at the end)") -> None:
    """Seed, device, run directory, resumption, checkpoint and evaluation intervals, progress."""
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the data, the initialisation and dropout")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="run directory for metrics.jsonl, checkpoint.pt and results.json; it must be new or "
                             "empty unless --resume (default: nothing written)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its checkpoint, with the same training options")
    parser.add_argument("--checkpoint-every", type=nonnegative_int, default=0, help=checkpoint_help)
    parser.add_argument("--eval-every", type=nonnegative_int, default=0, help="steps between evaluations (0: at the end)")
    parser.add_argument("--no-progress", action="store_true", help="no progress output")
    add_allow_large(parser)  # the size policy's override (posenc.cli.sizes)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads``: every command that runs a model takes it (:mod:`posenc.cli` adds it), and
    :func:`posenc.cli.main` applies it before the command imports torch
    (:func:`posenc.common.threads.set_threads`)."""
    from ..common.threads import usable_cores

    parser.add_argument("--threads", type=nonnegative_int, default=None,
                        help=f"CPU threads for torch and posenc's workers (default: OMP_NUM_THREADS, else the {usable_cores()} "
                             "usable cores less the threads other processes run when the command starts, so the speed "
                             "holds when another process shares the machine; 1 holds under any load; 0: torch's own "
                             "default, a thread per core)")


def train_config(args: argparse.Namespace, *, steps: int | None = None, batch_size: int | None = None):
    """The :class:`~posenc.training.trainer.TrainConfig` of the options of
    :func:`add_optim_arguments` and :func:`add_run_arguments`: the one translation from flags to
    the trainer's settings. ``steps`` and ``batch_size`` override ``--steps`` and ``--batch-size``
    where a command derives them (the graph command's schedule per dataset); progress is logged
    about ten times a run, at most every 50 steps."""
    from ..training.trainer import TrainConfig

    steps = args.steps if steps is None else steps
    return TrainConfig(
        steps=steps, batch_size=args.batch_size if batch_size is None else batch_size, lr=args.lr,
        weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
        seed=args.seed, device=args.device, out_dir=args.out, resume=args.resume,
        progress=not args.no_progress, log_every=max(1, min(50, steps // 10)),
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
    )


def encoding_error(name: str, modalities: Sequence[str], *, model: str, bidirectional: bool,
                   flag: str = "--encoding", feature_map: str | None = None) -> str | None:
    """Why ``model`` cannot take the encoding ``name`` (one line naming ``flag``), or None.

    The one rule for every command: the name is registered, its modality is one of ``modalities``,
    a bidirectional model refuses causal-only encodings, and the attention kind (softmax or the
    linear ``feature_map``) can run it (:func:`posenc.common.planning.check_attention_kind`, whose
    answers the catalog holds). Read from the registry's snapshot (:mod:`posenc.cli.catalog`),
    so the answer comes before anything imports torch.
    """
    from .catalog import entry, names

    if name == "none":
        return None
    info = entry(name)
    if info is None:
        listing = f"posenc list --modality {modalities[0]}" if len(modalities) == 1 else "posenc list"
        return f"{flag}: {unknown_name('encoding', name, names(modalities), listing=listing)}"
    if info.modality not in modalities:
        return (f"{flag}: {name!r} is a {info.modality} encoding; {model} takes {' or '.join(modalities)} encodings "
                f"(posenc list --modality {modalities[0]})")
    if bidirectional and info.causal_only:
        return f"{flag}: {name!r} is defined for causal attention only; {model} attends both ways"
    refusal = info.softmax_error if feature_map is None else info.linear_error
    if refusal is not None:
        hint = " (--feature-map elu or favor)" if feature_map is None else ""
        return f"{flag}: {refusal}{hint}"
    return None


def encoding_option_error(name: str, options: Sequence[tuple[str, object]],
                          flag: str = "--encoding-option") -> str | None:
    """Why the ``KEY=VALUE`` pairs of ``flag`` do not fit the encoding ``name`` (a key its
    constructor does not take, with the closest names), or None; from the catalog, before torch."""
    from .catalog import option_error

    if not options:
        return None
    if name == "none":
        return f"{flag} needs an encoding (got --encoding none)"
    error = option_error(name, [key for key, _ in options])
    return None if error is None else f"{flag}: {error}"


def out_dir_error(out: str | None, resume: bool) -> str | None:
    """Why ``--out`` cannot take this run, or None: runs never clobber. A new or empty directory
    starts a run; one holding files needs ``--resume`` (which continues the run there)."""
    if out is None:
        return RESUME_WITHOUT_OUT if resume else None
    if os.path.lexists(out) and not os.path.isdir(out):
        return f"--out: {out!r} exists and is not a directory"
    if not resume and os.path.isdir(out) and any(os.scandir(out)):
        return (f"--out: {out!r} already holds files (an earlier run?); add --resume to continue that run, "
                "or choose a new directory")
    return None
