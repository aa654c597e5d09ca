"""Reading the rope configs of today's models (issue 47's types) as transformers 5.24 computes them, from
configs built in code, in both schemas (transformers 4's ``rope_scaling`` beside ``rope_theta``,
transformers 5's ``rope_parameters``, nested by layer type): Gemma 3's local and global layers, Gemma 4's
proportional global layers, Qwen2-VL's and Qwen3-VL's M-RoPE, Llama 4's and SmolLM3's NoPE layers. Each is
compared with the model's own rotary module (``{layer_type}_inv_freq``, cos/sin, the rotation)."""

from __future__ import annotations

import copy

import pytest
import torch

from posenc.seq.hf_layers import hf_layer_encodings, hf_layer_kinds
from posenc.seq.hf_rope import rope_from_hf_config
from posenc.seq.mrope import MRoPE, mrope_cos_sin
from posenc.seq.nope_temperature import NoPETemperature
from posenc.seq.rope import RotaryEncoding

transformers = pytest.importorskip("transformers")
gemma3 = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
gemma4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")
qwen2 = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
qwen3 = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")


def _same_freqs(enc, hf_inv_freq: torch.Tensor) -> None:
    inv_freq, factor = enc.frequencies() if isinstance(enc, RotaryEncoding) else (enc.inv_freq, 1.0)
    torch.testing.assert_close(inv_freq.float(), hf_inv_freq.float(), rtol=1e-6, atol=0.0)
    assert factor == 1.0


# ---- Gemma 3 -------------------------------------------------------------------------------------------------

GEMMA3 = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
          "num_hidden_layers": 6, "intermediate_size": 32, "vocab_size": 32}


def _gemma3_config():
    return transformers.Gemma3TextConfig(**GEMMA3, rope_theta=1e6, rope_local_base_freq=5000.0,
                                         rope_scaling={"rope_type": "linear", "factor": 8.0})


@pytest.mark.parametrize("schema", ["config object", "transformers 5 dict", "transformers 4 dict", "multimodal dict"])
def test_gemma3_local_and_global_layers(schema):
    config = _gemma3_config()
    given = {
        "config object": config,
        "transformers 5 dict": config.to_dict(),
        "transformers 4 dict": {**GEMMA3, "model_type": "gemma3_text", "rope_theta": 1e6, "rope_local_base_freq": 5000.0,
                                "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 6},
        "multimodal dict": {"model_type": "gemma3", "text_config": config.to_dict()},
    }[schema]
    rotary = gemma3.Gemma3RotaryEmbedding(config)
    kinds = hf_layer_kinds(given)
    assert kinds == config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    layers = hf_layer_encodings(given)
    _same_freqs(layers[0], rotary.sliding_attention_inv_freq)
    _same_freqs(layers[5], rotary.full_attention_inv_freq)
    assert layers[0] is layers[4] and layers[5].scaling.name == "linear" and layers[0].base == 5000.0


# ---- Gemma 4 -------------------------------------------------------------------------------------------------


def _gemma4_config():
    return transformers.Gemma4TextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                         global_head_dim=32, num_hidden_layers=6, intermediate_size=64, vocab_size=32,
                                         vocab_size_per_layer_input=32, hidden_size_per_layer_input=8)


@pytest.mark.parametrize("schema", ["config object", "transformers 5 dict"])
def test_gemma4_proportional_global_layers_with_their_own_head_width(schema):
    config = _gemma4_config()
    given = config if schema == "config object" else config.to_dict()
    rotary = gemma4.Gemma4TextRotaryEmbedding(config)
    layers = hf_layer_encodings(given)
    assert [e.scaling and e.scaling.name for e in layers] == [None] * 5 + ["proportional"]
    assert layers[5].head_dim == 32 and layers[0].head_dim == 16
    _same_freqs(layers[0], rotary.sliding_attention_inv_freq)
    _same_freqs(layers[5], rotary.full_attention_inv_freq)
    # one layer type read alone, its head width given
    alone = rope_from_hf_config(given, layer_type="full_attention", head_dim=32)
    _same_freqs(alone, rotary.full_attention_inv_freq)


@pytest.mark.parametrize("factor", [None, 2.0])
def test_a_flat_proportional_config(factor):
    rope = {"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    if factor is not None:
        rope["factor"] = factor
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, rope_parameters=rope)
    theirs, _ = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["proportional"](config, None)
    _same_freqs(rope_from_hf_config(config.to_dict()), theirs)
    _same_freqs(rope_from_hf_config({"hidden_size": 64, "num_attention_heads": 2, "head_dim": 32,
                                     "rope_scaling": rope}), theirs)  # transformers 4's key


# ---- Qwen2-VL, Qwen3-VL ---------------------------------------------------------------------------------------

TEXT = {"hidden_size": 64, "num_attention_heads": 2}  # head_dim 32, 16 rotary pairs


