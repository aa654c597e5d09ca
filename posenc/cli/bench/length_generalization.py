"""``posenc bench length-generalization``: every causal sequence encoding on the length-generalisation
tasks of the NoPE and CoPE papers, plus the byte LM trained short and scored long, and a table of
which of the papers' claims hold at this scale.

::

    posenc bench length-generalization --out runs/lengen            # the default subset
    posenc bench length-generalization --full --out runs/lengen-full # everything; rerun to continue after a kill
    posenc bench length-generalization --tasks flipflop,counting --encodings nope,rope,cope --seeds 5

**Tasks** (:mod:`posenc.seq.length_tasks`): one small causal LM per (encoding, task, seed) learns
the task at sizes up to the task's training size (``--train-len`` overrides it for every task)
with the model, steps, learning rate, curriculum and format of ``--scale``
(:mod:`.length_settings`: ``cpu`` learned on 2 CPU cores, ``paper`` the papers' sizes for a
device, ``uniform`` one setting for all as in the runs before), every encoding at its paper's
settings scaled to the training length (not under ``uniform``), and is scored by exact match
(every answer token right under teacher forcing, which is when greedy decoding writes the whole
answer) on ``--eval-examples`` fresh instances at 1x, 2x and 4x that size, and on the density variants of flip-flop (sparse, dense) and selective copy. The
splits other than 1x are out of distribution ("OOD"); a task's OOD score is their mean.

**Long-context LM rows**: one byte LM per (encoding, seed) in ``--lm-encodings`` trained on
pydoc text at ``--lm-train-len`` (128) bytes and scored in bits per byte on the held-out tail at
``--lm-eval-lens`` (as in ``posenc bench extrapolation``, through the same helpers).

**Claims**: :mod:`posenc.cli.bench.length_claims` decides each paper claim on the seeds (mean
difference beyond two standard errors and a margin; ``unclear`` with fewer than two seeds), each
part only on the tasks that every encoding it compares learned in distribution ("no verdict"
where none was and no other part decides).

Encodings are named by label (:data:`ENCODINGS`): the registry name, or a variant of one
(``kerple`` is the log kernel, ``kerple_power`` the power one, ``cape_alibi`` / ``cape_kerple`` /
``cape_fire`` are CAPE on that bias). Learned absolute positions and TUPE, which have a table of
positions, are built with rows up to the longest test sequence; the rows past the training
length are never trained, as in a model whose position table is longer than its training data.

**Resuming**: with ``--out``, every finished unit is appended to ``units.jsonl`` there at once;
running the same command again skips the units already in it (of the same configuration) and
continues; ``--max-units N`` stops after N new units (a run in pieces), ``--max-units 0`` trains
none (the report of a run in progress). The tables, heat map, JSON and claims are rewritten from
the log after every run, marked partial until all units are in.

**Parallel units**: ``--jobs N`` trains N units at once in worker processes (each with 1/N of
this process's torch threads); this process alone writes the log, a line per unit as it
finishes, so a killed run resumes the same way. Units are independent and seeded, so the
results do not depend on ``N`` (up to the float summation order of the thread count).

Outputs (with ``--out``): ``length_generalization.txt`` (the settings, a table per task, the
in-distribution table, the LM table, the claims with their rule), ``length_generalization.json``,
``length_generalization.png`` (heat map: encodings x tasks, mean OOD exact match) and ``units.jsonl``.

This module is the command: its arguments, their checks (names, sizes, outputs) and the size
estimate, all before torch is imported; :mod:`.length_train` builds the task suites and trains and
scores the units, :mod:`.length_report` writes the tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..argtypes import device_name, int_list, nonnegative_int, positive_float, positive_int, seed_value
from ..errors import unknown_name, usage_error
from ..outputs import out_error, write_file, write_json_file
from ..sizes import add_allow_large, defaults_of, size_error
from . import length_budget
from .length_settings import ENCODINGS, LENGTH_TASKS, SCALES, TASK_SIZES, task_settings

PROG = "posenc bench length-generalization"

DEFAULT_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi", "t5", "cope")
DEFAULT_TASKS = ("copy", "summation", "flipflop", "counting")
# training budgets: (task steps under --scale uniform, LM steps, LM batch) by default and with --full
DEFAULT_BUDGET, FULL_BUDGET = (250, 200, 16), (1000, 1000, 32)
# the model of the byte LM rows (and of every task under --scale uniform) unless flags say otherwise
SMALL_MODEL = {"dim": 64, "depth": 2, "heads": 4, "lr": 3e-3, "batch_size": 32}
DEFAULT_LM_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi", "kerple", "fire", "cape_alibi")
FULL_LM_ENCODINGS = DEFAULT_LM_ENCODINGS + ("cape_kerple", "cape_fire")
DEFAULT_LM_EVAL_LENS = (128, 256, 512, 1024)
FULL_LM_EVAL_LENS = (128, 256, 512, 1024, 2048)
BASENAME = "length_generalization"


def _labels(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated names")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train one small causal LM per (encoding, task, seed) on the NoPE and CoPE papers' length-generalisation "
        "tasks and score exact match at 1x, 2x and 4x the training size (and flip-flop's and selective copy's "
        "sparse/dense variants); train byte LMs at 128 bytes and score them up to 1024 (2048 with --full); decide the "
        "papers' claims on the seeds, each part only on the tasks its encodings learned in distribution. Each task "
        "trains with its own model, steps, learning rate, curriculum and format (--scale; the settings are printed "
        "first). Defaults: encodings "
        f"{','.join(DEFAULT_ENCODINGS)}; tasks {','.join(DEFAULT_TASKS)}; LM rows {','.join(DEFAULT_LM_ENCODINGS)}. "
        f"--full: every encoding ({','.join(ENCODINGS)}), every task ({','.join(LENGTH_TASKS)}), LM rows "
        f"{','.join(FULL_LM_ENCODINGS)} to 2048 bytes with 1000 steps each."
    )
    parser.add_argument("--encodings", type=_labels, default=None,
                        help=f"task-model encodings, or 'all' (default {','.join(DEFAULT_ENCODINGS)}; choices "
                             f"{','.join(ENCODINGS)})")
    parser.add_argument("--tasks", type=_labels, default=None,
                        help=f"tasks, or 'all' (default {','.join(DEFAULT_TASKS)}; choices {','.join(LENGTH_TASKS)})")
    parser.add_argument("--lm-encodings", type=_labels, default=None,
                        help=f"byte-LM encodings, or 'none' for no LM rows (default {','.join(DEFAULT_LM_ENCODINGS)})")
    parser.add_argument("--full", action="store_true",
                        help="every encoding and task, the LM rows with CAPE on all three biases, scored to 2048 bytes")
    parser.add_argument("--seeds", type=positive_int, default=3, help="seeds per cell (default 3)")
    parser.add_argument("--seed", type=seed_value, default=0, help="the first seed (default 0)")
    parser.add_argument("--scale", choices=SCALES, default="cpu",
                        help="cpu (default): each task's model, budget, curriculum and format from the table learned "
                             "on 2 CPU cores, encodings at their papers' settings scaled to the training length; "
                             "paper: the papers' model sizes and budgets (for a device); uniform: one model and "
                             "budget for every task from the flags below, plain formats, registry defaults (the "
                             "runs before the table)")
    parser.add_argument("--train-len", type=positive_int, default=None,
                        help="largest training size of every task (default: the scale's, e.g. 8 items, 16 "
                             "flip-flop instructions)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="training steps per task model (default: the scale's; uniform: 250, --full 1000)")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="task batch (default: the scale's; 32)")
    parser.add_argument("--lr", type=positive_float, default=None,
                        help="learning rate (default: the scale's; 0.003, and for the byte LM)")
    parser.add_argument("--dim", type=positive_int, default=None, help="model width (default: the scale's; 64)")
    parser.add_argument("--depth", type=positive_int, default=None, help="layers (default: the scale's; 2)")
    parser.add_argument("--heads", type=positive_int, default=None, help="attention heads (default: the scale's; 4)")
    parser.add_argument("--eval-examples", type=positive_int, default=128, help="test instances per split (default 128)")
    parser.add_argument("--lm-steps", type=positive_int, default=None,
                        help="training steps per byte LM (default 200; --full 1000)")
    parser.add_argument("--lm-batch-size", type=positive_int, default=None,
                        help="byte-LM batch in windows (default 16; --full 32)")
    parser.add_argument("--lm-train-len", type=positive_int, default=128, help="byte-LM training window (default 128)")
    parser.add_argument("--lm-eval-lens", type=int_list(minimum=1), default=None,
                        help="byte-LM scoring lengths (default 128,256,512,1024; --full adds 2048)")
    parser.add_argument("--eval-tokens", type=positive_int, default=4096, help="byte LM: tokens scored per length")
    parser.add_argument("--max-units", type=nonnegative_int, default=None,
                        help="stop after this many new units (rerun the same command to continue); 0: train none, "
                             "rewrite the tables, JSON and claims from --out's units.jsonl (a run still in progress)")
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="units trained at once in worker processes, each with 1/N of the torch threads "
                             "(default 1: in this process)")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for the results and units.jsonl (needed to resume)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress")
    add_allow_large(parser)


def _choose(given: list[str] | None, default: tuple[str, ...], full: tuple[str, ...] | None, choices, flag: str,
            what: str, allow_none: bool = False) -> list[str]:
    """The names a list flag selects; ValueError naming the flag, the name and the closest ones on an
    unknown or repeated name."""
    if given is None:
        return list(full if full is not None else default)
    if given == ["all"]:
        return list(choices)
    if allow_none and given == ["none"]:
        return []
    for name in given:
        if name not in choices:
            words = ("all", "none") if allow_none else ("all",)
            raise ValueError(f"{flag}: {unknown_name(what, name, [*choices, *words])}")
    if len(set(given)) != len(given):
        raise ValueError(f"{flag}: a name is repeated in {','.join(given)}")
    return list(given)


def check(args: argparse.Namespace) -> str | None:
    """Fill the defaults that depend on ``--full`` and each task's settings; what is wrong with the
    arguments (one line), or None. Decided from the flags and the tables alone: torch is not imported."""
    full = args.full
    try:
        args.encodings = _choose(args.encodings, DEFAULT_ENCODINGS, tuple(ENCODINGS) if full else None, ENCODINGS,
                                 "--encodings", "encoding")
        args.tasks = _choose(args.tasks, DEFAULT_TASKS, LENGTH_TASKS if full else None, LENGTH_TASKS, "--tasks", "task")
        args.lm_encodings = _choose(args.lm_encodings, DEFAULT_LM_ENCODINGS, FULL_LM_ENCODINGS if full else None,
                                    ENCODINGS, "--lm-encodings", "encoding", allow_none=True)
    except ValueError as exc:
        return str(exc)
    budget = FULL_BUDGET if full else DEFAULT_BUDGET
    args.lm_steps = args.lm_steps or budget[1]
    args.lm_batch_size = args.lm_batch_size or budget[2]
    if args.lm_eval_lens is None:
        args.lm_eval_lens = list(FULL_LM_EVAL_LENS if full else DEFAULT_LM_EVAL_LENS)
    flags = {"train_len": args.train_len, "dim": args.dim, "depth": args.depth, "heads": args.heads,
             "steps": args.steps, "lr": args.lr, "batch_size": args.batch_size}
    small = {k: flags[k] if flags[k] is not None else v for k, v in SMALL_MODEL.items()}
    args.lm_model = {k: small[k] for k in ("dim", "depth", "heads", "lr")}  # the byte LM rows' model
    if args.scale == "uniform":
        flags = {**flags, **small, "steps": args.steps or budget[0]}
    args.settings = {}
    for name in args.tasks:
        default_len, smallest = TASK_SIZES[name]
        s = task_settings(args.scale, name, default_len=default_len, overrides=flags)
        if s.dim % s.heads:
            return (f"--dim ({s.dim}) must be divisible by --heads ({s.heads})"
                    + ("" if args.dim and args.heads else f" (task {name} at --scale {args.scale})"))
        if s.train_len < smallest:
            return f"--train-len {s.train_len}: task {name} trains at sizes from {smallest}; give at least {smallest}"
        args.settings[name] = s
    if args.lm_model["dim"] % args.lm_model["heads"]:
        return f"--dim ({args.lm_model['dim']}) must be divisible by --heads ({args.lm_model['heads']})"
    if args.max_units == 0 and (args.out is None or not (Path(args.out) / "units.jsonl").is_file()):
        where = "no --out was given" if args.out is None else f"{Path(args.out) / 'units.jsonl'} does not exist"
        return f"--max-units 0 rewrites the report from the log of a run (--out DIR/units.jsonl); {where}"
    return size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments)) or out_error(args.out, OUTPUTS)


SIZE_FLAGS = length_budget.SIZE_FLAGS
OUTPUTS = ("units.jsonl", f"{BASENAME}.txt", f"{BASENAME}.json", f"{BASENAME}.png")


def estimate(args: argparse.Namespace):
    """The run's work (posenc.cli.sizes; :mod:`.length_budget`)."""
    full = args.full
    return length_budget.estimate(args, budget=FULL_BUDGET if full else DEFAULT_BUDGET, small_model=SMALL_MODEL,
                                  lm_eval_lens=FULL_LM_EVAL_LENS if full else DEFAULT_LM_EVAL_LENS)


