"""rope_from_hf_config reads a Hugging Face rope config as transformers 5.24 does: for each rope
type and each field (stated, null, zero, missing, at the top level or in the rope dict, in both
schemas, flat or nested by layer type) the inverse frequencies and attention factor equal those of
transformers' own ``ROPE_INIT_FUNCTIONS`` on a config object built from the same dict (float32
rounding: transformers computes in float32). Configs are built in code (no download)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from posenc.seq import rope_from_hf_config
from posenc.seq.hf_rope import HF_ROPE_TYPES, hf_rope_fields

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402

BASE = {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 64, "max_position_embeddings": 4096}
PHI3 = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096}  # head_dim 64, derived
SHORT = [1.0 + 0.01 * i for i in range(32)]
LONG = [1.0 + 0.5 * i for i in range(32)]


def _rope(**fields):
    return {"rope_theta": 10000.0, **fields}


# (id, config class, config dict in the transformers 5 schema, lengths for a length-dependent type)
CASES = [
    ("default", "LlamaConfig", {**BASE, "rope_parameters": _rope(rope_type="default")}, ()),
    ("default-theta-missing", "LlamaConfig", {**BASE, "rope_parameters": {"rope_type": "default"}}, ()),
    ("default-no-rope-dict", "LlamaConfig", {**BASE, "rope_theta": 500.0}, ()),
    ("default-partial-half", "Phi3Config", {**PHI3, "rope_parameters": _rope(partial_rotary_factor=0.5)}, ()),
    ("default-partial-odd", "Phi3Config", {**PHI3, "rope_parameters": _rope(partial_rotary_factor=0.3)}, ()),
    ("linear", "LlamaConfig", {**BASE, "rope_parameters": _rope(rope_type="linear", factor=2.0)}, ()),
    ("linear-int-factor", "LlamaConfig", {**BASE, "rope_parameters": _rope(rope_type="linear", factor=3)}, ()),
    ("linear-partial-odd", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.3)}, ()),
    ("dynamic", "LlamaConfig", {**BASE, "rope_parameters": _rope(rope_type="dynamic", factor=2.0)},
     (100, 4096, 4097, 8192, 20000)),
    ("dynamic-stated-original-ignored", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="dynamic", factor=2.0, original_max_position_embeddings=2048)},
     (100, 3000, 4097, 20000)),
    ("yarn", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024)}, ()),
    ("yarn-factor-null", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=None, original_max_position_embeddings=512)}, ()),
    ("yarn-original-missing", "LlamaConfig", {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0)}, ()),
    ("yarn-original-top-level", "LlamaConfig",
     {**BASE, "original_max_position_embeddings": 512,
      "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024)}, ()),
    ("yarn-deepseek-mscale", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=40.0, original_max_position_embeddings=1024,
                                       mscale=1.0, mscale_all_dim=0.8)}, ()),
    ("yarn-mscale-all-dim-0", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                       mscale=1.0, mscale_all_dim=0)}, ()),
    ("yarn-mscale-0", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                       mscale=0, mscale_all_dim=0.8)}, ()),
    ("yarn-mscale-alone", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                       mscale=0.7)}, ()),
    ("yarn-beta-0", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                       beta_fast=0, beta_slow=0)}, ()),
    ("yarn-beta-stated", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                       beta_fast=16, beta_slow=2)}, ()),
    ("yarn-truncate-false", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                       truncate=False)}, ()),
    ("yarn-attention-factor", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                       attention_factor=1.5)}, ()),
    ("longrope-factor-stated", "LlamaConfig",
     {**BASE, "max_position_embeddings": 32, "rope_parameters": _rope(
         rope_type="longrope", factor=4.0, original_max_position_embeddings=16, short_factor=SHORT,
         long_factor=LONG)}, (8, 16, 17, 64)),
    ("longrope-factor-null", "LlamaConfig",
     {**BASE, "max_position_embeddings": 32, "rope_parameters": _rope(
         rope_type="longrope", factor=None, original_max_position_embeddings=16, short_factor=SHORT,
         long_factor=LONG)}, (16, 17)),
    ("longrope-factor-missing", "LlamaConfig",
     {**BASE, "max_position_embeddings": 32, "rope_parameters": _rope(
         rope_type="longrope", original_max_position_embeddings=16, short_factor=SHORT, long_factor=LONG)}, (16, 17)),
    ("longrope-factor-0", "LlamaConfig",
     {**BASE, "max_position_embeddings": 32, "rope_parameters": _rope(
         rope_type="longrope", factor=0, original_max_position_embeddings=16, short_factor=SHORT,
         long_factor=LONG)}, (16, 17)),
    ("longrope-attention-factor", "LlamaConfig",
     {**BASE, "max_position_embeddings": 32, "rope_parameters": _rope(
         rope_type="longrope", factor=4.0, attention_factor=1.3, original_max_position_embeddings=16,
         short_factor=SHORT, long_factor=LONG)}, (16, 17)),
    ("longrope-phi3-top-level-wins", "Phi3Config",
     {**PHI3, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_parameters": _rope(
         rope_type="longrope", original_max_position_embeddings=2048, short_factor=SHORT, long_factor=LONG)},
     (100, 3000, 4096, 4097, 8000)),
    ("llama3", "LlamaConfig",
     {**BASE, "max_position_embeddings": 131072, "rope_parameters": _rope(
         rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=8192)}, ()),
    ("llama3-original-missing", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)},
     ()),
    ("llama3-partial-odd", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=1024, partial_rotary_factor=0.3)}, ()),
    # issue 47: Gemma 4's proportional RoPE (the whole head; partial_rotary_factor picks the pairs that turn)
    ("proportional", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="proportional", rope_theta=1e6, partial_rotary_factor=0.25)}, ()),
    ("proportional-factor-odd-share", "LlamaConfig",
     {**BASE, "rope_parameters": _rope(rope_type="proportional", factor=2.0, partial_rotary_factor=0.3)}, ()),
    ("proportional-partial-missing", "LlamaConfig", {**BASE, "rope_parameters": _rope(rope_type="proportional")},
     ()),
]


def _v4(config: dict) -> dict:
    """The same config in the transformers 4 schema: ``rope_scaling`` beside a top-level ``rope_theta``
    and ``partial_rotary_factor``."""
    config = copy.deepcopy(config)
    rope = config.pop("rope_parameters", None)
    if rope is None:
        return config
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in rope:
            config[key] = rope.pop(key)
    if rope:
        config["rope_scaling"] = rope
    return config


def _hf_config(config_class: str, config: dict):
    return getattr(transformers, config_class)(**copy.deepcopy(config))


def _hf(config_class: str, config: dict, seq_len: int | None, layer_type: str | None = None):
    """transformers' ``(inv_freq float32 [r/2], attention factor)`` for ``config``."""
    hf_config = _hf_config(config_class, config)
    rope = hf_config.rope_parameters if layer_type is None else hf_config.rope_parameters[layer_type]
    kind = rope.get("rope_type", "default")
    if kind == "default":  # on the model in transformers 5; Phi-3's reads partial_rotary_factor
        if layer_type is not None:
            return Phi3RotaryEmbedding.compute_default_rope_parameters(_FlatView(hf_config, rope))
        return Phi3RotaryEmbedding.compute_default_rope_parameters(hf_config)
    extra = {} if layer_type is None else {"layer_type": layer_type}
    return rope_utils.ROPE_INIT_FUNCTIONS[kind](hf_config, None, seq_len=seq_len, **extra)


