"""The length-generalisation tasks of the NoPE and CoPE papers, and the train/test suites that
``posenc bench length-generalization`` runs.

Tasks (each a :class:`~posenc.seq.tasks.Task`; ``length`` is the problem size):

* :class:`FlipFlop` (Liu et al. 2023, https://arxiv.org/abs/2306.00946, as used by CoPE): ``length``
  instructions ``w b`` (write bit b), ``i b`` (ignore) or ``r b`` (read: b must be the latest
  written bit); the first is a write and the last a read; every other one is an ignore with
  probability ``p_ignore``, else a write or a read with equal odds. Every read bit is scored.
  Train at ``p_ignore = 0.8``; the out-of-distribution variants are *sparse* (0.98: long gaps
  between write and read) and *dense* (0.1: reads and writes everywhere).
* :class:`SelectiveCopy` (Gu & Dao 2023's selective copying, as used by CoPE): ``length`` data
  tokens scattered among ``round(blank_ratio * length)`` blanks; the answer is the data tokens in
  order. Sparse (more blanks) and dense (fewer) variants shift the blank ratio.
* :class:`Counting` (after CoPE's counting task): ``length`` statements, each ``v ++`` (increment
  variable v, two tokens) or ``pass`` (one token), then a query ``SEP v``; the answer is how many
  times v was incremented. The count of the queried variable is uniform in ``[0, max_count]`` at
  every length, so a longer instance holds more distractors, not larger numbers (no answer token
  is unseen in training).
* :class:`Parity` (NoPE): ``length`` bits; the answer is their sum mod 2.
* :class:`ModularSum` (NoPE's summation): ``length`` digits; the answer is their sum mod 10.

The NoPE paper's copy, reverse, sort and addition are :mod:`posenc.seq.tasks`' (see
``docs/length_generalization.md`` for where they differ from the paper).

Token layout: the special tokens of :mod:`.tasks` (``PAD BOS SEP EOS PLUS``), then each task's
symbols from ``NUM_SPECIAL`` on, named by the class attributes below.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from ..common.checks import check_choice, check_int, check_number
from .tasks import BOS, EOS, NUM_SPECIAL, SEP, TASKS, Task


class FlipFlop(Task):
    """Flip-flop language: ``BOS (op bit)*length EOS``, scored on the bit after every ``r``.

    Args:
        p_ignore: probability that an instruction between the first and the last is ``i``.
    """

    name = "flipflop"
    BIT0, BIT1, WRITE, IGNORE, READ = range(NUM_SPECIAL, NUM_SPECIAL + 5)
    min_symbols = 5

    def __init__(self, p_ignore: float = 0.8) -> None:
        super().__init__(5)
        self.p_ignore = check_number("p_ignore", p_ignore, minimum=0.0, maximum=1.0)

    def check_length(self, length: int) -> None:
        super().check_length(length)
        if length < 2:
            raise ValueError(f"flipflop: length must be >= 2 (a write, then a read); got {length}")

    def instructions(self, length: int, generator: torch.Generator) -> tuple[list[int], list[int]]:
        """``(ops, bits)`` of one instance: op tokens and bit values (0/1), reads already answered."""
        self.check_length(length)
        u = torch.rand(length, generator=generator).tolist()
        half = (1.0 - self.p_ignore) / 2
        ops = [self.WRITE] + [self.IGNORE if x < self.p_ignore else self.WRITE if x < self.p_ignore + half
                              else self.READ for x in u[1:-1]] + [self.READ]
        bits = torch.randint(0, 2, (length,), generator=generator).tolist()
        return ops, flip_flop_reads(ops, bits, write=self.WRITE, read=self.READ)

    def sequence(self, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        ops, bits = self.instructions(length, generator)
        seq = [BOS] + [t for op, b in zip(ops, bits) for t in (op, self.BIT0 + b)] + [EOS]
        tokens = torch.tensor(seq, dtype=torch.long)
        return tokens, tokens[:-1] == self.READ  # target t is token t + 1: the bit after each read

    def example(self, length, generator):
        raise NotImplementedError("flipflop scores every read; use sequence()")

    def max_total_length(self, length):
        return 2 * length + 2


def flip_flop_reads(ops: Sequence[int], bits: Sequence[int], *, write: int, read: int) -> list[int]:
    """``bits`` with each read's bit replaced by the bit of the latest write before it (the
    flip-flop's answer); a read before any write is a ValueError."""
    out, memory = list(bits), None
    for k, op in enumerate(ops):
        if op == write:
            memory = out[k]
        elif op == read:
            if memory is None:
                raise ValueError(f"read at instruction {k} comes before any write")
            out[k] = memory
    return out


