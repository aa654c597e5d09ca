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
continues; ``--max-units N`` stops after N new units (a run in pieces). The tables, heat map,
JSON and claims are rewritten from the log after every run, marked partial until all units are in.

**Parallel units**: ``--jobs N`` trains N units at once in worker processes (each with 1/N of
this process's torch threads); this process alone writes the log, a line per unit as it
finishes, so a killed run resumes the same way. Units are independent and seeded, so the
results do not depend on ``N`` (up to the float summation order of the thread count).

Outputs (with ``--out``): ``length_generalization.txt`` (the settings, a table per task, the
in-distribution table, the LM table, the claims with their rule), ``length_generalization.json``,
``length_generalization.png`` (heat map: encodings x tasks, mean OOD exact match) and ``units.jsonl``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch

from ..argtypes import device_name, int_list, positive_float, positive_int, seed_value
from ..outputs import out_error, write_file, write_json_file
from ..sizes import add_allow_large, defaults_of, size_error
from ...training.report import format_table
from . import length_budget
from .length_report import aggregate, plot_heat_map, render
from .length_settings import SCALES, encoding_options, settings_rows, task_rows, task_settings
from .length_units import check_line, check_planned
from .unit_log import UnitLog, UnitLogError, config_key

PROG = "posenc bench length-generalization"

# label -> (registered name, constructor options): every registered sequence encoding that runs in
# a causal LM with softmax attention (the SPE encodings need linear attention; the RoPE context
# extensions are ``posenc bench context-extension``'s subject).
ENCODINGS: dict[str, tuple[str, dict]] = {
    "nope": ("nope", {}), "sinusoidal": ("sinusoidal", {}), "learned": ("learned", {}), "rope": ("rope", {}),
    "xpos": ("xpos", {}), "alibi": ("alibi", {}), "t5": ("t5", {}), "kerple": ("kerple", {"variant": "log"}),
    "kerple_power": ("kerple", {"variant": "power"}), "fire": ("fire", {}),
    "cape_alibi": ("cape", {"base": "alibi"}), "cape_kerple": ("cape", {"base": "kerple"}),
    "cape_fire": ("cape", {"base": "fire"}), "cope": ("cope", {}), "shaw": ("shaw", {}),
    "transformer_xl": ("transformer_xl", {}), "tupe": ("tupe", {}), "deberta": ("deberta", {}), "peg1d": ("peg1d", {}),
    "fox": ("fox", {}), "fox_alibi": ("fox", {"gate_init": "alibi"}),
}
TABLE_ENCODINGS = frozenset({"learned", "tupe"})  # built with rows up to the longest test sequence

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
    from ...seq.length_tasks import LENGTH_TASKS

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
    parser.add_argument("--max-units", type=positive_int, default=None,
                        help="stop after this many new units (rerun the same command to continue)")
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="units trained at once in worker processes, each with 1/N of the torch threads "
                             "(default 1: in this process)")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for the results and units.jsonl (needed to resume)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress")
    add_allow_large(parser)


def _choose(given: list[str] | None, default: tuple[str, ...], full: tuple[str, ...], choices, flag: str,
            allow_none: bool = False) -> list[str]:
    """The names a list flag selects; ValueError naming the flag on an unknown or repeated name."""
    if given is None:
        return list(full if full is not None else default)
    if given == ["all"]:
        return list(choices)
    if allow_none and given == ["none"]:
        return []
    unknown = [n for n in given if n not in choices]
    if unknown:
        raise ValueError(f"{flag}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(choices)}"
                         + (" (or 'all', 'none')" if allow_none else " (or 'all')"))
    if len(set(given)) != len(given):
        raise ValueError(f"{flag}: a name is repeated in {','.join(given)}")
    return list(given)


