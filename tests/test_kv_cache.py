"""The KV cache's growable buffers: the same history as concatenation, room that doubles or is
reserved up front, crop."""

from __future__ import annotations

import pytest
import torch

from posenc.common.kv_cache import KVCache, LayerKVCache


def _steps(n=9, b=2, h=3, d=4):
    torch.manual_seed(0)
    return [(torch.randn(b, h, t, d), torch.randn(b, h, t, d), torch.arange(t)[None] + 10 * i)
            for i, t in enumerate([5] + [1] * (n - 1))]


def test_appending_keeps_the_history_of_a_concatenation_and_grows_by_doubling():
    cache, capacities = LayerKVCache(), []
    steps = _steps()
    with torch.no_grad():
        for k, v, pos in steps:
            got_k, got_v, got_pos = cache.append(k, v, pos)
            capacities.append(cache._k.shape[2])
    want_k = torch.cat([s[0] for s in steps], dim=2)
    want_pos = torch.cat([s[2] for s in steps], dim=1)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, torch.cat([s[1] for s in steps], dim=2))
    assert torch.equal(got_pos, want_pos) and cache.length == 13
    assert capacities == [5, 10, 10, 10, 10, 10, 20, 20, 20]  # one copy per doubling, not per step
    assert torch.equal(cache.next_positions(2), torch.tensor([[81, 82]]))


def test_the_first_entries_are_copied_so_the_callers_tensors_never_change():
    k, v, pos = _steps(1)[0]
    before = k.clone()
    cache = LayerKVCache()
    with torch.no_grad():
        cache.append(k, v, pos)
        cache.crop(2)
        cache.append(torch.zeros(2, 3, 3, 4), torch.zeros(2, 3, 3, 4), torch.arange(3)[None])
    assert torch.equal(k, before) and cache.length == 5 and cache.k[:, :, 2:].abs().sum() == 0


def test_a_history_with_a_gradient_is_concatenated_for_autograd():
    k = torch.randn(1, 1, 3, 2, requires_grad=True)
    cache = LayerKVCache()
    cache.append(k, k, torch.arange(3)[None])
    out_k, _, _ = cache.append(k * 2, k, torch.arange(3, 6)[None])
    out_k.sum().backward()
    assert torch.equal(k.grad, torch.full_like(k, 3.0))


def test_crop_rewinds_every_layer_and_checks_its_length():
    cache = KVCache(2)
    with torch.no_grad():
        for layer in cache.layers:
            for k, v, pos in _steps(4):
                layer.append(k, v, pos)
    cache.crop(5)
    assert cache.length == 5 and all(layer.pos.shape == (1, 5) for layer in cache.layers)
    with pytest.raises(ValueError, match=r"length must be an int in \[0, 5\]"):
        cache.crop(6)
    cache.crop(0)
    assert cache.length == 0 and cache[0].k is None


def test_the_cache_holds_keys_values_and_positions_only():
    """No pocket for an encoding's state: what a layer's cache holds after steps and a crop is
    its keys, values and positions (a conditional module between blocks reads KVCache.rows)."""
    cache = LayerKVCache()
    with torch.no_grad():
        for k, v, pos in _steps(4):
            cache.append(k, v, pos)
    cache.crop(3)
    # and the bookkeeping of its appends (ints: which entries a mark still names), no tensor beside
    # and the capacity it reserves at its first append (an int or None)
    assert set(vars(cache)) == {"_k", "_v", "_pos", "_length", "_id", "_appends", "_stamps", "_ends", "capacity"}
    assert all(isinstance(n, int) for n in (cache._id, cache._appends, *cache._stamps, *cache._ends))
    assert cache.capacity is None
    assert cache.k.shape[2] == cache.v.shape[2] == cache.pos.shape[1] == 3


def test_a_reserved_capacity_holds_the_whole_sequence_without_growing():
    """``capacity``: the first append reserves it (at least what it brings), later steps write in
    place until it is full, then the buffers double as before; a crop to nothing and a new
    prefill reserve it again; the history is the concatenation's either way."""
    steps = _steps()  # 5 entries, then 8 of 1: 13 in all
    cache, plain, capacities, storages = LayerKVCache(capacity=13), LayerKVCache(), [], set()
    with torch.no_grad():
        for k, v, pos in steps:
            got = cache.append(k, v, pos)
            want = plain.append(k, v, pos)
            capacities.append(cache._k.shape[2])
            storages.add(cache._k.untyped_storage().data_ptr())
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert capacities == [13] * 9 and len(storages) == 1  # one buffer, never copied
        cache.append(*_steps(2)[1])  # the 14th entry: doubling from here
        assert cache._k.shape[2] == 26 and cache.length == 14
        cache.crop(0)
        cache.append(*steps[0])
        assert cache._k.shape[2] == 13
        small = LayerKVCache(capacity=2)  # less than the first append: that append's size
        small.append(*steps[0])
        assert small._k.shape[2] == 5
    k, v, pos = steps[0]
    before = k.clone()
    with torch.no_grad():
        LayerKVCache(capacity=8).append(k, v, pos)[0].zero_()
    assert torch.equal(k, before)  # the reserved buffer is a copy, not the caller's tensor


def test_a_cache_reserves_its_capacity_in_every_layer_and_its_token_rows():
    cache = KVCache(2, capacity=40)
    assert [layer.capacity for layer in cache.layers] == [40, 40] and cache.rows(0).capacity == 40
    rows = cache.rows(1)
    with torch.no_grad():
        rows.append(torch.randn(2, 3, 4))
    assert rows._rows.shape[1] == 40 and KVCache(2).rows(0).capacity is None
    for bad in (0, -1, True, 2.5, "8"):
        with pytest.raises((ValueError, TypeError), match="capacity must be") as info:
            KVCache(2, capacity=bad)
        assert "\n" not in str(info.value)


def test_generate_reserves_what_it_will_hold_and_never_grows(monkeypatch):
    from posenc.seq.generation import generate
    from posenc.seq.models import CausalLM

    model = CausalLM(32, 16, 2, 2, encoding="rope", max_len=64).eval()
    prompt = torch.randint(0, 32, (2, 7), generator=torch.Generator().manual_seed(0))
    plain = generate(model, prompt, 6, greedy=True, use_cache=False)
    grown = []
    original = LayerKVCache._grow
    monkeypatch.setattr(LayerKVCache, "_grow",
                        lambda self, capacity, old: grown.append(capacity) or original(self, capacity, old))
    assert torch.equal(generate(model, prompt, 6, greedy=True), plain)
    assert grown == [7 + 6 - 1] * 2  # each layer's one reservation: the prompt and the 5 tokens fed back
