"""Training checkpoints: atomic writes, ``weights_only`` loads, RNG state capture, model checks.

A checkpoint is a plain ``dict`` holding only tensors and Python primitives (no pickled
classes), so it loads with ``torch.load(path, weights_only=True)``. The keys the trainer writes:

``format``            :data:`CHECKPOINT_FORMAT`
``model``             the model ``state_dict`` (unwrapped from DDP)
``model_class``       ``type(model).__name__``
``model_config``      the ``model_config`` dict given to the trainer (or None)
``optimizer``         ``optimizer.state_dict()``
``scheduler``         ``scheduler.state_dict()``
``step``              optimizer steps done
``epoch``, ``batch``  the next batch to draw: batch index ``batch`` of epoch ``epoch``
``rng``               one :func:`capture_rng_state` dict per rank
``log_window``        per rank, the loss/metric sums since the last train log line (so a resumed
                      run logs the same means as an uninterrupted one)
``config``            the ``TrainConfig`` as a dict
``world_size``        processes in the job that wrote it
``elapsed``           training seconds so far
``last_loss``         the last training loss (NaN before the first step)

:func:`load_checkpoint` refuses anything else with one :class:`CheckpointError` (a ``ValueError``)
whose one-line message names the file and what is wrong: a directory, an empty, truncated or
foreign file, a missing or mistyped key, an impossible counter (``step=-5``), or weights and
optimizer state that are not finite.
"""

from __future__ import annotations

import math
import os
import pickle
import random
import re
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from .report import write_atomic

CHECKPOINT_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: the message names the file and what is wrong, in one line."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"checkpoint {os.fspath(path)}: {problem}")
        self.path, self.problem = os.fspath(path), problem

# Types a ``model_config`` may contain so that it survives ``torch.load(..., weights_only=True)``.
_PLAIN = (type(None), bool, int, float, str)


def check_plain(value: Any, name: str) -> None:
    """Raise TypeError unless ``value`` is built from None/bool/int/float/str, lists, tuples and
    str-keyed dicts only (what a ``weights_only`` load can restore)."""

    def walk(v: Any, where: str) -> None:
        if isinstance(v, _PLAIN):
            return
        if isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                walk(item, f"{where}[{i}]")
            return
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    raise TypeError(f"{name}: keys must be str; got {k!r} at {where}")
                walk(item, f"{where}[{k!r}]")
            return
        raise TypeError(
            f"{name} must hold only None/bool/int/float/str, lists, tuples and dicts (so the checkpoint loads "
            f"with weights_only=True); got {type(v).__name__} at {where}"
        )

    walk(value, name)


# ----------------------------------------------------------------------------------------------
# RNG state


def capture_rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The state of torch (CPU and ``device`` if CUDA), ``random`` and ``numpy`` RNGs, as tensors
    and primitives only."""
    version, internal, gauss_next = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    cuda = None
    if device is not None and device.type == "cuda":
        cuda = torch.cuda.get_rng_state(device)
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "python": [int(version), torch.tensor(internal, dtype=torch.int64), gauss_next],
        "numpy": [str(np_name), torch.from_numpy(np.asarray(np_keys).astype(np.int64)), int(np_pos),
                  int(np_has_gauss), float(np_cached)],
    }


def restore_rng_state(state: Mapping[str, Any], device: torch.device | None = None) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal.tolist()), gauss_next))
    np_name, np_keys, np_pos, np_has_gauss, np_cached = state["numpy"]
    np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), int(np_pos), int(np_has_gauss), float(np_cached)))


# ----------------------------------------------------------------------------------------------
# Files


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file beside ``path``, fsync, then ``os.replace``
    (:func:`posenc.training.report.write_atomic`): a reader sees the old file or the new one, never a
    partial one; on any failure ``path`` is untouched."""
    write_atomic(path, lambda f: torch.save(obj, f))


