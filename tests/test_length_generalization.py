"""The length-generalisation tasks against hand-worked instances, the claim rule on synthetic
numbers, resuming a killed run, and a tiny ``posenc bench length-generalization``."""

from __future__ import annotations

import json

import pytest
import torch

from posenc import cli
from posenc.cli.bench import length_train
from posenc.cli.bench.length_claims import DOES_NOT, HOLDS, NO_VERDICT, NOT_RUN, UNCLEAR, combine, decide
from posenc.cli.bench.unit_log import UnitLog
from posenc.seq.length_tasks import (
    LENGTH_TASKS, Counting, FlipFlop, ModularSum, Parity, SelectiveCopy, count_increments, flip_flop_reads,
    length_suite, selective_copy_target,
)
from posenc.seq.tasks import BOS, EOS, NUM_SPECIAL, SEP, collate


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- tasks ----------------------------------------------------------------------------------

def test_flip_flop_reads_hand_worked():
    W, I, R = FlipFlop.WRITE, FlipFlop.IGNORE, FlipFlop.READ
    # w1 i0 r? w0 i1 r? r?  -> the reads give 1, 0, 0 (ignores never change the memory)
    ops = [W, I, R, W, I, R, R]
    assert flip_flop_reads(ops, [1, 0, 0, 0, 1, 1, 1], write=W, read=R) == [1, 0, 1, 0, 1, 0, 0]
    with pytest.raises(ValueError, match="before any write"):
        flip_flop_reads([R, W], [0, 1], write=W, read=R)


def test_flip_flop_sequence_scores_exactly_the_read_bits():
    task = FlipFlop(0.5)
    for seed in range(20):
        seq, mask = task.sequence(12, _gen(seed))
        assert seq[0] == BOS and seq[-1] == EOS and len(seq) == task.max_total_length(12)
        ops, bits = seq[1:-1:2].tolist(), (seq[2:-1:2] - FlipFlop.BIT0).tolist()
        assert ops[0] == FlipFlop.WRITE and ops[-1] == FlipFlop.READ
        memory, expected = None, []
        for op, b in zip(ops, bits):
            if op == FlipFlop.WRITE:
                memory = b
            elif op == FlipFlop.READ:
                assert b == memory  # every read bit is the latest write
                expected.append(b)
        tokens, targets, m = collate([(seq, mask)])
        assert (targets[0][m[0]] - FlipFlop.BIT0).tolist() == expected


def test_flip_flop_densities():
    sparse = FlipFlop(1.0).sequence(10, _gen())[0][1:-1:2].tolist()
    assert sparse == [FlipFlop.WRITE] + [FlipFlop.IGNORE] * 8 + [FlipFlop.READ]
    dense = FlipFlop(0.0).sequence(50, _gen())[0][1:-1:2].tolist()
    assert FlipFlop.IGNORE not in dense
    with pytest.raises(ValueError, match="length must be >= 2"):
        FlipFlop().sequence(1, _gen())
    with pytest.raises(ValueError, match="p_ignore"):
        FlipFlop(1.5)


def test_selective_copy_hand_worked_and_generated():
    b = 5
    assert selective_copy_target([b, 7, b, 9, b, 7], blank=b) == [7, 9, 7]
    for ratio in (0.5, 1.0, 2.0):
        task = SelectiveCopy(num_tokens=6, blank_ratio=ratio)
        seq, sep = task.sequence(6, _gen(3))
        question, answer = seq[1:sep].tolist(), seq[sep + 1:-1].tolist()
        assert question.count(task.BLANK) == round(ratio * 6) and len(question) == 6 + round(ratio * 6)
        assert answer == [t for t in question if t != task.BLANK] and len(answer) == 6
        assert len(seq) == task.max_total_length(6)


