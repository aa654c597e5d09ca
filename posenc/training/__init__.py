"""Training, beside the attention core: the shared :class:`Trainer` of every reference model
(AdamW, warm-up and cosine decay, AMP, ``torchrun`` data parallelism, atomic checkpoints and
exact resumption), the checkpoint helpers, and what the commands show and write
(:mod:`.report`: tables, progress, results files, optional packages). It imports no modality; the
``posenc train`` commands (:mod:`posenc.cli.train`), the benchmarks and the integrations use it.

The names below are imported on first use (module ``__getattr__``), so that :mod:`.report`
imports without torch: the command line answers ``posenc list`` before anything imports torch.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("CheckpointError", "load_checkpoint", "save_atomic"):
        from . import checkpoint as module
    elif name in ("TrainConfig", "Trainer", "lr_factor"):
        from . import trainer as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)


__all__ = ["CheckpointError", "TrainConfig", "Trainer", "lr_factor", "load_checkpoint", "save_atomic"]