# The keys the trainer writes, and the type each must have (``int`` never a ``bool``).
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "model": dict, "optimizer": dict, "scheduler": dict, "step": int, "epoch": int, "batch": int,
    "rng": list, "log_window": list, "world_size": int, "config": dict,
}


def _first_line(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()  # torch colours some messages
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def _non_finite(tensors: Mapping[str, Any], prefix: str) -> str | None:
    """The first floating tensor of ``tensors`` (nested dicts and lists walked) holding NaN or
    inf, described; None when all are finite."""
    stack: list[tuple[str, Any]] = [(f"{prefix}[{k!r}]", v) for k, v in tensors.items()]
    while stack:
        where, value = stack.pop(0)
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and value.numel() and not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                return f"{where} holds {bad} non-finite value(s) of {value.numel()}"
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{where} is {value}"
        elif isinstance(value, Mapping):
            stack.extend((f"{where}[{k!r}]", v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
    return None


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """``torch.load(path, map_location="cpu", weights_only=True)``, checked to be a trainer
    checkpoint that can be resumed from (see the module docstring); anything else is a
    :class:`CheckpointError`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(path, "is a directory, not a checkpoint file")
    if not os.path.exists(path):
        raise CheckpointError(path, "does not exist")
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise CheckpointError(path, f"cannot be read ({_first_line(exc)})") from None
    if size == 0:
        raise CheckpointError(path, "is empty (0 bytes): not a checkpoint, or a write that never finished")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" not in str(exc).lower():  # random bytes also fail to unpickle
            raise CheckpointError(
                path, "cannot be loaded: truncated, corrupted, or not written by posenc (it does not unpickle)"
            ) from None
        raise CheckpointError(
            path, "holds pickled Python objects that a weights_only load refuses: not a posenc checkpoint (posenc "
            "writes tensors and plain values only), and not safe to unpickle unless you trust its source"
        ) from None
    except Exception as exc:  # EOFError, RuntimeError (PytorchStreamReader), OSError, ...
        raise CheckpointError(
            path, f"cannot be loaded: truncated, corrupted, or not written by posenc ({_first_line(exc)})"
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "step" not in ckpt:
        found = sorted(map(str, ckpt))[:10] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(path, f"is not a posenc trainer checkpoint: expected a dict with 'model' and 'step'; found {found}")
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(path, f"expected checkpoint format {CHECKPOINT_FORMAT}; found {ckpt.get('format')!r}")
    for key, kind in _REQUIRED.items():
        if key not in ckpt:
            raise CheckpointError(path, f"has no {key!r} entry (every trainer checkpoint has one): edited or damaged")
        value = ckpt[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            what = "an int" if kind is int else f"a {kind.__name__}"
            raise CheckpointError(path, f"{key!r} must be {what}; found {type(value).__name__} {value!r:.40}")
    for key in ("step", "epoch", "batch"):
        if ckpt[key] < 0:
            raise CheckpointError(path, f"{key}={ckpt[key]} is impossible (a count, >= 0): edited or damaged")
    if ckpt["world_size"] < 1:
        raise CheckpointError(path, f"world_size={ckpt['world_size']} is impossible (>= 1): edited or damaged")
    for key in ("rng", "log_window"):
        if len(ckpt[key]) != ckpt["world_size"]:
            raise CheckpointError(
                path, f"{key!r} has {len(ckpt[key])} entries for world_size={ckpt['world_size']}: edited or damaged"
            )
    elapsed = ckpt.get("elapsed", 0.0)
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not math.isfinite(elapsed) or elapsed < 0:
        raise CheckpointError(path, f"elapsed={elapsed!r} is impossible (finite seconds >= 0)")
    for key in ("model", "optimizer"):
        problem = _non_finite(ckpt[key], key)
        if problem is not None:
            raise CheckpointError(path, f"{problem}: the run diverged before it was written (or it was edited); "
                                        "resume from an earlier checkpoint or start fresh")
    return ckpt


def check_model_matches(
    ckpt: Mapping[str, Any], model: nn.Module, model_config: Mapping[str, Any] | None, path: str | os.PathLike
) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` was written for a model like ``model``: same class name,
    same ``model_config`` and the same ``state_dict`` keys and shapes. The message lists every
    difference, expected (this model) against found (the checkpoint)."""
    problems: list[str] = []
    expected_class, found_class = type(model).__name__, ckpt.get("model_class")
    if expected_class != found_class:
        problems.append(f"model class: expected {expected_class!r}, found {found_class!r}")
    expected_cfg = dict(model_config) if model_config is not None else None
    found_cfg = ckpt.get("model_config")
    if expected_cfg != found_cfg:
        if isinstance(expected_cfg, dict) and isinstance(found_cfg, dict):
            keys = sorted(set(expected_cfg) | set(found_cfg))
            diffs = [
                f"{k}: expected {expected_cfg.get(k, '<absent>')!r}, found {found_cfg.get(k, '<absent>')!r}"
                for k in keys
                if expected_cfg.get(k, _MISSING) != found_cfg.get(k, _MISSING)
            ]
            problems.append("model_config differs (" + "; ".join(diffs) + ")")
        else:
            problems.append(f"model_config: expected {expected_cfg!r}, found {found_cfg!r}")
    problems += state_dict_problems(model.state_dict(), ckpt["model"], "the checkpoint")
    if problems:
        raise CheckpointError(
            path, "was written for a different model; " + " | ".join(problems)
            + ". Use another out_dir, or resume=False to start fresh."
        )


def state_dict_problems(own: Mapping[str, Any], theirs: Mapping[str, Any], where: str) -> list[str]:
    """How ``theirs`` (a saved state dict, from ``where``) differs from a model's ``own``: keys
    missing from it, keys it has in excess, and shape mismatches (expected = the model's); empty
    when it loads."""
    problems = []
    missing = [k for k in own if k not in theirs]
    unexpected = [k for k in theirs if k not in own]
    if missing:
        problems.append(f"state_dict keys missing from {where}: {_short(missing)}")
    if unexpected:
        problems.append(f"unexpected state_dict keys in {where}: {_short(unexpected)}")
    shapes = [
        f"{k}: expected {tuple(own[k].shape)}, found {tuple(theirs[k].shape)}"
        for k in own
        if k in theirs and hasattr(theirs[k], "shape") and tuple(own[k].shape) != tuple(theirs[k].shape)
    ]
    if shapes:
        problems.append("shape mismatches: " + _short(shapes))
    kinds = [f"{k}: expected a {_kind(own[k])} tensor ({own[k].dtype}), found "
             + (f"a {_kind(theirs[k])} tensor ({theirs[k].dtype})" if isinstance(theirs[k], torch.Tensor)
                else type(theirs[k]).__name__)
             for k in own if k in theirs and isinstance(own[k], torch.Tensor)
             and (not isinstance(theirs[k], torch.Tensor) or _kind(own[k]) != _kind(theirs[k]))]
    if kinds:
        problems.append("wrong dtypes (loading would cast them silently): " + _short(kinds))
    # NaN or inf where the model's own tensor is finite: such weights would make every output NaN
    # (a buffer that holds inf by design, a mask, stays allowed)
    broken = [k for k in own if k in theirs and isinstance(theirs[k], torch.Tensor) and isinstance(own[k], torch.Tensor)
              and theirs[k].is_floating_point() and own[k].is_floating_point() and theirs[k].numel()
              and not bool(torch.isfinite(theirs[k]).all()) and bool(torch.isfinite(own[k]).all())]
    if broken:
        problems.append("non-finite (NaN or inf) values in " + _short(broken))
    return problems


def _kind(tensor: torch.Tensor) -> str:
    """The dtype family a state dict entry must keep: a float weight read from ints is no weight."""
    if tensor.dtype == torch.bool:
        return "bool"
    if tensor.is_complex():
        return "complex"
    return "floating-point" if tensor.is_floating_point() else "integer"


class _Missing:
    pass


_MISSING = _Missing()


def _short(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")