def test_counting_hand_worked_and_generated():
    assert count_increments([0, None, 1, 0, 0, None], 0) == 3
    assert count_increments([None, None], 1) == 0
    task = Counting(num_variables=3, max_count=4)
    seen = set()
    for seed in range(40):
        seq, where = task.sequence(10, _gen(seed))
        toks = seq.tolist()
        assert toks[0] == BOS and toks[-1] == EOS and toks[-4] == SEP
        query, answer = toks[-3], toks[-2] - NUM_SPECIAL
        body, stmts, k = toks[1:-4], 0, 0
        count = 0
        while k < len(body):  # parse the statements back: "v ++" or "pass"
            if body[k] == task.PASS:
                k += 1
            else:
                assert task.VAR0 <= body[k] < task.INC and body[k + 1] == task.INC
                count += body[k] == query
                k += 2
            stmts += 1
        assert stmts == 10 and answer == count <= 4
        seen.add(answer)
        _, targets, m = collate([(seq, where)])
        assert targets[0][m[0]].tolist() == [NUM_SPECIAL + count, EOS]
    assert seen == set(range(5))  # every count in [0, max_count] occurs


@pytest.mark.parametrize("task, modulus", [(Parity(), 2), (ModularSum(), 10)])
def test_parity_and_sum(task, modulus):
    for seed in range(10):
        seq, sep = task.sequence(7, _gen(seed))
        values = [t - NUM_SPECIAL for t in seq[1:sep].tolist()]
        assert len(values) == 7 and seq[sep] == SEP
        assert seq[sep + 1] - NUM_SPECIAL == sum(values) % modulus


def test_hand_worked_sums():
    # 1 0 1 1 -> parity 1; 9 + 8 + 7 = 24 -> 4: through the same path the generator uses
    bits, digits = [1, 0, 1, 1], [9, 8, 7]
    assert sum(bits) % 2 == 1 and sum(digits) % 10 == 4
    g = _gen(11)
    seq, sep = Parity().sequence(4, g)
    assert (seq[sep + 1] - NUM_SPECIAL) == sum((seq[1:sep] - NUM_SPECIAL).tolist()) % 2


def test_suites_test_at_two_and_four_times():
    for name in LENGTH_TASKS:
        suite = length_suite(name)
        sizes = [s.size for s in suite.splits if not s.label.startswith(("sparse", "dense"))]
        assert sizes == [suite.train_max, 2 * suite.train_max, 4 * suite.train_max]
        assert [s.ood for s in suite.splits][0] is False and all(s.ood for s in suite.splits[1:])
    labels = [s.label for s in length_suite("flipflop", 4).splits]
    assert labels == ["@4", "@8", "@16", "sparse@4", "dense@4"]
    assert length_suite("flipflop").splits[3].task.p_ignore == 0.98
    with pytest.raises(ValueError, match="task must be one of"):
        length_suite("lego")
    with pytest.raises(ValueError, match="train_len"):
        length_suite("flipflop", 1)


# --- claim rule -----------------------------------------------------------------------------

def test_decide_on_synthetic_numbers():
    high, low = [0.90, 0.92, 0.88], [0.50, 0.52, 0.48]
    assert decide(high, low, margin=0.02) == HOLDS
    assert decide(low, high, margin=0.02) == DOES_NOT
    assert decide([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], margin=0.02) == DOES_NOT  # equal: no advantage
    assert decide([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], margin=-0.02) == HOLDS  # ... but at least as good
    assert decide([0.2, 0.9, 0.5], [0.3, 0.7, 0.4], margin=0.02) == UNCLEAR  # seeds disagree
    assert decide([0.9], [0.1], margin=0.02) == UNCLEAR  # one seed: no spread to judge by
    assert decide([0.95, 0.96, 0.97], 0.9, margin=0.0) == HOLDS
    assert decide([0.5, 0.6, 0.55], 0.9, margin=0.0) == DOES_NOT
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, UNCLEAR]) == UNCLEAR
    assert combine([UNCLEAR, DOES_NOT]) == DOES_NOT and combine([]) == NOT_RUN


# --- bench: resume and end to end ---------------------------------------------------------

