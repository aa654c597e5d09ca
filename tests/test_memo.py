"""ValueMemo: kept results of parameter-free functions of plain values (T5's offset buckets)."""

from __future__ import annotations

import pytest
import torch

from posenc.seq.memo import ValueMemo


def test_kept_per_key_least_recently_used_dropped_first():
    builds = []

    def build(n, device):
        builds.append(n)
        return torch.arange(n, device=device)

    memo = ValueMemo(build, size=2)
    a = memo(3, "cpu")
    assert memo(3, "cpu") is a and builds == [3]
    memo(4, "cpu")
    assert memo(3, "cpu") is a  # 3 used last: 4 is the one dropped next
    memo(5, "cpu")
    assert builds == [3, 4, 5]
    assert memo(3, "cpu") is a and builds == [3, 4, 5]
    memo(4, "cpu")
    assert builds == [3, 4, 5, 4]
    memo.clear()
    assert memo(3, "cpu") is not a


def test_a_table_first_built_in_inference_mode_serves_calls_with_gradients():
    memo = ValueMemo(lambda n: torch.arange(n))
    with torch.inference_mode():
        index = memo(4)
    assert not index.is_inference()
    table = torch.randn(6, requires_grad=True)
    table[memo(4)].sum().backward()  # indexing saves the index for the backward
    torch.testing.assert_close(table.grad, torch.tensor([1.0, 1, 1, 1, 0, 0]))


def test_t5_offset_buckets_are_the_buckets_of_each_call():
    from posenc.seq import t5

    t5._OFFSET_BUCKETS.clear()
    # the same offsets through encodings whose buckets differ: each gets its own
    for num_buckets, max_distance, bidirectional in ((8, 20, False), (8, 40, False), (16, 20, False), (8, 20, True)):
        enc = t5.T5Bias(2, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
        for n in (1, 7, 30, 31, 200):  # decoding steps, before and after the span's clamp
            q_pos, kv_pos = torch.tensor([[n - 1]]), torch.arange(n)[None]
            got = enc.score_bias(None, None, q_pos, kv_pos).dense(1, 2, torch.tensor([0]), torch.arange(n))
            want = t5.t5_bias(kv_pos - q_pos, enc.table, bidirectional=bidirectional, max_distance=max_distance)
            torch.testing.assert_close(got, want.unsqueeze(0), rtol=0, atol=0)  # [1, H, 1, n]


def test_misuse_is_one_clear_error():
    with pytest.raises(TypeError, match="build must be a callable of the key's values; got int"):
        ValueMemo(3)
    with pytest.raises(ValueError, match="size must be a positive int; got 0"):
        ValueMemo(lambda: torch.zeros(1), size=0)
