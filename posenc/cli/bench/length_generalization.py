"""``posenc bench length-generalization``: every causal sequence encoding on the length-generalisation
tasks of the NoPE and CoPE papers, plus the byte LM trained short and scored long, and a table of
which of the papers' claims hold at this scale.

::

    posenc bench length-generalization --out runs/lengen            # the default subset (about 9 min on 2 quiet cores)
    posenc bench length-generalization --full --out runs/lengen-full # everything; rerun to continue after a kill
    posenc bench length-generalization --tasks flipflop,counting --encodings nope,rope,cope --seeds 5

**Tasks** (:mod:`posenc.seq.length_tasks`): one small causal LM per (encoding, task, seed) learns
the task at sizes up to the task's training size (``--train-len`` overrides it for every task)
and is scored by exact match (every answer token right under teacher forcing, which is when
greedy decoding writes the whole answer) on ``--eval-examples`` fresh instances at 1x, 2x and
4x that size, and on the density variants of flip-flop (sparse, dense) and selective copy. The
splits other than 1x are out of distribution ("OOD"); a task's OOD score is their mean.

**Long-context LM rows**: one byte LM per (encoding, seed) in ``--lm-encodings`` trained on
pydoc text at ``--lm-train-len`` (128) bytes and scored in bits per byte on the held-out tail at
``--lm-eval-lens`` (as in ``posenc bench extrapolation``, through the same helpers).

**Claims**: :mod:`posenc.cli.bench.length_claims` decides each paper claim on the seeds (mean
difference beyond two standard errors and a margin; ``unclear`` with fewer than two seeds).

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

Outputs (with ``--out``): ``length_generalization.txt`` (a table per task, the LM table, the
claims), ``length_generalization.json``, ``length_generalization.png`` (heat map: encodings x
tasks, mean OOD exact match) and ``units.jsonl``.
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
from ...training.report import format_table, write_atomic, write_json
from .length_claims import CLAIMS, judge, mean_sd
from .unit_log import UnitLog, config_key

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
}
TABLE_ENCODINGS = frozenset({"learned", "tupe"})  # built with rows up to the longest test sequence

DEFAULT_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi", "t5", "cope")
DEFAULT_TASKS = ("copy", "summation", "flipflop", "counting")
# training budgets: (task steps, LM steps, LM batch) by default and with --full
DEFAULT_BUDGET, FULL_BUDGET = (250, 200, 16), (1000, 1000, 32)
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
        "papers' claims on the seeds. Defaults (about 9 minutes on 2 quiet CPU cores): encodings "
        f"{','.join(DEFAULT_ENCODINGS)}; tasks {','.join(DEFAULT_TASKS)}; LM rows {','.join(DEFAULT_LM_ENCODINGS)}. "
        f"--full: every encoding ({','.join(ENCODINGS)}), every task ({','.join(LENGTH_TASKS)}), LM rows "
        f"{','.join(FULL_LM_ENCODINGS)} to 2048 bytes, and 1000 training steps per model."
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
    parser.add_argument("--train-len", type=positive_int, default=None,
                        help="largest training size of every task (default: each task's own, e.g. 8 items, 16 "
                             "flip-flop instructions)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="training steps per task model (default 250; --full 1000)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="task batch (default 32)")
    parser.add_argument("--lr", type=positive_float, default=3e-3, help="learning rate (default: %(default)s)")
    parser.add_argument("--dim", type=positive_int, default=64, help="model width (default: %(default)s)")
    parser.add_argument("--depth", type=positive_int, default=2, help="layers (default: %(default)s)")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads (default: %(default)s)")
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
    args.steps = args.steps or budget[0]
    args.lm_steps = args.lm_steps or budget[1]
    args.lm_batch_size = args.lm_batch_size or budget[2]
    if args.lm_eval_lens is None:
        args.lm_eval_lens = list(FULL_LM_EVAL_LENS if full else DEFAULT_LM_EVAL_LENS)
    if args.dim % args.heads:
        raise ValueError(f"--dim ({args.dim}) must be divisible by --heads ({args.heads})")
    if args.train_len is not None:
        for name in args.tasks:
            try:
                length_suite(name, args.train_len)
            except ValueError as exc:
                raise ValueError(f"--train-len {args.train_len}: {exc}") from None
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out: {args.out!r} exists and is not a directory")
    if args.lm_encodings:
        _check_lm_memory(args)


def _check_lm_memory(args: argparse.Namespace) -> None:
    """Refuse LM scoring lengths whose attention scores (CAPE: its MLP's input and hidden layer too)
    could not fit, before anything trains."""
    from ...common.checks import check_allocation

    device = "cpu" if args.device == "auto" and not torch.cuda.is_available() else (
        "cuda" if args.device == "auto" else args.device)
    n = max(args.lm_eval_lens)
    windows = max(1, 4096 // n)  # the slice bits_per_byte_at scores at once
    check_allocation(f"--lm-eval-lens {n}: attention scores", (windows, args.heads, n, n), torch.float32, device)
    if any(ENCODINGS[e][0] == "cape" for e in args.lm_encodings):
        check_allocation(f"--lm-eval-lens {n}: CAPE's MLP over [scores; bias]", (windows, n, n, 2 * args.heads + 32),
                         torch.float32, device)


# ---------------------------------------------------------------------------------------------
# units


def _task_key(args: argparse.Namespace, suite) -> str:
    return config_key({
        "kind": "task", "task": suite.name, "train": [suite.train_min, suite.train_max],
        "splits": [s.label for s in suite.splits], "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
        "dim": args.dim, "depth": args.depth, "heads": args.heads, "eval_examples": args.eval_examples,
    })


def _lm_key(args: argparse.Namespace) -> str:
    return config_key({
        "kind": "lm", "train_len": args.lm_train_len, "eval_lens": sorted(args.lm_eval_lens), "steps": args.lm_steps,
        "batch_size": args.lm_batch_size, "lr": args.lr, "dim": args.dim, "depth": args.depth, "heads": args.heads,
        "eval_tokens": args.eval_tokens,
    })


def _model(args: argparse.Namespace, label: str, vocab: int, max_len: int):
    from ...seq.models import CausalLM

    name, options = ENCODINGS[label]
    return CausalLM(vocab, args.dim, args.depth, args.heads, encoding=name, encoding_options=options or None,
                    max_len=max_len)


def run_task_unit(args: argparse.Namespace, suite, label: str, seed: int) -> dict:
    """Train one model on ``suite``'s task and score every split -> the unit's result."""
    from ...seq.evaluation import task_eval_set, task_exact_match
    from ...seq.length_tasks import eval_seed
    from ...seq.tasks import train_on_task

    torch.manual_seed(seed)
    max_len = suite.max_total_length(tested=label in TABLE_ENCODINGS)
    model = _model(args, label, suite.vocab_size, max_len)
    t0 = time.perf_counter()
    loss = train_on_task(model, suite.train_task, suite.train_max, min_length=suite.train_min, steps=args.steps,
                         batch_size=args.batch_size, lr=args.lr, seed=seed, device=args.device, progress=False)
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
    model = _model(args, label, 256, max_len)
    t0 = time.perf_counter()
    loss = train_on_bytes(model, train_text, args.lm_train_len, steps=args.lm_steps, batch_size=args.lm_batch_size,
                          lr=args.lr, seed=seed, device=args.device, progress=False)
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
    from ...seq.length_tasks import length_suite

    seeds = [args.seed + k for k in range(args.seeds)]
    suites = [(name, length_suite(name, args.train_len)) for name in args.tasks]
    keys = {name: _task_key(args, suite) for name, suite in suites}
    lm_key = _lm_key(args)
    units = []
    for seed in seeds:
        for name, suite in suites:
            for label in args.encodings:
                units.append((f"task/{name}/{label}/{seed}", keys[name], {"kind": "task", "suite": suite, "task": name,
                                                                        "encoding": label, "seed": seed}))
        for label in args.lm_encodings:
            units.append((f"lm/{label}/{seed}", lm_key, {"kind": "lm", "encoding": label, "seed": seed}))
    return units


def execute(args: argparse.Namespace, log: UnitLog | None, *, say=print) -> tuple[list[dict], bool]:
    """Run the units not yet in ``log`` (all of them without one), appending each as it finishes;
    stop after ``--max-units`` new ones. Returns the results of this configuration's units (done
    before and now, in plan order) and whether every unit is in."""
    plan = _plan(args)
    planned = {uid: key for uid, key, _ in plan}
    done: dict[str, dict] = {}
    if log is not None:
        for item in log.lines:  # the last line of a unit wins
            if planned.get(item["unit"]) == item["config"]:
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
# aggregation and reports


def _stat(values: list[float]) -> dict:
    m, sd = mean_sd(values)
    return {"mean": m, "sd": sd, "values": values}


def aggregate(args: argparse.Namespace, results: list[dict]) -> dict:
    """Means and spreads over seeds, the per-seed scores the claims use, and the claims."""
    from ...seq.length_tasks import length_suite

    tasks: dict[str, dict] = {}
    ood_by_family: dict[str, dict[str, dict[int, list[float]]]] = {}
    for name in args.tasks:
        suite = length_suite(name, args.train_len)
        rows = [r for r in results if r["kind"] == "task" and r["task"] == name]
        encodings = {}
        for label in args.encodings:
            mine = sorted((r for r in rows if r["encoding"] == label), key=lambda r: r["seed"])
            if not mine:
                continue
            ood_labels = [s.label for s in suite.splits if s.ood]
            per_seed_ood = [sum(r["exact_match"][lab] for lab in ood_labels) / len(ood_labels) for r in mine]
            encodings[label] = {
                "seeds": [r["seed"] for r in mine],
                "exact_match": {s.label: _stat([r["exact_match"][s.label] for r in mine]) for s in suite.splits},
                "ood": _stat(per_seed_ood), "train_s": _stat([r["train_s"] for r in mine]),
            }
            family = ood_by_family.setdefault(suite.family, {}).setdefault(label, {})
            for r, v in zip(mine, per_seed_ood):
                family.setdefault(r["seed"], []).append(v)
        tasks[name] = {"family": suite.family, "train_sizes": [suite.train_min, suite.train_max],
                       "splits": [{"label": s.label, "size": s.size, "ood": s.ood} for s in suite.splits],
                       "encodings": encodings}
    scores: dict[str, dict[str, list[float]]] = {}
    for family, by_enc in ood_by_family.items():
        ran = [n for n in args.tasks if tasks[n]["family"] == family]
        # a seed counts for a family score only when every task of the family has it
        scores[f"ood_{family}"] = {e: [sum(v) / len(v) for s, v in sorted(seeds.items()) if len(v) == len(ran)]
                                   for e, seeds in by_enc.items()}
    lm = _aggregate_lm(args, results, scores)
    claims = judge(CLAIMS, scores)
    return {"tasks": tasks, "lm": lm, "claims": claims, "claim_scores": scores}


def _aggregate_lm(args: argparse.Namespace, results: list[dict], scores: dict) -> dict:
    lens = sorted(args.lm_eval_lens)
    base = args.lm_train_len if args.lm_train_len in lens else lens[0]
    longest = lens[-1]
    encodings = {}
    growth, long_bpb = {}, {}
    for label in args.lm_encodings:
        mine = sorted((r for r in results if r["kind"] == "lm" and r["encoding"] == label), key=lambda r: r["seed"])
        if not mine:
            continue
        g = [r["bpb"][str(longest)] - r["bpb"][str(base)] for r in mine]
        encodings[label] = {"seeds": [r["seed"] for r in mine],
                            "bpb": {str(n): _stat([r["bpb"][str(n)] for r in mine]) for n in lens},
                            "growth": _stat(g), "train_s": _stat([r["train_s"] for r in mine])}
        growth[label], long_bpb[label] = g, [r["bpb"][str(longest)] for r in mine]
    scores["lm_growth"], scores["lm_long"] = growth, long_bpb
    return {"train_len": args.lm_train_len, "eval_lens": lens, "base_len": base, "longest": longest,
            "encodings": encodings}


def _cell(stat: dict | None) -> str:
    if stat is None:
        return "-"
    return f"{stat['mean']:.2f}" if stat["sd"] is None else f"{stat['mean']:.2f}±{stat['sd']:.2f}"


def render(summary: dict) -> str:
    """The text report: a table per task, the LM table and the claims table."""
    parts = []
    for name, task in summary["tasks"].items():
        labels = [s["label"] for s in task["splits"]]
        headers = ["encoding", *labels, "OOD", "seeds"]
        body = [[enc, *[_cell(row["exact_match"][lab]) for lab in labels], _cell(row["ood"]), len(row["seeds"])]
                for enc, row in task["encodings"].items()]
        lo, hi = task["train_sizes"]
        parts.append(f"task {name}: exact match, mean±sd over seeds (trained at sizes {lo}..{hi}; "
                     f"OOD = mean of the splits other than @{hi})\n"
                     + format_table(headers, body, align="l" + "r" * (len(labels) + 2)))
    lm = summary["lm"]
    if lm["encodings"]:
        headers = ["encoding", *[f"@{n}" for n in lm["eval_lens"]], f"growth @{lm['longest']}-@{lm['base_len']}", "seeds"]
        body = [[enc, *[_cell(row["bpb"][str(n)]) for n in lm["eval_lens"]], _cell(row["growth"]), len(row["seeds"])]
                for enc, row in lm["encodings"].items()]
        parts.append(f"byte LM: bits per byte on held-out pydoc text (trained at {lm['train_len']} bytes; lower is "
                     "better)\n" + format_table(headers, body, align="l" + "r" * (len(lm["eval_lens"]) + 2)))
    body = [[c["paper"], c["claim"], "; ".join(c["numbers"]) or "-", c["verdict"]] for c in summary["claims"]]
    parts.append("claims (rule: mean difference beyond 2 standard errors and a margin; unclear with < 2 seeds)\n"
                 + format_table(["paper", "claim", "our numbers", "verdict"], body))
    return "\n\n".join(parts)


def plot_heat_map(summary: dict, path: Path) -> bool:
    """Encodings x tasks, mean OOD exact match; False when matplotlib is missing."""
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return False
    tasks = list(summary["tasks"])
    encodings = [e for e in ENCODINGS if any(e in summary["tasks"][t]["encodings"] for t in tasks)]
    if not tasks or not encodings:
        return False
    import numpy as np

    grid = np.full((len(encodings), len(tasks)), np.nan)
    for j, t in enumerate(tasks):
        for i, e in enumerate(encodings):
            row = summary["tasks"][t]["encodings"].get(e)
            if row is not None:
                grid[i, j] = row["ood"]["mean"]
    fig, ax = plt.subplots(figsize=(1.1 * len(tasks) + 2.5, 0.42 * len(encodings) + 1.6))
    image = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_yticks(range(len(encodings)), encodings)
    for i in range(len(encodings)):
        for j in range(len(tasks)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if grid[i, j] > 0.6 else "white")
    fig.colorbar(image, ax=ax, label="OOD exact match")
    ax.set_title("Length generalisation: out-of-distribution exact match")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _config(args: argparse.Namespace) -> dict:
    keys = ("encodings", "tasks", "lm_encodings", "full", "seeds", "seed", "train_len", "steps", "batch_size", "lr",
            "dim", "depth", "heads", "eval_examples", "lm_steps", "lm_batch_size", "lm_train_len", "lm_eval_lens", "eval_tokens")
    return {k: getattr(args, k) for k in keys}


def run(args: argparse.Namespace) -> int:
    try:
        _resolve(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    out = None if args.out is None else Path(args.out)
    log = None
    if out is not None:
        log = UnitLog(out / "units.jsonl")
        if log.path.is_symlink():
            print(f"{PROG}: error: --out: {log.path} is a symbolic link; results are never written through one",
                  file=sys.stderr)
            return 2
        log.load()
        if log.dropped:
            print(f"note: dropped {log.dropped} unreadable line(s) of {log.path} (a run killed while writing)")
    start = time.perf_counter()
    results, complete = execute(args, log)
    summary = aggregate(args, results)
    text = render(summary)
    status = "complete" if complete else "PARTIAL (rerun the same command to continue)"
    print(f"\n{text}\n\n{len(results)} units, {status}; {time.perf_counter() - start:.0f} s this run")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        header = "" if complete else "PARTIAL RUN: not every unit is in; rerun the same command to continue\n\n"
        write_atomic(out / f"{BASENAME}.txt", lambda f: f.write((header + text + "\n").encode("utf-8")))
        write_json(out / f"{BASENAME}.json", {"config": _config(args), "complete": complete, "units": len(results),
                                             **summary})
        drew = plot_heat_map(summary, out / f"{BASENAME}.png")
        print(f"written to {out}/{BASENAME}.{{txt,json{',png' if drew else ''}}} and units.jsonl")
    return 0


__all__ = ["DEFAULT_ENCODINGS", "DEFAULT_TASKS", "ENCODINGS", "add_arguments", "aggregate", "execute", "render", "run"]