def _resolve(args: argparse.Namespace) -> None:
    """:func:`check`, then the task suites (:func:`.length_train.prepare`, which imports torch);
    ValueError with one line on bad input."""
    error = check(args)
    if error is not None:
        raise ValueError(error)
    from .length_train import prepare

    prepare(args)


def _config(args: argparse.Namespace) -> dict:
    keys = ("encodings", "tasks", "lm_encodings", "full", "scale", "seeds", "seed", "eval_examples", "lm_steps",
            "lm_batch_size", "lm_train_len", "lm_eval_lens", "eval_tokens", "lm_model")
    return {**{k: getattr(args, k) for k in keys}, "settings": {n: s.key() for n, s in args.settings.items()}}


def run(args: argparse.Namespace) -> int:
    """Run the units not yet logged, print and write the report: 0, or 2 on bad input (the names,
    sizes and outputs refused before torch is imported)."""
    try:
        _resolve(args)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    from .length_report import aggregate, plot_heat_map, render, settings_text
    from .length_train import execute
    from .length_units import check_line
    from .unit_log import UnitLog, UnitLogError

    out = None if args.out is None else Path(args.out)
    log = None
    if out is not None:
        log = UnitLog(out / "units.jsonl", check=check_line)
        try:
            log.load()
        except UnitLogError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        if log.dropped:
            print(f"note: dropped {log.dropped} unreadable line(s) of {log.path} (a run killed while writing)")
    start = time.perf_counter()
    settings = settings_text(args)
    if not args.no_progress:
        print(settings + "\n", flush=True)
    try:
        results, complete = execute(args, log)
    except UnitLogError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    summary = aggregate(args, results)
    text = settings + "\n\n" + render(summary)
    status = "complete" if complete else "PARTIAL (rerun the same command to continue)"
    print(f"\n{text}\n\n{len(results)} units, {status}; {time.perf_counter() - start:.0f} s this run")
    if out is not None:
        header = "" if complete else "PARTIAL RUN: not every unit is in; rerun the same command to continue\n\n"
        write_file(out, f"{BASENAME}.txt", header + text + "\n")
        write_json_file(out, f"{BASENAME}.json", {"config": _config(args), "complete": complete, "units": len(results),
                                             **summary})
        drew = plot_heat_map(summary, out / f"{BASENAME}.png", ENCODINGS)
        print(f"written to {out}/{BASENAME}.{{txt,json{',png' if drew else ''}}} and units.jsonl")
    return 0


__all__ = ["DEFAULT_ENCODINGS", "DEFAULT_TASKS", "ENCODINGS", "add_arguments", "check", "estimate", "run"]