class SelectiveCopy(Task):
    """``BOS (data tokens among blanks) SEP data tokens EOS``.

    Args:
        num_tokens: data alphabet (the blank is one more symbol).
        blank_ratio: blanks per data token (1.0 in training; CoPE's sparse/dense tests change it).
    """

    name = "selective_copy"

    def __init__(self, num_tokens: int = 16, blank_ratio: float = 1.0) -> None:
        check_int("num_tokens", num_tokens, minimum=2)
        super().__init__(num_tokens + 1)
        self.blank_ratio = check_number("blank_ratio", blank_ratio, minimum=0.0)
        self.BLANK = NUM_SPECIAL

    def blanks(self, length: int) -> int:
        return int(round(self.blank_ratio * length))

    def example(self, length, generator):
        n, total = length, length + self.blanks(length)
        data = (torch.randint(1, self.num_symbols, (n,), generator=generator) + NUM_SPECIAL).tolist()
        slots = sorted(torch.randperm(total, generator=generator)[:n].tolist())
        question = [self.BLANK] * total
        for slot, token in zip(slots, data):
            question[slot] = token
        return question, selective_copy_target(question, blank=self.BLANK)

    def max_total_length(self, length):
        return 2 * length + self.blanks(length) + 3


def selective_copy_target(question: Sequence[int], *, blank: int) -> list[int]:
    """The non-blank tokens of ``question`` in order."""
    return [t for t in question if t != blank]


class Counting(Task):
    """``BOS statements SEP v count EOS``: statements ``v ++`` or ``pass``; the answer is the
    number of increments of the queried variable ``v``.

    Args:
        num_variables: variables in play (CoPE varies 1, 3, 5).
        max_count: largest answer; the queried variable's count is uniform in
            ``[0, min(max_count, length)]``.
    """

    name = "counting"

    def __init__(self, num_variables: int = 3, max_count: int = 8) -> None:
        check_int("num_variables", num_variables, minimum=1)
        check_int("max_count", max_count, minimum=1)
        super().__init__(max_count + 1 + num_variables + 2)
        self.num_variables, self.max_count = num_variables, max_count
        self.VAR0 = NUM_SPECIAL + max_count + 1  # count symbols come first: NUM_SPECIAL + c
        self.INC = self.VAR0 + num_variables
        self.PASS = self.INC + 1

    def statements(self, length: int, generator: torch.Generator) -> tuple[list[int | None], int]:
        """``(statements, query)``: each statement a variable index (``v ++``) or None (``pass``)."""
        self.check_length(length)
        query = int(torch.randint(0, self.num_variables, (1,), generator=generator))
        count = int(torch.randint(0, min(self.max_count, length) + 1, (1,), generator=generator))
        hits = set(torch.randperm(length, generator=generator)[:count].tolist())
        others = [v for v in range(self.num_variables) if v != query] + [None]  # other variables or pass
        fill = torch.randint(0, len(others), (length,), generator=generator).tolist()
        return [query if k in hits else others[fill[k]] for k in range(length)], query

    def sequence(self, length, generator):
        stmts, query = self.statements(length, generator)
        body = [t for v in stmts for t in ((self.PASS,) if v is None else (self.VAR0 + v, self.INC))]
        answer = NUM_SPECIAL + count_increments(stmts, query)
        seq = [BOS, *body, SEP, self.VAR0 + query, answer, EOS]
        return torch.tensor(seq, dtype=torch.long), len(body) + 2  # the target after the query variable

    def example(self, length, generator):
        raise NotImplementedError("counting builds its own sequence (the query follows SEP)")

    def max_total_length(self, length):
        return 2 * length + 5


def count_increments(statements: Sequence[int | None], variable: int) -> int:
    """How many statements increment ``variable``."""
    return sum(1 for v in statements if v == variable)


class Parity(Task):
    """``BOS bits SEP (sum mod 2) EOS``."""

    name = "parity"

    def __init__(self) -> None:
        super().__init__(2)

    def example(self, length, generator):
        bits = torch.randint(0, 2, (length,), generator=generator).tolist()
        return [NUM_SPECIAL + b for b in bits], [NUM_SPECIAL + sum(bits) % 2]

    def max_total_length(self, length):
        return length + 4


class ModularSum(Task):
    """``BOS digits SEP (sum mod 10) EOS`` (the NoPE paper's summation)."""

    name = "summation"

    def __init__(self) -> None:
        super().__init__(10)

    def example(self, length, generator):
        digits = torch.randint(0, 10, (length,), generator=generator).tolist()
        return [NUM_SPECIAL + d for d in digits], [NUM_SPECIAL + sum(digits) % 10]

    def max_total_length(self, length):
        return length + 4


