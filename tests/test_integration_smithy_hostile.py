"""posenc inside AttentionSmithy: hostile input (issue 51's surface). Each bad constructor argument
or call is one ValueError or TypeError naming the argument; a missing extra is one line naming it."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("attention_smithy")

from attention_smithy.numeric_embeddings import ALiBiPositionEmbedding  # noqa: E402

import posenc  # noqa: E402
from posenc.integrations.attention_smithy import (  # noqa: E402
    PosencAttentionMethod,
    PosencBiasStrategy,
    PosencInputStrategy,
    PosencRotaryStrategy,
    strategies,
)
from posenc.training.report import MissingExtra  # noqa: E402

from .test_integration_smithy import B, C, D, H, ROOT, _build  # noqa: E402  (one tiny model's sizes)


@pytest.mark.parametrize("call, error, match", [
    (lambda: strategies(3), TypeError, "name_or_encoding"),
    (lambda: strategies("no_such_encoding"), KeyError, "no_such_encoding"),
    (lambda: strategies("t5", num_heads=H, convention="smithy"), ValueError, "convention"),
    (lambda: strategies("t5", num_heads=H, positions="absolute"), ValueError, "positions"),
    (lambda: strategies("t5", num_heads=H, allow_cross_attention=1), TypeError, "allow_cross_attention"),
    (lambda: strategies("alibi", num_heads=H, slope_degree=0.5), ValueError, "slope_degree"),
    (lambda: strategies("alibi", num_heads=H, slope_degree=float("nan")), ValueError, "slope_degree"),
    (lambda: strategies("t5", num_heads=0), ValueError, "num_heads"),
    (lambda: strategies("t5", num_heads=True), TypeError, "num_heads"),
    (lambda: strategies("t5", dim=10, num_heads=3), ValueError, "divisible"),
    (lambda: strategies("t5", num_heads=H, options=[("num_buckets", 8)]), TypeError, "options"),
    (lambda: strategies("t5", num_heads=H, options={"buckets": 8}), TypeError, "buckets"),
    (lambda: strategies(_build("t5"), num_heads=H), ValueError, "built already"),
    (lambda: strategies("rope2d_axial", options={"head_dim": 16}), ValueError, "vision"),
    (lambda: strategies("spd", num_heads=H), ValueError, "graph"),
    (lambda: strategies("erpe", num_heads=H, max_len=8), ValueError, "PosencAttentionMethod"),
    (lambda: strategies("shaw", options={"head_dim": D}), ValueError, "PosencAttentionMethod"),
    (lambda: strategies("cope", options={"head_dim": D}, max_len=8), ValueError, "PosencAttentionMethod"),
    (lambda: strategies("sine_spe", num_heads=H, options={"head_dim": D}), ValueError, "linear attention"),
    (lambda: strategies("peg1d", dim=C), ValueError, "between"),
    (lambda: PosencAttentionMethod("rope"), TypeError, "encoding"),
    (lambda: PosencAttentionMethod(_build("sinusoidal")), ValueError, "input only"),
    (lambda: PosencAttentionMethod(is_causal_masking=1), TypeError, "is_causal_masking"),
    (lambda: PosencAttentionMethod(dropout=1.0), ValueError, "dropout"),
    (lambda: PosencAttentionMethod(dropout=-0.1), ValueError, "dropout"),
    (lambda: PosencAttentionMethod(dropout=float("nan")), ValueError, "dropout"),
    (lambda: PosencAttentionMethod(return_probabilities="yes"), TypeError, "return_probabilities"),
    (lambda: PosencAttentionMethod(backend="cuda"), ValueError, "backend"),
    (lambda: PosencInputStrategy(_build("t5")), TypeError, "input encoding"),
    (lambda: PosencRotaryStrategy(_build("xpos")), TypeError, "rotary"),
    (lambda: PosencBiasStrategy(_build("rope")), ValueError, "no score bias"),
    (lambda: PosencBiasStrategy(_build("t5"), smithy_alibi_slope_degree=2.0), ValueError, "ALiBi"),
])
def test_constructors_refuse_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_calls_refuse_bad_arguments():
    q = torch.randn(B, H, 4, D)
    method = PosencAttentionMethod()
    with pytest.raises(ValueError, match="q must be"):
        method(q[0], q, q, None)
    with pytest.raises(ValueError, match="padding_and_loss_attention_mask"):
        method(q, q, q, None, torch.ones(B, 5))
    with pytest.raises(TypeError, match="numeric_embedding_manager"):
        method(q, q, q, [ALiBiPositionEmbedding(H)])
    with pytest.raises(ValueError, match="causal"):
        PosencAttentionMethod(_build("fire"))(q, q, q, None)
    (bias,) = strategies("t5", num_heads=H, positions="custom")
    with pytest.raises(ValueError, match="alibi_key_values"):
        bias.create_bias_tensor(query=q, key=q, alibi_query_values=torch.arange(4), alibi_key_values=torch.arange(3))
    with pytest.raises(TypeError, match="alibi_query_values"):
        bias.create_bias_tensor(query=q, key=q, alibi_query_values=torch.ones(4, dtype=torch.bool),
                                alibi_key_values=torch.arange(4))
    with pytest.raises(TypeError, match="query="):
        bias.create_bias_tensor(key=q)
    with pytest.raises(ValueError, match="num_heads=2"):
        strategies("t5", num_heads=H)[0](torch.randn(1, 3, 4, D), torch.randn(1, 3, 4, D))
    with pytest.raises(ValueError, match="query must be"):
        strategies("t5", num_heads=H)[0](q[0], q)
    (rope,) = strategies("rope", options={"head_dim": D}, positions="custom")
    with pytest.raises(ValueError, match="rotary_custom_values"):
        rope.modify_matrix(q)
    with pytest.raises(ValueError, match="target_matrix"):
        rope.modify_matrix(q[0], rotary_custom_values=torch.arange(4))
    (sin,) = strategies("sinusoidal", dim=C)
    with pytest.raises(TypeError, match="token_embedding"):
        sin.create_positional_or_custom_embedding(x=q)
    with pytest.raises(ValueError, match="token_embedding"):
        sin(q)


def test_missing_attention_smithy_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "attention_smithy", None)  # import attention_smithy -> ImportError
    monkeypatch.delitem(sys.modules, "posenc.integrations.attention_smithy")
    with pytest.raises(MissingExtra, match=re.escape("pip install 'posenc[smithy]'")) as info:
        importlib.import_module("posenc.integrations.attention_smithy")
    assert "\n" not in str(info.value)


def test_import_posenc_does_not_import_the_bridge():
    code = "import sys, posenc; posenc.available(); print('attention_smithy' in sys.modules, " \
           "'posenc.integrations.attention_smithy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_non_finite_positions_are_refused_naming_the_kwarg():
    """Positions a caller passes as AttentionSmithy kwargs are checked as posenc's own are: NaN or
    infinite values would otherwise turn into NaN outputs with no word."""
    q = torch.randn(B, H, 4, D)
    nan4 = torch.tensor([0.0, 1.0, float("nan"), 3.0])
    (rope,) = strategies("rope", options={"head_dim": D}, positions="custom")
    with pytest.raises(ValueError, match="rotary_custom_values must be finite; got nan"):
        rope.modify_matrix(q, rotary_custom_values=nan4)
    (bias,) = strategies("t5", num_heads=H, positions="custom")
    with pytest.raises(ValueError, match="alibi_query_values must be finite; got inf"):
        bias.create_bias_tensor(query=q, key=q, alibi_query_values=torch.tensor([0.0, 1, float("inf"), 3]),
                                alibi_key_values=torch.arange(4.0))
    method = PosencAttentionMethod(posenc.build("alibi", num_heads=H), is_causal_masking=True)
    with pytest.raises(ValueError, match="q_pos must be finite; got nan"):
        method(q, q, q, None, q_pos=nan4[None], kv_pos=nan4[None])
