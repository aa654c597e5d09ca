"""The KV cache's growable buffers: the same history as concatenation, room that doubles, crop."""

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
    assert set(vars(cache)) == {"_k", "_v", "_pos", "_length", "_id", "_appends", "_stamps", "_ends"}
    assert all(isinstance(n, int) for n in (cache._id, cache._appends, *cache._stamps, *cache._ends))
    assert cache.k.shape[2] == cache.v.shape[2] == cache.pos.shape[1] == 3
