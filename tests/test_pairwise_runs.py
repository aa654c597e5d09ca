"""Runs of consecutive positions, the fact the decoding fast paths stand on: ``run_first`` and
``shared_run_offset`` say yes only for one integer run shared by the batch."""

from __future__ import annotations

import pytest
import torch

from posenc.common.pairwise import run_first, shared_run_offset


def test_run_first_names_the_first_position_of_one_integer_run_and_nothing_else():
    assert run_first(torch.arange(5, 12)[None]) == 5
    assert run_first(torch.tensor([[-3]])) == -3  # one position is a run (a decoding step's query)
    assert run_first(torch.tensor([[4, 5, 7]])) is None  # a gap
    assert run_first(torch.tensor([[5, 4, 3]])) is None  # backwards
    assert run_first(torch.arange(4).repeat(2, 1)) is None  # per-row positions, even when equal
    assert run_first(torch.arange(4.0)[None]) is None  # float positions
    assert run_first(torch.arange(4)) is None  # not [1, T]
    assert run_first(torch.zeros(1, 0, dtype=torch.long)) is None  # no position
    with pytest.raises(TypeError, match="positions must be a tensor; got list"):
        run_first([[0, 1, 2]])


def test_shared_run_offset_is_the_offset_of_two_runs():
    assert shared_run_offset(torch.tensor([[9]]), torch.arange(3, 10)[None]) == -6
    assert shared_run_offset(torch.arange(2, 4)[None], torch.arange(5)[None]) == -2
    assert shared_run_offset(torch.tensor([[9]]), torch.tensor([[0, 2, 3]])) is None
    assert shared_run_offset(torch.tensor([[1, 3]]), torch.arange(5)[None]) is None