@dataclass(frozen=True)
class EvalSplit:
    """One test condition: ``task`` at size ``size``; ``ood`` when it differs from training
    (longer, or another density)."""

    label: str
    task: Task
    size: int
    ood: bool


@dataclass(frozen=True)
class LengthSuite:
    """A task as the bench runs it: trained on ``train_task`` at sizes ``[train_min, train_max]``,
    tested on ``splits`` (the training size, 2x and 4x, and the task's density variants)."""

    name: str
    family: str  # "nope" or "cope": the paper whose claim the task feeds
    train_task: Task
    train_min: int
    train_max: int
    splits: tuple[EvalSplit, ...]
    options: tuple[tuple[str, object], ...] = ()  # the task's constructor options (its format), sorted

    @property
    def vocab_size(self) -> int:
        return self.train_task.vocab_size

    def max_total_length(self, *, tested: bool = False) -> int:
        """Tokens of the longest training example, or (``tested``) of the longest test one."""
        if not tested:
            return self.train_task.max_total_length(self.train_max)
        return max(s.task.max_total_length(s.size) for s in self.splits)


# name -> (train task factory, default largest training size, smallest size, paper family,
#          {variant label: test task factory})
_SUITES: dict[str, tuple[Callable[..., Task], int, int, str, dict[str, Callable[[], Task]]]] = {
    "copy": (TASKS["copy"], 8, 1, "nope", {}),
    "reverse": (TASKS["reverse"], 8, 1, "nope", {}),
    "sort": (TASKS["sort"], 8, 1, "nope", {}),
    "addition": (TASKS["addition"], 4, 1, "nope", {}),
    "summation": (ModularSum, 8, 1, "nope", {}),
    "parity": (Parity, 8, 1, "nope", {}),
    "flipflop": (FlipFlop, 16, 2, "cope", {"sparse": lambda: FlipFlop(0.98), "dense": lambda: FlipFlop(0.1)}),
    "selective_copy": (SelectiveCopy, 8, 1, "cope", {"sparse": lambda: SelectiveCopy(blank_ratio=2.0),
                                                    "dense": lambda: SelectiveCopy(blank_ratio=0.5)}),
    "counting": (Counting, 16, 1, "cope", {}),
}
LENGTH_TASKS: tuple[str, ...] = tuple(_SUITES)
TEST_MULTIPLES = (2, 4)


def length_suite(name: str, train_len: int | None = None, options: dict | None = None) -> LengthSuite:
    """The suite of task ``name`` (one of :data:`LENGTH_TASKS`), trained at sizes up to
    ``train_len`` (default: the task's own) and tested at 1x, 2x and 4x that size; the density
    variants (flip-flop, selective copy) are tested at 1x, where the papers test them.
    ``options``: the task's constructor arguments (its format, e.g. ``{"index_hints": True}``
    for addition); a task with density variants takes none."""
    check_choice("task", name, LENGTH_TASKS)
    make, default_len, smallest, family, variants = _SUITES[name]
    options = dict(options or {})
    if options and variants:
        raise ValueError(f"{name}: options are for tasks without density variants; got {sorted(options)}")
    size = default_len if train_len is None else check_int("train_len", train_len, minimum=smallest)
    try:
        task = make(**options)
    except TypeError as exc:
        raise ValueError(f"{name}: bad task options {options}: {exc}") from None
    for m in (1, *TEST_MULTIPLES):
        task.check_length(m * size)  # e.g. enough index hints for the longest test
    splits = [EvalSplit(f"@{m * size}", task, m * size, m > 1) for m in (1, *TEST_MULTIPLES)]
    splits += [EvalSplit(f"{label}@{size}", make_variant(), size, True) for label, make_variant in variants.items()]
    return LengthSuite(name, family, task, smallest, size, tuple(splits), tuple(sorted(options.items())))


def eval_seed(task: str, label: str, seed: int) -> int:
    """The seed of a test set: the same for every encoding, different per task, split and seed."""
    digest = hashlib.blake2b(f"posenc.length:{task}:{label}:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


__all__ = [
    "Counting", "EvalSplit", "FlipFlop", "LENGTH_TASKS", "LengthSuite", "ModularSum", "Parity", "SelectiveCopy",
    "TEST_MULTIPLES", "count_increments", "eval_seed", "flip_flop_reads", "length_suite", "selective_copy_target",
]
