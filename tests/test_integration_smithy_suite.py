"""AttentionSmithy's own tests, run against posenc's bridge (issue 22).

The attention, component and numeric-embedding test modules that ship inside the installed
``attention_smithy`` wheel are imported (no copy of them lives here) and each of their test
functions is run with posenc's pieces substituted for AttentionSmithy's:

* attention and component tests: the name ``StandardAttentionMethod`` in the test module becomes
  :class:`~posenc.integrations.attention_smithy.PosencAttentionMethod`, in two modes:
  ``probabilities`` (``return_probabilities=True``, the explicit path, as the tests read the
  probabilities) and ``fast`` (the default, fused kernels, returning ``(outputs, None)``) for
  the tests that do not read the probabilities;
* numeric-embedding tests: AttentionSmithy's ALiBi, sinusoidal and rotary strategy classes become
  posenc's strategies built by :func:`~posenc.integrations.attention_smithy.strategies` with
  ``convention="attention_smithy"`` (through the small constructor shims below).

Their fixtures are resolved here from the test module's own fixture functions. Tests that cannot
apply are skipped with the reason (``SKIPPED``). Result at the time of writing: every test that
applies passes (pytest -rs lists the skips and why).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable

import pytest
import torch

pytest.importorskip("attention_smithy")

from posenc.integrations.attention_smithy import PosencAttentionMethod, strategies  # noqa: E402

# --- what is substituted ---------------------------------------------------------------------


def _smithy_alibi_position(number_of_heads: int, slope_degree: int = 2, allow_cross_attention: bool = False):
    """``ALiBiPositionEmbedding``'s constructor -> posenc's ALiBi strategy in AttentionSmithy's convention."""
    (strategy,) = strategies("alibi", num_heads=number_of_heads, convention="attention_smithy",
                             slope_degree=float(slope_degree), allow_cross_attention=allow_cross_attention)
    return strategy


def _smithy_sinusoidal(custom: bool):
    def make(embedding_dimension: int):
        (strategy,) = strategies("sinusoidal", dim=embedding_dimension, convention="attention_smithy",
                                 positions="custom" if custom else "index")
        return strategy

    return make


def _smithy_rotary_custom(head_dimension: int):
    """``RotaryCustomEmbedding``'s constructor -> posenc's rope strategy reading ``rotary_custom_values``."""
    (strategy,) = strategies("rope", options={"head_dim": head_dimension}, convention="attention_smithy",
                             positions="custom")
    return strategy


METHOD = "StandardAttentionMethod"
# test module (under attention_smithy) -> {name in that module: what replaces it}
SUBSTITUTED: dict[str, dict[str, Callable[..., Any]]] = {
    "attention.tests.test_StandardAttentionMethod": {METHOD: PosencAttentionMethod},
    "components.tests.test_MultiheadAttention": {METHOD: PosencAttentionMethod},
    "components.tests.test_Encoder": {METHOD: PosencAttentionMethod},
    "components.tests.test_EncoderLayer": {METHOD: PosencAttentionMethod},
    "components.tests.test_Decoder": {METHOD: PosencAttentionMethod},
    "components.tests.test_DecoderLayer": {METHOD: PosencAttentionMethod},
    "numeric_embeddings.tests.test_ALiBiPositionEmbedding": {"ALiBiPositionEmbedding": _smithy_alibi_position},
    "numeric_embeddings.tests.test_SinusoidalPositionEmbedding": {"SinusoidalPositionEmbedding": _smithy_sinusoidal(False)},
    "numeric_embeddings.specialized.tests.test_SinusoidalCustomEmbedding": {
        "SinusoidalCustomEmbedding": _smithy_sinusoidal(True)},
    "numeric_embeddings.specialized.tests.test_RotaryCustomEmbedding": {"RotaryCustomEmbedding": _smithy_rotary_custom},
}

# Whole modules that cannot apply, and why.
MODULE_SKIPS = {
    "attention.tests.test_LongformerAttentionMethod": "tests AttentionSmithy's Longformer method (another method; "
                                                      "its baseline subclasses StandardAttentionMethod)",
    "attention.tests.test_LinformerAttentionMethod": "tests AttentionSmithy's Linformer method (another method)",
    "components.tests.test_SublayerUnit": "no attention method in it (a dummy sublayer)",
    "components.tests.test_FeedForwardNetwork": "no attention method in it",
    "components.specialized.tests.test_Perceiver": "dummy attention modules, no attention method",
    "numeric_embeddings.specialized.tests.test_ALiBiCustomEmbedding": (
        "calls forward(values, values, value_to_not_apply_linear_bias_toward), a masking option posenc's ALiBi "
        "strategy does not have (its custom positions, alibi_query_values/alibi_key_values, are tested in "
        "tests/test_integration_smithy.py)"),
    "numeric_embeddings.specialized.tests.test_ContinuousValueEmbedding": "an MLP value embedding; posenc has no "
                                                                          "counterpart",
}

