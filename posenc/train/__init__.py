"""``posenc train MODALITY``: one module per modality, each with ``add_arguments(parser)`` and
``run(args) -> int`` (see :mod:`posenc.cli`). They train that modality's reference model through
:class:`posenc.common.trainer.Trainer`, so every one has checkpoints, resumption, progress bars
and ``torchrun`` data parallelism."""
