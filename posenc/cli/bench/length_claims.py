"""The length-generalisation papers' claims, each decided on our seeds by one written rule.

The rule (:func:`decide`): a comparison "A beats B" holds when the mean difference over seeds
clears the margin by two standard errors, does not when it falls short of the margin by two
standard errors, and is unclear otherwise, and always with fewer than two seeds on a side (no
spread to judge by). "A at least matches B" is the same test with the margin on the other side
(``-margin``); against a fixed threshold ("CoPE solves it": exact match above 0.9) the margin is 0. A claim of several parts holds when every part holds, does not when any part does
not, and is unclear otherwise; parts whose encodings were not run are left out, and a claim
with no part left is ``not run``.

Scores (per encoding and seed): ``ood_nope`` / ``ood_cope``: exact match on the out-of-distribution
splits, averaged over the NoPE paper's tasks (copy, reverse, sort, addition, summation, parity) or
CoPE's (flip-flop, selective copy, counting) that were run; ``lm_growth``: the byte LM's bits per
byte at the longest scored length minus at the training length; ``lm_long``: bits per byte at the
longest length (lower is better for both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

Z = 2.0  # standard errors a difference must clear
MARGIN_ACCURACY = 0.02  # exact match: a difference smaller than this is no difference
MARGIN_BPB = 0.01  # bits per byte
SOLVED = 0.9  # exact match that counts as solving a task
FLAT_BPB = 0.1  # growth in bits per byte that still counts as flat

HOLDS, DOES_NOT, UNCLEAR, NOT_RUN = "holds", "does not", "unclear", "not run"


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None with one value)."""
    if not values:
        raise ValueError("mean_sd needs at least one value")
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def decide(left: Sequence[float], right: Sequence[float] | float, *, margin: float) -> str:
    """Whether ``mean(left) - mean(right) > margin``: :data:`HOLDS`, :data:`DOES_NOT` or
    :data:`UNCLEAR` (see the module docstring). A number as ``right`` is a fixed threshold with no
    error of its own."""
    if len(left) < 2 or (not isinstance(right, (int, float)) and len(right) < 2):
        return UNCLEAR
    ml, sl = mean_sd(left)
    se2 = sl ** 2 / len(left)
    if isinstance(right, (int, float)):
        mr = float(right)
    else:
        mr, sr = mean_sd(right)
        se2 += sr ** 2 / len(right)
    diff, se = ml - mr, math.sqrt(se2)
    if diff - Z * se > margin:
        return HOLDS
    if diff + Z * se < margin:
        return DOES_NOT
    return UNCLEAR


def combine(verdicts: Sequence[str]) -> str:
    """One verdict for a claim of several parts."""
    if not verdicts:
        return NOT_RUN
    if DOES_NOT in verdicts:
        return DOES_NOT
    return HOLDS if all(v == HOLDS for v in verdicts) else UNCLEAR


@dataclass(frozen=True)
class Part:
    """``left relation right`` on the claim's score: ``">"`` beats, ``">="`` at least matches; for
    a lower-is-better score "beats" means lower. ``right`` is an encoding or a fixed threshold."""

    left: str
    relation: str
    right: str | float


@dataclass(frozen=True)
class Claim:
    key: str
    paper: str
    text: str
    score: str  # ood_nope, ood_cope, lm_growth or lm_long
    parts: tuple[Part, ...]


LOWER_IS_BETTER = {"ood_nope": False, "ood_cope": False, "lm_growth": True, "lm_long": True}

