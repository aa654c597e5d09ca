"""The claims bench judges only what its models learned: the rule of length_claims on made-up logs."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from posenc.cli.bench.length_claims import (
    CLAIMS, DOES_NOT, HOLDS, LEARNED_BPB, LEARNED_EXACT, NO_VERDICT, NOT_LEARNED, NOT_RUN, RULE, UNCLEAR, Claim, Part,
    combine, judge, judge_part,
)
from posenc.cli.bench.length_report import aggregate, in_distribution_rows, render
from posenc.cli.bench.length_settings import CPU
from posenc.seq.length_tasks import length_suite

SEEDS = (0, 1, 2)
WOBBLE = (-0.01, 0.0, 0.01)  # a small spread over seeds, so that clear differences clear two standard errors


def _task_lines(task: str, scores: dict[str, tuple[float, float]], seeds=SEEDS) -> list[dict]:
    """Unit-log lines of ``task``: encoding -> (exact match at the training size, at every other split)."""
    suite = length_suite(task)
    lines = []
    for enc, (inside, outside) in scores.items():
        for seed in seeds:
            w = WOBBLE[seed % 3]
            em = {s.label: min(1.0, max(0.0, (outside if s.ood else inside) + w)) for s in suite.splits}
            lines.append({"unit": f"task/{task}/{enc}/{seed}", "kind": "task", "task": task, "encoding": enc,
                          "seed": seed, "exact_match": em, "train_s": 1.0})
    return lines


def _lm_lines(scores: dict[str, tuple[float, float]]) -> list[dict]:
    """Byte-LM lines: encoding -> (bits per byte at 128, at 512)."""
    return [{"unit": f"lm/{enc}/{seed}", "kind": "lm", "encoding": enc, "seed": seed, "train_s": 1.0,
             "bpb": {"128": short + WOBBLE[seed], "256": (short + long) / 2 + WOBBLE[seed], "512": long + WOBBLE[seed]}}
            for enc, (short, long) in scores.items() for seed in SEEDS]


def _args(tasks, encodings, lm_encodings=()) -> argparse.Namespace:
    return argparse.Namespace(
        tasks=list(tasks), encodings=list(encodings), lm_encodings=list(lm_encodings), lm_eval_lens=[128, 256, 512],
        lm_train_len=128, scale="cpu", settings=CPU, suites={t: length_suite(t) for t in tasks})


def _claim(summary, key):
    return next(c for c in summary["claims"] if c["key"] == key)


NOPE_CLAIM = ("nope", "t5", "alibi", "rope", "sinusoidal", "learned")


def test_learned_tasks_are_judged_and_the_claim_holds():
    good = {"nope": (1.0, 0.8), "t5": (1.0, 0.8), "alibi": (1.0, 0.3), "rope": (0.98, 0.2), "sinusoidal": (0.95, 0.1),
            "learned": (0.97, 0.1)}
    summary = aggregate(_args(["copy"], NOPE_CLAIM), _task_lines("copy", good))
    row = _claim(summary, "nope")
    assert row["verdict"] == HOLDS and len(row["numbers"]) == 5
    assert "not learned" not in " ".join(row["numbers"])


def test_a_task_not_learned_by_an_encoding_of_a_part_is_left_out_of_that_part():
    copy = {"nope": (1.0, 0.8), "t5": (1.0, 0.8), "alibi": (1.0, 0.3), "rope": (1.0, 0.2),
            "sinusoidal": (1.0, 0.1), "learned": (1.0, 0.1)}
    # on sort T5 is at 0.6 in distribution: its extrapolation there (0.0) must not count against it
    sort = {**copy, "t5": (0.6, 0.0), "nope": (0.95, 0.9)}
    summary = aggregate(_args(["copy", "sort"], NOPE_CLAIM),
                        _task_lines("copy", copy) + _task_lines("sort", sort))
    row = _claim(summary, "nope")
    first = row["numbers"][0]  # nope >= t5: judged on copy alone (0.8 against 0.8)
    assert first.startswith("nope 0.800±0.010 >= t5 0.800±0.010 on copy (not learned in distribution: sort: nope 0.95,"
                            " t5 0.60)")
    assert first.endswith(": holds")
    assert row["verdict"] == HOLDS
    # had sort counted, t5's mean over the two tasks would be 0.40 against nope's 0.85
    kept = judge_part(Part("nope", ">=", "t5"), {"sort": {"nope": {0: (1.0, 0.85)}, "t5": {0: (1.0, 0.4)}}}, "ood_nope")
    assert kept[1].startswith("nope 0.850 >= t5 0.400")


def test_nothing_learned_gives_no_verdict_with_the_scores_beside_it():
    bad = {enc: (0.3, 0.0) for enc in NOPE_CLAIM}
    summary = aggregate(_args(["addition"], NOPE_CLAIM), _task_lines("addition", bad))
    row = _claim(summary, "nope")
    assert row["verdict"] == NO_VERDICT
    assert all(NOT_LEARNED in n for n in row["numbers"])
    assert row["numbers"][0] == ("nope >= t5: not learned in distribution (exact match at the training size: "
                                 "addition: nope 0.30, t5 0.30)")


def test_other_parts_decide_a_claim_with_a_part_not_learned():
    # CoPE is judged on flip-flop (learned by all) and loses to RoPE there: the claim does not hold
    # whatever the part on a task nobody learned would have said
    flip = {"cope": (1.0, 0.5), "rope": (1.0, 0.9), "sinusoidal": (0.4, 0.1), "learned": (1.0, 0.2)}
    summary = aggregate(_args(["flipflop"], flip), _task_lines("flipflop", flip))
    row = _claim(summary, "cope")
    verdicts = [n.rsplit(": ", 1)[1] if NOT_LEARNED not in n else NOT_LEARNED for n in row["numbers"]]
    assert verdicts == [DOES_NOT, NOT_LEARNED, HOLDS, DOES_NOT]  # > 0.9; > sinusoidal; > learned; > rope
    assert row["verdict"] == DOES_NOT


def test_the_byte_lm_counts_as_learned_below_its_threshold():
    lines = _lm_lines({"fire": (2.2, 2.25), "kerple": (2.2, 2.2), "rope": (2.1, 4.0), "sinusoidal": (2.4, 4.5)})
    summary = aggregate(_args([], [], ["fire", "kerple", "rope", "sinusoidal"]), lines)
    assert _claim(summary, "flat")["verdict"] == HOLDS
    lines = _lm_lines({"fire": (LEARNED_BPB + 0.5, LEARNED_BPB + 0.5), "kerple": (2.2, 2.2), "rope": (2.1, 4.0),
                       "sinusoidal": (2.4, 4.5)})
    row = _claim(aggregate(_args([], [], ["fire", "kerple", "rope", "sinusoidal"]), lines), "flat")
    assert row["verdict"] == NO_VERDICT  # KERPLE's parts hold; FIRE's are not learned
    assert row["numbers"][0] == ("fire < 0.1: not learned in distribution (bits per byte at the training length: "
                                 "byte LM: fire 3.00)")


def test_seeds_counted_are_those_on_every_task_of_the_part():
    copy = {"nope": (1.0, 0.8), "t5": (1.0, 0.8)}
    lines = _task_lines("copy", copy) + _task_lines("reverse", copy, seeds=(0, 1))  # seed 2 not run on reverse yet
    summary = aggregate(_args(["copy", "reverse"], ["nope", "t5"]), lines)
    evidence = summary["claim_evidence"]["ood_nope"]
    assert set(evidence["copy"]["nope"]) == {"0", "1", "2"} and set(evidence["reverse"]["nope"]) == {"0", "1"}
    first = _claim(summary, "nope")["numbers"][0]
    assert first.startswith("nope 0.795±0.007 >= t5 0.795±0.007")  # seeds 0 and 1: (0.79, 0.80) each


def test_combine_and_not_run():
    assert combine([HOLDS, NOT_LEARNED]) == NO_VERDICT and combine([NOT_LEARNED, DOES_NOT]) == DOES_NOT
    assert combine([UNCLEAR, NOT_LEARNED]) == NO_VERDICT and combine([NOT_LEARNED]) == NO_VERDICT
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, UNCLEAR]) == UNCLEAR and combine([]) == NOT_RUN
    claims = (Claim("c", "paper", "A beats B", "lm_long", (Part("a", ">", "b"), Part("a", ">", "zzz"))),
              Claim("d", "paper", "nothing run", "lm_long", (Part("x", ">", "y"),)))
    item = {"a": {0: (2.0, 2.0), 1: (2.0, 2.01), 2: (2.0, 1.99)}, "b": {0: (2.0, 3.0), 1: (2.0, 3.1), 2: (2.0, 2.9)}}
    rows = judge(claims, {"lm_long": {"byte LM": item}})
    assert rows[0]["verdict"] == HOLDS and len(rows[0]["numbers"]) == 1 and rows[1]["verdict"] == NOT_RUN
    with pytest.raises(ValueError, match="relation must be"):
        judge_part(Part("a", "<", "b"), {"byte LM": item}, "lm_long")


def test_the_rule_is_printed_with_the_table_and_the_in_distribution_table():
    copy = {"nope": (0.6, 0.0), "t5": (0.95, 0.0), "rope": (1.0, 0.0)}
    summary = aggregate(_args(["copy"], copy), _task_lines("copy", copy))
    text = render(summary)
    assert RULE in text and f">= {LEARNED_EXACT}" in RULE and f"<= {LEARNED_BPB}" in RULE
    headers, rows = in_distribution_rows(summary)
    assert rows == [["copy", "@8", "rope 1.00±0.01", "2 of 3", "yes"]]
    assert "in distribution: exact match at the training size" in text
    args = _args(["copy"], copy)
    args.settings = {"copy": dataclasses.replace(CPU["copy"], cpu_learned=False)}
    summary = aggregate(args, _task_lines("copy", copy))
    assert in_distribution_rows(summary)[1][0][-1] == "not learned in budget: for a device"
    assert "task copy: exact match" in render(summary) and "[not learned on CPU in budget" in render(summary)


def test_every_claim_names_encodings_the_bench_runs():
    from posenc.cli.bench.length_generalization import ENCODINGS

    for claim in CLAIMS:
        for part in claim.parts:
            assert part.left in ENCODINGS and (isinstance(part.right, float) or part.right in ENCODINGS)
