"""Hostile input, round three (issue 51): the functional helpers follow the modules' rules.

Non-finite positions (NaN, inf) are refused with one line naming the argument, as the modules
refuse them, instead of turning into NaN rows without a word; degenerate sizes are refused; the
score scale of attention is checked once, on every path; and the helpers still give the right
answer (known values, float64 references) and still trace whole under ``torch.compile``."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
import posenc.functional as PF
from posenc.seq.spline import SplineTransformer

Q = torch.randn(1, 2, 4, 8)
POS = torch.arange(4)
NAN_POS = torch.tensor([0.0, float("nan"), 2.0, 3.0])
INF_POS = torch.tensor([0.0, 1.0, float("inf"), 3.0])


# ---- non-finite positions: refused, naming the argument ------------------------------------------

NON_FINITE = [
    (lambda p: PF.apply_rope(Q, Q, p), "positions must be finite"),
    (lambda p: PF.apply_rope(Q, Q, POS.float(), k_positions=p), "k_positions must be finite"),
    (lambda p: PF.rope_cos_sin(p, 8), "positions must be finite"),
    (lambda p: PF.alibi_penalty(p, PF.alibi_slopes(2)[:, None], symmetric=True), "distance must be finite"),
    (lambda p: PF.relative_positions(p, POS.float()), "q_pos must be finite"),
    (lambda p: PF.relative_positions(POS.float(), p), "kv_pos must be finite"),
    (lambda p: PF.sinusoid_table(p, 8), "positions must be finite"),
    (lambda p: PF.sincos2d_table(torch.stack((p, p), dim=-1), 8), "coords must be finite"),
]


@pytest.mark.parametrize("bad", [NAN_POS, INF_POS], ids=["nan", "inf"])
@pytest.mark.parametrize("call, fragment", NON_FINITE)
def test_non_finite_positions_are_refused_naming_the_argument(call, fragment, bad):
    with pytest.raises(ValueError, match=fragment) as info:
        call(bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("slopes", [torch.tensor([0.5, float("nan")]), torch.tensor([float("inf"), 0.25])])
def test_alibi_refuses_non_finite_slopes(slopes):
    with pytest.raises(ValueError, match="slopes must be finite"):
        PF.alibi_bias(4, 4, slopes, causal=True)
    with pytest.raises(ValueError, match="slopes must be finite"):
        PF.alibi_penalty(torch.ones(3), slopes[:, None], symmetric=True)


# ---- degenerate sizes ----------------------------------------------------------------------------

DEGENERATE = [
    (lambda: PF.clipped_relative_index(torch.tensor([-2, 0, 3]), 0), ValueError, "max_distance must be a positive int; got 0"),
    (lambda: PF.clipped_relative_index(torch.tensor([-2, 0, 3]), True), TypeError, "max_distance must be an int"),
    (lambda: PF.clipped_relative_index(torch.tensor([True, False]), 2), TypeError, "relative must hold integer"),
    (lambda: PF.alibi_bias(4, 4, torch.zeros(0), causal=True), ValueError, "slopes must hold one slope a head"),
    (lambda: PF.alibi_penalty(torch.ones(3), torch.ones(3), symmetric=1), TypeError, "symmetric must be True or False"),
    (lambda: PF.sinusoid_frequencies(8, float("nan")), ValueError, "base must be a finite number"),
    (lambda: PF.sinusoid_frequencies(8, 1.0), ValueError, "base must be a number > 1.0"),
    (lambda: PF.sinusoid_frequencies(7), ValueError, "dim must be a positive even number"),
    (lambda: PF.sinusoid_table(POS, 8, scale=float("inf")), ValueError, "scale must be a finite number"),
    (lambda: PF.sincos2d_table(torch.zeros(3, 2), 8, base=float("nan")), ValueError, "base must be a finite number"),
    (lambda: SplineTransformer(2, 16, 1, 2, decoder_depth=True), TypeError, "decoder_depth must be an int; got True"),
    (lambda: SplineTransformer(2, 16, 1, 2, decoder_depth=0), ValueError, "decoder_depth must be a positive int"),
    (lambda: SplineTransformer(2, 16, 1, 2, decoder_window=True), TypeError, "decoder_window must be an int"),
]


@pytest.mark.parametrize("call, kind, fragment", DEGENERATE)
def test_degenerate_sizes_are_refused(call, kind, fragment):
    with pytest.raises(kind) as info:
        call()
    assert fragment in str(info.value), str(info.value)


# ---- the score scale: checked once, on every path ------------------------------------------------

BAD_SCALES = [0.0, -0.125, float("inf"), float("nan")]
PATHS = [
    dict(backend="sdpa"),
    dict(backend="dense", encoding="alibi"),
    dict(backend="math", encoding="alibi"),
    dict(backend="auto", encoding="alibi"),
    dict(feature_map="elu"),
]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize("scale", BAD_SCALES)
def test_a_bad_score_scale_is_refused_on_every_path(scale, path):
    q = torch.randn(1, 2, 5, 8)
    kwargs = dict(path)
    if kwargs.get("encoding") == "alibi":
        kwargs["encoding"] = posenc.build("alibi", num_heads=2)
    if kwargs.get("feature_map") == "elu":
        kwargs["feature_map"] = posenc.EluFeatureMap()
    mask, pos = posenc.AttentionMask(causal=True), torch.arange(5)
    with pytest.raises(ValueError, match="scale must be a") as info:
        posenc.attend(q, q, q, q_pos=pos, kv_pos=pos, mask=mask, scale=scale, **kwargs)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="scale must be a"):
        posenc.plan(q, q, q, q_pos=pos, kv_pos=pos, mask=mask, scale=scale, **kwargs)


def test_a_bool_scale_is_refused_and_a_given_scale_is_used():
    q, k, v = torch.randn(3, 1, 2, 5, 8, dtype=torch.float64)
    pos = torch.arange(5)
    with pytest.raises(TypeError, match="scale must be a number"):
        posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, scale=True)
    out = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, scale=0.3)
    reference = torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1) @ v
    torch.testing.assert_close(out, reference)


def test_torch_drop_in_refuses_a_zero_kdim():
    from posenc.torch_attention import TorchMultiheadAttention

    with pytest.raises(ValueError, match="kdim must be a positive int, got 0"):
        TorchMultiheadAttention(16, 2, kdim=0)
    with pytest.raises(ValueError, match="vdim must be a positive int, got True"):
        TorchMultiheadAttention(16, 2, vdim=True)
    layer = TorchMultiheadAttention(16, 2, kdim=3, vdim=5)  # other widths still build
    assert layer.k_proj_weight.shape == (16, 3) and layer.v_proj_weight.shape == (16, 5)


# ---- the right answers: finite positions give what they gave -------------------------------------


def test_finite_float_positions_give_the_float64_formula():
    pos = torch.tensor([0.0, 1.5, 7.25])
    table = PF.sinusoid_table(pos, 4, dtype=torch.float64)
    omega = torch.tensor([1.0, 10000.0 ** -0.5], dtype=torch.float64)
    angles = pos.double()[:, None] * omega
    expected = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    torch.testing.assert_close(table, expected)
    cos, sin = PF.rope_cos_sin(pos, 4, dtype=None)
    torch.testing.assert_close(cos, angles.cos())
    torch.testing.assert_close(sin, angles.sin())
    torch.testing.assert_close(PF.relative_positions(pos, pos), pos[None, :] - pos[:, None])
    bias = PF.alibi_penalty(pos - 1.0, torch.tensor([0.5]), symmetric=True)
    torch.testing.assert_close(bias, -0.5 * (pos - 1.0).abs())


def test_integer_positions_are_never_read_and_the_helpers_still_compile_whole():
    pos = torch.arange(4)
    compiled = torch.compile(lambda q, p: PF.apply_rope(q, q, p)[0] + PF.sinusoid_table(p, 8).sum()
                             + PF.relative_positions(p, p).sum(), fullgraph=True, backend="eager")
    eager = PF.apply_rope(Q, Q, pos)[0] + PF.sinusoid_table(pos, 8).sum() + PF.relative_positions(pos, pos).sum()
    torch.testing.assert_close(compiled(Q, pos), eager)
    # float positions too: under tracing only the static rules run (a value read would break the graph)
    compiled_float = torch.compile(lambda q, p: PF.apply_rope(q, q, p)[0], fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled_float(Q, pos.float()), PF.apply_rope(Q, Q, pos.float())[0])


def test_clipped_relative_index_at_one_keeps_three_rows():
    rel = torch.tensor([-5, -1, 0, 1, 9])
    assert PF.clipped_relative_index(rel, 1).tolist() == [0, 0, 1, 2, 2]


def test_the_module_bias_equals_the_checked_function():
    alibi = posenc.build("alibi", num_heads=2)
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    pos = torch.arange(6)[None]
    dense = alibi.score_bias(q, q, pos, pos).dense(1, 2, torch.arange(6), torch.arange(6))
    reference = PF.alibi_bias(6, 6, PF.alibi_slopes(2).double(), causal=True)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(dense[0][:, allowed].double(), reference[:, allowed])
    assert math.isinf(reference[0, 0, 1])
