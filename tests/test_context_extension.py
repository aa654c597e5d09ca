"""Post-hoc context extension of trained RoPE models (extend_context) and Hugging Face rope
configs (rope_from_hf_config): identity at factor 1, in-place switching with the KV-cache rules,
clear errors, and real model families' configs against the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.seq import extend_context, rope_from_hf_config, rotary_layers
from posenc.seq.models import CausalLM, SequenceEncoder

VOCAB = 40


def _lm(encoding="rope", **kw):
    torch.manual_seed(0)
    return CausalLM(VOCAB, 32, 2, 2, encoding=encoding, **kw).eval()


def _tokens(t=40, seed=0):
    return torch.randint(0, VOCAB, (2, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method, kw", [
    ("none", {}), ("linear", {}), ("pi", {}), ("ntk", {}), ("yarn", {"original_max_len": 16}),
    ("llama3", {"original_max_len": 16}), ("longrope", {"original_max_len": 16}),
])
def test_factor_one_reproduces_the_model_exactly(method, kw):
    model = _lm()
    x = _tokens()
    with torch.no_grad():
        ref = model(x)
        extend_context(model, method, **kw)
        assert torch.equal(model(x), ref)


def test_dynamic_ntk_is_exact_up_to_the_original_length_and_rescales_beyond():
    model = _lm()
    x = _tokens(48)
    with torch.no_grad():
        ref = model(x)
        extend_context(model, "dynamic_ntk", factor=2.0, original_max_len=48)
        assert torch.equal(model(x), ref)  # T = 48 <= L0: the original base
        extend_context(model, "dynamic_ntk", factor=2.0, original_max_len=16)
        assert not torch.allclose(model(x), ref)


def test_switching_keeps_weights_and_none_restores_the_original():
    model = _lm()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    x = _tokens(64)
    with torch.no_grad():
        ref = model(x)
        layers = extend_context(model, "yarn", factor=4.0, original_max_len=16)
        assert len(layers) == 1 and layers[0].scaling.name == "yarn"
        changed = model(x)
        assert not torch.allclose(changed, ref)
        for k, v in model.state_dict().items():
            assert torch.equal(v, weights[k]), k
        extend_context(model, "none")
        assert torch.equal(model(x), ref)


def test_every_rotary_layer_of_a_per_layer_model_is_switched():
    model = _lm(share_encoding=False)
    assert len(rotary_layers(model)) == 2
    extend_context(model, "linear", factor=2.0)
    assert all(layer.scaling.name == "linear" for layer in rotary_layers(model))
    torch.testing.assert_close(rotary_layers(model)[0].frequencies()[0], rotary_layers(_lm())[0].frequencies()[0] / 2)
    enc = SequenceEncoder(VOCAB, 32, 1, 2, encoding="rope")
    assert extend_context(enc, "ntk", factor=2.0)[0].scaling.name == "ntk"


def test_kv_cache_rules_follow_the_scaling():
    model = _lm()
    x = _tokens(20)
    extend_context(model, "yarn", factor=4.0, original_max_len=8)
    assert model.supports_kv_cache
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        pieces = [model(x[:, :12], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-4, atol=1e-4)
    extend_context(model, "dynamic_ntk", factor=4.0, original_max_len=8)
    assert not model.supports_kv_cache
    with pytest.raises(ValueError, match="does not support a KV cache"):
        model.new_cache()
    extend_context(model, "longrope", factor=4.0, original_max_len=8, select="long")
    assert model.supports_kv_cache  # a fixed list is length-independent
    extend_context(model, "none")
    assert model.supports_kv_cache


def test_frequencies_are_public_and_length_dependent_ones_need_the_length():
    model = _lm()
    layer = rotary_layers(model)[0]
    base, factor = layer.frequencies()
    assert factor == 1.0 and base.dtype == torch.float64 and base.shape == (8,)
    extend_context(model, "dynamic_ntk", factor=4.0, original_max_len=16)
    with pytest.raises(ValueError, match="depends on the length: pass length="):
        layer.frequencies()
    torch.testing.assert_close(layer.frequencies(16)[0], base)
    r = 16
    new_base = 10000.0 * (4.0 * 64 / 16 - 3) ** (r / (r - 2))
    expected = new_base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    torch.testing.assert_close(layer.frequencies(64)[0], expected)


@pytest.mark.parametrize("call, match", [
    (lambda m: extend_context(m, "rotate"), "method must be one of"),
    (lambda m: extend_context(m, "linear", factor=0.5), "factor must be .*>= 1.*0.5"),
    (lambda m: extend_context(m, "yarn", factor=2.0), "yarn needs original_max_len"),
    (lambda m: extend_context(m, "none", factor=2.0), "takes no factor"),
    (lambda m: extend_context(m, "linear", factor=2.0, beta_fast=3), "unknown option"),
    (lambda m: extend_context(m, "longrope", factor=2.0, original_max_len=8, long_factor=[1.0, 2.0]), "long_factor"),
])
def test_misuse_is_a_clear_error_and_leaves_the_model_unchanged(call, match):
    model = _lm()
    x = _tokens()
    with torch.no_grad():
        ref = model(x)
        with pytest.raises(ValueError, match=match):
            call(model)
        assert torch.equal(model(x), ref) and rotary_layers(model)[0].scaling is None


def test_a_model_without_rotary_layers_is_refused():
    with pytest.raises(ValueError, match="no rotary layer"):
        extend_context(_lm("alibi"), "yarn", factor=2.0, original_max_len=16)
    with pytest.raises(TypeError, match="torch module"):
        extend_context("model", "yarn")


# --- Hugging Face configs, written out as in the models' config.json -------------------------------


def _theta(base, r):
    return base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)


def _yarn(base, r, factor, l0, beta_fast=32.0, beta_slow=1.0):
    def dim(rot):
        return r * math.log(l0 / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), r - 1)
    ramp = ((torch.arange(r // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    theta = _theta(base, r)
    return theta / factor * ramp + theta * (1 - ramp), 0.1 * math.log(factor) + 1


def test_llama_3_1_config():
    config = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    enc = rope_from_hf_config(config)
    theta = _theta(500000.0, 128)
    expected = []
    for t in theta.tolist():
        wavelen = 2 * math.pi / t
        if wavelen < 8192 / 4:
            expected.append(t)
        elif wavelen > 8192 / 1:
            expected.append(t / 8)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            expected.append((1 - smooth) * t / 8 + smooth * t)
    inv_freq, factor = enc.frequencies()
    torch.testing.assert_close(inv_freq, torch.tensor(expected, dtype=torch.float64))
    assert factor == 1.0 and enc.scaling.original_max_len == 8192 and enc.rotary_dim == 128


def test_qwen2_yarn_config_keeps_its_stated_factor():
    config = {"hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
              "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
    inv_freq, factor = rope_from_hf_config(config).frequencies()
    expected, attention = _yarn(1000000.0, 128, 4.0, 32768)
    torch.testing.assert_close(inv_freq, expected)
    assert factor == pytest.approx(attention) and abs(factor - 1.1386) < 1e-4


def test_yarn_and_longrope_derive_the_factor_from_the_two_lengths():
    yarn = {"head_dim": 64, "max_position_embeddings": 32768, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}}
    inv_freq, factor = rope_from_hf_config(yarn).frequencies()
    expected, attention = _yarn(10000.0, 64, 8.0, 4096)
    torch.testing.assert_close(inv_freq, expected)
    assert factor == pytest.approx(attention) and abs(factor - 1.2079) < 1e-4
    # Phi-3 mini 128k: original length at the top level, no factor, 48 pairs of searched factors
    short = [1.0 + 0.01 * i for i in range(48)]
    long = [1.0 + 0.5 * i for i in range(48)]
    phi3 = {"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long}}
    enc = rope_from_hf_config(phi3)
    theta = _theta(10000.0, 96)
    attention = math.sqrt(1 + math.log(32) / math.log(4096))
    long_freq, factor = enc.frequencies(8000)
    torch.testing.assert_close(long_freq, theta / torch.tensor(long, dtype=torch.float64))
    assert factor == pytest.approx(attention) and abs(factor - 1.1902) < 1e-4
    torch.testing.assert_close(enc.frequencies(4096)[0], theta / torch.tensor(short, dtype=torch.float64))
    assert not enc.supports_kv_cache
    longrope = {"head_dim": 64, "max_position_embeddings": 32768, "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 4096,
                                 "short_factor": [1.0] * 32, "long_factor": [2.0] * 32}}
    assert rope_from_hf_config(longrope).frequencies(40000)[1] == pytest.approx(math.sqrt(1.25))  # 1.118


def test_dynamic_ntk_partial_rotary_and_rope_parameters_configs():
    dynamic = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096, "rope_theta": 10000.0,
               "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    enc = rope_from_hf_config(dynamic)
    r = 128
    expected = (10000.0 * (2.0 * 8192 / 4096 - 1) ** (r / (r - 2))) ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    torch.testing.assert_close(enc.frequencies(8192)[0], expected)
    torch.testing.assert_close(enc.frequencies(4096)[0], _theta(10000.0, r))
    partial = {"hidden_size": 2560, "num_attention_heads": 32, "partial_rotary_factor": 0.4, "rope_theta": 10000.0,
               "max_position_embeddings": 2048}
    enc = rope_from_hf_config(partial)
    assert (enc.head_dim, enc.rotary_dim, enc.scaling) == (80, 32, None)
    v5 = {"head_dim": 64, "max_position_embeddings": 8192,
          "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0}}
    torch.testing.assert_close(rope_from_hf_config(v5).frequencies()[0], _theta(50000.0, 64) / 2)
    with pytest.raises(ValueError, match="rope type 'ntk_by_parts' has no posenc mapping"):
        rope_from_hf_config({"head_dim": 64, "rope_scaling": {"rope_type": "ntk_by_parts"}})
    # mrope is mapped (issue 47); sections that do not fit the head are one clear line
    with pytest.raises(ValueError, match=r"sections \(16, 24, 24\) must add up to the 32 rotary pairs"):
        rope_from_hf_config({"head_dim": 64, "rope_scaling": {"rope_type": "mrope"}})
