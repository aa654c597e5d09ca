"""The table of RoPE scalings (``ROPE_SCALING_ENTRIES``): each row's dataclass, function and
encoding agree with each other, the context-extension methods read the table, and configs
round-trip through plain values."""

from __future__ import annotations

import dataclasses
import inspect
from typing import ClassVar

import pytest
import torch

import posenc
from posenc.common import registry as encoding_registry
from posenc.common.registry import ModelDims
from posenc.seq import rope_scaling as rs
from posenc.seq.rope_scaled import SCALED_ROPE_CLASSES
from posenc.seq.context import extend_context, make_scaling, rotary_layers
from posenc.seq.models import CausalLM


def test_every_row_of_the_table_agrees_with_its_function_config_and_encoding():
    names = [e.name for e in rs.rope_scaling_entries()]
    assert names == ["linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "proportional"] \
        == list(rs.ROPE_SCALING_ENTRIES)
    for entry in rs.rope_scaling_entries():
        # the function takes the config, the width, the base and the length
        assert list(inspect.signature(entry.inv_freq).parameters)[1:] == ["rotary_dim", "base", "seq_len"]
        fields = dataclasses.fields(entry.config)
        assert [f.name for f in fields] == list(entry.parameter_names)
        assert entry.config.name == entry.name
        assert rs.ROPE_SCALINGS[entry.name] is entry.inv_freq
        # the registered encoding is the class, builds that config, and takes its options with their defaults
        enc = posenc.build(entry.encoding, dims=ModelDims(64, 4, 1024))
        assert type(enc) is SCALED_ROPE_CLASSES[entry.name] and type(enc).scaling_name == entry.name
        assert encoding_registry.get(entry.encoding).paper == entry.paper
        assert type(enc.scaling) is entry.config
        signature = inspect.signature(type(enc).__init__).parameters
        assert set(entry.options) <= set(signature)
        for f in fields:
            if f.name in entry.options and f.default is not dataclasses.MISSING:
                assert signature[f.name].default == f.default
        # and what it computes is the function's result
        freqs, factor = entry.inv_freq(enc.scaling, 16, 10000.0, None)
        got, got_factor = enc.frequencies(2048) if enc.scaling.dynamic else enc.frequencies()
        if not enc.scaling.dynamic:
            torch.testing.assert_close(got, freqs)
            assert got_factor == factor


def test_public_names_are_the_table_classes():
    assert rs.LinearScaling is rs.rope_scaling_entry("linear").config
    assert rs.YaRNScaling is rs.rope_scaling_entry("yarn").config
    assert posenc.seq.YaRNRoPE is SCALED_ROPE_CLASSES["yarn"]
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


@dataclasses.dataclass(frozen=True)
class HalvingScaling(rs.RopeScaling):
    """A scaling written by a test: theta / (2 * factor)."""

    name: ClassVar[str] = "halving"
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not self.factor >= 1:
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")


def halving_inv_freq(p: HalvingScaling, rotary_dim: int, base: float, seq_len=None) -> rs.Frequencies:
    return rs.default_inv_freq(rotary_dim, base) / (2 * p.factor), 1.0


@pytest.fixture
def halving_entry(monkeypatch):
    """A row added to the table by a test (removed afterwards)."""
    entry = rs.RopeScalingEntry(HalvingScaling, halving_inv_freq, encoding="rope_halving",
                                summary="theta / (2 factor)", paper="a test", aliases=("half",))
    monkeypatch.setitem(rs.ROPE_SCALING_ENTRIES, "halving", entry)
    return entry


def test_a_row_added_to_the_table_is_a_method_of_extend_context_and_of_the_configs(halving_entry):
    # replaces the test of the removed decorator (register_rope_scaling): a scaling is written, then listed;
    # the dataclass's inherited compute calls the row's function
    config = HalvingScaling(3.0)
    assert config.factor == 3.0 and config.name == "halving" and not config.dynamic
    assert config.entry is halving_entry and rs.ROPE_SCALINGS["halving"] is halving_inv_freq
    with pytest.raises(ValueError, match="factor must be >= 1, got 0.5"):
        HalvingScaling(0.5)
    assert rs.rope_scaling_config("half", factor=4.0) == HalvingScaling(4.0)
    assert rs.rope_scaling_from_dict(HalvingScaling(4.0).to_dict()) == HalvingScaling(4.0)
    model = CausalLM(32, dim=32, depth=1, num_heads=2, encoding="rope", max_len=64)
    extend_context(model, "half", factor=2.0)  # by its alias
    layer = rotary_layers(model)[0]
    assert layer.scaling == HalvingScaling(2.0)
    torch.testing.assert_close(layer.frequencies()[0], rs.default_inv_freq(16) / 4)
    assert make_scaling("halving", rotary_dim=8, factor=5.0) == HalvingScaling(5.0)


def test_rope_does_not_import_the_scaled_classes():
    # the scaled classes import rope; rope's old aliases of them (which closed the circle) are gone, as are
    # the inert scaling decorator and listener (CHANGELOG.md)
    from posenc.seq import rope as rope_module

    assert not hasattr(rope_module, "YaRNRoPE") and not hasattr(rope_module, "scaled_rope_class")
    assert not hasattr(rs, "register_rope_scaling") and not hasattr(rs, "on_rope_scaling_registered")
    assert posenc.seq.YaRNRoPE is SCALED_ROPE_CLASSES["yarn"]
