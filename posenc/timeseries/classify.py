"""Train and evaluate a :class:`~.convtran.ConvTranClassifier` through the shared
:class:`~posenc.training.trainer.Trainer` (progress bar, atomic checkpoints, exact resume).

Training follows ConvTran's defaults where the shared trainer allows: batch 16, learning rate
1e-3 held constant, no weight decay, no gradient clipping, 100 epochs. Differences: AdamW (the
trainer's optimiser; with no weight decay it is Adam) instead of RAdam; the whole training split is
used for a fixed number of epochs and the final model is tested (ConvTran holds out 20% of the
training split and tests the epoch with the best validation accuracy); the trainer drops the
trailing incomplete batch of each epoch. The test split is evaluated once, at the end.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..training.trainer import TrainConfig, Trainer
from .convtran import ConvTranClassifier
from .datasets import SeriesSet, collate_series


@dataclass
class ClassifierSettings:
    """Model and training settings (ConvTran's defaults)."""

    encoding: str = "tape+erpe"
    dim: int = 16
    num_heads: int = 8
    ff_dim: int = 256
    dropout: float = 0.01
    attn_scale: str = "d_model"
    epochs: int = 100
    batch_size: int = 16
    lr: float = 1e-3
    seed: int = 0
    encoding_options: dict | None = None  # constructor arguments (see convtran.build_encodings)

    def validate(self) -> None:
        for name in ("dim", "num_heads", "ff_dim", "epochs", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive; got {self.lr}")


def accuracy(model: ConvTranClassifier, data: SeriesSet, batch_size: int = 256) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on ``data`` (call under no_grad, eval mode)."""
    device = next(model.parameters()).device
    correct, loss, n = 0, 0.0, len(data)
    for start in range(0, n, batch_size):
        x, lengths, y = collate_series([data[i] for i in range(start, min(n, start + batch_size))])
        x, lengths, y = x.to(device), lengths.to(device), y.to(device)
        logits = model(x, lengths)
        correct += int((logits.argmax(-1) == y).sum())
        loss += float(F.cross_entropy(logits.float(), y, reduction="sum"))
    return {"accuracy": correct / n, "loss": loss / n}


def build_classifier(settings: ClassifierSettings, train: SeriesSet, max_len: int) -> ConvTranClassifier:
    return ConvTranClassifier(
        train.num_channels, len(train.classes), max_len, dim=settings.dim, num_heads=settings.num_heads,
        ff_dim=settings.ff_dim, dropout=settings.dropout, encoding=settings.encoding, attn_scale=settings.attn_scale,
        encoding_options=settings.encoding_options, classes=list(train.classes),
    )


def classifier_config(settings: ClassifierSettings, train: SeriesSet, max_len: int) -> dict:
    """What the model is (checked on resume, recorded in results.json): the classifier's
    constructor arguments and the class names."""
    model_fields = ("encoding", "dim", "num_heads", "ff_dim", "dropout", "attn_scale", "encoding_options")
    return {
        **{k: v for k, v in asdict(settings).items() if k in model_fields}, "in_channels": train.num_channels,
        "num_classes": len(train.classes), "max_len": max_len, "classes": list(train.classes),
    }


def train_classifier(
    train: SeriesSet,
    test: SeriesSet | None,
    settings: ClassifierSettings,
    *,
    max_len: int | None = None,
    steps: int | None = None,
    device: str = "auto",
    out_dir: str | None = None,
    resume: bool = False,
    progress: bool = True,
    checkpoint_every_epochs: int = 10,
    checkpoint_every: int | None = None,
    eval_every: int = 0,
) -> tuple[ConvTranClassifier, dict[str, float]]:
    """Train on ``train`` and test on ``test`` once at the end.

    Args:
        max_len: the longest series the model accepts; default the longest of both splits.
        steps: optimizer steps; default ``epochs * (len(train) // batch_size)``.
        checkpoint_every: steps between checkpoints (0: at the end); default every
            ``checkpoint_every_epochs`` epochs. eval_every: steps between test evaluations (0: at the end).

    Returns ``(model, metrics)``: ``train_loss``, ``test_accuracy``, ``test_loss`` (without a test
    split: training metrics only), ``steps``, ``train_seconds``.
    """
    settings.validate()
    if max_len is None:
        max_len = max(train.max_length, test.max_length if test is not None else 0)
    batch_size = min(settings.batch_size, len(train))  # tiny training splits: one batch per epoch
    per_epoch = len(train) // batch_size
    total = settings.epochs * per_epoch if steps is None else steps
    torch.manual_seed(settings.seed)
    model = build_classifier(settings, train, max_len)

    def loss_fn(m, batch: tuple[Tensor, Tensor, Tensor]):
        x, lengths, y = batch
        logits = m(x, lengths)
        return F.cross_entropy(logits, y), {"accuracy": (logits.argmax(-1) == y).float().mean()}

    def eval_fn(m) -> dict[str, float]:
        if test is None:
            return {}
        return {f"test_{k}": v for k, v in accuracy(m, test).items()}

    config = TrainConfig(
        steps=total, batch_size=batch_size, lr=settings.lr, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0,
        grad_clip=None, seed=settings.seed, device=device, out_dir=out_dir, resume=resume, progress=progress,
        log_every=per_epoch, eval_every=eval_every,
        checkpoint_every=(per_epoch * checkpoint_every_epochs if checkpoint_every is None else checkpoint_every) if out_dir else 0,
    )
    model_config = classifier_config(settings, train, max_len)
    start = time.perf_counter()
    trainer = Trainer(model, train, loss_fn, config, eval_fn=eval_fn, collate_fn=collate_series, model_config=model_config)
    metrics = trainer.fit()
    metrics["steps"] = float(total)
    metrics["train_seconds"] = time.perf_counter() - start
    return trainer.model, metrics
