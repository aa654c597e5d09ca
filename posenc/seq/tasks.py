"""Synthetic length-generalisation tasks: copy, reverse, sort, addition, associative recall
(the NoPE paper's setting: Kazemnejad et al. 2023, https://arxiv.org/abs/2305.19466).

Every task writes one example as a token sequence ``BOS question SEP answer EOS`` for a causal
LM trained on next-token prediction, with the loss only on the answer (and its EOS). ``length``
is the problem size (items to copy, digits per operand, key-value pairs); train at sizes up to
``L`` and evaluate up to ``4L``.

A batch is ``(tokens, targets, loss_mask)``, each ``[B, T]``: ``targets`` is ``tokens`` shifted
left by one (the next token), ``loss_mask`` is True where the target is an answer token.
Sequences of a batch are right-padded with ``PAD`` to the longest one (padding is never in the
mask, and causal attention keeps it out of the real tokens' view). :func:`exact_match` scores a
model's teacher-forced argmax: an example counts when every answer token is right, which is
exactly when greedy decoding would produce the whole answer.

Vocabulary (shared by all tasks of a given ``num_symbols``): ``PAD=0, BOS=1, SEP=2, EOS=3,
PLUS=4``, then the symbols ``5 .. 5 + num_symbols - 1`` (the digits 0-9 for addition).
"""

from __future__ import annotations

import hashlib
from typing import Callable

import torch
from torch import Tensor
from torch.utils.data import Dataset

PAD, BOS, SEP, EOS, PLUS = 0, 1, 2, 3, 4
NUM_SPECIAL = 5