def _resolve(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on ``--full``; ValueError with one line on bad input."""
    from ...seq.length_tasks import LENGTH_TASKS, length_suite

    full = args.full
    args.encodings = _choose(args.encodings, DEFAULT_ENCODINGS, tuple(ENCODINGS) if full else None, ENCODINGS,
                             "--encodings")
    args.tasks = _choose(args.tasks, DEFAULT_TASKS, LENGTH_TASKS if full else None, LENGTH_TASKS, "--tasks")
    args.lm_encodings = _choose(args.lm_encodings, DEFAULT_LM_ENCODINGS, FULL_LM_ENCODINGS if full else None,
                                ENCODINGS, "--lm-encodings", allow_none=True)
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
    args.settings, args.suites = {}, {}
    for name in args.tasks:
        default_len = length_suite(name).train_max
        s = task_settings(args.scale, name, default_len=default_len, overrides=flags)
        if s.dim % s.heads:
            raise ValueError(f"--dim ({s.dim}) must be divisible by --heads ({s.heads})"
                             + ("" if args.dim and args.heads else f" (task {name} at --scale {args.scale})"))
        try:
            args.suites[name] = length_suite(name, s.train_len, dict(s.options))
        except ValueError as exc:
            raise ValueError(f"--train-len {s.train_len}: {exc}") from None
        args.settings[name] = s
    if args.lm_model["dim"] % args.lm_model["heads"]:
        raise ValueError(f"--dim ({args.lm_model['dim']}) must be divisible by --heads ({args.lm_model['heads']})")
    if args.lm_encodings:
        _check_lm_memory(args)
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments)) or out_error(args.out, OUTPUTS)
    if error is not None:
        raise ValueError(error)


SIZE_FLAGS = length_budget.SIZE_FLAGS
OUTPUTS = ("units.jsonl", f"{BASENAME}.txt", f"{BASENAME}.json", f"{BASENAME}.png")


def estimate(args: argparse.Namespace):
    """The run's work (posenc.cli.sizes; :mod:`.length_budget`)."""
    full = args.full
    return length_budget.estimate(args, budget=FULL_BUDGET if full else DEFAULT_BUDGET, small_model=SMALL_MODEL,
                                  lm_eval_lens=FULL_LM_EVAL_LENS if full else DEFAULT_LM_EVAL_LENS)


def _check_lm_memory(args: argparse.Namespace) -> None:
    """Refuse LM scoring lengths whose attention scores (CAPE: its MLP's input and hidden layer too)
    could not fit, before anything trains."""
    from ...common.checks import check_allocation

    device = "cpu" if args.device == "auto" and not torch.cuda.is_available() else (
        "cuda" if args.device == "auto" else args.device)
    n = max(args.lm_eval_lens)
    windows = max(1, 4096 // n)  # the slice bits_per_byte_at scores at once
    check_allocation(f"--lm-eval-lens {n}: attention scores", (windows, args.lm_model["heads"], n, n), torch.float32,
                     device)
    if any(ENCODINGS[e][0] == "cape" for e in args.lm_encodings):
        check_allocation(f"--lm-eval-lens {n}: CAPE's MLP over [scores; bias]", (windows, n, n, 2 * args.lm_model["heads"] + 32),
                         torch.float32, device)


# ---------------------------------------------------------------------------------------------
# units


def _encoding_key(args: argparse.Namespace, label: str, length: int) -> dict:
    """The options of ``label``'s encoding at training length ``length`` (nothing under ``uniform``:
    the registry defaults, as in the runs before the settings table)."""
    if args.scale == "uniform":
        return {}
    return {"scale": args.scale, "encoding": [ENCODINGS[label][0], _options(args, label, length)]}


def _task_key(args: argparse.Namespace, suite, label: str) -> str:
    """The configuration of one task unit of encoding ``label`` (another key: another unit)."""
    s = args.settings[suite.name]
    if args.scale == "uniform":  # the key of the runs before the settings table
        return config_key({
            "kind": "task", "task": suite.name, "train": [suite.train_min, suite.train_max],
            "splits": [sp.label for sp in suite.splits], "steps": s.steps, "batch_size": s.batch_size, "lr": s.lr,
            "dim": s.dim, "depth": s.depth, "heads": s.heads, "eval_examples": args.eval_examples,
        })
    return config_key({
        "kind": "task", "task": suite.name, "train_min": suite.train_min, "splits": [sp.label for sp in suite.splits],
        **s.key(), "eval_examples": args.eval_examples, **_encoding_key(args, label, suite.max_total_length()),
    })


def _lm_key(args: argparse.Namespace, label: str) -> str:
    """The configuration of the byte LM unit of encoding ``label``."""
    m = args.lm_model
    return config_key({
        "kind": "lm", "train_len": args.lm_train_len, "eval_lens": sorted(args.lm_eval_lens), "steps": args.lm_steps,
        "batch_size": args.lm_batch_size, "lr": m["lr"], "dim": m["dim"], "depth": m["depth"], "heads": m["heads"],
        "eval_tokens": args.eval_tokens, **_encoding_key(args, label, args.lm_train_len),
    })


def _options(args: argparse.Namespace, label: str, length: int) -> dict:
    """The constructor options of ``label`` for a model trained at ``length`` tokens."""
    base = ENCODINGS[label][1]
    return dict(base) if args.scale == "uniform" else encoding_options(label, base, length)


def _model(args: argparse.Namespace, label: str, vocab: int, max_len: int, length: int, model: dict):
    """A causal LM with encoding ``label`` trained at ``length`` tokens (``max_len``: the table
    length of learned positions); ``model``: its ``dim``, ``depth`` and ``heads``."""
    from ...seq.models import CausalLM

    options = _options(args, label, length)
    return CausalLM(vocab, model["dim"], model["depth"], model["heads"], encoding=ENCODINGS[label][0],
                    encoding_options=options or None, max_len=max_len)


def run_task_unit(args: argparse.Namespace, suite, label: str, seed: int) -> dict:
    """Train one model on ``suite``'s task and score every split -> the unit's result."""
    from ...seq.evaluation import task_eval_set, task_exact_match
    from ...seq.length_tasks import eval_seed
    from ...seq.tasks import train_on_task

    s = args.settings[suite.name]
    torch.manual_seed(seed)
    max_len = suite.max_total_length(tested=label in TABLE_ENCODINGS)
    model = _model(args, label, suite.vocab_size, max_len, suite.max_total_length(), s.__dict__)
    t0 = time.perf_counter()
    loss = train_on_task(model, suite.train_task, suite.train_max, min_length=suite.train_min, steps=s.steps,
                         batch_size=s.batch_size, lr=s.lr, seed=seed, device=args.device, progress=False,
                         curriculum=s.curriculum)
    train_s = time.perf_counter() - t0
    model.eval()
    scores = {}
    for split in suite.splits:
        batch = task_eval_set(split.task, split.size, args.eval_examples, seed=eval_seed(suite.name, split.label, seed))
        scores[split.label] = task_exact_match(model, batch)
    return {"train_loss": round(loss, 4), "train_s": round(train_s, 2),
            "eval_s": round(time.perf_counter() - t0 - train_s, 2), "exact_match": scores}


def run_lm_unit(args: argparse.Namespace, label: str, seed: int, texts: tuple[str, str]) -> dict:
    """Train one byte LM at ``--lm-train-len`` and score bits per byte at every ``--lm-eval-lens``."""
    from ...seq.byte_lm import bits_per_byte_at, train_on_bytes

    train_text, valid_text = texts
    torch.manual_seed(seed)
    max_len = max(args.lm_eval_lens + [args.lm_train_len]) if label in TABLE_ENCODINGS else args.lm_train_len
    model = _model(args, label, 256, max_len, args.lm_train_len, args.lm_model)
    t0 = time.perf_counter()
    loss = train_on_bytes(model, train_text, args.lm_train_len, steps=args.lm_steps, batch_size=args.lm_batch_size,
                          lr=args.lm_model["lr"], seed=seed, device=args.device, progress=False)
    train_s = time.perf_counter() - t0
    bpb = bits_per_byte_at(model, valid_text, sorted(args.lm_eval_lens), args.eval_tokens)
    return {"train_loss": round(loss, 4), "train_s": round(train_s, 2),
            "eval_s": round(time.perf_counter() - t0 - train_s, 2), "bpb": {str(n): v for n, v in bpb.items()}}


_TEXTS: tuple[str, str] | None = None  # the byte-LM corpus, read once per process


def run_unit(args: argparse.Namespace, spec: dict) -> dict:
    """One unit of :func:`_plan` -> its result (in this process or a worker)."""
    global _TEXTS
    if spec["kind"] == "task":
        return run_task_unit(args, spec["suite"], spec["encoding"], spec["seed"])
    if _TEXTS is None:
        from ...seq.data import pydoc_corpus, split_text

        _TEXTS = split_text(pydoc_corpus())
    return run_lm_unit(args, spec["encoding"], spec["seed"], _TEXTS)


def _timed_unit(args: argparse.Namespace, spec: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    return run_unit(args, spec), time.perf_counter() - t0


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)


def _run_in_workers(args: argparse.Namespace, todo: list, finish) -> None:
    """``--jobs``: at most ``args.jobs`` units in flight, handed out in plan order (so a stopped run
    has the first seeds first); each result is logged by this process as it arrives."""
    threads = max(1, torch.get_num_threads() // args.jobs)
    # spawn, not fork: a forked copy of a process that has run torch's thread pools can hang
    pool = ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init, initargs=(threads,))
    pending = iter(todo)
    running: dict = {}
    try:
        for unit in pending:
            running[pool.submit(_timed_unit, args, unit[2])] = unit
            if len(running) == args.jobs:
                break
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                uid, key, spec = running.pop(future)
                result, seconds = future.result()
                finish(uid, key, spec, result, seconds)
                unit = next(pending, None)
                if unit is not None:
                    running[pool.submit(_timed_unit, args, unit[2])] = unit
    except BaseException:
        # Ctrl-C or a failed unit: the units still training are lost either way, so stop them now
        # rather than wait for them (what is logged stays logged)
        for process in list((pool._processes or {}).values()):  # no public terminate before Python 3.14
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _plan(args: argparse.Namespace) -> list[tuple[str, str, dict]]:
    """Every unit of the run: ``(unit id, config key, spec)``, seed-major: every task model and
    byte LM at the first seed, then at the next, so that a partial (long, ``--full``) run already
    has every cell at its first seeds."""
    seeds = [args.seed + k for k in range(args.seeds)]
    suites = [(name, args.suites[name]) for name in args.tasks]
    keys = {(name, label): _task_key(args, suite, label) for name, suite in suites for label in args.encodings}
    lm_keys = {label: _lm_key(args, label) for label in args.lm_encodings}
    units = []
    for seed in seeds:
        for name, suite in suites:
            for label in args.encodings:
                units.append((f"task/{name}/{label}/{seed}", keys[name, label],
                              {"kind": "task", "suite": suite, "task": name, "encoding": label, "seed": seed}))
        for label in args.lm_encodings:
            units.append((f"lm/{label}/{seed}", lm_keys[label], {"kind": "lm", "encoding": label, "seed": seed}))
    return units


def _scored(args: argparse.Namespace, spec: dict) -> list[str]:
    """The scores a unit's line must hold: its task's splits, or the LM's scoring lengths."""
    if spec["kind"] == "task":
        return [s.label for s in spec["suite"].splits]
    return [str(n) for n in args.lm_eval_lens]


def execute(args: argparse.Namespace, log: UnitLog | None, *, say=print) -> tuple[list[dict], bool]:
    """Run the units not yet in ``log`` (all of them without one), appending each as it finishes;
    stop after ``--max-units`` new ones. Returns the results of this configuration's units (done
    before and now, in plan order) and whether every unit is in."""
    plan = _plan(args)
    planned = {uid: key for uid, key, _ in plan}
    done: dict[str, dict] = {}
    if log is not None:
        needed = {uid: _scored(args, spec) for uid, _, spec in plan}
        for index, item in enumerate(log.lines):  # the last line of a unit wins
            if planned.get(item["unit"]) == item["config"]:
                problem = check_planned(item, needed[item["unit"]])
                if problem is not None:  # a line the report would read a missing score from
                    raise log.refuse(index, problem)
                done[item["unit"]] = item
        others = sum(1 for item in log.lines if planned.get(item["unit"]) != item["config"])
        if others:
            say(f"note: {others} line(s) of {log.path} belong to another configuration or selection; not used")
    todo = [u for u in plan if u[0] not in done]
    if done and todo:
        say(f"resuming: {len(done)} of {len(plan)} units already in {log.path}")
    if args.max_units is not None and len(todo) > args.max_units:
        say(f"stopping after {args.max_units} new units (--max-units {args.max_units}); {len(todo) - args.max_units} "
            "left: run the same command again to continue")
        todo = todo[:args.max_units]

    def finish(uid: str, key: str, spec: dict, result: dict, seconds: float) -> None:
        item = {"unit": uid, "config": key, "kind": spec["kind"], "encoding": spec["encoding"], "seed": spec["seed"],
                **({"task": spec["task"]} if spec["kind"] == "task" else {}), **result}
        if log is not None:
            log.append(item)
        done[uid] = item
        if not args.no_progress:
            print(f"[{len(done)}/{len(plan)}] {uid}: {seconds:.1f} s", file=sys.stderr, flush=True)

    if args.jobs == 1 or len(todo) <= 1:
        for uid, key, spec in todo:
            t0 = time.perf_counter()
            finish(uid, key, spec, run_unit(args, spec), time.perf_counter() - t0)
    else:
        _run_in_workers(args, todo, finish)
    results = [done[uid] for uid, _, _ in plan if uid in done]
    return results, len(results) == len(plan)


# ---------------------------------------------------------------------------------------------
# report


def settings_text(args: argparse.Namespace) -> str:
    """The run's settings: per task, what the papers used and what runs here; and the encodings'
    settings scaled to the training length (none under ``--scale uniform``)."""
    headers, body = task_rows(args.scale, args.settings)
    text = f"settings (--scale {args.scale})\n" + format_table(headers, body)
    if args.scale == "uniform":
        return text + "\n(encodings at their registry defaults: no setting scaled to the training length)"
    lengths = {name: args.suites[name].max_total_length() for name in args.tasks}
    if args.lm_encodings:
        lengths = {"byte LM": args.lm_train_len, **lengths}
    headers, body = settings_rows(lengths)
    return text + "\n\nencodings at their papers' settings scaled to the training length\n" + format_table(headers, body)


def _config(args: argparse.Namespace) -> dict:
    keys = ("encodings", "tasks", "lm_encodings", "full", "scale", "seeds", "seed", "eval_examples", "lm_steps",
            "lm_batch_size", "lm_train_len", "lm_eval_lens", "eval_tokens", "lm_model")
    return {**{k: getattr(args, k) for k in keys}, "settings": {n: s.key() for n, s in args.settings.items()}}


def run(args: argparse.Namespace) -> int:
    try:
        _resolve(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
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


__all__ = ["DEFAULT_ENCODINGS", "DEFAULT_TASKS", "ENCODINGS", "add_arguments", "execute", "run", "settings_text"]