class _FlatView:
    """A nested config seen with one layer type's rope dict (how a model's default rope reads it)."""

    def __init__(self, config, rope):
        self._config, self.rope_parameters = config, rope

    def __getattr__(self, name):
        return getattr(self._config, name)


def _assert_same(ours, theirs) -> None:
    inv_freq, factor = ours
    hf_inv_freq, hf_factor = theirs
    assert inv_freq.dtype == torch.float64 and hf_inv_freq.dtype == torch.float32
    assert inv_freq.shape == hf_inv_freq.shape
    torch.testing.assert_close(inv_freq.float(), hf_inv_freq, rtol=2e-6, atol=0.0)  # float32 rounding
    assert factor == pytest.approx(hf_factor, rel=1e-12)


def _compare(enc, config_class, config, lengths, layer_type=None):
    if enc.scaling is not None and enc.scaling.dynamic:
        assert lengths, "a length-dependent type is compared at given lengths"
        for length in lengths:
            _assert_same(enc.frequencies(length), _hf(config_class, config, length, layer_type))
    else:
        _assert_same(enc.frequencies(), _hf(config_class, config, None, layer_type))


@pytest.mark.parametrize("schema", ["v5", "v4"])
@pytest.mark.parametrize("case, config_class, config, lengths", CASES, ids=[c[0] for c in CASES])
def test_every_field_reads_as_transformers_reads_it(case, config_class, config, lengths, schema):
    config = config if schema == "v5" else _v4(config)
    enc = rope_from_hf_config(copy.deepcopy(config))
    _compare(enc, config_class, config, lengths)
    # the transformers config object built from the dict reads the same
    from_object = rope_from_hf_config(_hf_config(config_class, config))
    assert (from_object.rotary_dim, from_object.base, from_object.scaling) == (enc.rotary_dim, enc.base, enc.scaling)


