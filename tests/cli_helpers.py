"""Helpers of the command-line tests."""

from __future__ import annotations

import contextlib

from posenc.training.trainer import Trainer


@contextlib.contextmanager
def interrupted_at(step: int):
    """Within the block, training stops with KeyboardInterrupt (Ctrl-C) when it is about to take
    step ``step + 1``: a run killed after ``step`` steps, to be resumed afterwards."""
    original = Trainer._train_step

    def step_or_stop(self, batch):
        if self.step == step:
            raise KeyboardInterrupt
        return original(self, batch)

    Trainer._train_step = step_or_stop
    try:
        yield
    finally:
        Trainer._train_step = original
