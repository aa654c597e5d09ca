"""Training and evaluating a :class:`~posenc.vision.vit.ViT` classifier: the pieces that
``posenc train vision``, ``posenc bench resolution`` and the demo share.

* :func:`vit_config` / :func:`build_vit`: a ViT as a plain config dict (what ``results.json`` and
  checkpoints record as ``model_config``) and back.
* :func:`train_vit`: build, train through :class:`~posenc.training.trainer.Trainer`, evaluate on
  several image sizes (:func:`evaluate_sizes`, :func:`accuracy`, :func:`eval_sizes`).
"""

from __future__ import annotations

import math
import sys
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


def eval_sizes(img_size: int, scales: Sequence[float]) -> list[int]:
    """The image sides ``round(img_size * s)`` for each scale, in order, without repeats."""
    return list(dict.fromkeys(int(round(img_size * s)) for s in scales))


def build_vit(config: Mapping[str, object]) -> nn.Module:
    """A :class:`posenc.vision.ViT` from a plain config dict (the ``model_config`` of a checkpoint):
    the ViT's constructor arguments, with ``encoding`` ``None`` for no encoding."""
    from .vit import ViT

    return ViT(**dict(config))


def vit_config(
    encoding: str | None,
    *,
    img_size: int,
    patch_size: int,
    in_chans: int,
    num_classes: int,
    dim: int,
    depth: int,
    num_heads: int,
    mlp_ratio: float = 2.0,
    pool: str = "cls",
    encoding_options: Mapping[str, object] | None = None,
    peg_blocks: Sequence[int] = (0,),
    feature_map: str | None = None,
    dropout: float = 0.0,
    num_frames: int | None = None,
    tubelet_size: int = 1,
) -> dict[str, object]:
    """The plain config dict of a ViT (see :func:`build_vit`); ``peg_blocks`` only for PEG;
    ``num_frames`` and ``tubelet_size`` only for a video model."""
    config: dict[str, object] = {
        "img_size": img_size, "patch_size": patch_size, "in_chans": in_chans, "num_classes": num_classes,
        "dim": dim, "depth": depth, "num_heads": num_heads, "mlp_ratio": mlp_ratio, "pool": pool,
        "encoding": None if encoding in (None, "none") else encoding,
        "encoding_options": dict(encoding_options or {}), "dropout": dropout,
    }
    if feature_map is not None:  # absent for softmax: configs written before linear attention still load
        config["feature_map"] = feature_map
    if encoding == "peg":
        config["peg_blocks"] = list(peg_blocks)
    if num_frames is not None:
        config["num_frames"], config["tubelet_size"] = num_frames, tubelet_size
    return config


def accuracy(model: nn.Module, data: Dataset, *, batch_size: int = 256) -> float:
    """Top-1 accuracy of ``model`` (in its current mode) on ``(image, label)`` items."""
    device = next(model.parameters()).device
    correct = total = 0
    with torch.no_grad():
        for images, labels in DataLoader(data, batch_size=batch_size, shuffle=False):
            logits = model(images.to(device))
            correct += int((logits.argmax(-1).cpu() == labels).sum())
            total += len(labels)
    return correct / max(1, total)


def classification_loss(model: nn.Module, batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy of ``model(images)`` against the labels; the batch accuracy as an extra."""
    images, labels = batch
    logits = model(images)
    return F.cross_entropy(logits, labels), {"accuracy": (logits.argmax(-1) == labels).float().mean().item()}


def evaluate_sizes(model: nn.Module, sets: Mapping[int, Dataset], *, batch_size: int = 256) -> dict[str, float]:
    """``{"accuracy@<size>": accuracy}`` per evaluation set. A size the model refuses (an encoding that
    cannot follow the new grid) gives NaN, and the reason is printed once."""
    out: dict[str, float] = {}
    for size, data in sets.items():
        try:
            out[f"accuracy@{size}"] = accuracy(model, data, batch_size=batch_size)
        except ValueError as exc:
            print(f"size {size}: refused: {exc}", file=sys.stderr)
            out[f"accuracy@{size}"] = math.nan
    return out


def train_vit(
    model_config: Mapping[str, object],
    train_set: Dataset,
    eval_sets: Mapping[int, Dataset],
    train_config,
) -> tuple[nn.Module, dict[str, float], object]:
    """Build the ViT of ``model_config``, train it on ``train_set`` with ``train_config`` (a
    :class:`~posenc.training.trainer.TrainConfig`) and evaluate it on ``eval_sets`` ({size: set}).
    Returns ``(model, metrics, trainer)``; metrics hold ``train_loss``, ``train_accuracy`` and ``accuracy@<size>``."""
    from ..training.trainer import Trainer

    torch.manual_seed(train_config.seed)
    model = build_vit(model_config)

    def evaluate(m: nn.Module) -> dict[str, float]:
        return evaluate_sizes(m, eval_sets)

    trainer = Trainer(model, train_set, classification_loss, train_config, eval_fn=evaluate,
                      model_config=dict(model_config))
    metrics = trainer.fit()
    return model, metrics, trainer


__all__ = ["eval_sizes", "build_vit", "vit_config", "accuracy", "classification_loss", "evaluate_sizes", "train_vit"]