TINY = ["--tasks", "copy,flipflop", "--encodings", "nope,rope", "--seeds", "2", "--steps", "2", "--dim", "16",
        "--depth", "1", "--heads", "2", "--batch-size", "4", "--eval-examples", "4", "--train-len", "2",
        "--lm-encodings", "nope", "--lm-steps", "2", "--lm-batch-size", "2", "--lm-train-len", "16",
        "--lm-eval-lens", "16,32", "--eval-tokens", "64", "--no-progress"]
TOTAL = 2 * 2 * 2 + 2


def _bench(out, *extra):
    return cli.main(["bench", "length-generalization", *TINY, "--out", str(out), *extra])


def _scores(out):
    data = json.loads((out / "length_generalization.json").read_text())
    tasks = {t: {e: r["exact_match"] for e, r in v["encodings"].items()} for t, v in data["tasks"].items()}
    lm = {e: r["bpb"] for e, r in data["lm"]["encodings"].items()}
    return data, tasks, lm


def test_end_to_end_writes_tables_json_heat_map_and_claims(tmp_path, capsys):
    out = tmp_path / "run"
    assert _bench(out) == 0
    printed = capsys.readouterr().out
    data, tasks, lm = _scores(out)
    assert data["complete"] and data["units"] == TOTAL
    assert set(tasks) == {"copy", "flipflop"} and set(tasks["flipflop"]["rope"]) == {"@2", "@4", "@8", "sparse@2",
                                                                                      "dense@2"}
    assert all(0 <= s["mean"] <= 1 for s in tasks["copy"]["nope"].values())
    assert set(lm["nope"]) == {"16", "32"}
    assert [c["key"] for c in data["claims"]] == ["nope", "cope", "flat", "fire", "cape"]
    assert all(c["verdict"] in (HOLDS, DOES_NOT, UNCLEAR, NOT_RUN, NO_VERDICT) for c in data["claims"])
    text = (out / "length_generalization.txt").read_text()
    assert "task flipflop" in text and "byte LM" in text and "claims" in text and "task copy" in printed
    assert (out / "length_generalization.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((out / "units.jsonl").read_text().splitlines()) == TOTAL


def test_a_killed_run_continues_without_redoing_units(tmp_path, monkeypatch, capsys):
    whole = tmp_path / "whole"
    assert _bench(whole) == 0
    _, tasks_whole, lm_whole = _scores(whole)

    # 1. stopped on purpose after 3 units
    out = tmp_path / "pieces"
    assert _bench(out, "--max-units", "3") == 0
    first = (out / "units.jsonl").read_text().splitlines()
    assert len(first) == 3 and not json.loads((out / "length_generalization.json").read_text())["complete"]
    assert "PARTIAL" in (out / "length_generalization.txt").read_text()

    # 2. killed: the next unit raises after two more, and a half-written line is left behind
    real, real_lm, calls = length_train.run_task_unit, length_train.run_lm_unit, []

    def dying(run):  # task and LM units alternate by seed: count both
        def unit(*a, **k):
            if len(calls) == 2:
                raise KeyboardInterrupt
            calls.append(1)
            return run(*a, **k)
        return unit

    monkeypatch.setattr(length_train, "run_task_unit", dying(real))
    monkeypatch.setattr(length_train, "run_lm_unit", dying(real_lm))
    assert _bench(out) == 130  # Ctrl-C: the command line says "interrupted"
    partial = '{"unit": "task/copy/rope/1", "conf'
    with open(out / "units.jsonl", "a") as f:
        f.write(partial)
    log = UnitLog(out / "units.jsonl").load()
    assert len(log.lines) == 5 and log.dropped == 1
    assert (out / "units.jsonl").read_text().endswith("}\n")  # the partial line is gone from the file
    with open(out / "units.jsonl", "a") as f:
        f.write(partial)  # again, for the bench to find

    # 3. the rerun does only the rest
    ran = []
    monkeypatch.setattr(length_train, "run_task_unit", lambda *a, **k: ran.append(a[1].name) or real(*a, **k))
    monkeypatch.setattr(length_train, "run_lm_unit", real_lm)
    capsys.readouterr()
    assert _bench(out) == 0
    assert "dropped 1 unreadable line" in capsys.readouterr().out
    lines = (out / "units.jsonl").read_text().splitlines()
    assert lines[:3] == first and len(lines) == TOTAL
    assert len({json.loads(line)["unit"] for line in lines}) == TOTAL  # nothing done twice
    finished_tasks = sum(1 for line in log.lines if line["kind"] == "task")
    assert len(ran) == 8 - finished_tasks  # only the task units not among the 5 finished ones
    data, tasks, lm = _scores(out)
    assert data["complete"] and tasks == tasks_whole and lm == lm_whole


def test_max_units_0_rewrites_the_report_of_a_run_in_progress_without_training(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert _bench(out, "--max-units", "3") == 0
    log = (out / "units.jsonl").read_text()
    (out / "length_generalization.txt").unlink()

    def no_training(*a, **k):
        raise AssertionError("--max-units 0 trained a unit")

    monkeypatch.setattr(length_train, "run_task_unit", no_training)
    monkeypatch.setattr(length_train, "run_lm_unit", no_training)
    assert _bench(out, "--max-units", "0") == 0
    assert (out / "units.jsonl").read_text() == log  # read, not written
    assert "PARTIAL" in (out / "length_generalization.txt").read_text()
    assert "no unit trained; the report is rewritten from 3 of 10 units" in capsys.readouterr().out
    for argv, why in [([], "no --out was given"), (["--out", str(tmp_path / "empty")], "units.jsonl does not exist")]:
        assert cli.main(["bench", "length-generalization", *TINY, "--max-units", "0", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert "--max-units 0 rewrites the report" in err and why in err and len(err.splitlines()) == 1


def test_another_configuration_is_not_reused(tmp_path, capsys):
    out = tmp_path / "run"
    assert _bench(out, "--max-units", "2") == 0
    assert _bench(out, "--max-units", "1", "--eval-examples", "5") == 0
    printed = capsys.readouterr().out
    assert "belong to another configuration" in printed
    assert len((out / "units.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("argv, needle", [
    (["--encodings", "nope,bogus"], "--encodings: unknown encoding 'bogus'"),
    (["--tasks", "copy,copy"], "--tasks: a name is repeated"),
    (["--tasks", "flipflop", "--train-len", "1"], "--train-len 1"),
    (["--dim", "10", "--heads", "3"], "--dim (10) must be divisible by --heads (3)"),
    (["--lm-eval-lens", "10000000"], "--lm-eval-lens 10000000"),
    (["--jobs", "0"], "--jobs"),
])
def test_bad_input_exits_2_with_one_line(argv, needle, capsys):
    assert cli.main(["bench", "length-generalization", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_jobs_give_the_same_units_as_one_process(tmp_path, monkeypatch, capsys):
    threads = torch.get_num_threads()
    # one thread for the serial run and each worker: the same arithmetic. Stated to the command, whose
    # thread policy otherwise takes both cores of a quiet machine (and a worker takes 1 of --jobs)
    try:
        assert _bench(tmp_path / "serial", "--threads", "1") == 0
        assert _bench(tmp_path / "jobs", "--jobs", "2", "--max-units", "7", "--threads", "1") == 0
        assert len((tmp_path / "jobs" / "units.jsonl").read_text().splitlines()) == 7
        assert _bench(tmp_path / "jobs", "--jobs", "3", "--threads", "1") == 0  # and resumes like a serial run
    finally:
        torch.set_num_threads(threads)
    serial = {json.loads(line)["unit"]: json.loads(line) for line in (tmp_path / "serial" / "units.jsonl").open()}
    lines = [json.loads(line) for line in (tmp_path / "jobs" / "units.jsonl").open()]
    assert len(lines) == TOTAL and {item["unit"] for item in lines} == set(serial)
    for item in lines:
        mine = serial[item["unit"]]
        assert item["train_loss"] == mine["train_loss"]
        assert item.get("exact_match") == mine.get("exact_match") and item.get("bpb") == mine.get("bpb")
    assert _scores(tmp_path / "jobs")[1:] == _scores(tmp_path / "serial")[1:]
