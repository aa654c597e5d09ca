"""The shared trainer of the reference models: AdamW, warm-up + cosine, AMP, DDP, exact resume.

::

    cfg = TrainConfig(steps=2000, batch_size=64, lr=3e-4, out_dir="runs/alibi")
    trainer = Trainer(model, train_set, loss_fn, cfg, eval_fn=evaluate, model_config={"dim": 128})
    metrics = trainer.fit()  # {"train_loss": ..., **evaluate(model)}

``loss_fn(model, batch) -> (loss, extras)`` gets the batch already on the device. Under DDP the
``model`` it gets is the DDP wrapper, so it must call ``model(...)`` (the forward) for gradients to
be synchronised. ``eval_fn(model) -> metrics`` gets the bare model in eval mode under
``torch.no_grad()`` (and autocast when AMP is on); it runs on every rank and must fetch its own data.

Determinism. ``seed`` seeds torch, ``random`` and numpy (rank ``r`` of a multi-process job uses
``seed + r``, so dropout differs between ranks). The data order of epoch ``e`` is
``torch.randperm`` from a generator seeded with ``(seed, e)``, the same on every rank; rank ``r``
takes every ``world_size``-th index of it (like ``DistributedSampler``), and the trailing
incomplete batch is dropped. Evaluation runs with the RNG state saved and restored around it, so
how often one evaluates never changes the training trajectory. A checkpoint holds the position
within the epoch and every rank's RNG state, so a run killed and resumed ends with exactly the
parameters of an uninterrupted one (with ``num_workers=0``, or datasets whose items do not draw
random numbers in worker processes).

Files (rank 0 only, when ``out_dir`` is set): ``metrics.jsonl`` with one JSON object per line,
``{"split": "train", "step", "lr", "loss", <extras>, "grad_norm", "elapsed"}`` every ``log_every``
steps (loss and extras are means over the steps since the previous line, the loss also over ranks)
and ``{"split": "eval", "step", <eval metrics>, "elapsed"}``; and ``checkpoint.pt``
(see :mod:`.checkpoint`). Resuming drops lines logged after the checkpoint's step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..common.checks import check_bool, check_int, check_number, is_int
from .json_input import parse_json
from .report import Progress, write_atomic
from . import distributed as distu
from .checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    capture_rng_state,
    check_model_matches,
    check_plain,
    load_checkpoint,
    restore_rng_state,
    save_atomic,
)

logger = logging.getLogger("posenc.trainer")

LossFn = Callable[[nn.Module, Any], "tuple[Tensor, dict[str, float]]"]
EvalFn = Callable[[nn.Module], "dict[str, float]"]

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"


# ----------------------------------------------------------------------------------------------
# Configuration

# The settings that shape training: a resumed run must keep them (the schedule depends on them).
RESUME_FIELDS = ("steps", "batch_size", "lr", "weight_decay", "warmup_steps", "min_lr_ratio", "grad_clip")


class ResumeMismatch(CheckpointError):
    """A checkpoint was written under other training settings than the run resuming it."""

    def __init__(self, path: str, field: str, saved: Any, requested: Any) -> None:
        super().__init__(
            path, f"was written with {field}={saved!r}, but this run has {field}={requested!r}; resuming "
            f"continues the same run, so the settings that shape training must match (use {field}={saved!r}, or start "
            "a new run in another out_dir)"
        )
        self.field, self.saved, self.requested = field, saved, requested


@dataclass
class TrainConfig:
    """Everything a training run needs besides the model and the data. Checked on construction:
    a bad value is a ValueError (TypeError for a wrong type) naming the field."""

    steps: int = 1000  # optimizer steps in total
    batch_size: int = 32  # per process
    lr: float = 1e-3
    weight_decay: float = 0.01
    # linear warm-up, then cosine decay to min_lr_ratio * lr at `steps`; None: min(100, steps // 10),
    # so a short run is not all warm-up (a larger explicit value is honoured: the run is then warm-up)
    warmup_steps: int | None = None
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    amp: bool = True  # bf16 autocast on CUDA only; ignored on CPU
    seed: int = 0
    device: str = "auto"  # "auto" -> cuda if available else cpu (under torchrun: cuda:LOCAL_RANK)
    out_dir: str | None = None  # where metrics.jsonl and checkpoint.pt go; None = nothing written
    log_every: int = 10
    eval_every: int = 0  # 0: evaluate only at the end
    checkpoint_every: int = 0  # 0: checkpoint only at the end (if out_dir)
    resume: bool = False  # continue from out_dir/checkpoint.pt if it exists
    progress: bool = True  # progress on stderr, rank 0 only (posenc.training.report.Progress)
    num_workers: int = 0

    def __post_init__(self) -> None:
        if self.warmup_steps is None and is_int(self.steps):
            self.warmup_steps = min(100, max(0, self.steps) // 10)
        self.validate()

    def validate(self) -> None:
        def field(name: str) -> tuple[str, Any]:
            return f"TrainConfig.{name}", getattr(self, name)

        for name in ("steps", "batch_size"):
            check_int(*field(name), minimum=1)
        for name in ("warmup_steps", "log_every", "eval_every", "checkpoint_every", "num_workers"):
            check_int(*field(name), minimum=0)
        check_int(*field("seed"), minimum=0, maximum=2**32 - 1)  # numpy's limit
        check_number(*field("lr"), minimum=0.0, strict=True)
        check_number(*field("weight_decay"), minimum=0.0)
        check_number(*field("min_lr_ratio"), minimum=0.0, maximum=1.0)
        if self.grad_clip is not None:
            check_number(*field("grad_clip"), minimum=0.0, strict=True)
        for name in ("amp", "resume", "progress"):
            check_bool(*field(name))
        if not isinstance(self.device, str) or not self.device:
            raise TypeError(f"TrainConfig.device must be a non-empty str such as 'auto', 'cpu' or 'cuda:0'; got {self.device!r}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError):
                raise ValueError(
                    f"TrainConfig.device must be 'auto' or a torch device string such as 'cpu' or 'cuda:0'; got {self.device!r}"
                ) from None
        if self.out_dir is not None and (not isinstance(self.out_dir, (str, os.PathLike)) or not os.fspath(self.out_dir)):
            raise TypeError(f"TrainConfig.out_dir must be a non-empty path or None; got {self.out_dir!r}")
        if self.resume and self.out_dir is None:
            raise ValueError("TrainConfig.resume=True needs TrainConfig.out_dir (the checkpoint lives there); got out_dir=None")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["out_dir"] is not None:
            d["out_dir"] = os.fspath(d["out_dir"])
        return d


# ----------------------------------------------------------------------------------------------
# Pure helpers (public: the tests and the reference models use them)


def lr_factor(step: int, *, steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (0-based).

    Warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps`` (full rate at the last
    warm-up step). Then cosine: ``r + (1 - r) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup_steps) / (steps - warmup_steps)`` and ``r = min_lr_ratio``, which reaches
    ``r`` at ``step == steps``. With ``warmup_steps >= steps`` the whole run is warm-up.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s data permutation: a hash of ``(seed, epoch)`` to 32 bits (the
    CPU generator's Mersenne Twister keeps only the low 32 bits of a seed, so ``seed << 32 | epoch``
    would make the order ignore ``seed``)."""
    return _hash32("posenc.epoch", seed, epoch)


