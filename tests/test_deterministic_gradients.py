"""The same training step gives the same gradients on every run, with several CPU threads: the
learned tables a bias reads (T5, KERPLE, FIRE, eRPE, the shortest-path and 2D relative biases)
are gathered with ``posenc.common.pairwise.gather``, whose backward adds in a fixed order;
advanced indexing's backward accumulates with atomic adds across threads, and FIRE's ``c``
differed in its last bits from run to run on two threads."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.common.pairwise import gather

from .threads import torch_threads

DIMS = posenc.ModelDims(dim=64, num_heads=4, max_len=256)


@pytest.fixture(autouse=True)
def two_threads():
    with torch_threads(2):
        yield


def _grads(encoding: str, mask: posenc.AttentionMask) -> list[torch.Tensor]:
    torch.manual_seed(0)
    enc = posenc.build(encoding, dims=DIMS)
    for p in enc.parameters():  # zero-initialised tables: random values make every entry count
        with torch.no_grad():
            p.add_(torch.randn_like(p) * 0.1)
    q, k, v = (torch.randn(2, 4, 192, 16, requires_grad=True) for _ in range(3))
    pos = torch.arange(192)[None]
    out = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend="dense")
    out.square().sum().backward()
    return [p.grad for p in enc.parameters()] + [q.grad]


@pytest.mark.parametrize("encoding", ["t5", "kerple", "fire", "erpe"])
def test_a_bias_over_a_padded_batch_gives_the_same_gradients_every_run(encoding):
    # key padding: the general path, which gathers the table per element (not its diagonals)
    valid = torch.arange(192)[None].expand(2, -1) < torch.tensor([[192], [150]])
    mask = posenc.AttentionMask(causal=True, key_valid=valid)
    if encoding == "erpe":
        mask = posenc.AttentionMask(key_valid=valid)
    runs = [_grads(encoding, mask) for _ in range(3)]
    assert any(g.abs().sum() > 0 for g in runs[0][:-1])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_gather_equals_indexing_with_its_gradient_and_refuses_a_wrong_index_count():
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(3, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    h = torch.arange(3).view(1, 3, 1, 1)
    col = torch.randint(0, 7, (2, 1, 5, 6), generator=gen)
    torch.testing.assert_close(gather(table, h, col), table[h, col], rtol=0, atol=0)
    assert gather(table, torch.tensor(2), torch.tensor(4)).item() == table[2, 4].item()  # scalars (score_mod)
    weights = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=gen)
    (g1,) = torch.autograd.grad((gather(table, h, col) * weights).sum(), table)
    (g2,) = torch.autograd.grad((table[h, col] * weights).sum(), table)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="one index per axis of the table \\(2\\); got 1"):
        gather(table, col)