def _cos_sin_equal(enc: MRoPE, module) -> None:
    pos = torch.randint(0, 50, (2, 9, 3), generator=torch.Generator().manual_seed(0))
    cos, sin = module(torch.zeros(1, dtype=torch.float64), pos.permute(2, 0, 1))
    ours_cos, ours_sin = mrope_cos_sin(pos, enc.inv_freq, enc.axes)
    torch.testing.assert_close(torch.cat((ours_cos, ours_cos, ours_sin, ours_sin), -1), torch.cat((cos, sin), -1),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("schema", ["config object", "text dict", "transformers 4 dict (type mrope)",
                                    "multimodal object"])
def test_qwen2_vl_mrope(schema):
    params = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
    text = transformers.Qwen2VLTextConfig(**TEXT, rope_parameters=copy.deepcopy(params))
    given = {
        "config object": text,
        "text dict": text.to_dict(),
        "transformers 4 dict (type mrope)": {**TEXT, "model_type": "qwen2_vl", "rope_theta": 1e6, "num_hidden_layers": 2,
                                             "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}},
        "multimodal object": transformers.Qwen2VLConfig(text_config={**TEXT, "rope_parameters": params}),
    }[schema]
    (enc,) = set(hf_layer_encodings(given))
    assert isinstance(enc, MRoPE) and enc.sections == (4, 6, 6) and enc.layout == "sections" and enc.base == 1e6
    _cos_sin_equal(enc, qwen2.Qwen2VLRotaryEmbedding(text))


def test_qwen_vl_text_configs_without_sections_get_the_models_own():
    head128 = {"hidden_size": 256, "num_attention_heads": 2}
    q2 = rope_from_hf_config(transformers.Qwen2VLTextConfig(**head128))
    q3 = rope_from_hf_config(transformers.Qwen3VLTextConfig(**head128, head_dim=128))
    assert (q2.sections, q2.layout) == ((16, 24, 24), "sections")
    assert (q3.sections, q3.layout) == ((24, 20, 20), "interleaved")
    _cos_sin_equal(q3, qwen3.Qwen3VLTextRotaryEmbedding(transformers.Qwen3VLTextConfig(**head128, head_dim=128)))


@pytest.mark.parametrize("stated", [True, False])
def test_qwen3_vl_interleaved_mrope(stated):
    params = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [6, 5, 5]}
    if stated:
        params["mrope_interleaved"] = True
    config = transformers.Qwen3VLTextConfig(**TEXT, head_dim=32, rope_parameters=params)
    enc = rope_from_hf_config(config)
    assert enc.layout == "interleaved" and enc.sections == (6, 5, 5)
    _cos_sin_equal(enc, qwen3.Qwen3VLTextRotaryEmbedding(config))
    # an explicit mrope_interleaved: false outside Qwen3-VL keeps the sections
    flat = rope_from_hf_config({**TEXT, "rope_parameters": {**params, "mrope_interleaved": False}})
    assert flat.layout == "sections"


# ---- Llama 4, SmolLM3 -------------------------------------------------------------------------------------------

LLAMA4 = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "num_hidden_layers": 8, "intermediate_size": 32, "intermediate_size_mlp": 32, "vocab_size": 32}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("schema", ["config object", "transformers 5 dict", "transformers 4 dict"])
def test_llama4_rope_and_nope_layers(schema):
    config = transformers.Llama4TextConfig(**LLAMA4, rope_scaling=dict(LLAMA3_SCALING), floor_scale=4, attn_scale=0.2)
    given = {
        "config object": config,
        "transformers 5 dict": config.to_dict(),
        "transformers 4 dict": {**LLAMA4, "model_type": "llama4_text", "rope_theta": 500000.0,
                                "rope_scaling": dict(LLAMA3_SCALING), "no_rope_layer_interval": 4, "floor_scale": 4,
                                "attn_scale": 0.2, "attn_temperature_tuning": True},
    }[schema]
    layers = hf_layer_encodings(given)
    assert hf_layer_kinds(given) == ["rope", "rope", "rope", "nope"] * 2
    nope = layers[3]
    assert isinstance(nope, NoPETemperature) and (nope.floor_scale, nope.attn_scale) == (4.0, 0.2)
    rope = layers[0]
    assert rope.pairing == "interleaved" and rope.scaling.name == "llama3" and layers[4] is rope
    rotary = llama4.Llama4TextRotaryEmbedding(config)
    _same_freqs(rope, rotary.inv_freq)
    # the rotation: Llama 4's complex product is posenc's interleaved pairs
    q, k = (torch.randn(2, 7, 4, 16) for _ in range(2))
    pos = torch.arange(7)[None]
    hf_q, hf_k = llama4.apply_rotary_emb(q, k, rotary(q, pos))
    ours_q, ours_k = rope.transform_qk(q.transpose(1, 2), k.transpose(1, 2), pos, pos)
    torch.testing.assert_close(ours_q.transpose(1, 2), hf_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_k.transpose(1, 2), hf_k, rtol=1e-5, atol=1e-5)


def test_llama4_without_temperature_and_smollm3():
    config = transformers.Llama4TextConfig(**LLAMA4, attn_temperature_tuning=False)
    assert hf_layer_encodings(config)[3] is None
    smol = transformers.SmolLM3Config(hidden_size=64, num_attention_heads=4, num_hidden_layers=8)
    layers = hf_layer_encodings(smol)
    assert [e is None for e in layers] == [False, False, False, True] * 2
    assert layers[0].pairing == "half_split" and layers[0].base == smol.rope_parameters["rope_theta"]
    explicit = hf_layer_encodings({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3,
                                   "no_rope_layers": [0, 1, 1]})
    assert explicit[0] is None and isinstance(explicit[1], RotaryEncoding)


@pytest.mark.parametrize("config, match", [
    ({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3, "no_rope_layers": [1, 2, 1]},
     "no_rope_layers must hold 0 or 1 for each of the 3 layers"),
    ({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "no_rope_layers": [1]},
     "no_rope_layers must hold 0 or 1 for each of the 2 layers"),
    ({"hidden_size": 64, "num_attention_heads": 4}, "num_hidden_layers must be a positive int"),
    ({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "rope_local_base_freq": 1e4,
      "layer_types": ["sliding_attention"]}, "layer_types names 1 layers; the config has 2"),
])
def test_bad_layer_configs_are_one_clear_error(config, match):
    with pytest.raises(ValueError, match=match):
        hf_layer_encodings(config)
