"""rope_from_hf_config against transformers itself: for each rope type, the inverse frequencies and
attention factor equal those of transformers' ``ROPE_INIT_FUNCTIONS`` (which compute in float32)
to float32 rounding, at lengths on both sides of the original length for the length-dependent
types. Configs are built in code (no download)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from posenc.seq import rope_from_hf_config
from posenc.seq.context import DYNAMIC_LENGTH_SOURCES

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")

LLAMA = {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 64, "max_position_embeddings": 4096,
         "rope_theta": 10000.0}
SHORT = [1.0 + 0.01 * i for i in range(32)]
LONG = [1.0 + 0.5 * i for i in range(32)]

# (id, config class, config dict, lengths at which a length-dependent type is compared)
CASES = [
    ("default", "LlamaConfig", LLAMA, ()),
    ("linear", "LlamaConfig", {**LLAMA, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 10000.0}}, ()),
    ("dynamic", "LlamaConfig", {**LLAMA, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                              "rope_theta": 10000.0}}, (100, 4096, 4097, 8192, 20000)),
    ("dynamic-stated-original", "LlamaConfig",
     {**LLAMA, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0,
                                   "original_max_position_embeddings": 2048}}, (100, 3000, 4097, 8192, 20000)),
    ("yarn-qwen2", "Qwen2Config",
     {**LLAMA, "max_position_embeddings": 32768, "rope_parameters": {
         "rope_type": "yarn", "factor": 4.0, "rope_theta": 1000000.0, "original_max_position_embeddings": 32768}}, ()),
    ("yarn-deepseek", "LlamaConfig",
     {**LLAMA, "max_position_embeddings": 163840, "rope_parameters": {
         "rope_type": "yarn", "factor": 40.0, "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}}, ()),
    ("yarn-factor-from-lengths", "LlamaConfig",
     {**LLAMA, "max_position_embeddings": 32768, "rope_parameters": {
         "rope_type": "yarn", "factor": None, "rope_theta": 10000.0, "original_max_position_embeddings": 4096}}, ()),
    ("llama3", "LlamaConfig",
     {**LLAMA, "max_position_embeddings": 131072, "rope_parameters": {
         "rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}, ()),
    ("longrope-phi3", "Phi3Config",
     {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 131072,
      "original_max_position_embeddings": 4096,
      "rope_parameters": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                          "rope_theta": 10000.0}}, (100, 4096, 4097, 8000)),
]


def _hf(config_class: str, config: dict, seq_len: int | None):
    """transformers' (inv_freq float32 [r/2], attention factor) for ``config``."""
    hf_config = getattr(transformers, config_class)(**copy.deepcopy(config))
    kind = hf_config.rope_parameters.get("rope_type", "default")
    if kind == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        if "default" in rope_utils.ROPE_INIT_FUNCTIONS:  # older transformers list it; 5.x has it on the model
            return rope_utils.ROPE_INIT_FUNCTIONS["default"](hf_config, None)
        return LlamaRotaryEmbedding.compute_default_rope_parameters(hf_config)
    return rope_utils.ROPE_INIT_FUNCTIONS[kind](hf_config, None, seq_len=seq_len)


def _assert_same(ours: tuple[torch.Tensor, float], theirs: tuple[torch.Tensor, float]) -> None:
    inv_freq, factor = ours
    hf_inv_freq, hf_factor = theirs
    assert inv_freq.dtype == torch.float64 and hf_inv_freq.dtype == torch.float32
    torch.testing.assert_close(inv_freq.float(), hf_inv_freq, rtol=1e-6, atol=0.0)  # float32 rounding
    assert factor == pytest.approx(hf_factor, rel=1e-12)


@pytest.mark.parametrize("case, config_class, config, lengths", CASES, ids=[c[0] for c in CASES])
def test_rope_from_hf_config_computes_what_transformers_computes(case, config_class, config, lengths):
    enc = rope_from_hf_config(copy.deepcopy(config))
    if enc.scaling is not None and enc.scaling.dynamic:
        assert lengths, "a length-dependent type is compared at given lengths"
        for length in lengths:
            _assert_same(enc.frequencies(length), _hf(config_class, config, length))
    else:
        _assert_same(enc.frequencies(), _hf(config_class, config, None))
    # a transformers config object reads the same as its dict
    hf_config = getattr(transformers, config_class)(**copy.deepcopy(config))
    from_object = rope_from_hf_config(hf_config)
    assert (from_object.rotary_dim, from_object.base, from_object.scaling) == (enc.rotary_dim, enc.base, enc.scaling)


def test_dynamic_reads_the_stated_original_length_only_when_asked():
    config = dict(CASES[3][2])  # dynamic, max_position_embeddings 4096, original 2048
    as_transformers = rope_from_hf_config(copy.deepcopy(config))
    stated = rope_from_hf_config(copy.deepcopy(config), dynamic_length_from="original_max_position_embeddings")
    assert as_transformers.scaling.original_max_len == 4096 and stated.scaling.original_max_len == 2048
    r, length = 64, 3000
    k = torch.arange(0, r, 2, dtype=torch.float64)
    grown = 10000.0 * (2.0 * length / 2048 - 1) ** (r / (r - 2))  # L0 = 2048 < 3000: the base grows
    torch.testing.assert_close(stated.frequencies(length)[0], grown ** (-k / r))
    torch.testing.assert_close(as_transformers.frequencies(length)[0], 10000.0 ** (-k / r))  # 3000 <= 4096
    # without a stated original length the two readings agree
    plain = dict(CASES[2][2])
    assert (rope_from_hf_config(copy.deepcopy(plain)).scaling
            == rope_from_hf_config(copy.deepcopy(plain), dynamic_length_from=DYNAMIC_LENGTH_SOURCES[1]).scaling)
    # other types are unaffected by the option
    llama3 = dict(CASES[7][2])
    assert (rope_from_hf_config(copy.deepcopy(llama3), dynamic_length_from="original_max_position_embeddings").scaling
            == rope_from_hf_config(copy.deepcopy(llama3)).scaling)
    with pytest.raises(ValueError, match="dynamic_length_from must be one of 'max_position_embeddings', "
                                         "'original_max_position_embeddings'; got 'stated'"):
        rope_from_hf_config(copy.deepcopy(config), dynamic_length_from="stated")
    assert math.isfinite(grown)
