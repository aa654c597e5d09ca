"""Known values and invariances of the four proving encodings, and the registry."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.primitives.rotary import apply_rotary, rotary_angles
from posenc.seq.alibi import ALiBi, alibi_slopes
from posenc.seq.rope import RotaryEncoding, rope_inv_freq
from posenc.seq.sinusoidal import SinusoidalEncoding
from posenc.timeseries.erpe import ERPE

from . import reference as ref

# ---- RoPE -----------------------------------------------------------------------------------

@pytest.mark.parametrize("pairing", ["half_split", "interleaved"])
def test_rope_matches_complex_rotation(pairing):
    torch.manual_seed(0)
    enc = RotaryEncoding(16, pairing=pairing, rotary_dim=12)
    q, k = torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 16)
    pos = torch.tensor([[0, 1, 2, 5, 9, 100, 4097]])
    rq, rk = enc.transform_qk(q, k, pos, pos)
    inter = pairing == "interleaved"
    torch.testing.assert_close(rq.double(), ref.rope_rotate(q, pos, interleaved=inter, rotary_dim=12), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rk.double(), ref.rope_rotate(k, pos, interleaved=inter, rotary_dim=12), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rq[..., 12:], q[..., 12:])  # partial rotary passes the rest through


def test_rope_scores_depend_only_on_offset_and_preserve_norm():
    torch.manual_seed(0)
    enc = RotaryEncoding(32).double()
    q, k = torch.randn(1, 2, 1, 32, dtype=torch.float64), torch.randn(1, 2, 1, 32, dtype=torch.float64)
    scores = []
    for shift in [0, 3, 1000, 12345.5]:
        rq, rk = enc.transform_qk(q, k, torch.tensor([[shift + 7.0]]), torch.tensor([[shift + 2.0]]))
        scores.append((rq * rk).sum(-1))
        torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    for s in scores[1:]:
        torch.testing.assert_close(s, scores[0], rtol=1e-9, atol=1e-9)
    rq, rk = enc.transform_qk(q, k, torch.tensor([[8.0]]), torch.tensor([[2.0]]))
    assert not torch.allclose((rq * rk).sum(-1), scores[0])  # a different offset changes the score


def test_rope_pairings_differ_by_a_feature_permutation():
    torch.manual_seed(0)
    d = 8
    x = torch.randn(1, 1, 5, d)
    pos = torch.arange(5)[None]
    half, inter = RotaryEncoding(d), RotaryEncoding(d, pairing="interleaved")
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # half-split pair (k, k+d/2) -> interleaved (2k, 2k+1)
    a, _ = half.transform_qk(x, x, pos, pos)
    b, _ = inter.transform_qk(x[..., perm], x[..., perm], pos, pos)
    torch.testing.assert_close(a[..., perm], b)


def test_rope_inverse_frequencies_and_gradients():
    torch.testing.assert_close(rope_inv_freq(8), torch.tensor([1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75], dtype=torch.float64))
    # the custom backward is the rotation by the opposite angle
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    ang = rotary_angles(torch.arange(5)[None], rope_inv_freq(8)).unsqueeze(1)
    for inter in (False, True):
        assert torch.autograd.gradcheck(lambda t: apply_rotary(t, ang.cos(), ang.sin(), interleaved=inter), (x,))
    with pytest.raises(ValueError, match="rotary_dim must be a positive even number, got 7"):
        RotaryEncoding(8, rotary_dim=7)
    with pytest.raises(ValueError, match=r"rotary_dim \(16\) must not exceed head_dim \(8\)"):
        RotaryEncoding(8, rotary_dim=16)
    with pytest.raises(ValueError, match="pairing must be one of"):
        RotaryEncoding(8, pairing="gptj")


def test_rope_survives_half_precision_cast():
    enc = RotaryEncoding(8).half()
    q = torch.randn(1, 1, 3, 8)
    pos = torch.tensor([[0, 1, 60000]])
    a, _ = enc.transform_qk(q, q, pos, pos)
    b, _ = RotaryEncoding(8).transform_qk(q, q, pos, pos)
    torch.testing.assert_close(a, b)


# ---- ALiBi ----------------------------------------------------------------------------------

def test_alibi_slopes_known_values():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -h for h in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2.0 ** (-h / 2) for h in range(1, 17)]))
    # 12 heads: the 8-head schedule, then every other slope of the 16-head schedule
    expected12 = [2.0 ** -h for h in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected12))
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([2.0 ** -8]))
    with pytest.raises(ValueError, match="num_heads must be a positive int.*0"):
        alibi_slopes(0)


def test_alibi_bias_values_and_shift_invariance():
    enc = ALiBi(8)
    q = torch.zeros(1, 8, 4, 2)
    for shift in (0, 50):
        pos = torch.arange(4)[None] + shift
        bias = enc.score_bias(q, q, pos, pos).dense(1, 8, torch.arange(4), torch.arange(4))
        expected = -alibi_slopes(8)[:, None, None] * (torch.arange(4)[:, None] - torch.arange(4)[None, :])
        torch.testing.assert_close(bias[0], expected)
    sym = ALiBi(8, symmetric=True).score_bias(q, q, pos, pos).dense(1, 8, torch.arange(4), torch.arange(4))
    torch.testing.assert_close(sym[0], -alibi_slopes(8)[:, None, None] * (torch.arange(4)[:, None] - torch.arange(4)[None, :]).abs())


# ---- sinusoidal ------------------------------------------------------------------------------

def test_sinusoidal_matches_formula():
    enc = SinusoidalEncoding(6)
    pos = torch.tensor([[0, 1, 7, 250]])
    x = torch.zeros(1, 4, 6)
    out = enc.encode_input(x, pos)
    torch.testing.assert_close(out.double(), ref.sinusoid(pos, 6), rtol=1e-6, atol=1e-6)
    assert out[0, 1, 0].item() == pytest.approx(math.sin(1.0))
    assert out[0, 1, 3].item() == pytest.approx(math.cos(1.0 / 10000 ** (2 / 6)))
    with pytest.raises(ValueError, match="dim must be a positive even number, got 5"):
        SinusoidalEncoding(5)


# ---- eRPE ------------------------------------------------------------------------------------

@pytest.mark.parametrize("heads", [1, 4, 8, 16])
@pytest.mark.parametrize("length", [5, 12])
def test_erpe_bias_lands_at_the_right_offsets(heads, length):
    max_len = 12
    enc = ERPE(heads, max_len)
    with torch.no_grad():
        enc.weight.copy_(torch.arange(heads * (2 * max_len - 1), dtype=torch.float32).view(heads, -1))
    pos = torch.arange(length)[None]
    dense = enc.prob_bias(pos, pos).dense(1, heads, torch.arange(length), torch.arange(length))
    for h in range(heads):
        for i in range(length):
            for j in range(length):
                assert dense[0, h, i, j].item() == enc.weight[h, i - j + max_len - 1].item()


# ---- registry -------------------------------------------------------------------------------

def test_registry_lists_and_builds():
    infos = {i.name: i for i in posenc.available()}
    assert {"sinusoidal", "rope", "alibi", "erpe"} <= set(infos)
    assert infos["alibi"].hooks == ("score_bias",) and infos["alibi"].modality == "seq"
    assert infos["erpe"].hooks == ("post_softmax",) and infos["erpe"].modality == "timeseries"
    assert "arxiv.org" in infos["rope"].paper
    assert [i.name for i in posenc.available("timeseries")] == ["erpe", "erpe_vector", "tape"]
    dims = posenc.ModelDims(dim=64, num_heads=8, max_len=128)
    assert posenc.build("rope", dims=dims).head_dim == 8
    assert posenc.build("rope", dims=dims, pairing="interleaved").pairing == "interleaved"
    assert posenc.build("erpe", dims=dims).weight.shape == (8, 255)
    assert posenc.build("alibi", num_heads=12).slopes.shape == (12,)


def test_registry_errors_name_the_valid_choices():
    with pytest.raises(KeyError, match=r"unknown encoding 'rotary'; posenc.available\(\) \(or `posenc list`\) names all \d+"):
        posenc.build("rotary", num_heads=4)
    with pytest.raises(KeyError) as caught:  # a close name: the suggestion alone, not every name after it
        posenc.build("alibbi", num_heads=4)
    assert caught.value.args[0] == "unknown encoding 'alibbi' (did you mean 'alibi'?)"
    with pytest.raises(TypeError, match="alibi: unknown argument\\(s\\) heads; ALiBi accepts num_heads, symmetric"):
        posenc.build("alibi", heads=4)
    with pytest.raises(TypeError, match="alibi: missing required argument\\(s\\) num_heads"):
        posenc.build("alibi")
    with pytest.raises(ValueError, match="modality must be one of"):
        posenc.available("audio")


def test_torchscript_is_refused_by_every_encoding_with_one_clear_error():
    import warnings

    import posenc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.14 deprecates torch.jit.script itself
        for enc in (posenc.build("rope", head_dim=16), posenc.build("sinusoidal", dim=16)):
            with pytest.raises(NotImplementedError, match=f"{type(enc).__name__} does not support TorchScript.*FX"):
                torch.jit.script(enc)
