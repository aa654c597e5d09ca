"""One registry entry per RoPE scaling: the config class, the registered encoding and the
context-extension method are all made from the entry (its function and its checks)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import posenc
from posenc.common import registry as encoding_registry
from posenc.common.registry import ModelDims
from posenc.seq import rope as rope_module
from posenc.seq import rope_scaling as rs
from posenc.seq.context import extend_context, make_scaling, rotary_layers
from posenc.seq.models import CausalLM


def test_every_scaling_makes_its_config_and_encoding_from_one_entry():
    names = [e.name for e in rs.rope_scaling_entries()]
    assert names == ["linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope"]
    for entry in rs.rope_scaling_entries():
        # the config's fields are the function's keyword parameters, in order, with its defaults
        fields = dataclasses.fields(entry.config)
        assert [f.name for f in fields] == [p.name for p in entry.parameters]
        assert [f.default for f in fields] == [
            dataclasses.MISSING if p.default is inspect.Parameter.empty else p.default for p in entry.parameters]
        assert "seq_len" not in {f.name for f in fields}
        assert rs.ROPE_SCALINGS[entry.name] is entry.compute
        # the registered encoding builds that config, and its options are the entry's
        enc = posenc.build(entry.encoding_name, dims=ModelDims(64, 4, 1024))
        assert type(enc) is rope_module.SCALED_ROPE_CLASSES[entry.name]
        assert type(enc.scaling) is entry.config
        signature = inspect.signature(type(enc).__init__).parameters
        assert set(entry.options) <= set(signature)
        # and what it computes is the function's result
        freqs, factor = entry.compute(16, 10000.0, **enc.scaling.params())
        got, got_factor = enc.frequencies(2048) if enc.scaling.dynamic else enc.frequencies()
        if not enc.scaling.dynamic:
            torch.testing.assert_close(got, freqs)
            assert got_factor == factor


def test_public_names_are_the_registry_classes():
    assert rs.LinearScaling is rs.rope_scaling_entry("linear").config
    assert rs.YaRNScaling is rs.rope_scaling_entry("yarn").config
    assert posenc.seq.YaRNRoPE is rope_module.SCALED_ROPE_CLASSES["yarn"]
    assert posenc.seq.LongRoPE.scaling_name == "longrope"
    # positional construction follows the function's parameter order (required ones first)
    assert rs.DynamicNTKScaling(64, 2.0).original_max_len == 64
    assert rs.LongRoPEScaling([1, 1], [2, 3], 64).long_factor == (2.0, 3.0)  # lists become float tuples


@pytest.mark.parametrize("method,params", [
    ("linear", {"factor": 2.0}),
    ("yarn", {"original_max_len": 64, "factor": 4.0, "beta_fast": 16.0}),
    ("longrope", {"short_factor": [1.0, 1.0], "long_factor": [1.5, 2.0], "original_max_len": 32, "select": "long"}),
])
def test_a_scaling_round_trips_through_plain_values(method, params):
    scaling = rs.rope_scaling_config(method, **params)
    plain = scaling.to_dict()
    assert plain["method"] == method
    import json

    assert rs.rope_scaling_from_dict(json.loads(json.dumps(plain))) == scaling


@pytest.mark.parametrize("call,match", [
    (lambda: rs.rope_scaling_config("spin", factor=2.0), "unknown RoPE scaling 'spin'; registered: linear, ntk"),
    (lambda: rs.rope_scaling_config("linear", factor=2.0, beta=1.0), "linear: unknown parameter.s. beta; it takes factor"),
    (lambda: rs.rope_scaling_config("yarn", factor=2.0), "yarn: missing parameter.s. original_max_len"),
    (lambda: rs.rope_scaling_from_dict({"factor": 2.0}), "needs a 'method' key"),
    (lambda: rs.rope_scaling_config("pi", factor=0.5), "factor must be a number >= 1; got 0.5"),  # an alias, checked
])
def test_bad_scalings_are_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.fixture
def halving_scaling():
    """A scaling registered by a test (theta / (2 * factor)), removed afterwards."""

    def _validate(*, factor: float) -> None:
        if not factor >= 1:
            raise ValueError(f"factor must be >= 1, got {factor!r}")

    def halving_scaling(rotary_dim: int, base: float, *, factor: float = 2.0) -> rs.Frequencies:
        _validate(factor=factor)
        return rs.default_inv_freq(rotary_dim, base) / (2 * factor), 1.0

    rs.register_rope_scaling(
        "halving", validate=_validate, config_name="HalvingScaling", encoding_name="rope_halving",
        encoding_class_name="HalvingRoPE", aliases=("half",), paper="a test", summary="theta / (2 factor)",
    )(halving_scaling)
    yield rs.rope_scaling_entry("halving")
    rs._ENTRIES.pop("halving")
    rope_module.SCALED_ROPE_CLASSES.pop("halving")
    encoding_registry._REGISTRY.pop("rope_halving")


def test_registering_one_function_adds_config_encoding_and_extension_method(halving_scaling):
    config = halving_scaling.config(3.0)
    assert config.factor == 3.0 and config.name == "halving" and not config.dynamic
    with pytest.raises(ValueError, match="factor must be >= 1, got 0.5"):
        halving_scaling.config(0.5)
    enc = posenc.build("rope_halving", dims=ModelDims(32, 2, 64), factor=4.0)
    torch.testing.assert_close(enc.frequencies()[0], rs.default_inv_freq(16) / 8)
    model = CausalLM(32, dim=32, depth=1, num_heads=2, encoding="rope", max_len=64)
    extend_context(model, "half", factor=2.0)  # by its alias
    assert rotary_layers(model)[0].scaling == halving_scaling.config(2.0)
    assert make_scaling("halving", rotary_dim=8, factor=5.0) == halving_scaling.config(5.0)
