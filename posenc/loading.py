"""``posenc.load(path)``: a reference model back from disk, whatever wrote it.

``path`` may be

* a directory of ``model.save_pretrained(path)`` (``config.json`` and ``model.pt``);
* the ``--out`` directory of ``posenc train seq|vision|graph|timeseries``: the trainer's
  ``checkpoint.pt`` holds the model's class name, its constructor arguments (``model_config``) and
  its weights (the last checkpoint written: the end of training, or the latest periodic one);
* the output of ``posenc extend`` (``results.json`` with the method, factor and original length):
  the run's model, from the fine-tuned checkpoint there if it was fine-tuned, else from the run it
  extended, switched to the recorded context extension.

The model is returned on the CPU in eval mode. The reference models are :class:`posenc.seq.CausalLM`,
:class:`posenc.seq.SequenceEncoder`, :class:`posenc.vision.ViT`, :class:`posenc.graph.gps.GPS` and
:class:`posenc.timeseries.convtran.ConvTranClassifier`; only those names are built (nothing named in a file
is imported).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from torch import nn

from .common.checks import check_int, check_number
from .training.vocabulary import read_results

from .training.checkpoint import load_checkpoint
from .training.pretrained import (
    CONFIG_FILE,
    build_from_config,
    first_line,
    load_state_checked,
    read_pretrained_config,
)

CHECKPOINT_FILE = "checkpoint.pt"
# class name -> the module that defines it (imported on use: loading a ViT does not load PyG)
MODEL_CLASSES = {
    "CausalLM": "posenc.seq.models",
    "SequenceEncoder": "posenc.seq.models",
    "ViT": "posenc.vision.vit",
    "GPS": "posenc.graph.gps",
    "ConvTranClassifier": "posenc.timeseries.convtran",
}


def model_class(name: str) -> type[nn.Module]:
    """The reference model class called ``name``; a ValueError listing them otherwise."""
    if name not in MODEL_CLASSES:
        raise ValueError(f"unknown model class {name!r}; posenc.load builds {', '.join(MODEL_CLASSES)}")
    return getattr(importlib.import_module(MODEL_CLASSES[name]), name)


def load(path: str | os.PathLike) -> nn.Module:
    """The model saved at ``path`` (see the module docstring), on the CPU, in eval mode."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"{os.fspath(path)!r} is not a directory (save_pretrained or posenc train --out writes one)")
    if (directory / CONFIG_FILE).is_file():
        return model_class(read_pretrained_config(directory)["model_class"]).from_pretrained(directory)
    record = _results(directory / "results.json")
    if record is not None and "method" in record and "run_dir" in record:
        return _load_extension(directory, record)
    if (directory / CHECKPOINT_FILE).is_file():
        return load_run_checkpoint(directory / CHECKPOINT_FILE).eval()
    raise FileNotFoundError(
        f"{os.fspath(path)!r} has neither {CONFIG_FILE} (save_pretrained) nor {CHECKPOINT_FILE} (posenc train --out)"
    )


def load_run_checkpoint(path: Path) -> nn.Module:
    """The model of a trainer checkpoint: built from its ``model_class`` and ``model_config``,
    weights loaded (left in train mode)."""
    try:
        ckpt = load_checkpoint(path)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 -- an unreadable file is one line, whatever torch raised
        raise ValueError(f"{path} is not a readable checkpoint: {type(exc).__name__}: {first_line(exc)}") from None
    config = ckpt.get("model_config")
    if not isinstance(config, dict):
        raise ValueError(f"{path} has no model_config (written by a Trainer given none): the model cannot be rebuilt")
    model = build_from_config(model_class(str(ckpt.get("model_class"))), config, f"{path}: model_config")
    load_state_checked(model, ckpt["model"], os.fspath(path))
    return model


def _results(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return read_results(path)  # runs written with the old metric names read in today's
    except OSError as exc:
        raise ValueError(f"{path} is not readable JSON: {exc}") from None
    except ValueError as exc:
        if "not an object" in str(exc):
            return None
        raise


def _load_extension(directory: Path, record: dict[str, Any]) -> nn.Module:
    """A ``posenc extend`` output: the (fine-tuned or original) run's model with its extension."""
    from .seq.context import extend_context

    if (directory / CHECKPOINT_FILE).is_file():  # fine-tuned at the target length
        source = directory / CHECKPOINT_FILE
    else:
        run_dir = Path(str(record["run_dir"]))
        if not (run_dir / CHECKPOINT_FILE).is_file() and (directory.parent / CHECKPOINT_FILE).is_file():
            run_dir = directory.parent  # the default --out sits inside the run it extends
        source = run_dir / CHECKPOINT_FILE
        if not source.is_file():
            raise FileNotFoundError(f"{directory}: the extended run's {source} is missing")
    where = directory / "results.json"
    options = record.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"{where}: options must be a JSON object; got {options!r}")
    if not isinstance(record["method"], str):
        raise ValueError(f"{where}: method must be a name; got {record['method']!r}")
    try:
        factor = check_number("factor", record.get("factor"), minimum=1.0)
        original = record.get("original_max_len")
        if original is not None:
            check_int("original_max_len", original, minimum=1)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    model = load_run_checkpoint(source)
    try:
        extend_context(model, record["method"], factor=factor, original_max_len=original, **options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {first_line(exc)}") from None
    return model.eval()


__all__ = ["MODEL_CLASSES", "load", "load_run_checkpoint", "model_class"]
