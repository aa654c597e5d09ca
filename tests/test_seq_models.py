"""Reference sequence models: cached decoding equals the full forward for every registered
sequence encoding, gradients reach every learned parameter, generation, sharing, the encoder."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.seq.models import CausalLM, SequenceEncoder

SEQ_NAMES = [info.name for info in posenc.available("seq")]
VOCAB, DIM, DEPTH, HEADS, MAX_LEN = 40, 32, 2, 4, 64


def _attention_kind(name: str | None) -> dict:
    """Linear attention for the encodings defined on it only (SPE), softmax for the others."""
    return {"feature_map": "elu"} if name is not None and posenc.common.registry.get(name).cls.linear_only else {}


def _perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Move every encoding parameter off its initial value (zero-initialised tables would make
    position terms vanish and the tests pass vacuously). Multiplicative where the value is
    nonzero, so positive parameters (KERPLE's r, FIRE's c) stay positive."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for enc in model.encodings:
            for p in enc.parameters():
                noise = torch.randn(p.shape, generator=g).to(p.dtype)
                if p.abs().max() > 0:
                    p.mul_(1 + 0.2 * noise.clamp(-2, 2))
                else:
                    p.add_(0.2 * noise)


def _lm(name: str | None, seed: int = 0, **kw) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(VOCAB, DIM, DEPTH, HEADS, encoding=name, max_len=MAX_LEN, **_attention_kind(name), **kw)
    _perturb(model)
    return model.eval()


@pytest.mark.parametrize("name", SEQ_NAMES + [None])
def test_cached_decoding_equals_full_forward_or_is_refused(name):
    model = _lm(name)
    tokens = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)
        if not model.supports_kv_cache:
            with pytest.raises(ValueError, match="does not support a KV cache.*use_cache=False"):
                model.new_cache()
            with pytest.raises(ValueError, match="does not support a KV cache"):
                model(tokens, cache=posenc.KVCache(DEPTH))
            with pytest.raises(ValueError, match="does not support a KV cache"):
                model.generate(tokens[:, :4], 3, greedy=True, use_cache=True)
            return
        cache = model.new_cache()
        pieces = [model(tokens[:, :5], cache=cache)]  # prompt
        pieces += [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 11)]  # one token at a time
        pieces.append(model(tokens[:, 11:], cache=cache))  # then a chunk of three
    assert cache.length == 14
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", SEQ_NAMES + [None])
def test_greedy_generate_equals_argmax_of_repeated_full_forwards(name):
    model = _lm(name)
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, 6, greedy=True)  # cached where the encodings allow
    expected = prompt
    with torch.no_grad():
        for _ in range(6):
            nxt = model(expected)[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat((expected, nxt), dim=1)
    assert torch.equal(out, expected)
    assert torch.equal(model.generate(prompt, 6, greedy=True, use_cache=False), expected)


def _assert_every_parameter_learns(model, what):
    params = [(n, p) for enc in model.encodings for n, p in enc.named_parameters()]
    for n, p in params:
        assert p.grad is not None, f"{what}: encoding parameter {n} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{what}: encoding parameter {n} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{what}: encoding parameter {n} has an all-zero gradient"


@pytest.mark.parametrize("name", SEQ_NAMES)
def test_gradients_reach_every_encoding_parameter_in_a_causal_lm(name):
    model = _lm(name).train()
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    _assert_every_parameter_learns(model, f"CausalLM({name})")


@pytest.mark.parametrize("name", SEQ_NAMES)
def test_bidirectional_encodings_learn_in_the_sequence_encoder_and_causal_ones_are_refused(name):
    probe = posenc.build(name, dims=posenc.ModelDims(DIM, HEADS, MAX_LEN))
    if probe.causal_only:
        with pytest.raises(ValueError, match=f"SequenceEncoder attends in both directions, but encoding '{name}'"):
            SequenceEncoder(VOCAB, DIM, DEPTH, HEADS, encoding=name, max_len=MAX_LEN)
        return
    torch.manual_seed(0)
    model = SequenceEncoder(VOCAB, DIM, DEPTH, HEADS, encoding=name, num_outputs=3, max_len=MAX_LEN,
                            **_attention_kind(name))
    _perturb(model)
    tokens = torch.randint(0, VOCAB, (3, 20), generator=torch.Generator().manual_seed(4))
    valid = torch.ones(3, 20, dtype=torch.bool)
    valid[1, 15:] = False
    out = model(tokens, key_valid=valid)
    assert out.shape == (3, 3)
    model.loss(out, torch.tensor([0, 1, 2])).backward()
    _assert_every_parameter_learns(model, f"SequenceEncoder({name})")


def test_alibi_is_refused_bidirectionally_with_the_symmetric_hint_and_works_symmetric():
    with pytest.raises(ValueError, match=r"encoding_options=\{'symmetric': True\}"):
        SequenceEncoder(VOCAB, DIM, DEPTH, HEADS, encoding="alibi")
    model = SequenceEncoder(VOCAB, DIM, DEPTH, HEADS, encoding="alibi", encoding_options={"symmetric": True})
    assert model(torch.randint(0, VOCAB, (2, 6))).shape == (2, 2)


class _NoCache(posenc.PositionEncoding):
    """A score bias that refuses a cache (like dynamic NTK or CoPE might)."""

    hooks = frozenset({posenc.Hook.SCORE_BIAS})
    supports_kv_cache = False

    def score_bias(self, q, k, q_pos, kv_pos):
        def fn(b, h, qi, ki):
            return -0.1 * (q_pos[0, qi] - kv_pos[0, ki]).float().abs()
        return posenc.PairwiseBias(fn, name="nocache")


def test_an_encoding_without_cache_support_decodes_by_recomputation():
    torch.manual_seed(0)
    model = CausalLM(VOCAB, DIM, DEPTH, HEADS, encoding=_NoCache()).eval()
    assert not model.supports_kv_cache
    prompt = torch.randint(0, VOCAB, (1, 3))
    with pytest.raises(ValueError, match="_NoCache does not support a KV cache.*use_cache=False"):
        model.generate(prompt, 2, use_cache=True)
    out = model.generate(prompt, 4, greedy=True)  # default: recompute the prefix
    assert out.shape == (1, 7) and torch.equal(out[:, :3], prompt)


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    model = _lm("rope")
    prompt = torch.randint(0, VOCAB, (2, 3))
    a = model.generate(prompt, 8, temperature=0.8, generator=torch.Generator().manual_seed(5))
    b = model.generate(prompt, 8, temperature=0.8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    assert torch.equal(model.generate(prompt, 8, top_k=1), model.generate(prompt, 8, greedy=True))
    assert torch.equal(model.generate(prompt, 0), prompt)
    for kw, msg in [
        ({"temperature": 0.0}, "temperature must be positive"),
        ({"top_k": 0}, "top_k must be a positive int"),
    ]:
        with pytest.raises(ValueError, match=msg):
            model.generate(prompt, 2, **kw)
    with pytest.raises(ValueError, match="max_new_tokens must be a non-negative int"):
        model.generate(prompt, -1)
    with pytest.raises(ValueError, match="tokens must be a non-empty"):
        model.generate(prompt[:, :0], 2)


def test_cached_input_encoding_sees_absolute_positions_of_new_tokens():
    # With a cache, the new token of a sinusoidal model must be encoded at its own position:
    # the same logits as position 5 of the full pass, not those of position 0.
    model = _lm("sinusoidal")
    tokens = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        cache = model.new_cache()
        model(tokens[:, :5], cache=cache)
        step = model(tokens[:, 5:], cache=cache)
        fresh = model(tokens[:, 5:])
        full = model(tokens)
    torch.testing.assert_close(step[:, 0], full[:, 5], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(step[:, 0], fresh[:, 0], atol=1e-3)


def test_encoding_sharing_defaults_and_overrides():
    def layer_encs(m):
        return [b.attn.encoding for b in m.encoder.blocks]

    # A parameter-free encoding is shared (one instance serves every layer).
    encs = layer_encs(CausalLM(VOCAB, DIM, 3, HEADS, encoding="alibi"))
    assert encs[0] is encs[1] is encs[2]
    # One with learned parameters gets one instance per layer unless its paper shares it.
    encs = layer_encs(CausalLM(VOCAB, DIM, 3, HEADS, encoding="erpe", max_len=16))
    assert len({id(e) for e in encs}) == 3
    encs = layer_encs(CausalLM(VOCAB, DIM, 3, HEADS, encoding="erpe", max_len=16, share_encoding=True))
    assert encs[0] is encs[1] is encs[2]
    if "t5" in SEQ_NAMES:
        encs = layer_encs(CausalLM(VOCAB, DIM, 3, HEADS, encoding="t5"))
        assert encs[0] is encs[1] is encs[2]  # shared across layers, as in T5
    with pytest.raises(ValueError, match="share_encoding=False: 'sinusoidal' has an input hook"):
        CausalLM(VOCAB, DIM, 2, HEADS, encoding="sinusoidal", share_encoding=False)
    with pytest.raises(ValueError, match="share_encoding=False needs the encoding by name"):
        CausalLM(VOCAB, DIM, 2, HEADS, encoding=posenc.build("alibi", num_heads=HEADS), share_encoding=False)
    with pytest.raises(ValueError, match="unknown encoding 'rotary'"):
        CausalLM(VOCAB, DIM, 2, HEADS, encoding="rotary")
    with pytest.raises(TypeError, match="unknown argument"):
        CausalLM(VOCAB, DIM, 2, HEADS, encoding="rope", encoding_options={"bass": 3})


def test_sequence_encoder_ignores_padding_and_supports_both_pools_and_regression():
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (1, 7))
    padded = torch.cat((tokens, torch.zeros(1, 3, dtype=torch.long)), dim=1)
    valid = torch.tensor([[True] * 7 + [False] * 3])
    for pool in ("mean", "cls"):
        model = SequenceEncoder(VOCAB, DIM, DEPTH, HEADS, encoding="rope", pool=pool, num_outputs=4).eval()
        with torch.no_grad():
            torch.testing.assert_close(model(padded, key_valid=valid), model(tokens), rtol=1e-5, atol=1e-5)
    reg = SequenceEncoder(input_dim=5, dim=DIM, depth=1, num_heads=HEADS, encoding="sinusoidal",
                          task="regression", num_outputs=1)
    x = torch.randn(4, 9, 5)
    out = reg(x)
    assert out.shape == (4, 1)
    loss = reg.loss(out, torch.randn(4))
    loss.backward()
    assert reg.embed.weight.grad is not None
    for kw, msg in [
        ({}, "give exactly one of vocab_size and input_dim"),
        ({"vocab_size": VOCAB, "pool": "max"}, "pool must be 'mean' or 'cls'"),
        ({"vocab_size": VOCAB, "task": "ranking"}, "task must be 'classification' or 'regression'"),
    ]:
        with pytest.raises(ValueError, match=msg):
            SequenceEncoder(dim=DIM, depth=1, num_heads=HEADS, **kw)
    with pytest.raises(ValueError, match="key_valid must be a \\[batch=1, length=7\\] bool tensor"):
        SequenceEncoder(VOCAB, DIM, 1, HEADS)(tokens, key_valid=valid)