def _hash32(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def epoch_batches(
    num_samples: int, batch_size: int, *, seed: int, epoch: int, rank: int = 0, world_size: int = 1
) -> list[list[int]]:
    """The index batches of ``rank`` in epoch ``epoch``.

    One permutation of ``range(num_samples)`` per epoch from a ``torch.Generator`` seeded with
    ``(seed, epoch)``, identical on every rank; it is cut to a multiple of ``world_size``, rank ``r``
    takes positions ``r, r + world_size, ...``, and only full batches are kept.
    """
    g = torch.Generator()
    g.manual_seed(epoch_seed(seed, epoch))
    perm = torch.randperm(num_samples, generator=g)
    per_rank = num_samples // world_size
    shard = perm[rank : per_rank * world_size : world_size]
    n_batches = per_rank // batch_size
    return shard[: n_batches * batch_size].view(n_batches, batch_size).tolist()


def move_to_device(obj: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Move tensors inside (nested) tuples, lists, namedtuples and dicts to ``device``; objects
    with a ``.to`` method (e.g. PyG batches) are moved with it; anything else is returned as is."""
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        return _rebuild_mapping(obj, device, non_blocking)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(move_to_device(v, device, non_blocking=non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to_device(v, device, non_blocking=non_blocking) for v in obj)
    to = getattr(obj, "to", None)
    if callable(to) and not isinstance(obj, (str, bytes, nn.Module)):
        return to(device)
    return obj


def _rebuild_mapping(obj: Mapping, device: torch.device, non_blocking: bool) -> Any:
    moved = {k: move_to_device(v, device, non_blocking=non_blocking) for k, v in obj.items()}
    if type(obj) is dict:
        return moved
    try:
        return type(obj)(moved)
    except TypeError:
        return moved


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and every CUDA device), ``random`` and numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay for matrices (``ndim >= 2``), none for biases, norm weights and other
    1-D or scalar parameters. Frozen parameters are left out."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


# ----------------------------------------------------------------------------------------------
# Trainer


def kept_metrics(path: str | os.PathLike, resumed_step: int) -> list[dict[str, Any]]:
    """The records of the metrics log at ``path`` up to ``resumed_step`` (what a resumed run keeps).
    The last line may be cut short by a kill and is dropped; any other line that is not a record
    (not UTF-8, not JSON, not an object, a ``step`` that is not an int) is one ValueError naming
    the file and the line: the log was edited or damaged."""
    raw = Path(path).read_bytes().split(b"\n")
    last = max((i for i, line in enumerate(raw) if line.strip()), default=-1)
    kept = []
    for i, line in enumerate(raw):
        if not line.strip():
            continue
        where = f"{os.fspath(path)} line {i + 1}"
        try:
            rec = parse_json(line, where)
        except ValueError:
            if i == last:
                continue  # a line cut short by a kill
            raise ValueError(f"{where} is not a JSON record (the metrics log was edited or damaged; move it away "
                             "to resume without it)") from None
        step = rec.get("step") if isinstance(rec, dict) else None
        if not is_int(step):
            raise ValueError(f"{where}: a metrics record must be a JSON object with an int 'step'; got "
                             f"{line[:80].decode('utf-8', 'replace')!r}")
        if step <= resumed_step:
            kept.append(rec)
    return kept


class Trainer:
    """Trains ``model`` on ``train_data`` with ``loss_fn``; see the module docstring.

    Args:
        model: the model; moved to the trainer's device here (and wrapped in DDP under torchrun).
        train_data: a map-style dataset (``__len__`` and ``__getitem__``).
        loss_fn: ``loss_fn(model, batch) -> (scalar loss, {name: float})``.
        config: the :class:`TrainConfig`.
        eval_fn: ``eval_fn(model) -> {name: float}``, every ``eval_every`` steps and at the end.
        collate_fn: for the DataLoader (default: ``torch.utils.data.default_collate``).
        model_config: the constructor arguments of the model (plain values only); stored in the
            checkpoint and checked on resume.
        ddp_kwargs: extra keyword arguments for ``DistributedDataParallel`` (for instance
            ``{"find_unused_parameters": True}`` for a model whose forward skips parameters).

    Attributes: ``model`` (bare), ``train_model`` (what ``loss_fn`` gets: DDP wrapper or bare
    model), ``optimizer``, ``scheduler``, ``device``, ``rank``, ``world_size``, ``is_main``,
    ``step``, ``epoch``, ``batch_in_epoch`` (the next batch to draw), ``batches_per_epoch``.

    Under torchrun the process group is created here (when none exists) and destroyed at the end
    of :meth:`fit` (``train_model`` is then the bare model again); a trainer is then good for one
    ``fit``.
    """

    def __init__(
        self,
        model: nn.Module,
        train_data: Dataset,
        loss_fn: LossFn,
        config: TrainConfig,
        *,
        eval_fn: EvalFn | None = None,
        collate_fn: Callable | None = None,
        model_config: dict | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig; got {type(config).__name__}")
        config.validate()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
        if isinstance(model, DistributedDataParallel):
            raise TypeError("model must be the bare module; the trainer wraps it in DistributedDataParallel itself")
        if isinstance(train_data, IterableDataset) or not hasattr(train_data, "__len__") or not hasattr(train_data, "__getitem__"):
            raise TypeError(f"train_data must be a map-style dataset with __len__ and __getitem__; got {type(train_data).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable; got {type(loss_fn).__name__}")
        if eval_fn is not None and not callable(eval_fn):
            raise TypeError(f"eval_fn must be callable or None; got {type(eval_fn).__name__}")
        if model_config is not None:
            if not isinstance(model_config, dict):
                raise TypeError(f"model_config must be a dict or None; got {type(model_config).__name__}")
            check_plain(model_config, "model_config")
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError(f"model ({type(model).__name__}) has no trainable parameters")

        self.config = config
        self.loss_fn = loss_fn
        self.eval_fn = eval_fn
        self.train_data = train_data
        self.collate_fn = collate_fn
        self.model_config = model_config

        env = distu.dist_env()
        self.rank, self.world_size = env.rank, env.world_size
        self.device = distu.resolve_device(config.device, env)
        n = len(train_data)
        per_rank = n // self.world_size
        if per_rank < config.batch_size:
            raise ValueError(
                f"TrainConfig.batch_size={config.batch_size} is larger than the data each process gets: "
                f"{n} samples / {self.world_size} process(es) = {per_rank}; lower batch_size or add data"
            )
        self.batches_per_epoch = per_rank // config.batch_size
        # Runs never clobber: checked on every rank before the process group forms, so no rank can
        # have written yet.
        if self.out_dir is not None and not config.resume:
            held = [f for f in (METRICS_FILE, CHECKPOINT_FILE) if os.path.lexists(os.path.join(self.out_dir, f))]
            if held:
                raise ValueError(
                    f"out_dir {self.out_dir!r} already holds a run ({', '.join(held)}); pass resume=True to continue "
                    "it, or choose another out_dir"
                )

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is what NCCL collectives use
        self._owns_group = distu.init_process_group(env, self.device)
        seed_everything(config.seed + self.rank)

        self.model = model.to(self.device)
        if env.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model: nn.Module = DistributedDataParallel(self.model, device_ids=ids, **(ddp_kwargs or {}))
        else:
            self.train_model = self.model
        self.optimizer = torch.optim.AdamW(param_groups(self.model, config.weight_decay), lr=config.lr)
        steps, warmup, ratio = config.steps, config.warmup_steps, config.min_lr_ratio

        def schedule(step: int) -> float:
            return lr_factor(step, steps=steps, warmup_steps=warmup, min_lr_ratio=ratio)

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)

        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self._elapsed_before = 0.0  # seconds trained before this process (from a checkpoint)
        self._t0 = time.perf_counter()
        self._last_loss = math.nan
        self._last_extras: dict[str, float] = {}
        self._reset_window()
        self._metrics_file = None
        self._last_checkpoint_step = -1

    # ---- small helpers ------------------------------------------------------------------------

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def out_dir(self) -> str | None:
        return None if self.config.out_dir is None else os.fspath(self.config.out_dir)

    @property
    def checkpoint_path(self) -> str | None:
        return None if self.out_dir is None else os.path.join(self.out_dir, CHECKPOINT_FILE)

    @property
    def metrics_path(self) -> str | None:
        return None if self.out_dir is None else os.path.join(self.out_dir, METRICS_FILE)

    @property
    def amp_enabled(self) -> bool:
        return self.config.amp and self.device.type == "cuda"

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on CUDA when ``amp``; a no-op otherwise."""
        if self.amp_enabled:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def to_device(self, obj: Any) -> Any:
        """:func:`move_to_device` to this trainer's device."""
        return move_to_device(obj, self.device, non_blocking=self.device.type == "cuda")

    def elapsed(self) -> float:
        return self._elapsed_before + (time.perf_counter() - self._t0)

    # ---- data ---------------------------------------------------------------------------------

    def _loader(self, epoch: int, start: int) -> DataLoader:
        batches = epoch_batches(
            len(self.train_data), self.config.batch_size, seed=self.config.seed, epoch=epoch,
            rank=self.rank, world_size=self.world_size,
        )[start:]
        # A DataLoader draws its workers' base seed from `generator` (from the global RNG without
        # one) even with num_workers=0; a dedicated generator keeps the global RNG stream intact.
        g = torch.Generator()
        g.manual_seed(_hash32("posenc.loader", self.config.seed, epoch, self.rank))
        return DataLoader(
            self.train_data,
            batch_sampler=batches,
            collate_fn=self.collate_fn,
            num_workers=self.config.num_workers,
            pin_memory=self.device.type == "cuda",
            generator=g,
        )

    # ---- logging ------------------------------------------------------------------------------

    def _prepare_out_dir(self) -> None:
        """Rank 0, before anything is written: the run directory exists, holds no symbolic link
        where the trainer writes (a link would send a write outside it), and no temporary files
        left by a checkpoint write that was killed."""
        os.makedirs(self.out_dir, exist_ok=True)
        for name in (METRICS_FILE, CHECKPOINT_FILE):
            path = os.path.join(self.out_dir, name)
            if os.path.islink(path):
                raise ValueError(f"{path} is a symbolic link; the trainer writes only plain files inside out_dir "
                                 "(remove the link)")
        for entry in os.scandir(self.out_dir):
            stale = entry.name.startswith((f".{CHECKPOINT_FILE}.", f".{METRICS_FILE}.")) and entry.name.endswith(".tmp")
            if stale and not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)  # left by a write that was killed; never read

    def _open_metrics(self, resumed_step: int | None) -> None:
        if not self.is_main or self.metrics_path is None:
            return
        self._prepare_out_dir()
        kept: list[str] = []
        if resumed_step is not None and os.path.exists(self.metrics_path):
            kept = [json.dumps(rec) for rec in kept_metrics(self.metrics_path, resumed_step)]
        # the kept lines go to a fresh file renamed over the log: never written through a link
        text = "".join(line + "\n" for line in kept).encode("utf-8")
        write_atomic(self.metrics_path, lambda f: f.write(text))
        self._metrics_file = open(self.metrics_path, "a", encoding="utf-8")

    def _write_metrics(self, record: dict[str, Any]) -> None:
        if self._metrics_file is not None:
            self._metrics_file.write(json.dumps(record) + "\n")
            self._metrics_file.flush()

    # ---- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint contents (this rank's RNG only; :meth:`save_checkpoint` gathers all)."""
        return {
            "format": CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "model_class": type(self.model).__name__,
            "model_config": self.model_config,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "batch": self.batch_in_epoch,
            "rng": [capture_rng_state(self.device)],
            "log_window": [self._window_state()],
            "config": self.config.to_dict(),
            "world_size": self.world_size,
            "elapsed": self.elapsed(),
            "last_loss": float(self._last_loss),
        }

    def _release_group(self, orderly: bool) -> None:
        """Tear down the process group this trainer created.

        After a finished run every rank first meets at a barrier (no rank closes its gloo
        connections while a peer still reads the last collective's messages), and the DDP
        wrapper, whose reducer holds the group, is freed here, in this thread, while the
        interpreter is whole: left to the interpreter's exit, gloo's threads are destroyed
        during finalization, which can abort the process (SIGABRT after a successful run).
        After an error no barrier: the other ranks may never reach one.
        """
        if orderly:
            distu.barrier()
        if self.train_model is not self.model:
            self.train_model = self.model
            gc.collect()  # DDP's hooks form reference cycles; free the reducer now
        distu.destroy_process_group()
        self._owns_group = False

    def save_checkpoint(self) -> None:
        """Write ``out_dir/checkpoint.pt`` atomically (rank 0; every rank must call it)."""
        if self.checkpoint_path is None:
            return
        per_rank = distu.gather_objects((capture_rng_state(self.device), self._window_state()))
        if self.is_main:
            state = self.state_dict()
            state["rng"] = [rng for rng, _ in per_rank]
            state["log_window"] = [window for _, window in per_rank]
            save_atomic(state, self.checkpoint_path)
        distu.barrier()
        self._last_checkpoint_step = self.step

    def _resume(self) -> int | None:
        """Load ``out_dir/checkpoint.pt`` if ``resume``; the step resumed from, or None."""
        path = self.checkpoint_path
        if not self.config.resume or path is None:
            return None
        if not os.path.exists(path):
            if self.is_main:
                logger.warning("resume=True but there is no checkpoint at %s; starting fresh from step 0", path)
            return None
        ckpt = load_checkpoint(path)
        check_model_matches(ckpt, self.model, self.model_config, path)
        saved_cfg = ckpt.get("config") or {}
        for name in ("world_size", *RESUME_FIELDS):
            now = self.world_size if name == "world_size" else getattr(self.config, name)
            then = ckpt["world_size"] if name == "world_size" else saved_cfg.get(name)
            if then != now:
                raise ResumeMismatch(path, name, then, now)
        if saved_cfg.get("seed") != self.config.seed and self.is_main:
            logger.warning("resuming %s written with seed=%s under seed=%s: the data order changes", path, saved_cfg.get("seed"), self.config.seed)
        # Each part is restored in turn; one that does not fit (an edited optimizer state, a foreign
        # RNG record) is one CheckpointError naming it, raised before the model is touched.
        def scheduler_part() -> None:
            missing = sorted(set(self.scheduler.state_dict()) - set(ckpt["scheduler"]))
            if missing:
                raise KeyError(f"missing {', '.join(missing)}")
            self.scheduler.load_state_dict(ckpt["scheduler"])

        parts = (
            ("optimizer", lambda: self.optimizer.load_state_dict(ckpt["optimizer"])),
            ("scheduler", scheduler_part),
            ("rng", lambda: restore_rng_state(ckpt["rng"][self.rank], self.device)),
            ("log_window", lambda: self._load_window(ckpt["log_window"][self.rank])),
            ("elapsed", lambda: float(ckpt.get("elapsed", 0.0))),
            ("last_loss", lambda: float(ckpt.get("last_loss", math.nan))),
        )
        for part, restore in parts:
            try:
                restore()
            except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
                text = str(exc).strip().splitlines()
                reason = f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__
                raise CheckpointError(path, f"its {part!r} entry does not fit this run ({reason}): edited or damaged") from None
        self.model.load_state_dict(ckpt["model"])
        self.step, self.epoch, self.batch_in_epoch = int(ckpt["step"]), int(ckpt["epoch"]), int(ckpt["batch"])
        self._elapsed_before = float(ckpt.get("elapsed", 0.0))
        self._last_loss = float(ckpt.get("last_loss", math.nan))
        self._last_checkpoint_step = self.step
        if self.is_main:
            logger.info("resumed from %s at step %d (epoch %d, batch %d)", path, self.step, self.epoch, self.batch_in_epoch)
        return self.step

    # ---- the log window: sums over the steps since the last train log line --------------------

    def _reset_window(self) -> None:
        self._window_loss = torch.zeros((), device=self.device)
        self._window_extras: dict[str, float] = {}
        self._window_n = 0

    def _window_state(self) -> dict[str, Any]:
        return {"loss": float(self._window_loss), "n": self._window_n, "extras": dict(self._window_extras)}

    def _load_window(self, state: Mapping[str, Any]) -> None:
        self._window_loss = torch.tensor(float(state["loss"]), dtype=torch.float32, device=self.device)
        self._window_n = int(state["n"])
        self._window_extras = {str(k): float(v) for k, v in state["extras"].items()}

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Run ``eval_fn`` (eval mode, no grad, RNG state restored afterwards) and log its metrics."""
        if self.eval_fn is None:
            return {}
        rng = capture_rng_state(self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.autocast():
                metrics = self.eval_fn(self.model)
        finally:
            self.model.train(was_training)
            restore_rng_state(rng, self.device)
        if not isinstance(metrics, Mapping):
            raise TypeError(f"eval_fn must return a dict of floats; got {type(metrics).__name__}")
        metrics = {str(k): _to_float(v, f"eval_fn metric {k!r}") for k, v in metrics.items()}
        if self.is_main:
            self._write_metrics({"split": "eval", "step": self.step, **metrics, "elapsed": round(self.elapsed(), 3)})
        return metrics

    # ---- training -----------------------------------------------------------------------------

    def _train_step(self, batch: Any) -> tuple[Tensor, dict[str, float], Tensor | None]:
        batch = self.to_device(batch)
        with self.autocast():
            out = self.loss_fn(self.train_model, batch)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(f"loss_fn must return (loss, metrics); got {type(out).__name__}")
        loss, extras = out
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise TypeError(f"loss_fn must return a scalar tensor loss; got {type(loss).__name__}"
                            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else ""))
        if not isinstance(extras, Mapping):
            raise TypeError(f"loss_fn must return a dict of metrics as its second value; got {type(extras).__name__}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.reshape(()).backward()
        grad_norm = None
        if self.config.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        extras = {str(k): _to_float(v, f"loss_fn metric {k!r}") for k, v in extras.items()}
        return loss.detach().float().reshape(()), extras, grad_norm

    def fit(self) -> dict[str, float]:
        """Train to ``config.steps``; returns ``{"train_loss": last loss, "train_<extra>": ...,
        **eval metrics}`` (the loss averaged over ranks)."""
        cfg = self.config
        bar = None
        finished = False
        try:
            resumed = self._resume()
            self._open_metrics(resumed)
            self._t0 = time.perf_counter()
            self.model.train()
            # a bar on a terminal, a plain line every 10 s when redirected (no carriage returns in logs)
            bar = Progress(cfg.steps, "train", initial=min(self.step, cfg.steps),
                           enabled=cfg.progress and self.is_main, every=10.0)
            eval_metrics: dict[str, float] = {}
            evaluated_at = -1
            grad_norm = None
            last_loss_t: Tensor | None = None
            batches: Iterator[Any] | None = None
            while self.step < cfg.steps:
                if batches is None:  # at the start, and after each epoch: the rest of this epoch
                    batches = iter(self._loader(self.epoch, self.batch_in_epoch))
                batch = next(batches)
                lr = self.optimizer.param_groups[0]["lr"]
                loss, extras, grad_norm = self._train_step(batch)
                self.step += 1
                self.batch_in_epoch += 1
                if self.batch_in_epoch >= self.batches_per_epoch:
                    self.epoch += 1
                    self.batch_in_epoch = 0
                    batches = None
                self._window_loss += loss
                self._window_n += 1
                last_loss_t = loss
                for k, v in extras.items():
                    self._window_extras[k] = self._window_extras.get(k, 0.0) + v
                self._last_extras = extras
                bar.update(1)
                final = self.step == cfg.steps
                if (cfg.log_every and self.step % cfg.log_every == 0) or final:
                    mean_loss = distu.mean_across_ranks(self._window_loss / self._window_n).item()
                    if not math.isfinite(mean_loss):
                        raise FloatingPointError(f"training loss is {mean_loss} at step {self.step}")
                    record: dict[str, Any] = {"split": "train", "step": self.step, "lr": lr, "loss": mean_loss}
                    record.update({k: v / self._window_n for k, v in self._window_extras.items()})
                    if grad_norm is not None:
                        record["grad_norm"] = float(grad_norm)
                    record["elapsed"] = round(self.elapsed(), 3)
                    if self.is_main:
                        self._write_metrics(record)
                    bar.note = f"loss {mean_loss:.4g}, lr {lr:.3g}"
                    self._reset_window()
                if cfg.eval_every and self.step % cfg.eval_every == 0 and not final:
                    eval_metrics = self.evaluate()
                    evaluated_at = self.step
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and not final:
                    self._last_loss = distu.mean_across_ranks(loss).item()
                    self.save_checkpoint()
            if last_loss_t is not None:
                self._last_loss = distu.mean_across_ranks(last_loss_t).item()
            if evaluated_at != self.step:
                eval_metrics = self.evaluate()
            if self._last_checkpoint_step != self.step:
                self.save_checkpoint()
            result = {"train_loss": float(self._last_loss)}
            result.update({f"train_{k}": v for k, v in self._last_extras.items()})
            result.update(eval_metrics)
            finished = True
            return result
        finally:
            if bar is not None:
                bar.close()
            if self._metrics_file is not None:
                self._metrics_file.close()
                self._metrics_file = None
            if self._owns_group:
                self._release_group(orderly=finished)


def _to_float(v: Any, what: str) -> float:
    if isinstance(v, Tensor):
        if v.numel() != 1:
            raise TypeError(f"{what} must be a number or a one-element tensor; got a tensor of shape {tuple(v.shape)}")
        return float(v.item())
    if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool):
        return float(v)
    raise TypeError(f"{what} must be a number; got {type(v).__name__}")
