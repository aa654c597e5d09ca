"""Hostile input, round three (issue 51): the KV cache and generation.

A prompt holding a token id past the vocabulary (or a negative one) is one error naming the id and
the vocabulary size, before anything runs, instead of the embedding's "index out of range in
self"; the decoding options are checked (an int that is a bool, an infinite temperature); a cache
that does not fit the call is one clear error and is left as it was; and cached decoding gives the
full forward's answer."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.seq import CausalLM, SequenceEncoder
from posenc.seq.generation import check_token_ids

VOCAB = 11


def _lm(encoding="rope", depth=2, **kw) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(VOCAB, 16, depth, 2, encoding=encoding, max_len=64, **kw).eval()


PROMPT = torch.tensor([[1, 2, 3], [4, 5, 6]])

GENERATE = [
    (dict(tokens=torch.tensor([[1, 2, VOCAB]])), ValueError, f"tokens must hold token ids in [0, {VOCAB}) (the model's "
                                                             f"vocab_size); got {VOCAB}"),
    (dict(tokens=torch.tensor([[1, -3, 2]])), ValueError, f"tokens must hold token ids in [0, {VOCAB})"),
    (dict(tokens=PROMPT.float()), ValueError, "tokens must be a non-empty [batch, length] long tensor"),
    (dict(tokens=[[1, 2]]), ValueError, "tokens must be a non-empty [batch, length] long tensor; got list"),
    (dict(max_new_tokens=True), ValueError, "max_new_tokens must be a non-negative int, got True"),
    (dict(max_new_tokens=2.0), ValueError, "max_new_tokens must be a non-negative int, got 2.0"),
    (dict(temperature=float("inf")), ValueError, "temperature must be a finite number; got inf"),
    (dict(temperature=float("nan")), ValueError, "temperature must be positive"),
    (dict(top_k=True), TypeError, "top_k must be an int; got True"),
    (dict(greedy="yes"), TypeError, "greedy must be True or False"),
    (dict(use_cache="no"), TypeError, "use_cache must be True or False; got 'no'"),
]


@pytest.mark.parametrize("change, kind, fragment", GENERATE)
def test_generate_refuses_bad_input_in_one_line(change, kind, fragment):
    model = _lm()
    kwargs = dict(tokens=PROMPT, max_new_tokens=2)
    kwargs.update(change)
    with pytest.raises(kind) as info:
        model.generate(kwargs.pop("tokens"), kwargs.pop("max_new_tokens"), **kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_check_token_ids_reads_nothing_for_an_empty_prompt_and_accepts_the_edges():
    check_token_ids(torch.zeros(1, 0, dtype=torch.long), VOCAB)
    check_token_ids(torch.tensor([[0, VOCAB - 1]]), VOCAB)
    with pytest.raises(ValueError, match=r"ids in \[0, 4\) \(the model's vocab_size\); got 4"):
        check_token_ids(torch.tensor([[4]]), 4)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "t5", "sinusoidal"])
def test_cached_greedy_decoding_gives_the_full_forwards_tokens(encoding):
    model = _lm(encoding).double()
    cached = model.generate(PROMPT, 6, greedy=True, use_cache=True)
    full = model.generate(PROMPT, 6, greedy=True, use_cache=False)
    assert torch.equal(cached, full)
    # and the logits of the last step equal the full forward's, in float64
    cache = model.new_cache()
    model(cached[:, :-1], cache=cache)
    step = model(cached[:, -1:], cache=cache)[:, -1]
    torch.testing.assert_close(step, model(cached)[:, -1])


def test_a_cache_of_another_batch_is_refused_and_left_as_it_was():
    model = _lm()
    cache = model.new_cache()
    with torch.no_grad():
        model(PROMPT, cache=cache)
        lengths = [layer.length for layer in cache.layers]
        with pytest.raises(ValueError, match="must match the cached keys .* in batch"):
            model(torch.tensor([[1], [2], [3]]), cache=cache)
    assert [layer.length for layer in cache.layers] == lengths


def test_a_cache_of_another_depth_is_refused():
    model = _lm(depth=2)
    with pytest.raises(ValueError, match="cache") as info:
        model(PROMPT, cache=posenc.KVCache(1))
    assert "\n" not in str(info.value)


def test_a_cache_that_is_no_kv_cache_and_a_bad_layer_count_are_one_line():
    with pytest.raises(TypeError, match=r"cache must be a posenc KVCache \(model.new_cache\(\)\) or None; got list"):
        _lm()(PROMPT, cache=[1, 2])
    for layers in (True, "2"):
        with pytest.raises(TypeError, match="num_layers must be an int"):
            posenc.KVCache(layers)


def test_a_forward_names_a_token_id_past_the_vocabulary():
    """The embedding's own IndexError says "index out of range in self"; the models name the id."""
    with pytest.raises(ValueError, match=rf"tokens must hold token ids in \[0, {VOCAB}\) .*got {VOCAB}"):
        _lm()(torch.tensor([[1, VOCAB]]))
    encoder = SequenceEncoder(VOCAB, 16, 1, 2, encoding="rope")
    with pytest.raises(ValueError, match=rf"x must hold token ids in \[0, {VOCAB}\) .*got {VOCAB + 1}"):
        encoder(torch.tensor([[1, VOCAB + 1]]))


def test_a_learned_table_refuses_decoding_past_its_rows_naming_them():
    model = _lm("learned")
    prompt = torch.randint(0, VOCAB, (1, 62))
    with pytest.raises(ValueError, match="64") as info:
        model.generate(prompt, 5, greedy=True)
    assert "\n" not in str(info.value)