def test_the_issue_figures():
    """longrope with a stated factor 4 and lengths 32/16 takes the factor (1.225, not the ratio's
    1.118); yarn with mscale_all_dim 0 is plain yarn (1.139, not 1.098)."""
    longrope = dict(CASES[[c[0] for c in CASES].index("longrope-factor-stated")][2])
    assert rope_from_hf_config(longrope).frequencies(17)[1] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))
    assert abs(rope_from_hf_config(longrope).frequencies(17)[1] - 1.2247) < 1e-4
    yarn = dict(CASES[[c[0] for c in CASES].index("yarn-mscale-all-dim-0")][2])
    assert rope_from_hf_config(yarn).frequencies()[1] == pytest.approx(0.1 * math.log(4) + 1)
    assert abs(rope_from_hf_config(yarn).frequencies()[1] - 1.1386) < 1e-4


def test_yarn_scaling_itself_reads_a_zero_mscale_as_absent():
    """The scaling's own function (extend_context, posenc extend) follows transformers too."""
    from posenc.seq.rope_scaling import YaRNScaling

    plain = YaRNScaling(original_max_len=1024, factor=4.0).compute(64, 10000.0)[1]
    for mscale, mscale_all_dim in ((1.0, 0.0), (0.0, 0.8), (0.7, None)):
        scaling = YaRNScaling(original_max_len=1024, factor=4.0, mscale=mscale, mscale_all_dim=mscale_all_dim)
        assert scaling.compute(64, 10000.0)[1] == plain == pytest.approx(0.1 * math.log(4) + 1)
    both = YaRNScaling(original_max_len=1024, factor=4.0, mscale=1.0, mscale_all_dim=0.8).compute(64, 10000.0)[1]
    assert both == pytest.approx((0.1 * math.log(4) + 1) / (0.08 * math.log(4) + 1))


NESTED = {**BASE, "num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"],
          "rope_theta": 50000.0,
          "rope_parameters": {
              "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                 "original_max_position_embeddings": 1024, "truncate": False},
              "sliding_attention": {"rope_type": "default"}}}


@pytest.mark.parametrize("layer_type", ["full_attention", "sliding_attention"])
def test_a_rope_dict_nested_by_layer_type_reads_each_layer_type(layer_type):
    enc = rope_from_hf_config(copy.deepcopy(NESTED), layer_type=layer_type)
    _compare(enc, "Qwen2Config", NESTED, (), layer_type)
    from_object = rope_from_hf_config(_hf_config("Qwen2Config", NESTED), layer_type=layer_type)
    assert (from_object.rotary_dim, from_object.base, from_object.scaling) == (enc.rotary_dim, enc.base, enc.scaling)
    if layer_type == "sliding_attention":  # the top-level theta fills the layer dict that has none
        assert enc.base == 50000.0 and enc.scaling is None
    else:  # transformers reads yarn's truncate from the outer dict: the layer's False is not seen
        assert enc.base == 1e6 and enc.scaling.truncate is True


def test_a_nested_rope_dict_needs_its_layer_type_and_a_flat_one_serves_every_layer_type():
    with pytest.raises(ValueError, match=r"one dict per layer type \(full_attention, sliding_attention\): "
                                         "pass layer_type="):
        rope_from_hf_config(copy.deepcopy(NESTED))
    with pytest.raises(ValueError, match="layer_type must be one of full_attention, sliding_attention; got 'chunked'"):
        rope_from_hf_config(copy.deepcopy(NESTED), layer_type="chunked")
    flat = CASES[0][2]
    assert rope_from_hf_config(flat, layer_type="sliding_attention").base == rope_from_hf_config(flat).base
    # a dict without layer_types: the keys that hold dicts are the layer types
    bare = {k: v for k, v in copy.deepcopy(NESTED).items() if k != "layer_types"}
    assert rope_from_hf_config(bare, layer_type="full_attention").scaling == rope_from_hf_config(
        copy.deepcopy(NESTED), layer_type="full_attention").scaling
    nope = copy.deepcopy(NESTED)
    nope["rope_parameters"]["sliding_attention"] = None
    with pytest.raises(ValueError, match="layer type 'sliding_attention' has no rope"):
        rope_from_hf_config(nope, layer_type="sliding_attention")