# Single tests that cannot apply, and why.
TEST_SKIPS = {
    ("numeric_embeddings.tests.test_ALiBiPositionEmbedding",
     "test__ALiBiPositionEmbedding__query_and_kv_lengths_differ__no_cross_attention_allowed_throws_warning"):
        "asserts the exact text of AttentionSmithy's own warning; posenc's strategy adds nothing in cross attention "
        "as AttentionSmithy's does, without that warning",
    ("numeric_embeddings.specialized.tests.test_RotaryCustomEmbedding",
     "test__RotaryCustomEmbedding__fails_on_mismatched_positions"):
        "matches AttentionSmithy's exact error text; posenc raises a ValueError naming rotary_custom_values and the "
        "shapes in posenc's wording",
}

# Tests that read the attention probabilities: run in "probabilities" mode only (the fast path
# returns None for them, as documented).
READS_PROBABILITIES = {
    "attention.tests.test_StandardAttentionMethod": "*",
    "components.tests.test_MultiheadAttention": {
        "test__MultiheadAttention__forward_pass_output_has_correct_shape_and_back_propogates",
        "test__MultiheadAttention__multihead_attention_still_works_when_query_and_key_value_sequence_lengths_are_different",
        "test__MultiheadAttention__forward_pass_output_has_correct_shape__with_rotary_embedding",
    },
}

ALL_MODULES = sorted(set(SUBSTITUTED) | set(MODULE_SKIPS))


# --- collection ------------------------------------------------------------------------------


def _module(name: str):
    return importlib.import_module(f"attention_smithy.{name}")


def _fixtures(module) -> dict[str, Callable[..., Any]]:
    """name -> the undecorated fixture function, for the fixtures defined in ``module``."""
    out = {}
    for value in vars(module).values():
        if type(value).__name__ == "FixtureFunctionDefinition":
            out[value.name] = inspect.unwrap(value)
    return out


def _tests(module) -> list[str]:
    return sorted(n for n, f in vars(module).items() if n.startswith("test") and inspect.isfunction(f)
                  and f.__module__ == module.__name__)


def _cases() -> list:
    cases = []
    for name in ALL_MODULES:
        if name in MODULE_SKIPS:
            cases.append(pytest.param(name, None, "-", id=f"{name}::*",
                                      marks=pytest.mark.skip(reason=MODULE_SKIPS[name])))
            continue
        module = _module(name)
        substitutes_method = METHOD in SUBSTITUTED[name]
        for test in _tests(module):
            modes = ["probabilities", "fast"] if substitutes_method else ["-"]
            reads = READS_PROBABILITIES.get(name, ())
            for mode in modes:
                marks = []
                if (name, test) in TEST_SKIPS:
                    marks.append(pytest.mark.skip(reason=TEST_SKIPS[(name, test)]))
                elif mode == "fast" and (reads == "*" or test in reads):
                    marks.append(pytest.mark.skip(reason="reads the attention probabilities, which "
                                                         "PosencAttentionMethod returns only when asked "
                                                         "(return_probabilities=True: the 'probabilities' run)"))
                cases.append(pytest.param(name, test, mode, id=f"{name}::{test}[{mode}]", marks=marks))
    return cases


def _resolve(fixtures: dict[str, Callable[..., Any]], fn: Callable[..., Any], cache: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``fn``, each built from the module's fixture of that name (once per test)."""
    args = {}
    for param in inspect.signature(fn).parameters:
        if param not in cache:
            if param not in fixtures:
                raise LookupError(f"{fn.__name__} asks for {param!r}, which its module defines no fixture for")
            cache[param] = fixtures[param](**_resolve(fixtures, fixtures[param], cache))
        args[param] = cache[param]
    return args


@pytest.mark.parametrize("module_name, test_name, mode", _cases())
def test_attention_smithy_suite_with_posenc(module_name, test_name, mode, monkeypatch):
    module = _module(module_name)
    for attr, replacement in SUBSTITUTED[module_name].items():
        assert hasattr(module, attr), f"{module_name} no longer imports {attr}: the substitution would not apply"
        if attr == METHOD:
            replacement = functools.partial(replacement, return_probabilities=mode == "probabilities")
        monkeypatch.setattr(module, attr, replacement)
    torch.manual_seed(0)
    fn = getattr(module, test_name)
    fn(**_resolve(_fixtures(module), fn, {}))


def test_the_substitution_reaches_the_modules_it_patches(monkeypatch):
    """Guard against a harness that passes because nothing was substituted: a method that
    refuses every call makes a substituted attention test fail."""

    class Refusing(PosencAttentionMethod):
        def forward(self, *args, **kwargs):
            raise RuntimeError("substituted")

    name = "attention.tests.test_StandardAttentionMethod"
    module = _module(name)
    monkeypatch.setattr(module, METHOD, Refusing)
    fn = getattr(module, _tests(module)[0])
    with pytest.raises(RuntimeError, match="substituted"):
        fn(**_resolve(_fixtures(module), fn, {}))
