"""The work of ``posenc bench length-generalization`` (see :mod:`.length_generalization` for the
command): the task suites built, each unit's configuration key, model, training and scoring, the
plan of units (seed-major), and their run, in this process or ``--jobs`` worker processes, each
logged as it finishes. Imported once the arguments passed their checks."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

import torch

from .length_settings import ENCODINGS, TABLE_ENCODINGS, encoding_options
from .length_units import check_planned, check_repeat
from .unit_log import UnitLog, config_key


def prepare(args: argparse.Namespace) -> None:
    """Build each task's suite at its settings (``args.suites``) and refuse LM scoring lengths that
    could not fit; ValueError with one line. After :func:`.length_generalization.check`."""
    from ...seq.length_tasks import length_suite

    args.suites = {}
    for name in args.tasks:
        s = args.settings[name]
        try:
            args.suites[name] = length_suite(name, s.train_len, dict(s.options))
        except ValueError as exc:
            raise ValueError(f"--train-len {s.train_len}: {exc}") from None
    if args.lm_encodings:
        _check_lm_memory(args)


def _check_lm_memory(args: argparse.Namespace) -> None:
    """Refuse LM scoring lengths whose attention scores (CAPE: its MLP's input and hidden layer too)
    could not fit, before anything trains."""
    from ...primitives.budget import check_allocation

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
        first: dict[str, int] = {}  # unit -> the index of its first line
        for index, item in enumerate(log.lines):  # a unit's lines agree but for timings; the last one wins
            if planned.get(item["unit"]) == item["config"]:
                problem = check_planned(item, needed[item["unit"]])  # a score the report would miss
                if problem is None and item["unit"] in first:
                    earlier = first[item["unit"]]
                    problem = check_repeat(log.lines[earlier], item, log.numbers[earlier])
                if problem is not None:
                    raise log.refuse(index, problem)
                first.setdefault(item["unit"], index)
                done[item["unit"]] = item
        others = sum(1 for item in log.lines if planned.get(item["unit"]) != item["config"])
        if others:
            say(f"note: {others} line(s) of {log.path} belong to another configuration or selection; not used")
    todo = [u for u in plan if u[0] not in done]
    if done and todo:
        say(f"resuming: {len(done)} of {len(plan)} units already in {log.path}")
    if args.max_units == 0:
        say(f"--max-units 0: no unit trained; the report is rewritten from {len(done)} of {len(plan)} units")
        todo = []
    elif args.max_units is not None and len(todo) > args.max_units:
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


__all__ = ["execute", "prepare", "run_lm_unit", "run_task_unit", "run_unit"]