def test_rope_scaling_wins_over_rope_parameters_when_both_are_given():
    config = {**BASE, "rope_parameters": _rope(rope_type="linear", factor=2.0),
              "rope_scaling": {"rope_type": "linear", "factor": 3.0}}
    assert rope_from_hf_config(config).scaling.factor == 3.0
    _compare(rope_from_hf_config(config), "LlamaConfig", config, ())
    empty = {**BASE, "rope_parameters": _rope(rope_type="linear", factor=2.0), "rope_scaling": {}}
    assert rope_from_hf_config(empty).scaling.factor == 2.0


@pytest.mark.parametrize("rope, match", [
    ({"rope_type": "linear"}, "factor is required"),
    ({"rope_type": "dynamic", "factor": None}, "factor is required by this rope type; got null"),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "low_freq_factor is required"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "high_freq_factor is required"),
    ({"rope_type": "longrope", "long_factor": LONG}, "short_factor is required"),
])
def test_a_field_transformers_requires_is_required(rope, match):
    config = {**BASE, "rope_parameters": _rope(**rope)}
    with pytest.raises(ValueError, match=match):
        rope_from_hf_config(config)
    with pytest.raises((KeyError, TypeError, ValueError)):  # transformers refuses it as well
        hf_config = _hf_config("LlamaConfig", config)
        rope_utils.ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, None)


@pytest.mark.parametrize("rope, match", [
    ({"rope_type": "linear", "factor": 0}, "factor must be a positive number; got 0"),
    ({"rope_type": "yarn", "factor": 0, "original_max_position_embeddings": 1024}, "factor must be a positive"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0},
     "original_max_position_embeddings must be a positive int; got 0"),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.0}, "attention_factor must be a positive number"),
    ({"rope_type": "linear", "factor": 0.5}, "factor must be a number >= 1; got 0.5"),
    ({"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 1, "short_factor": SHORT,
      "long_factor": LONG}, "attention factor undefined"),
    ({"rope_type": "dynamic", "factor": 2.0, "partial_rotary_factor": 0.3}, "odd rotary width"),
    ({"rope_type": "yarn", "factor": 2.0, "partial_rotary_factor": 0.3}, "odd rotary width"),
    ({"rope_type": "longrope", "factor": 2.0, "partial_rotary_factor": 0.3, "short_factor": [1.0] * 10,
      "long_factor": [1.0] * 10}, "odd rotary width"),
    ({"rope_type": "default", "partial_rotary_factor": 0.001}, "rotates no feature"),
    ({"rope_type": "default", "rope_theta": 1.0}, "rope_theta must be a finite number > 1"),
])
def test_values_transformers_cannot_use_are_one_line_naming_the_field(rope, match):
    config = {**BASE, "rope_parameters": {"rope_theta": 10000.0, **rope}}
    with pytest.raises(ValueError, match=match) as info:
        rope_from_hf_config(config)
    message = str(info.value)
    assert "\n" not in message and f"rope_type {rope['rope_type']!r}" in message


def test_every_type_of_the_table_has_a_case_and_the_fields_are_read_once():
    covered = {c[2].get("rope_parameters", {}).get("rope_type", "default") for c in CASES}
    assert set(HF_ROPE_TYPES) - covered == {"su", "mrope"}  # mrope: Qwen2-VL's, tests/test_hf_layers.py
    fields = hf_rope_fields(CASES[10][2])
    assert (fields.rope_type, fields.head_dim, fields.nested) == ("yarn", 64, False)


def config_table() -> str:
    """The issue's table: each case in both schemas, posenc against transformers' ROPE_INIT_FUNCTIONS
    (the largest relative difference of the inverse frequencies, float32 on their side, and the two
    attention factors; a length-dependent type at each of its lengths, the worst shown)."""
    rows = ["| case | schema | rope type | inv_freq rel. diff | attention factor posenc | transformers |",
            "|---|---|---|---|---|---|"]
    for case, config_class, config, lengths in CASES:
        for schema in ("v5", "v4"):
            given = config if schema == "v5" else _v4(config)
            enc = rope_from_hf_config(copy.deepcopy(given))
            kind = hf_rope_fields(given).rope_type
            worst, ours, theirs = 0.0, None, None
            for length in (lengths if enc.scaling is not None and enc.scaling.dynamic else (None,)):
                inv, factor = enc.frequencies(length) if length else enc.frequencies()
                hf_inv, hf_factor = _hf(config_class, given, length)
                worst = max(worst, float(((inv.float() - hf_inv).abs() / hf_inv.abs()).max()))
                ours, theirs = factor, hf_factor
            rows.append(f"| {case} | {schema} | {kind} | {worst:.1e} | {ours:.6f} | {float(theirs):.6f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(config_table())
