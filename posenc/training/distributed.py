"""Process-group plumbing for the trainer: ``torchrun`` environment, device choice, collectives.

Under ``torchrun`` every process sees ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``. With
``WORLD_SIZE > 1`` the trainer initialises the default process group (``gloo`` on CPU, ``nccl``
on CUDA) through the ``env://`` rendezvous, and destroys it again when it created it. Every helper
here is a no-op (or the identity) in a single process, so the trainer calls them unconditionally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, from the ``torchrun`` environment variables."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer; got {raw!r}") from None


def dist_env() -> DistEnv:
    """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; missing variables mean a single process."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank if world_size > 1 else 0)
    if world_size < 1:
        raise ValueError(f"environment variable WORLD_SIZE must be >= 1; got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"environment variable RANK must be in 0..{world_size - 1}; got {rank}")
    if local_rank < 0:
        raise ValueError(f"environment variable LOCAL_RANK must be >= 0; got {local_rank}")
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank)


def resolve_device(spec: str, env: DistEnv) -> torch.device:
    """Turn ``TrainConfig.device`` into a device for this process.

    ``"auto"`` is ``cuda`` when available, else ``cpu``. Under a multi-process job a bare
    ``"cuda"`` (or ``"auto"`` resolving to it) becomes ``cuda:LOCAL_RANK``; an explicit index is kept.
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be 'auto' or a torch device string such as 'cpu' or 'cuda:0'; got {spec!r}") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={spec!r} asks for CUDA, but torch.cuda.is_available() is False; use 'cpu' or 'auto'")
        if device.index is None:
            device = torch.device("cuda", env.local_rank if env.distributed else torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
                + (f" and LOCAL_RANK={env.local_rank}" if env.distributed else "")
            )
    return device


def init_process_group(env: DistEnv, device: torch.device) -> bool:
    """Initialise the default group for a multi-process job; True when this call created it.

    The backend is ``nccl`` for CUDA devices and ``gloo`` otherwise. An existing group is reused
    (and must match ``WORLD_SIZE``).
    """
    if not env.distributed:
        return False
    if not dist.is_available():
        raise RuntimeError(f"WORLD_SIZE={env.world_size} asks for distributed training, but torch.distributed is not available")
    if dist.is_initialized():
        if dist.get_world_size() != env.world_size:
            raise RuntimeError(
                f"an existing process group has world size {dist.get_world_size()}, but WORLD_SIZE={env.world_size}"
            )
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        dist.init_process_group(backend=backend, init_method="env://", rank=env.rank, world_size=env.world_size, **kwargs)
        return True
    # Under torchrun the store outlives a restart (--max-restarts): the previous attempt's keys,
    # its workers' addresses among them, are still there, and a worker that reads one before its
    # peer rewrites it connects to a dead process ("Connection refused"). Each attempt gets keys
    # of its own.
    store, rank, world_size = next(dist.rendezvous("env://", rank=env.rank, world_size=env.world_size))
    dist.init_process_group(backend=backend, store=dist.PrefixStore(f"posenc/attempt{restart}", store), rank=rank,
                            world_size=world_size, **kwargs)
    return True


def is_active() -> bool:
    """A process group with more than one member is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if is_active():
        dist.barrier()


def mean_across_ranks(value: Tensor) -> Tensor:
    """Mean of ``value`` over all ranks (a detached copy; the identity in one process)."""
    value = value.detach().clone()
    if is_active():
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


def gather_objects(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` in one process)."""
    if not is_active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
