"""posenc.functional: known values worked by hand, RoPE's relative-shift invariance, equality with
the modules that use the same functions, and tracing under torch.compile(fullgraph=True)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
import posenc.functional as PF
from posenc.common.masks import AttentionMask
from posenc.seq import ALiBi, RotaryEncoding, SinusoidalEncoding, T5Bias
from posenc.seq.shaw import clipped_offsets
from posenc.vision import SinCos2D

SCALINGS = [
    None,
    PF.rope_scaling_config("linear", factor=2.0),
    PF.rope_scaling_config("ntk", factor=2.0),
    PF.rope_scaling_config("yarn", factor=4.0, original_max_len=16),
    PF.rope_scaling_config("llama3", factor=4.0, original_max_len=16),
    PF.rope_scaling_config("dynamic_ntk", factor=2.0, original_max_len=8),
    PF.rope_scaling_config("longrope", short_factor=[1.0] * 4, long_factor=[1.0, 1.5, 2.0, 3.0], original_max_len=8),
]


# ---- RoPE --------------------------------------------------------------------------------------


@pytest.mark.parametrize("pairing,partner", [("half_split", 2), ("interleaved", 1)])
def test_apply_rope_known_values(pairing, partner):
    # D = 4, theta = (1, 10000^-0.5 = 0.01). A unit vector on feature 0 at position p turns by p rad
    # into its partner feature (2 for half-split pairs (0, 2), (1, 3); 1 for interleaved (0, 1), (2, 3)).
    q = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    k[..., 3] = 1.0  # the second feature of the slow pair: turns by p * 0.01
    rq, rk = PF.apply_rope(q, k, torch.tensor([0, 1, 2]), pairing=pairing)
    for p in range(3):
        assert rq[0, 0, p, 0].item() == pytest.approx(math.cos(p))
        assert rq[0, 0, p, partner].item() == pytest.approx(math.sin(p))
    slow_first = 1 if pairing == "half_split" else 2  # the partner of feature 3
    for p in range(3):
        assert rk[0, 0, p, 3].item() == pytest.approx(math.cos(0.01 * p))
        assert rk[0, 0, p, slow_first].item() == pytest.approx(-math.sin(0.01 * p))


def test_rope_cos_sin_known_values_and_attention_factor():
    cos, sin = PF.rope_cos_sin(torch.tensor([0, 3]), 4, 100.0, dtype=None)
    assert cos.shape == (2, 2) and cos.dtype == torch.float64
    theta = [1.0, 100.0 ** -0.5]
    torch.testing.assert_close(cos, torch.tensor([[1.0, 1.0], [math.cos(3 * theta[0]), math.cos(3 * theta[1])]],
                                                 dtype=torch.float64))
    torch.testing.assert_close(sin[1], torch.tensor([math.sin(3 * t) for t in theta], dtype=torch.float64))
    yarn = PF.rope_scaling_config("yarn", factor=4.0, original_max_len=16)
    cos_y, _ = PF.rope_cos_sin(torch.tensor([0]), 8, scaling=yarn)
    torch.testing.assert_close(cos_y, torch.full((1, 4), 0.1 * math.log(4.0) + 1))  # cos(0) times the factor
    batch = PF.rope_cos_sin(torch.arange(6).view(2, 3), 8)[0]
    assert batch.shape == (2, 3, 4)


@pytest.mark.parametrize("pairing", ["half_split", "interleaved"])
@pytest.mark.parametrize("scaling", SCALINGS[:5], ids=lambda s: getattr(s, "name", "plain"))
def test_rope_scores_depend_on_the_offset_only(pairing, scaling):
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 1, 8, dtype=torch.float64), torch.randn(1, 2, 1, 8, dtype=torch.float64)
    scores = []
    for shift in (0.0, 5.0, 123.5):  # float positions too
        rq, rk = PF.apply_rope(q, k, torch.tensor([7.0 + shift]), k_positions=torch.tensor([2.0 + shift]),
                               pairing=pairing, rotary_dim=6, scaling=scaling)
        scores.append((rq * rk).sum(-1))
    torch.testing.assert_close(scores[1], scores[0])
    torch.testing.assert_close(scores[2], scores[0])
    rq, rk = PF.apply_rope(q, k, torch.tensor([8.0]), k_positions=torch.tensor([2.0]), pairing=pairing, scaling=scaling)
    assert not torch.allclose((rq * rk).sum(-1), scores[0])  # a different offset gives a different score


@pytest.mark.parametrize("pairing", ["half_split", "interleaved"])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: getattr(s, "name", "plain"))
def test_apply_rope_equals_the_rotary_module(pairing, scaling):
    torch.manual_seed(1)
    q, k = torch.randn(2, 4, 5, 12, dtype=torch.float64), torch.randn(2, 2, 9, 12, dtype=torch.float64)
    q_pos = torch.tensor([[4, 5, 6, 7, 8], [10, 11, 12, 13, 20]])  # per-row positions, beyond L0 in row 2
    kv_pos = torch.arange(9)[None]
    module = RotaryEncoding(12, rotary_dim=8, pairing=pairing, scaling=scaling)
    mq, mk = module.transform_qk(q, k, q_pos, kv_pos)
    fq, fk = PF.apply_rope(q, k, q_pos, k_positions=kv_pos, rotary_dim=8, pairing=pairing, scaling=scaling)
    assert torch.equal(mq, fq) and torch.equal(mk, fk)
    torch.testing.assert_close(fq[..., 8:], q[..., 8:], rtol=0, atol=0)  # partial rotary leaves the rest


def test_rope_cos_sin_is_the_cache_apply_rotary_reads():
    torch.manual_seed(2)
    q = torch.randn(1, 2, 6, 8)
    cos, sin = PF.rope_cos_sin(torch.arange(6), 8)  # [T, 4]
    via_cache = PF.apply_rotary(q, cos, sin, interleaved=False)
    torch.testing.assert_close(via_cache, PF.apply_rope(q, q, torch.arange(6))[0])


# ---- ALiBi -------------------------------------------------------------------------------------


def test_alibi_bias_values_by_hand():
    m = PF.alibi_slopes(2)
    torch.testing.assert_close(m, torch.tensor([2.0 ** -4, 2.0 ** -8]))
    inf = float("-inf")
    causal = PF.alibi_bias(3, 3, m, causal=True)
    expected0 = torch.tensor([[0.0, inf, inf], [-1 / 16, 0.0, inf], [-2 / 16, -1 / 16, 0.0]])
    torch.testing.assert_close(causal[0], expected0)
    torch.testing.assert_close(causal[1], expected0 / 16)  # inf / 16 is still -inf
    assert not bool((causal > 0).any())  # never positive
    symmetric = PF.alibi_bias(3, 3, m, causal=False)
    torch.testing.assert_close(symmetric[0], torch.tensor([[0.0, -1.0, -2.0], [-1.0, 0.0, -1.0], [-2.0, -1.0, 0.0]]) / 16)
    # one new query after three cached keys: it sits at position 3 (offset k_len - q_len)
    torch.testing.assert_close(PF.alibi_bias(1, 4, m, causal=True)[0], torch.tensor([[-3.0, -2.0, -1.0, 0.0]]) / 16)
    # an explicit offset: query 0 at position 1 of the keys; key 2 is after it
    torch.testing.assert_close(PF.alibi_bias(1, 3, m, causal=True, offset=1)[0], torch.tensor([[-1 / 16, 0.0, inf]]))


def test_alibi_bias_equals_the_module_and_serves_sdpa_as_a_full_mask():
    torch.manual_seed(3)
    heads, t = 4, 7
    q, k, v = (torch.randn(2, heads, t, 8, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t)[None]
    slopes = PF.alibi_slopes(heads).double()
    for causal in (True, False):
        module = ALiBi(heads, symmetric=not causal)
        dense = module.score_bias(q, k, pos, pos).dense(1, heads, torch.arange(t), torch.arange(t))[0]
        functional = PF.alibi_bias(t, t, PF.alibi_slopes(heads), causal=causal)
        allowed = torch.ones(t, t, dtype=torch.bool).tril() if causal else torch.ones(t, t, dtype=torch.bool)
        torch.testing.assert_close(functional[:, allowed], dense[:, allowed])
        mask = AttentionMask(causal=True) if causal else None
        ref = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=module, mask=mask)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=PF.alibi_bias(t, t, slopes, causal=causal))
        torch.testing.assert_close(out, ref)


def test_alibi_bias_states_its_causal_choice():
    with pytest.raises(TypeError, match="causal"):
        PF.alibi_bias(3, 3, PF.alibi_slopes(2))  # no silent default for keys after the query
    with pytest.raises(TypeError, match="causal must be True or False, got 'yes'"):
        PF.alibi_bias(3, 3, PF.alibi_slopes(2), causal="yes")
    with pytest.raises(ValueError, match=r"slopes must be a \[num_heads\] tensor"):
        PF.alibi_bias(3, 3, PF.alibi_slopes(2)[None], causal=True)


# ---- T5, relative indices, sinusoid tables -----------------------------------------------------------


def test_relative_index_helpers():
    torch.testing.assert_close(PF.relative_position_grid(2, 3), torch.tensor([[-1, 0, 1], [-2, -1, 0]]))
    torch.testing.assert_close(PF.relative_position_grid(2, 2, offset=0), torch.tensor([[0, 1], [-1, 0]]))
    rel = torch.tensor([-5, -2, 0, 1, 9])
    torch.testing.assert_close(PF.clipped_relative_index(rel, 2), torch.tensor([0, 0, 2, 3, 4]))
    q_pos, kv_pos = torch.tensor([[3, 4]]), torch.tensor([[0, 1, 2, 3, 4, 5]])
    assert torch.equal(clipped_offsets(q_pos, kv_pos, 2)[0, 0], PF.clipped_relative_index(
        PF.relative_positions(q_pos, kv_pos)[0], 2))
    with pytest.raises(TypeError, match="integer tensor"):
        PF.clipped_relative_index(rel.float(), 2)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_equals_the_module(bidirectional):
    torch.manual_seed(4)
    module = T5Bias(3, num_buckets=8, max_distance=20, bidirectional=bidirectional)
    t = 30
    pos = torch.arange(t)[None]
    dense = module.score_bias(None, None, pos, pos).dense(1, 3, torch.arange(t), torch.arange(t))[0]
    functional = PF.t5_bias(PF.relative_position_grid(t, t), module.table, bidirectional=bidirectional, max_distance=20)
    assert torch.equal(functional, dense)
    # buckets by hand (8 buckets, causal: exact 0..3 for distances 0..3, log-spaced after, future -> 0)
    if not bidirectional:
        r = torch.tensor([3, 0, -1, -3, -4, -19, -20, -100])
        torch.testing.assert_close(PF.t5_relative_buckets(r, False, 8, 20), torch.tensor([0, 0, 1, 3, 4, 7, 7, 7]))


def test_sinusoid_tables_known_values_and_module_equality():
    table = PF.sinusoid_table(torch.tensor([0, 1]), 4, dtype=torch.float64)
    torch.testing.assert_close(table, torch.tensor([[0.0, 1.0, 0.0, 1.0],
                                                    [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]],
                                                   dtype=torch.float64))
    x = torch.zeros(1, 5, 8)
    torch.testing.assert_close(SinusoidalEncoding(8).encode_input(x, torch.arange(5)[None]),
                               PF.sinusoid_table(torch.arange(5), 8)[None])
    grid = PF.sincos2d_grid(2, 3, 8, dtype=torch.float64)  # timm: [sin r, sin c, cos r, cos c], omega = (1, 0.01)
    torch.testing.assert_close(grid[4], torch.tensor([math.sin(1), math.sin(0.01), math.sin(1), math.sin(0.01),
                                                      math.cos(1), math.cos(0.01), math.cos(1), math.cos(0.01)],
                                                     dtype=torch.float64))  # patch (1, 1)
    assert grid[2, 2].item() == pytest.approx(math.sin(2.0))  # patch (0, 2): sin(c * omega_0) in the second quarter
    for layout in ("timm", "mae"):
        module = SinCos2D(8, layout=layout)
        coords = torch.cartesian_prod(torch.arange(2), torch.arange(3))[None]
        enc = module.encode_input(torch.zeros(1, 6, 8, dtype=torch.float64), coords)
        torch.testing.assert_close(enc[0], PF.sincos2d_grid(2, 3, 8, layout=layout, dtype=torch.float64))


# ---- torch.compile -----------------------------------------------------------------------------------


def test_apply_rope_and_alibi_bias_trace_whole():
    torch.manual_seed(5)
    q, k = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    pos = torch.arange(6)
    scaling = PF.rope_scaling_config("dynamic_ntk", factor=2.0, original_max_len=4)  # length read from positions

    def rope(q, k, pos):
        return PF.apply_rope(q, k, pos, pairing="interleaved", scaling=scaling)

    def alibi(slopes):
        return PF.alibi_bias(6, 6, slopes, causal=True) + PF.alibi_bias(6, 6, slopes, causal=False)

    torch._dynamo.reset()
    compiled_rope = torch.compile(rope, fullgraph=True, backend="aot_eager")
    compiled_alibi = torch.compile(alibi, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled_rope(q, k, pos), rope(q, k, pos)):
        torch.testing.assert_close(got, want)
    slopes = PF.alibi_slopes(2)
    torch.testing.assert_close(compiled_alibi(slopes), alibi(slopes))


def test_apply_rope_bad_input():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="rotary_dim must be a positive even number <= head_dim .8.; got 7"):
        PF.apply_rope(q, q, torch.arange(4), rotary_dim=7)
    with pytest.raises(ValueError, match="pairing must be one of"):
        PF.apply_rope(q, q, torch.arange(4), pairing="neox")
    with pytest.raises(ValueError, match="k has 3 tokens and q 4: pass k_positions"):
        PF.apply_rope(q, q[:, :, :3], torch.arange(4))
    with pytest.raises(ValueError, match=r"positions must be \[4\] or \[batch or 1, 4\]; got \(5,\)"):
        PF.apply_rope(q, q, torch.arange(5))
