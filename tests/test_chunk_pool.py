"""The worker pool of the chunked paths: order, errors, grad mode, thread settings, determinism."""

from __future__ import annotations

import threading

import pytest
import torch

import posenc
from posenc.common import chunk_pool
from posenc.common.kernels import chunking

from .threads import torch_threads


@pytest.fixture
def two_threads():
    with torch_threads(2):
        yield


def test_results_come_in_the_order_of_the_items(two_threads):
    names = []

    def work(i):
        names.append(threading.current_thread().name)
        return i * i

    assert list(chunk_pool.ordered_map(work, range(20))) == [i * i for i in range(20)]
    assert all(n.startswith("posenc-chunks-") for n in names)


def test_an_error_in_an_item_is_raised_to_the_caller(two_threads):
    def work(i):
        if i == 3:
            raise ValueError("item 3 is bad")
        return i

    with pytest.raises(ValueError, match="item 3 is bad"):
        list(chunk_pool.ordered_map(work, range(8)))
    assert list(chunk_pool.ordered_map(lambda i: i, range(4))) == [0, 1, 2, 3]  # the pool still works


def test_workers_take_the_callers_grad_mode_and_one_thread_each(two_threads):
    seen = list(chunk_pool.ordered_map(lambda _: (torch.is_grad_enabled(), torch.get_num_threads()), range(4)))
    assert seen == [(True, 1)] * 4
    with torch.no_grad():
        assert [g for g, _ in chunk_pool.ordered_map(lambda _: (torch.is_grad_enabled(), 0), range(4))] == [False] * 4
    # the caller, and threads started later, keep torch's setting
    assert torch.get_num_threads() == 2
    later = []
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert later == [2]


def test_workers_take_the_callers_inference_mode(two_threads, monkeypatch):
    """Under torch.inference_mode the chunks write into inference tensors: a worker outside that
    mode may not (prefill of a long prompt with a score bias failed there)."""
    modes = lambda _: (torch.is_inference_mode_enabled(), torch.is_grad_enabled())  # noqa: E731
    with torch.inference_mode():
        assert list(chunk_pool.ordered_map(modes, range(4))) == [(True, False)] * 4
    assert list(chunk_pool.ordered_map(modes, range(4))) == [(False, True)] * 4
    monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", 2 * 4 * 300 * 32)  # chunks of about 32 rows
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 300))
    for encoding in ("alibi", "t5", "deberta", "cape"):
        model = posenc.seq.CausalLM(64, 32, 1, 4, encoding=encoding, max_len=300).eval()
        with torch.no_grad():
            want = model(tokens)
        with torch.inference_mode():  # several chunks of rows on the workers
            got = model(tokens)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=encoding)


def test_the_caller_consumes_results_on_one_thread_and_gets_its_setting_back(two_threads):
    """While results come in, the caller's own work runs beside the workers: one torch thread,
    restored afterwards, also when the caller stops early or an item fails."""
    seen = [torch.get_num_threads() for _ in chunk_pool.ordered_map(lambda i: i, range(6))]
    assert seen == [1] * 6 and torch.get_num_threads() == 2
    results = chunk_pool.ordered_map(lambda i: i, range(6))
    next(results)
    assert torch.get_num_threads() == 1
    results.close()
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="bad"):
        list(chunk_pool.ordered_map(lambda i: i if i < 2 else int("bad"), range(6)))
    assert torch.get_num_threads() == 2


def test_one_thread_runs_inline():
    with torch_threads(1):
        names = list(chunk_pool.ordered_map(lambda _: threading.current_thread().name, range(3)))
    assert names == [threading.current_thread().name] * 3


def test_chunked_backward_on_workers_is_bitwise_reproducible(two_threads, monkeypatch):
    """The parts of dk, dv and the learned gradients are added in a fixed order, whichever worker
    finished first."""
    monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", 2 * 4 * 8 * 96)
    monkeypatch.setattr("posenc.common.kernels.chunking.MIN_CHUNK_ROWS", 8)
    dims = posenc.ModelDims(dim=32, num_heads=4, max_len=96)
    for name in ("t5", "transformer_xl", "alibi"):
        torch.manual_seed(0)
        attn = posenc.MultiheadAttention(32, 4, encoding=posenc.build(name, dims=dims))
        x = torch.randn(2, 96, 32, requires_grad=True)
        grads = []
        for _ in range(3):
            attn.zero_grad()
            x.grad = None
            attn(x, mask=posenc.AttentionMask(causal=True)).square().sum().backward()
            grads.append([x.grad.clone()] + [p.grad.clone() for p in attn.parameters() if p.grad is not None])
        for again in grads[1:]:
            assert all(torch.equal(a, b) for a, b in zip(grads[0], again)), name


def test_chunks_are_handed_out_largest_first():
    """Causal chunks grow with their rows; the largest goes first so it does not run alone at
    the end (ties keep their order; a remainder chunk comes last)."""
    causal = list(chunking.row_chunks(10, 10, 4, causal=True))
    assert causal == [(0, 4, 4), (4, 8, 8), (8, 10, 10)]
    assert chunking.largest_first(causal) == [(4, 8, 8), (8, 10, 10), (0, 4, 4)]
    full = list(chunking.row_chunks(10, 10, 4, causal=False))
    assert chunking.largest_first(full) == [(0, 4, 10), (4, 8, 10), (8, 10, 10)]
    assert chunking.largest_first(iter(full)) == chunking.largest_first(full)


def test_row_chunked_outputs_come_back_in_row_order_on_workers(two_threads, monkeypatch):
    """The row-chunked terms (eRPE's probability bias) run their chunks largest first on the
    workers and must still concatenate them in row order: the same output and gradients as one
    chunk, causal and not."""
    dims = posenc.ModelDims(dim=32, num_heads=4, max_len=64)
    monkeypatch.setattr("posenc.common.kernels.chunking.MIN_CHUNK_ROWS", 8)
    for name in ("erpe", "erpe_vector", "shaw"):
        for mask in (posenc.AttentionMask(causal=True), None):
            results = []
            for elements in (chunking.CHUNK_ELEMENTS, 2 * 4 * 64 * 8):  # one chunk, then four of 16 rows
                monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", elements)
                torch.manual_seed(0)  # a new module (its plan is made for this chunk size), the same weights
                attn = posenc.MultiheadAttention(32, 4, encoding=posenc.build(name, dims=dims)).double()
                with torch.no_grad():  # eRPE's weights start at zero: a term of zeros reads the same in any order
                    for p in attn.parameters():
                        p.normal_(0.0, 0.3)
                x = torch.randn(2, 64, 32, dtype=torch.float64, requires_grad=True)
                out = attn(x, mask=mask)
                out.square().sum().backward()
                results.append([out.detach(), x.grad] + [p.grad for p in attn.parameters() if p.grad is not None])
            for a, b in zip(*results, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
