"""Training, beside the attention core: the shared :class:`Trainer` of every reference model
(AdamW, warm-up and cosine decay, AMP, ``torchrun`` data parallelism, atomic checkpoints and
exact resumption), the checkpoint helpers, and what the commands show and write
(:mod:`.report`: tables, progress, results files, optional packages). It imports no modality; the
``posenc train`` commands (:mod:`posenc.cli.train`), the benchmarks and the integrations use it.

The names below are imported on first use (module ``__getattr__``), so that :mod:`.report`
imports without torch: the command line answers ``posenc list`` before anything imports torch.
"""

from __future__ import annotations

import importlib

# public name -> the submodule defining it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("CheckpointError", "load_checkpoint", "save_atomic"), "checkpoint"),
    **dict.fromkeys(("TrainConfig", "Trainer", "lr_factor"), "trainer"),
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later reads skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = ["CheckpointError", "TrainConfig", "Trainer", "lr_factor", "load_checkpoint", "save_atomic"]
