"""Synthetic length-generalisation tasks and the no-network text data."""

from __future__ import annotations

import pytest
import torch

from posenc.seq.data import eval_windows, load_corpus
from posenc.seq.tasks import (
    BOS, EOS, NUM_SPECIAL, PAD, PLUS, SEP, TASKS, TaskDataset, collate, exact_match, make_task, masked_loss,
)


def _split(task, length, seed=0):
    """(question, answer, sequence, SEP index) of one copy/reverse/sort example, read back from its tokens."""
    seq, sep = task.sequence(length, torch.Generator().manual_seed(seed))
    seq = seq.tolist()
    assert seq[0] == BOS and seq[-1] == EOS
    return seq[1:sep], seq[sep + 1 : -1], seq, sep


@pytest.mark.parametrize("seed", range(3))
def test_copy_reverse_sort_targets(seed):
    for name, rule in (("copy", lambda x: x), ("reverse", lambda x: x[::-1]), ("sort", sorted)):
        task = make_task(name, num_symbols=12)
        q, a, seq, sep = _split(task, 6, seed)
        assert seq[sep] == SEP
        assert len(q) == 6 and all(NUM_SPECIAL <= t < NUM_SPECIAL + 12 for t in q)
        assert a == list(rule(q)), name


def test_known_sequences_from_a_fixed_question():
    g = torch.Generator().manual_seed(0)
    copy, rev, srt = make_task("copy"), make_task("reverse"), make_task("sort")
    # Same generator state -> same question; the answers follow the rules exactly.
    q = copy.example(4, torch.Generator().manual_seed(7))[0]
    assert rev.example(4, torch.Generator().manual_seed(7)) == (q, q[::-1])
    assert srt.example(4, torch.Generator().manual_seed(7)) == (q, sorted(q))
    seq, sep = copy.sequence(2, g)
    assert seq.tolist()[sep] == SEP and len(seq) == copy.max_total_length(2) == 7


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("reverse_digits", [True, False])
def test_addition_answers_are_the_sums(seed, reverse_digits):
    task = make_task("addition", reverse_digits=reverse_digits)
    q, a = task.example(5, torch.Generator().manual_seed(seed))
    plus = q.index(PLUS)
    digits = [[t - NUM_SPECIAL for t in part] for part in (q[:plus], q[plus + 1 :], a)]
    if reverse_digits:
        digits = [d[::-1] for d in digits]
    x, y, s = (int("".join(map(str, d))) for d in digits)
    assert len(digits[0]) == len(digits[1]) == 5 and len(digits[2]) == 6
    assert x + y == s


def test_addition_known_examples():
    from posenc.seq.tasks import Addition

    assert Addition.sum_digits([9, 9, 9], [0, 1, 2]) == [1, 0, 1, 1]
    assert Addition.sum_digits([0, 4], [0, 5]) == [0, 0, 9]
    assert Addition.sum_digits([5], [5]) == [1, 0]


@pytest.mark.parametrize("seed", range(5))
def test_recall_answer_is_the_value_of_the_queried_key(seed):
    task = make_task("recall", num_symbols=20)
    seq, sep = task.sequence(7, torch.Generator().manual_seed(seed))
    seq = seq.tolist()
    pairs = seq[1 : 1 + 14]
    keys, values = pairs[0::2], pairs[1::2]
    assert len(set(keys)) == 7  # distinct keys
    assert seq[15] == SEP and seq[sep] == seq[16]  # the query key sits at the mask start
    query, answer = seq[16], seq[17]
    assert answer == values[keys.index(query)] and seq[18] == EOS
    tokens, targets, mask = collate([(torch.tensor(seq), sep)])
    assert targets[0, mask[0]].tolist() == [answer, EOS]
    with pytest.raises(ValueError, match="recall: length=21 pairs need distinct keys, but num_symbols=20"):
        task.sequence(21, torch.Generator())


@pytest.mark.parametrize("name", list(TASKS))
def test_batches_respect_lengths_masks_and_seeds(name):
    task = make_task(name)
    g = torch.Generator().manual_seed(3)
    tokens, targets, mask = task.batch(16, 6, generator=g, min_length=2)
    assert tokens.shape == targets.shape == mask.shape and tokens.shape[1] <= task.max_total_length(6) - 1
    assert torch.equal(tokens[:, 1:][tokens[:, 1:] != PAD], targets[:, :-1][tokens[:, 1:] != PAD])  # shifted by one
    assert (targets[mask] != PAD).all() and (targets[mask] == EOS).sum() == 16  # one EOS per answer
    assert (tokens[:, 0] == BOS).all()
    exact = task.batch(4, 6, generator=torch.Generator().manual_seed(0), min_length=6)[0]
    assert exact.shape[1] == task.max_total_length(6) - 1 and (exact != PAD).all()  # size exactly 6
    again = task.batch(16, 6, generator=torch.Generator().manual_seed(3), min_length=2)
    assert all(torch.equal(a, b) for a, b in zip((tokens, targets, mask), again))
    other = task.batch(16, 6, generator=torch.Generator().manual_seed(4), min_length=2)[0]
    assert not (other.shape == tokens.shape and torch.equal(other, tokens))
    ds = TaskDataset(task, 10, 5, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(ds[3], TaskDataset(task, 10, 5, seed=1)[3]))
    assert ds[3][0].shape == (task.max_total_length(5) - 1,)
    with pytest.raises(IndexError):
        ds[10]


def test_bad_task_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown task 'parity'; choose from copy, reverse, sort, addition, recall"):
        make_task("parity")
    with pytest.raises(ValueError, match="copy: length must be a positive int, got 0"):
        make_task("copy").batch(2, 0, generator=torch.Generator())
    with pytest.raises(ValueError, match="min_length must be an int in \\[1, length=3\\], got 4"):
        make_task("copy").batch(2, 3, generator=torch.Generator(), min_length=4)
    with pytest.raises(ValueError, match="addition: num_symbols must be an int >= 10, got 5"):
        make_task("addition", num_symbols=5)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        make_task("sort").batch(0, 3, generator=torch.Generator())


def test_exact_match_and_masked_loss():
    targets = torch.tensor([[5, 6, 7], [5, 6, 7]])
    mask = torch.tensor([[False, True, True], [False, True, True]])
    logits = torch.nn.functional.one_hot(torch.tensor([[0, 6, 7], [5, 6, 0]]), 10).float()
    assert exact_match(logits, targets, mask).tolist() == [True, False]  # row 0: unmasked miss ignored
    loss = masked_loss(logits * 50, targets, mask)
    assert 0 < loss < 50 / 4 + 1  # only the one wrong answer token costs anything, averaged over 4


def test_text_data_user_file_and_fixed_token_windows(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdefghijklmnopqrstuvwxyz" * 4)
    assert load_corpus(path).startswith("abc")
    assert len(load_corpus()) > 100_000  # pydoc
    x, y = eval_windows(load_corpus(path), 10, 25)
    assert x.shape == (3, 10) and bytes(x[1].tolist()) == b"klmnopqrst" and bytes(y[1].tolist()) == b"lmnopqrstu"
    with pytest.raises(ValueError, match="the text holds 10 windows of 10 bytes; 1000 tokens need 100"):
        eval_windows(load_corpus(path), 10, 1000)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(tmp_path / "missing.txt")
