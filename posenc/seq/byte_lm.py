"""Byte-level language modelling helpers shared by ``posenc extend`` and the benchmarks:
bits per byte on held-out text at several lengths, and a short next-byte training run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .data import ByteWindows, eval_windows
from .evaluation import bits_per_byte


def bits_per_byte_at(model: nn.Module, text: str, lens: list[int], num_tokens: int) -> dict[int, float]:
    """Bits per byte of ``model`` (switched to eval) on ``text`` at each length, ``num_tokens``
    tokens per length in non-overlapping windows, scored in slices that bound the memory."""
    model.eval()
    with torch.no_grad():
        return {n: bits_per_byte(model, *eval_windows(text, n, num_tokens), batch_size=max(1, 4096 // n)) for n in lens}


def next_byte_loss(model: nn.Module, batch) -> tuple[torch.Tensor, dict]:
    """The trainer's loss for ``(x, y)`` byte windows: mean next-byte cross-entropy."""
    x, y = batch
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten()), {}


def train_on_bytes(model: nn.Module, text: str, length: int, *, steps: int, batch_size: int, lr: float, seed: int,
                   device: str, progress: bool, out_dir: str | None = None, model_config: dict | None = None) -> float:
    """``steps`` of next-byte training on windows of ``length`` bytes of ``text`` (warm-up a
    tenth, cosine decay) through the shared trainer; returns the final training loss."""
    from ..training.trainer import TrainConfig, Trainer

    config = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, warmup_steps=max(1, steps // 10), seed=seed,
                         device=device, out_dir=out_dir, progress=progress, log_every=0)
    trainer = Trainer(model, ByteWindows(text, length), next_byte_loss, config, model_config=model_config)
    return float(trainer.fit()["train_loss"])
