"""The length-generalisation papers' claims, each decided on our seeds by one written rule (:data:`RULE`).

A comparison "A beats B" (:func:`decide`) holds when the mean difference over seeds clears the
margin by two standard errors, does not when it falls short of the margin by two standard
errors, and is unclear otherwise, and always with fewer than two seeds on a side (no spread to
judge by). "A at least matches B" is the same test with the margin on the other side
(``-margin``); against a fixed threshold ("CoPE solves it": exact match above 0.9) the margin is 0.

Only what the models learned is judged (:func:`judge_part`): a part is judged on a task only where
every encoding it compares learned that task *in distribution* (:data:`LEARNED`: mean exact match
at the training size at least :data:`LEARNED_EXACT` over the seeds counted; for the byte LM, bits
per byte at the training length at most :data:`LEARNED_BPB`). A model that cannot do a task at
the training length says nothing about extrapolation. The tasks left out are named with their
in-distribution scores; a part with no task left reads :data:`NOT_LEARNED`.

A claim of several parts (:func:`combine`) does not hold when any part does not, has
:data:`NO_VERDICT` when a part was not learned and no part decides it, holds when every part
holds, and is unclear otherwise; parts whose encodings were not run are left out, and a claim
with no part left is ``not run``.

Evidence (:func:`judge`'s argument), per score: item (a task, or ``"byte LM"``) -> encoding ->
seed -> ``(in-distribution score, score)``. Scores: ``ood_nope`` / ``ood_cope``: exact match on
the out-of-distribution splits, averaged over the judged tasks of the NoPE paper (copy, reverse,
sort, addition, summation, parity) or CoPE's (flip-flop, selective copy, counting);
``lm_growth``: the byte LM's bits per byte at the longest scored length minus at the training
length; ``lm_long``: bits per byte at the longest length (lower is better for both).
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
LEARNED_EXACT = 0.9  # exact match at the training size that counts as having learned a task
# A byte LM above this at its training length has learned little beyond which bytes follow
# which (the pydoc text's bigram entropy is above 3 bits per byte).
LEARNED_BPB = 2.5

HOLDS, DOES_NOT, UNCLEAR, NOT_RUN = "holds", "does not", "unclear", "not run"
NOT_LEARNED, NO_VERDICT = "not learned in distribution", "no verdict"

RULE = (
    f"rule: a part 'A beats B' holds when the mean difference over seeds clears the margin ({MARGIN_ACCURACY} exact "
    f"match, {MARGIN_BPB} bit/byte) by {Z:g} standard errors, does not when it falls short of it by {Z:g}, and is "
    "unclear otherwise or with fewer than 2 seeds; 'A at least matches B' moves the margin to the other side. A "
    "part is judged only on the tasks that every encoding it compares learned in distribution (mean exact match at "
    f"the training size >= {LEARNED_EXACT} over the seeds counted; byte LM: bits per byte at the training length "
    f"<= {LEARNED_BPB}); the tasks left out are named with those scores, and a part with none left reads "
    f"'{NOT_LEARNED}'. A claim does not hold when any part does not, has '{NO_VERDICT}' when a part was not "
    "learned and no part decides it, holds when every part holds, and is unclear otherwise."
)


@dataclass(frozen=True)
class Learned:
    """What counts as learned in distribution: the mean in-distribution score over the seeds
    counted at least (``higher_is_better``) or at most ``threshold``."""

    what: str
    threshold: float
    higher_is_better: bool

    def met(self, values: Sequence[float]) -> bool:
        m = sum(values) / len(values)
        return m >= self.threshold if self.higher_is_better else m <= self.threshold


_EXACT = Learned("exact match at the training size", LEARNED_EXACT, True)
_BPB = Learned("bits per byte at the training length", LEARNED_BPB, False)
LEARNED: dict[str, Learned] = {"ood_nope": _EXACT, "ood_cope": _EXACT, "lm_growth": _BPB, "lm_long": _BPB}
LOWER_IS_BETTER = {"ood_nope": False, "ood_cope": False, "lm_growth": True, "lm_long": True}


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
    """One verdict for a claim of several parts (see the module docstring)."""
    if not verdicts:
        return NOT_RUN
    if DOES_NOT in verdicts:
        return DOES_NOT
    if NOT_LEARNED in verdicts:
        return NO_VERDICT
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

# score -> item -> encoding -> seed -> (in-distribution score, score)
Evidence = Mapping[str, Mapping[str, Mapping[str, Mapping[int, tuple[float, float]]]]]


def _margin(score: str) -> float:
    return MARGIN_BPB if score.startswith("lm") else MARGIN_ACCURACY


def _fmt(values: Sequence[float]) -> str:
    m, sd = mean_sd(values)
    return f"{m:.3f}" if sd is None else f"{m:.3f}±{sd:.3f}"


def _check_part(part: Part, score: str) -> None:
    if part.relation not in (">", ">="):
        raise ValueError(f"relation must be '>' or '>='; got {part.relation!r}")
    if score not in LEARNED:
        raise ValueError(f"score must be one of {', '.join(LEARNED)}; got {score!r}")


def judge_part(part: Part, items: Mapping[str, Mapping[str, Mapping[int, tuple[float, float]]]],
               score: str) -> tuple[str, str] | None:
    """``(verdict, numbers)`` of one part on the evidence of its score (item -> encoding -> seed
    -> (in-distribution score, score)), or None when an encoding of it was not run.

    The items where every encoding of the part ran are considered; an encoding's seeds counted
    are those it has on every such item. An item is judged when every encoding's mean
    in-distribution score over its seeds counted meets :data:`LEARNED`; the part compares the
    per-seed means of the score over the judged items."""
    _check_part(part, score)
    names = [part.left] + ([] if isinstance(part.right, (int, float)) else [part.right])
    ran = [item for item, by_enc in items.items() if all(by_enc.get(n) for n in names)]
    if not ran:
        return None
    seeds = {n: sorted(set.intersection(*(set(items[item][n]) for item in ran))) for n in names}
    if any(not s for s in seeds.values()):
        return None  # a partial run: no seed of an encoding is on every item yet
    criterion = LEARNED[score]

    def in_dist(item: str, name: str) -> list[float]:
        return [items[item][name][s][0] for s in seeds[name]]

    judged = [item for item in ran if all(criterion.met(in_dist(item, n)) for n in names)]
    left_out = [item for item in ran if item not in judged]
    shown = "<" if LOWER_IS_BETTER[score] else ">"
    relation = shown if part.relation == ">" else shown + "="
    rhs_name = f"{part.right:g}" if isinstance(part.right, (int, float)) else part.right
    note = "; ".join(f"{item}: " + ", ".join(f"{n} {sum(in_dist(item, n)) / len(seeds[n]):.2f}" for n in names)
                     for item in left_out)
    if not judged:
        return NOT_LEARNED, f"{part.left} {relation} {rhs_name}: {NOT_LEARNED} ({criterion.what}: {note})"
    per_seed = {n: [sum(items[item][n][s][1] for item in judged) / len(judged) for s in seeds[n]] for n in names}
    if isinstance(part.right, (int, float)):
        right: float | list[float] = float(part.right)
        margin = 0.0  # a threshold is its own margin
    else:
        right = per_seed[part.right]
        margin = _margin(score) if part.relation == ">" else -_margin(score)
    sign = -1.0 if LOWER_IS_BETTER[score] else 1.0  # lower is better: compare the negated scores
    verdict = decide([sign * v for v in per_seed[part.left]],
                     sign * right if isinstance(right, float) else [sign * v for v in right], margin=margin)
    rhs = rhs_name if isinstance(right, float) else f"{part.right} {_fmt(right)}"
    text = f"{part.left} {_fmt(per_seed[part.left])} {relation} {rhs}"
    if left_out:
        text += f" on {', '.join(judged)} (not learned in distribution: {note})"
    return verdict, f"{text}: {verdict}"


def judge(claims: Sequence[Claim], evidence: Evidence) -> list[dict]:
    """One row per claim: ``{"key", "paper", "claim", "score", "numbers": [...], "verdict"}``.

    Args:
        evidence: score -> item -> encoding -> seed -> (in-distribution score, score); encodings
            not run are absent.
    """
    rows = []
    for claim in claims:
        judged = [judge_part(p, evidence.get(claim.score, {}), claim.score) for p in claim.parts]
        judged = [j for j in judged if j is not None]
        rows.append({"key": claim.key, "paper": claim.paper, "claim": claim.text, "score": claim.score,
                     "numbers": [n for _, n in judged], "verdict": combine([v for v, _ in judged])})
    return rows


__all__ = [
    "CLAIMS", "LEARNED", "LEARNED_BPB", "LEARNED_EXACT", "NOT_LEARNED", "NO_VERDICT", "RULE", "Claim", "Learned",
    "Part", "combine", "decide", "judge", "judge_part", "mean_sd",
]
