"""Training, beside the attention core: the shared :class:`Trainer` of every reference model
(AdamW, warm-up and cosine decay, AMP, ``torchrun`` data parallelism, atomic checkpoints and
exact resumption) and the checkpoint helpers. It imports no modality; the ``posenc train``
commands (:mod:`posenc.cli.train`) and the benchmarks use it."""

from .checkpoint import CheckpointError, load_checkpoint, save_atomic
from .trainer import TrainConfig, Trainer, lr_factor

__all__ = ["CheckpointError", "TrainConfig", "Trainer", "lr_factor", "load_checkpoint", "save_atomic"]