class Task:
    """Base class: subclasses define ``name``, :meth:`example` and :meth:`max_total_length`.

    Args:
        num_symbols: size of the symbol alphabet (>= 10 for addition; >= the largest ``length``
            for associative recall, whose keys are distinct).
    """

    name: str = ""
    min_symbols: int = 2

    def __init__(self, num_symbols: int = 64) -> None:
        if not isinstance(num_symbols, int) or num_symbols < self.min_symbols:
            raise ValueError(f"{self.name}: num_symbols must be an int >= {self.min_symbols}, got {num_symbols!r}")
        self.num_symbols = num_symbols

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + self.num_symbols

    def check_length(self, length: int) -> None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"{self.name}: length must be a positive int, got {length!r}")

    def example(self, length: int, generator: torch.Generator) -> tuple[list[int], list[int]]:
        """``(question, answer)`` symbol lists (token ids) of one example of size ``length``."""
        raise NotImplementedError

    def max_total_length(self, length: int) -> int:
        """Tokens of the longest example of size ``length``, with BOS, SEP and EOS."""
        raise NotImplementedError

    def _symbols(self, n: int, g: torch.Generator, count: int | None = None) -> list[int]:
        count = self.num_symbols if count is None else count
        return (torch.randint(0, count, (n,), generator=g) + NUM_SPECIAL).tolist()

    def sequence(self, length: int, generator: torch.Generator) -> tuple[Tensor, int]:
        """One example as ``BOS question SEP answer EOS`` ``[T]`` and the index of SEP."""
        self.check_length(length)
        question, answer = self.example(length, generator)
        seq = [BOS, *question, SEP, *answer, EOS]
        return torch.tensor(seq, dtype=torch.long), len(question) + 1

    def batch(
        self, batch_size: int, length: int, *, generator: torch.Generator, min_length: int = 1
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``batch_size`` examples with sizes drawn uniformly from ``[min_length, length]``.

        Returns ``(tokens, targets, loss_mask)``, each ``[batch_size, T]``.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.check_length(length)
        if not isinstance(min_length, int) or not 1 <= min_length <= length:
            raise ValueError(f"min_length must be an int in [1, length={length}], got {min_length!r}")
        sizes = torch.randint(min_length, length + 1, (batch_size,), generator=generator).tolist()
        return collate([self.sequence(n, generator) for n in sizes])


def collate(items: list[tuple[Tensor, int | Tensor]], pad_to: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad ``(sequence [T], where)`` items to one ``(tokens, targets, loss_mask)`` batch.

    ``where`` is the index of SEP (every target after it, the answer and EOS, is scored) or a
    bool ``[T - 1]`` mask over the targets (``sequence[1:]``) for a task whose answers are spread
    through the sequence (flip-flop's reads)."""
    longest = max(len(s) for s, _ in items) - 1
    width = longest if pad_to is None else pad_to - 1
    tokens = torch.full((len(items), width), PAD, dtype=torch.long)
    targets = torch.full((len(items), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.bool)
    for i, (seq, where) in enumerate(items):
        n = len(seq) - 1
        tokens[i, :n] = seq[:-1]
        targets[i, :n] = seq[1:]
        if isinstance(where, Tensor):
            if where.dtype != torch.bool or tuple(where.shape) != (n,):
                raise ValueError(f"an answer mask must be bool [{n}] (one per target); got {where.dtype} "
                                 f"{tuple(where.shape)}")
            mask[i, :n] = where
        else:
            mask[i, where:n] = True  # targets after SEP: the answer and EOS
    return tokens, targets, mask


class Copy(Task):
    """``x1 .. xn SEP x1 .. xn``."""

    name = "copy"

    def example(self, length, generator):
        x = self._symbols(length, generator)
        return x, list(x)

    def max_total_length(self, length):
        return 2 * length + 3


class Reverse(Task):
    """``x1 .. xn SEP xn .. x1``."""

    name = "reverse"

    def example(self, length, generator):
        x = self._symbols(length, generator)
        return x, x[::-1]

    def max_total_length(self, length):
        return 2 * length + 3


class Sort(Task):
    """``x1 .. xn SEP sorted(x)`` (ascending symbol ids)."""

    name = "sort"

    def example(self, length, generator):
        x = self._symbols(length, generator)
        return x, sorted(x)

    def max_total_length(self, length):
        return 2 * length + 3


class Addition(Task):
    """``a PLUS b SEP (a + b)`` with ``length``-digit operands (leading zeros allowed) and a
    ``length + 1``-digit sum. Digits are written least significant first by default
    (``reverse_digits``), the order in which a left-to-right model can carry.

    ``index_hints`` (Zhou et al. 2023, https://arxiv.org/abs/2310.16028): every digit follows a
    hint token naming its place, the same hint for the same place in both operands and the sum
    (``h0 a0 h1 a1 .. PLUS h0 b0 h1 b1 .. SEP h0 s0 h1 s1 ..``), so a digit is found by content
    instead of by counting. The hints are consecutive symbols of the ordered set after the ten
    digits, starting at a random place in it, so every hint is seen in training at short
    lengths; ``num_symbols`` must leave ``length + 1`` of them.
    """

    name = "addition"
    min_symbols = 10

    def __init__(self, num_symbols: int = 64, reverse_digits: bool = True, index_hints: bool = False) -> None:
        super().__init__(num_symbols)
        if not isinstance(reverse_digits, bool) or not isinstance(index_hints, bool):
            raise TypeError(f"addition: reverse_digits and index_hints must be bools; got {reverse_digits!r}, "
                            f"{index_hints!r}")
        self.reverse_digits, self.index_hints = reverse_digits, index_hints

    @property
    def num_hints(self) -> int:
        """Hint symbols (the symbols after the ten digits)."""
        return self.num_symbols - 10 if self.index_hints else 0

    def check_length(self, length):
        super().check_length(length)
        if self.index_hints and length + 1 > self.num_hints:
            raise ValueError(f"addition: {length} digits need {length + 1} index hints; num_symbols={self.num_symbols} "
                             f"leaves {self.num_hints} (num_symbols >= {length + 11})")

    def example(self, length, generator):
        a = torch.randint(0, 10, (length,), generator=generator).tolist()  # most significant first
        b = torch.randint(0, 10, (length,), generator=generator).tolist()
        s = self.sum_digits(a, b)
        if self.reverse_digits:
            a, b, s = a[::-1], b[::-1], s[::-1]
        d = NUM_SPECIAL
        a, b, s = [d + v for v in a], [d + v for v in b], [d + v for v in s]
        if self.index_hints:
            start = int(torch.randint(0, self.num_hints - length, (1,), generator=generator))
            hints = [d + 10 + start + k for k in range(length + 1)]
            a, b, s = (self.hinted(x, hints) for x in (a, b, s))
        return a + [PLUS] + b, s

    @staticmethod
    def hinted(digits: list[int], hints: list[int]) -> list[int]:
        """``digits`` with hint ``k`` before digit ``k``."""
        return [t for pair in zip(hints, digits) for t in pair]

    def max_total_length(self, length):
        return 6 * length + 6 if self.index_hints else 3 * length + 5

    @staticmethod
    def sum_digits(a: list[int], b: list[int]) -> list[int]:
        """Digits (most significant first) of the sum of two equal-length digit lists, one digit longer."""
        total = int("".join(map(str, a))) + int("".join(map(str, b)))
        return [int(c) for c in str(total).zfill(len(a) + 1)]


class AssociativeRecall(Task):
    """``k1 v1 .. kn vn SEP kq`` -> ``v_q``: ``length`` pairs with distinct keys, then a query
    key drawn from them; the answer is its value. Needs ``num_symbols >= length``."""

    name = "recall"

    def check_length(self, length):
        super().check_length(length)
        if length > self.num_symbols:
            raise ValueError(f"recall: length={length} pairs need distinct keys, but num_symbols={self.num_symbols}")

    def example(self, length, generator):
        keys = (torch.randperm(self.num_symbols, generator=generator)[:length] + NUM_SPECIAL).tolist()
        values = self._symbols(length, generator)
        q = int(torch.randint(0, length, (1,), generator=generator))
        pairs = [t for kv in zip(keys, values) for t in kv]
        # The query key sits after SEP, so it is part of the question the answer attends to.
        return pairs + [SEP, keys[q]], [values[q]]

    def sequence(self, length, generator):
        self.check_length(length)
        question, answer = self.example(length, generator)
        seq = [BOS, *question, *answer, EOS]  # the question already ends with SEP kq
        return torch.tensor(seq, dtype=torch.long), len(question)

    def max_total_length(self, length):
        return 2 * length + 5


TASKS: dict[str, Callable[..., Task]] = {
    "copy": Copy, "reverse": Reverse, "sort": Sort, "addition": Addition, "recall": AssociativeRecall,
}


def make_task(name: str, **options) -> Task:
    """The task registered as ``name`` (one of :data:`TASKS`)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name](**options)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "little") >> 1


class TaskDataset(Dataset):
    """``num_examples`` examples of a task as a map-style dataset (for the Trainer): item ``i`` is
    drawn from a generator seeded with ``(seed, i)``, so it is the same in every epoch and process.
    Sizes are uniform in ``[min_length, length]`` (``[min_length, largest[i]]`` with ``largest``,
    a curriculum: see :func:`curriculum_largest`); each item is padded to the longest possible
    example, so items stack into a batch. Item: ``(tokens, targets, loss_mask)``, each ``[T]``."""

    def __init__(self, task: Task, num_examples: int, length: int, *, seed: int = 0, min_length: int = 1,
                 largest: list[int] | None = None) -> None:
        task.check_length(length)
        if not isinstance(min_length, int) or not 1 <= min_length <= length:
            raise ValueError(f"min_length must be an int in [1, length={length}], got {min_length!r}")
        if num_examples < 1:
            raise ValueError(f"num_examples must be positive, got {num_examples}")
        if largest is not None and (len(largest) != num_examples
                                    or any(not min_length <= n <= length for n in largest)):
            raise ValueError(f"largest must hold {num_examples} sizes in [min_length={min_length}, length={length}]")
        self.task, self.num_examples, self.length, self.seed, self.min_length = task, num_examples, length, seed, min_length
        self.largest = largest
        self.width = task.max_total_length(length)

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, Tensor]:
        if not 0 <= i < self.num_examples:
            raise IndexError(f"index {i} out of range for {self.num_examples} examples")
        g = torch.Generator().manual_seed(_seed("posenc.task", self.task.name, self.seed, i))
        top = self.length if self.largest is None else self.largest[i]
        size = int(torch.randint(self.min_length, top + 1, (1,), generator=g))
        tokens, targets, mask = collate([self.task.sequence(size, g)], pad_to=self.width)
        return tokens[0], targets[0], mask[0]


def curriculum_largest(steps: int, batch_size: int, *, seed: int, min_length: int, length: int,
                       fraction: float) -> list[int]:
    """The largest size of each item of a :class:`TaskDataset` of ``steps * batch_size`` items
    that the trainer reads once in its order (:func:`posenc.training.trainer.epoch_batches`), so
    that the largest training size grows linearly from ``min_length`` to ``length`` over the
    first ``fraction`` of the steps, then stays at ``length``."""
    from ..training.trainer import epoch_batches

    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"curriculum must be a fraction of the steps in (0, 1]; got {fraction!r}")
    ramp = max(1.0, fraction * steps)
    largest = [length] * (steps * batch_size)
    for step, batch in enumerate(epoch_batches(steps * batch_size, batch_size, seed=seed, epoch=0)):
        top = min(length, min_length + int((length - min_length + 1) * step / ramp))
        for i in batch:
            largest[i] = top
    return largest


def exact_match(logits: Tensor, targets: Tensor, loss_mask: Tensor) -> Tensor:
    """Per example: whether the argmax of ``logits [B, T, V]`` equals ``targets [B, T]`` at every
    position of ``loss_mask [B, T]`` -> bool ``[B]``."""
    right = (logits.argmax(-1) == targets) | ~loss_mask
    return right.all(-1)


def masked_loss(logits: Tensor, targets: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean cross-entropy over the answer positions."""
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    m = loss_mask.flatten().to(loss.dtype)
    return (loss * m).sum() / m.sum().clamp_min(1.0)


def task_loss(model: torch.nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, dict]:
    """The trainer's ``loss_fn`` for a task batch ``(tokens, targets, loss_mask)``: the answer's
    mean cross-entropy (``posenc train seq`` and ``posenc bench extrapolation`` share it)."""
    tokens, targets, mask = batch
    return masked_loss(model(tokens), targets, mask), {}


def train_on_task(model: torch.nn.Module, task: Task, length: int, *, steps: int, batch_size: int, lr: float,
                  seed: int, device: str, progress: bool, min_length: int = 1, curriculum: float = 0.0) -> float:
    """``steps`` of answer-only training on ``task`` at sizes ``[min_length, length]`` (warm-up a
    tenth, cosine decay) through the shared trainer; returns the final training loss. With
    ``curriculum`` (a fraction of the steps), the largest size grows from ``min_length`` to
    ``length`` over that fraction (:func:`curriculum_largest`). The task counterpart of
    :func:`posenc.seq.byte_lm.train_on_bytes` (``posenc bench extrapolation`` and ``posenc bench
    length-generalization`` share both)."""
    from ..training.trainer import TrainConfig, Trainer

    count = max(batch_size, steps * batch_size)
    largest = None
    if curriculum:
        largest = curriculum_largest(steps, batch_size, seed=seed, min_length=min_length, length=length,
                                     fraction=curriculum)
    train = TaskDataset(task, count, length, seed=seed, min_length=min_length, largest=largest)
    config = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, warmup_steps=max(1, steps // 10), seed=seed,
                         device=device, progress=progress, log_every=0)
    return float(Trainer(model, train, task_loss, config).fit()["train_loss"])
