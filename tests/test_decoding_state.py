"""The decoding state beside the KV cache: the cache's marks say which entries are still the ones a
kept value was computed from (appends keep them, a crop cuts them, another cache matches none);
FoX keeps its running gate sums there, reads only the new keys' gates at a step, and gives the
full forward's values through crops, parameter edits and a state passed with the wrong cache."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.common.decoding_state import DecodingState, LayerDecodingState
from posenc.common.kv_cache import LayerKVCache
from posenc.seq.fox import ForgettingGate

H = 4


def _append(cache: LayerKVCache, t: int) -> None:
    with torch.no_grad():
        cache.append(torch.randn(1, 2, t, 4), torch.randn(1, 2, t, 4), torch.arange(t)[None] + cache.length)


def test_a_mark_counts_the_entries_unchanged_since():
    torch.manual_seed(0)
    cache, other = LayerKVCache(), LayerKVCache()
    assert cache.unchanged_prefix(None) == 0 and cache.unchanged_prefix(cache.mark()) == 0
    _append(cache, 5)
    _append(cache, 1)
    mark = cache.mark()
    assert cache.unchanged_prefix(mark) == 6
    _append(cache, 1)
    _append(cache, 2)
    assert cache.unchanged_prefix(mark) == 6  # appends leave the older entries as they were
    cache.crop(7)
    assert cache.unchanged_prefix(mark) == 6
    cache.crop(4)  # into the first append: its first 4 entries stay
    assert cache.unchanged_prefix(mark) == 4
    _append(cache, 3)  # the new entries 4..6 are not the mark's
    assert cache.unchanged_prefix(mark) == 4 and cache.unchanged_prefix(cache.mark()) == 7
    _append(other, 9)
    assert other.unchanged_prefix(mark) == 0  # another cache's mark
    cache.crop(0)
    _append(cache, 9)
    assert cache.unchanged_prefix(mark) == 0


def _fox_model(seed=0) -> posenc.seq.CausalLM:
    torch.manual_seed(seed)
    model = posenc.seq.CausalLM(40, 32, 2, H, encoding="fox", max_len=64).double().eval()
    with torch.no_grad():
        for gate in model.encodings:
            gate.weight.normal_(0, 0.3)
    return model


class _GateReads:
    """How many keys each call of ForgettingGate.log_gates reads."""

    def __init__(self, monkeypatch) -> None:
        self.keys: list[int] = []
        original = ForgettingGate.log_gates

        def counting(gate, k):
            self.keys.append(k.shape[2])
            return original(gate, k)

        monkeypatch.setattr(ForgettingGate, "log_gates", counting)


def _decode(model, tokens, cache, state, start):
    """Logits of ``tokens[:, start:]`` fed one at a time."""
    return torch.cat([model(tokens[:, t: t + 1], cache=cache, decoding_state=state) for t in range(start, tokens.shape[1])],
                     dim=1)


def test_fox_keeps_its_gate_sums_and_reads_only_the_new_keys(monkeypatch):
    model = _fox_model()
    tokens = torch.randint(0, 40, (2, 18), generator=torch.Generator().manual_seed(1))
    reads = _GateReads(monkeypatch)
    with torch.no_grad():
        full = model(tokens)
        cache, state = model.new_cache(), DecodingState(model.depth)
        prefix = model(tokens[:, :10], cache=cache, decoding_state=state)  # more rows than a decoding step
        reads.keys.clear()
        steps = _decode(model, tokens, cache, state, 10)
    torch.testing.assert_close(torch.cat((prefix, steps), dim=1), full, rtol=1e-10, atol=1e-12)
    # the first step reads the 11 keys of each layer (the prompt kept nothing); every later one its new key
    assert reads.keys == [11, 11] + [1, 1] * 7


def test_without_a_state_every_step_reads_every_cached_key(monkeypatch):
    model = _fox_model()
    tokens = torch.randint(0, 40, (1, 8), generator=torch.Generator().manual_seed(2))
    reads = _GateReads(monkeypatch)
    with torch.no_grad():
        cache = model.new_cache()
        model(tokens[:, :5], cache=cache)
        reads.keys.clear()
        _decode(model, tokens, cache, None, 5)
    assert reads.keys == [6, 6, 7, 7, 8, 8]


def test_a_crop_and_other_tokens_give_the_full_forward_of_the_new_sequence(monkeypatch):
    """Speculative decoding: the cache is cropped and other tokens follow; the kept sums of the
    dropped tokens are not read, those before the crop are."""
    model = _fox_model()
    gen = torch.Generator().manual_seed(3)
    first, second = torch.randint(0, 40, (2, 12), generator=gen), torch.randint(0, 40, (2, 12), generator=gen)
    second[:, :7] = first[:, :7]
    reads = _GateReads(monkeypatch)
    with torch.no_grad():
        cache, state = model.new_cache(), DecodingState(model.depth)
        model(first[:, :4], cache=cache, decoding_state=state)
        _decode(model, first, cache, state, 4)
        cache.crop(7)
        reads.keys.clear()
        steps = _decode(model, second, cache, state, 7)
        assert reads.keys == [1, 1] * 5
        expected = model(second)[:, 7:]
    torch.testing.assert_close(steps, expected, rtol=1e-10, atol=1e-12)


def _decoded_to_8(seed: int):
    """A FoX model, 10 tokens, and the cache and state after a prompt of 5 and 3 steps."""
    model = _fox_model()
    tokens = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(seed))
    cache, state = model.new_cache(), DecodingState(model.depth)
    with torch.no_grad():
        model(tokens[:, :5], cache=cache, decoding_state=state)
        _decode(model, tokens[:, :8], cache, state, 5)
    return model, tokens, cache, state


def test_an_edited_gate_or_another_cache_recomputes_the_sums():
    model, tokens, cache, state = _decoded_to_8(seed=4)
    with torch.no_grad():
        model.encodings[1].bias.add_(-2.0)  # an in-place edit: the kept sums are of the old gates
        steps = _decode(model, tokens, cache, state, 8)
        torch.testing.assert_close(steps, model(tokens)[:, 8:], rtol=1e-10, atol=1e-12)
        # the same state with a new cache of other tokens: nothing kept belongs to it
        other = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(5))
        cache = model.new_cache()
        model(other[:, :8], cache=cache, decoding_state=state)
        steps = _decode(model, other, cache, state, 8)
        torch.testing.assert_close(steps, model(other)[:, 8:], rtol=1e-10, atol=1e-12)


def test_a_layer_given_another_gate_between_steps_reads_nothing_kept_by_the_old_one():
    model, tokens, cache, state = _decoded_to_8(seed=8)
    with torch.no_grad():
        # the last layer's: the cached keys of every layer stay those the new gate would give
        attn = model.encoder.blocks[-1].attn
        fresh = ForgettingGate(H, attn.head_dim).double()
        fresh.weight.normal_(0, 0.3)  # its parameters' versions now those of the old gate's: only the module differs
        assert (fresh.weight._version, fresh.bias._version) == (attn.encoding.weight._version, attn.encoding.bias._version)
        attn.encoding = fresh
        steps = _decode(model, tokens, cache, state, 8)
        torch.testing.assert_close(steps, model(tokens)[:, 8:], rtol=1e-10, atol=1e-12)


def test_generate_gives_the_same_tokens_as_recomputing():
    model = _fox_model().float()
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(6))
    assert torch.equal(model.generate(prompt, 10, greedy=True), model.generate(prompt, 10, greedy=True, use_cache=False))


def test_misuse_is_one_clear_line():
    model = _fox_model()
    tokens = torch.zeros(1, 3, dtype=torch.long)
    with torch.no_grad():
        with pytest.raises(TypeError, match="decoding_state must be a posenc DecodingState.*got dict"):
            model(tokens, cache=model.new_cache(), decoding_state={})
        with pytest.raises(ValueError, match="this stack has 2 blocks, the state 3 layers"):
            model(tokens, cache=model.new_cache(), decoding_state=DecodingState(3))
        with pytest.raises(ValueError, match="and no cache was passed"):
            model(tokens, decoding_state=DecodingState(2))
        attn = model.encoder.blocks[0].attn
        x = torch.zeros(1, 3, 32, dtype=torch.float64)
        with pytest.raises(TypeError, match="decoding_state must be a posenc LayerDecodingState.*got DecodingState"):
            attn(x, cache=LayerKVCache(), decoding_state=DecodingState(2))
        with pytest.raises(ValueError, match="decoding_state goes with a KV cache"):
            attn(x, decoding_state=LayerDecodingState())
    with pytest.raises(ValueError, match="num_layers must be"):
        DecodingState(0)
    layer = LayerDecodingState()
    with pytest.raises(RuntimeError, match="before follow"):
        layer.keep("x", 0, torch.zeros(3))
    with pytest.raises(TypeError, match="follows a posenc LayerKVCache; got KVCache"):
        layer.follow(posenc.KVCache(1))
    cache = LayerKVCache()
    _append(cache, 3)
    layer.follow(cache)
    with pytest.raises(ValueError, match=r"one entry per cached key \(3\); got \(2, 4\)"):
        layer.keep("x", 0, torch.zeros(2, 4))
    with pytest.raises(TypeError, match="takes a str name and a tensor value; got int, Tensor"):
        layer.keep(1, 0, torch.zeros(3))
    with pytest.raises(TypeError, match="takes a str name and a tensor value; got str, list"):
        layer.keep("x", 0, [0.0, 0.0, 0.0])
    for mark in ("abc", (1, 2), (1, 2, 3.0), [1, 2, 3]):
        with pytest.raises(TypeError, match=r"mark must be what LayerKVCache.mark\(\) returned"):
            cache.unchanged_prefix(mark)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fox_decoding_with_a_state_equals_the_full_forward():
    model = _fox_model().float().cuda()
    tokens = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(7)).cuda()
    with torch.no_grad():
        full = model(tokens)
        cache, state = model.new_cache(), DecodingState(model.depth)
        prefix = model(tokens[:, :12], cache=cache, decoding_state=state)
        steps = _decode(model, tokens, cache, state, 12)
    torch.testing.assert_close(torch.cat((prefix, steps), dim=1), full, rtol=1e-4, atol=1e-4)
