"""Evaluation of sequence models: bits per byte on text windows, exact match on synthetic tasks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .tasks import Task, collate, exact_match


@torch.no_grad()
def bits_per_byte(model: nn.Module, x: Tensor, y: Tensor, *, batch_size: int = 8) -> float:
    """Mean next-byte cross-entropy in bits over every position of ``x, y [N, T]`` (run in
    slices of ``batch_size`` windows to bound the attention memory at long ``T``).
    Perplexity per byte is ``2 ** bits_per_byte``."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for s in range(0, len(x), batch_size):
        xb, yb = x[s : s + batch_size].to(device), y[s : s + batch_size].to(device)
        logits = model(xb)
        total += F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten(), reduction="sum").item()
        count += yb.numel()
    return total / count / math.log(2)


def task_eval_set(task: Task, length: int, num_examples: int, *, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """``num_examples`` examples of size exactly ``length`` from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return collate([task.sequence(length, g) for _ in range(num_examples)])


@torch.no_grad()
def task_exact_match(
    model: nn.Module, batch: tuple[Tensor, Tensor, Tensor], *, batch_size: int = 64
) -> float:
    """Fraction of examples whose whole answer the model's teacher-forced argmax gets right."""
    device = next(model.parameters()).device
    tokens, targets, mask = batch
    right = 0
    for s in range(0, len(tokens), batch_size):
        tb = tokens[s : s + batch_size].to(device)
        logits = model(tb)
        right += int(exact_match(logits, targets[s : s + batch_size].to(device), mask[s : s + batch_size].to(device)).sum())
    return right / len(tokens)
