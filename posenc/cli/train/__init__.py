"""``posenc train MODALITY``: one module per modality, each with ``add_arguments(parser)`` and
``run(args) -> int`` (see :mod:`posenc.cli`). They train that modality's reference model through
:class:`posenc.training.trainer.Trainer`, so every one has checkpoints, resumption, progress and
``torchrun`` data parallelism, and they share the option vocabulary of :mod:`posenc.cli.options`.

Every run directory (``--out``) ends with the same files: ``metrics.jsonl`` and ``checkpoint.pt``
(the trainer) and ``results.json`` (:func:`write_results`): ``command``, ``encoding``,
``model_config`` (the reference model's constructor arguments, enough to rebuild it),
``train_config`` (the trainer's settings), ``steps``, ``train_loss``, ``metrics`` (the final
evaluation, ``null`` where a model refused a size) and command-specific fields.

Runs never clobber: a non-empty ``--out`` is refused unless ``--resume`` continues the run there,
and a resumed run must keep the options that shape training (``--steps``, ``--batch-size``,
``--lr``, ...): the learning-rate schedule depends on them, so changing them would not continue the
same run. To train longer, start a new run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import run_checked  # noqa: F401  (the commands' shared error path, kept importable here)

RESULTS_FILE = "results.json"
# every file a run directory gets (the trainer's and results.json): checked before training
RUN_FILES = ("metrics.jsonl", "checkpoint.pt", RESULTS_FILE)


def run_dir_error(out: str | None) -> str | None:
    """Why ``--out`` cannot take a training run (see :func:`posenc.cli.outputs.out_error`), or None."""
    from ..outputs import out_error

    return out_error(out, RUN_FILES)


def write_results(out: str | None, record: Mapping[str, Any]) -> Path | None:
    """Write ``record`` as ``out/results.json`` (the one writer, :mod:`posenc.cli.outputs`; nothing
    without ``--out``)."""
    from ..outputs import write_json_file

    if out is None:
        return None
    path = write_json_file(Path(out), RESULTS_FILE, dict(record))
    print(f"results written to {path}")
    return path