CLAIMS: tuple[Claim, ...] = (
    Claim("nope", "Kazemnejad et al. 2023 (NoPE)",
          "NoPE >= T5 > ALiBi, RoPE, absolute (sinusoidal, learned) out of distribution", "ood_nope",
          (Part("nope", ">=", "t5"), Part("t5", ">", "alibi"), Part("t5", ">", "rope"), Part("t5", ">", "sinusoidal"),
           Part("t5", ">", "learned"))),
    Claim("cope", "Golovneva et al. 2024 (CoPE)",
          f"CoPE solves flip-flop, selective copy, counting (OOD >= {SOLVED}) where absolute and RoPE fail",
          "ood_cope",
          (Part("cope", ">", SOLVED), Part("cope", ">", "sinusoidal"), Part("cope", ">", "learned"),
           Part("cope", ">", "rope"))),
    Claim("flat", "Li et al. 2024 (FIRE); Chi et al. 2022 (KERPLE)",
          f"FIRE and KERPLE stay flat (growth < {FLAT_BPB} bit/byte) far beyond the training length where RoPE "
          "and sinusoidal grow", "lm_growth",
          (Part("fire", ">", FLAT_BPB), Part("kerple", ">", FLAT_BPB), Part("fire", ">", "rope"),
           Part("fire", ">", "sinusoidal"), Part("kerple", ">", "rope"), Part("kerple", ">", "sinusoidal"))),
    Claim("fire", "Li et al. 2024 (FIRE)", "FIRE at least matches ALiBi and KERPLE at the longest length", "lm_long",
          (Part("fire", ">=", "alibi"), Part("fire", ">=", "kerple"))),
    Claim("cape", "Zheng et al. 2024 (DAPE/CAPE)",
          "CAPE on top of a bias (ALiBi, KERPLE, FIRE) lowers bits per byte at the longest length", "lm_long",
          (Part("cape_alibi", ">", "alibi"), Part("cape_kerple", ">", "kerple"), Part("cape_fire", ">", "fire"))),
)


def _margin(score: str) -> float:
    return MARGIN_BPB if score.startswith("lm") else MARGIN_ACCURACY


def _fmt(values: Sequence[float]) -> str:
    m, sd = mean_sd(values)
    return f"{m:.3f}" if sd is None else f"{m:.3f}±{sd:.3f}"


def judge_part(part: Part, scores: Mapping[str, Sequence[float]], score: str) -> tuple[str, str] | None:
    """``(verdict, numbers)`` of one part, or None when an encoding of it was not run."""
    left = scores.get(part.left)
    right = part.right if isinstance(part.right, (int, float)) else scores.get(part.right)
    if not left or right is None or (not isinstance(right, (int, float)) and not right):
        return None
    if part.relation not in (">", ">="):
        raise ValueError(f"relation must be '>' or '>='; got {part.relation!r}")
    if isinstance(right, (int, float)):
        margin = 0.0  # a threshold is its own margin
    else:
        margin = _margin(score) if part.relation == ">" else -_margin(score)
    sign = -1.0 if LOWER_IS_BETTER[score] else 1.0  # lower is better: compare the negated scores
    neg_left = [sign * v for v in left]
    neg_right = sign * right if isinstance(right, (int, float)) else [sign * v for v in right]
    verdict = decide(neg_left, neg_right, margin=margin)
    shown = "<" if LOWER_IS_BETTER[score] else ">"
    relation = shown if part.relation == ">" else shown + "="
    rhs = f"{right:g}" if isinstance(right, (int, float)) else f"{part.right} {_fmt(right)}"
    return verdict, f"{part.left} {_fmt(left)} {relation} {rhs}: {verdict}"


def judge(claims: Sequence[Claim], scores: Mapping[str, Mapping[str, Sequence[float]]]) -> list[dict]:
    """One row per claim: ``{"key", "paper", "claim", "score", "numbers": [...], "verdict"}``.

    Args:
        scores: score name -> encoding -> per-seed values (encodings not run are absent).
    """
    rows = []
    for claim in claims:
        judged = [judge_part(p, scores.get(claim.score, {}), claim.score) for p in claim.parts]
        judged = [j for j in judged if j is not None]
        rows.append({"key": claim.key, "paper": claim.paper, "claim": claim.text, "score": claim.score,
                     "numbers": [n for _, n in judged], "verdict": combine([v for v, _ in judged])})
    return rows


__all__ = ["CLAIMS", "Claim", "Part", "combine", "decide", "judge", "judge_part", "mean_sd"]
