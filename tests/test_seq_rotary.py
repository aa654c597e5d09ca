"""RoPE context extensions and xPos: inverse frequencies against independent implementations of
the REFERENCES.md definitions (plain Python math), invariances, pairings against a float64
rotation, KV-cache honesty, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.common.kv_cache import KVCache
from posenc.common.registry import ModelDims
from posenc.seq import rope_scaling as rs
from posenc.seq.rope import RotaryEncoding
from posenc.seq.xpos import XPos, xpos_zeta
from tests import reference as ref

SCALED = ["rope_linear", "rope_ntk", "rope_dynamic_ntk", "rope_yarn", "rope_llama3", "rope_longrope"]


def scaled(method, rotary_dim, base, *, seq_len=None, **params):
    """A scaling's frequencies and attention factor: its dataclass, checked, then computed."""
    return rs.rope_scaling_config(method, **params).compute(rotary_dim, base, seq_len)


# ---- independent definitions (plain Python) --------------------------------------------------


def theta(r: int, base: float) -> list[float]:
    return [base ** (-2.0 * k / r) for k in range(r // 2)]


def yarn_ref(r, base, s, l0, beta_fast=32.0, beta_slow=1.0, truncate=True):
    def corr(rot):
        return r * math.log(l0 / (2 * math.pi * rot)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001
    out = []
    for k, t in enumerate(theta(r, base)):
        ramp = min(1.0, max(0.0, (k - low) / (high - low)))
        out.append(t / s * ramp + t * (1 - ramp))
    return out


def llama3_ref(r, base, s=8.0, low=1.0, high=4.0, l0=8192):
    out = []
    for t in theta(r, base):
        w = 2 * math.pi / t
        if w < l0 / high:
            out.append(t)
        elif w > l0 / low:
            out.append(t / s)
        else:
            g = (l0 / w - low) / (high - low)
            out.append((1 - g) * t / s + g * t)
    return out


def dynamic_ref(r, base, s, l0, length):
    if length > l0:
        base = base * ((s * length / l0) - (s - 1)) ** (r / (r - 2))
    return theta(r, base)


def rotate_ref(x: torch.Tensor, positions: torch.Tensor, freqs: list[float], *, interleaved: bool, factor=1.0):
    """Complex rotation in float64 by ``p * freqs[k]`` of each pair, times ``factor``."""
    r = 2 * len(freqs)
    x = x.double()
    xr, rest = x[..., :r], x[..., r:]
    f = torch.tensor(freqs, dtype=torch.float64)
    ang = positions.double()[:, None, :, None] * f
    rot = torch.polar(torch.full_like(ang, factor), ang)
    if interleaved:
        z = torch.complex(xr[..., 0::2], xr[..., 1::2]) * rot
        out = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    else:
        z = torch.complex(xr[..., : r // 2], xr[..., r // 2 :]) * rot
        out = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((out, rest), dim=-1)


def close(a, b, tol=1e-12):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), rtol=tol, atol=tol)


# ---- inverse frequencies -------------------------------------------------------------------


def test_linear_and_ntk_frequencies():
    f, a = scaled("linear", 16, 10000.0, factor=4.0)
    close(f, [t / 4 for t in theta(16, 10000.0)])
    assert a == 1.0
    f, a = scaled("ntk", 16, 10000.0, factor=4.0)
    close(f, theta(16, 10000.0 * 4.0 ** (16 / 14)))
    # the fastest pair is never touched by NTK; the slowest is divided by exactly s
    assert f[0] == 1.0 and math.isclose(float(f[-1]), theta(16, 10000.0)[-1] / 4, rel_tol=1e-12)


@pytest.mark.parametrize("length", [1, 100, 128, 129, 300, 1000])
def test_dynamic_ntk_below_and_above_original_length(length):
    f, _ = scaled("dynamic_ntk", 32, 10000.0, factor=4.0, original_max_len=128, seq_len=length)
    close(f, dynamic_ref(32, 10000.0, 4.0, 128, length))
    if length <= 128:
        close(f, theta(32, 10000.0))
    # one length per batch row
    f, _ = scaled("dynamic_ntk", 32, 10000.0, factor=4.0, original_max_len=128, seq_len=torch.tensor([50.0, length]))
    close(f[0], theta(32, 10000.0))
    close(f[1], dynamic_ref(32, 10000.0, 4.0, 128, length))


@pytest.mark.parametrize(
    "r,base,s,l0,truncate",
    [(64, 10000.0, 4.0, 256, True), (128, 500000.0, 16.0, 4096, True), (32, 10000.0, 8.0, 512, False)],
)
def test_yarn_frequencies_and_attention_factor(r, base, s, l0, truncate):
    f, a = scaled("yarn", r, base, factor=s, original_max_len=l0, truncate=truncate)
    close(f, yarn_ref(r, base, s, l0, truncate=truncate))
    assert math.isclose(a, 0.1 * math.log(s) + 1, rel_tol=1e-12)
    t = theta(r, base)
    assert f[0] == t[0] and math.isclose(float(f[-1]), t[-1] / s, rel_tol=1e-12)  # extrapolate fast, interpolate slow


def test_yarn_equal_correction_bounds_and_mscale_knobs():
    # L0 = 6 < 2*pi: both correction dims round to 0, so high gets +0.001 (no division by zero)
    f, _ = scaled("yarn", 16, 10000.0, factor=4.0, original_max_len=6)
    close(f, yarn_ref(16, 10000.0, 4.0, 6))
    t = theta(16, 10000.0)
    close(f, [t[0]] + [x / 4 for x in t[1:]])
    assert torch.isfinite(f).all()
    # DeepSeek-style knobs: equal mscale and mscale_all_dim cancel; otherwise their ratio
    _, a = scaled("yarn", 16, 10000.0, factor=40.0, original_max_len=4096, mscale=1.0, mscale_all_dim=1.0)
    assert a == 1.0
    _, a = scaled("yarn", 16, 10000.0, factor=40.0, original_max_len=4096, mscale=0.707, mscale_all_dim=0.0)
    assert math.isclose(a, 0.1 * math.log(40) + 1, rel_tol=1e-12)  # a 0 reads as absent, as in transformers
    _, a = scaled("yarn", 16, 10000.0, factor=40.0, original_max_len=4096, mscale=0.707, mscale_all_dim=0.5)
    assert math.isclose(a, (0.1 * 0.707 * math.log(40) + 1) / (0.1 * 0.5 * math.log(40) + 1), rel_tol=1e-12)
    _, a = scaled("yarn", 16, 10000.0, factor=40.0, original_max_len=4096, attention_factor=1.5)
    assert a == 1.5
    _, a = scaled("yarn", 16, 10000.0, factor=1.0, original_max_len=4096)
    assert a == 1.0


@pytest.mark.parametrize("r,base,l0", [(128, 500000.0, 8192), (64, 10000.0, 2048), (32, 10000.0, 64)])
def test_llama3_frequencies_and_bands(r, base, l0):
    f, a = scaled("llama3", r, base, original_max_len=l0)
    close(f, llama3_ref(r, base, l0=l0))
    assert a == 1.0
    t = torch.tensor(theta(r, base), dtype=torch.float64)
    w = 2 * math.pi / t
    short, long = w < l0 / 4, w > l0
    mid = ~short & ~long
    assert short.any() and long.any() and mid.any()  # the settings exercise all three bands
    close(f[short], t[short])
    close(f[long], t[long] / 8)
    assert bool(((f[mid] < t[mid]) & (f[mid] > t[mid] / 8)).all())


def test_llama3_band_edges_are_continuous():
    # wavelengths exactly at the band edges: the blend meets both neighbours
    r, base = 4, 10000.0
    w = 2 * math.pi / theta(r, base)[1]  # 200*pi
    for l0, expected in ((4 * w, theta(r, base)[1]), (w, theta(r, base)[1] / 8)):
        g = (l0 / w - 1) / 3
        blended = (1 - g) * theta(r, base)[1] / 8 + g * theta(r, base)[1]
        assert math.isclose(blended, expected, rel_tol=1e-12)
    # and the implementation agrees with the piecewise definition around the edges
    for l0 in (int(4 * w) - 1, int(4 * w), int(4 * w) + 1, int(w), int(w) + 1):
        close(scaled("llama3", r, base, original_max_len=l0)[0], llama3_ref(r, base, l0=l0))


def test_longrope_short_and_long_factors():
    short = [1.0, 1.5, 2.0, 3.0]
    long = [1.0, 2.0, 4.0, 8.0]
    t = theta(8, 10000.0)
    kw = dict(short_factor=short, long_factor=long, factor=8.0, original_max_len=512)
    f, a = scaled("longrope", 8, 10000.0, seq_len=512, **kw)
    close(f, [x / s for x, s in zip(t, short)])
    assert math.isclose(a, math.sqrt(1 + math.log(8) / math.log(512)), rel_tol=1e-12)
    f, a2 = scaled("longrope", 8, 10000.0, seq_len=513, **kw)
    close(f, [x / s for x, s in zip(t, long)])
    assert a2 == a  # the attention factor applies in both regimes (as in HF)
    f, _ = scaled("longrope", 8, 10000.0, seq_len=torch.tensor([10.0, 2000.0]), **kw)
    close(f[0], [x / s for x, s in zip(t, short)])
    close(f[1], [x / s for x, s in zip(t, long)])
    # the default long list reproduces the NTK-aware base
    close(scaled("longrope", 8, 10000.0, short_factor=[1] * 4, long_factor=rs.ntk_long_factors(8, 4.0),
                 factor=4.0, original_max_len=64)[0], scaled("ntk", 8, 10000.0, factor=4.0)[0])


def test_registry_of_scaling_functions():
    assert set(rs.ROPE_SCALINGS) == {"linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "proportional"}
    assert rs.ROPE_SCALINGS["yarn"] is rs.yarn_inv_freq


# ---- encodings -------------------------------------------------------------------------------


def build(name, head_dim=16, max_len=256, **opts):
    return posenc.build(name, dims=ModelDims(head_dim * 2, 2, max_len), **opts).double()


def expected_freqs(enc, length):
    """Independent frequencies and attention factor of a registered encoding at ``length``."""
    r, base = enc.rotary_dim, enc.base
    sc = enc.scaling
    if sc is None:
        return theta(r, base), 1.0
    if isinstance(sc, rs.LinearScaling):
        return [t / sc.factor for t in theta(r, base)], 1.0
    if isinstance(sc, rs.NTKScaling):
        return theta(r, base * sc.factor ** (r / (r - 2))), 1.0
    if isinstance(sc, rs.DynamicNTKScaling):
        return dynamic_ref(r, base, sc.factor, sc.original_max_len, length), 1.0
    if isinstance(sc, rs.YaRNScaling):
        return yarn_ref(r, base, sc.factor, sc.original_max_len), 0.1 * math.log(sc.factor) + 1
    if isinstance(sc, rs.Llama3Scaling):
        return llama3_ref(r, base, sc.factor, l0=sc.original_max_len), 1.0
    if isinstance(sc, rs.LongRoPEScaling):
        fs = sc.long_factor if length > sc.original_max_len else sc.short_factor
        return [t / f for t, f in zip(theta(r, base), fs)], math.sqrt(1 + math.log(sc.factor) / math.log(sc.original_max_len))
    raise AssertionError(sc)


@pytest.mark.parametrize("name", ["rope"] + SCALED)
@pytest.mark.parametrize("pairing", ["half_split", "interleaved"])
@pytest.mark.parametrize("length", [20, 100])
def test_scaled_rope_matches_float64_rotation(name, pairing, length):
    torch.manual_seed(0)
    enc = build(name, pairing=pairing, rotary_dim=12, max_len=200)  # L0 = 50 (25 for llama3)
    q, k = torch.randn(2, 2, length, 16, dtype=torch.float64), torch.randn(2, 2, length, 16, dtype=torch.float64)
    pos = torch.arange(length)[None]
    rq, rk = enc.transform_qk(q, k, pos, pos)
    freqs, factor = expected_freqs(enc, length)
    inter = pairing == "interleaved"
    close(rq, rotate_ref(q, pos, freqs, interleaved=inter, factor=factor), 1e-10)
    close(rk, rotate_ref(k, pos, freqs, interleaved=inter, factor=factor), 1e-10)
    # rotation preserves the norm of every token (up to the attention factor); partial rotary keeps the rest
    close(rq[..., :12].norm(dim=-1), q[..., :12].norm(dim=-1) * factor, 1e-10)
    close(rq[..., 12:], q[..., 12:])


@pytest.mark.parametrize("name", ["rope"] + SCALED + ["xpos"])
def test_scores_depend_only_on_offset(name):
    torch.manual_seed(1)
    enc = build(name, max_len=64)  # lengths below run past L0 = 16 for the length-dependent scalings
    t = 40
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64).expand(1, 1, t, 16)
    k = torch.randn(1, 1, 1, 16, dtype=torch.float64).expand(1, 1, t, 16)
    pos = torch.arange(t)[None]
    rq, rk = enc.transform_qk(q, k, pos, pos)
    s = rq @ rk.transpose(-1, -2)
    # same content everywhere: every diagonal of the score matrix is constant (within one call)
    close(s[..., 1:, 1:], s[..., :-1, :-1], 1e-9)
    if name not in ("rope_dynamic_ntk", "rope_longrope", "xpos"):
        # static frequencies: shifting both positions leaves the scores unchanged
        rq2, rk2 = enc.transform_qk(q, k, pos + 1000, pos + 1000)
        close(rq2 @ rk2.transpose(-1, -2), s, 1e-9)


def test_dynamic_ntk_reads_the_length_from_the_positions():
    enc = build("rope_dynamic_ntk", rotary_dim=16, max_len=64)  # L0 = 16, factor 4
    assert not enc.supports_kv_cache
    q = torch.randn(2, 2, 10, 16, dtype=torch.float64)
    pos = torch.stack([torch.arange(10), torch.arange(10) + 30])  # row lengths 10 (< L0) and 40 (> L0)
    rq, _ = enc.transform_qk(q, q, pos, pos)
    close(rq[:1], rotate_ref(q[:1], pos[:1], theta(16, 10000.0), interleaved=False))
    close(rq[1:], rotate_ref(q[1:], pos[1:], dynamic_ref(16, 10000.0, 4.0, 16, 40), interleaved=False))
    # nothing is kept between calls
    again, _ = enc.transform_qk(q[:1], q[:1], pos[:1], pos[:1])
    close(again, rq[:1])


def test_kv_cache_flags_and_refusal():
    assert build("rope_yarn").supports_kv_cache and build("rope_llama3").supports_kv_cache
    assert not build("rope_dynamic_ntk").supports_kv_cache
    assert not build("rope_longrope").supports_kv_cache
    assert build("rope_longrope", select="long").supports_kv_cache
    assert build("xpos").supports_kv_cache and not build("xpos", center="length").supports_kv_cache
    mha = posenc.MultiheadAttention(32, 2, encoding=build("rope_dynamic_ntk").float())
    with pytest.raises(ValueError, match="DynamicNTKRoPE does not support a KV cache"):
        mha(torch.randn(1, 3, 32), cache=posenc.common.LayerKVCache())


@pytest.mark.parametrize("name", ["rope_yarn", "rope_llama3", "rope_ntk", "xpos"])
def test_cached_decoding_equals_full_forward(name):
    torch.manual_seed(0)
    enc = posenc.build(name, dims=ModelDims(32, 2, 64))
    stack = posenc.TransformerEncoder(32, 2, 2, encoding=enc).double().eval()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    mask = posenc.AttentionMask(causal=True)
    full = stack(x, mask=mask)
    cache = KVCache(2)
    steps = [stack(x[:, :5], mask=mask, cache=cache)] + [stack(x[:, t : t + 1], mask=mask, cache=cache) for t in range(5, 12)]
    close(torch.cat(steps, dim=1), full, 1e-10)


@pytest.mark.parametrize("name", SCALED + ["xpos"])
def test_attention_output_against_float64_reference(name):
    torch.manual_seed(0)
    enc = build(name, max_len=64)
    q, k, v = (torch.randn(2, 2, 30, 16, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(30)[None]
    out = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(causal=True))
    rq, rk = enc.transform_qk(q, k, pos, pos)
    expected = ref.attention(rq, rk, v, ref.allowed_matrix(2, 30, 30, causal=True))
    close(out, expected, 1e-10)


def test_modules_survive_half_precision_cast():
    q = torch.randn(1, 1, 3, 16)
    for name in SCALED + ["xpos"]:
        # xPos is exact only within centre +- 18130 in float32 (XPos.position_limit)
        pos = torch.tensor([[0, 1, 15000 if name == "xpos" else 60000]])
        enc = posenc.build(name, dims=ModelDims(32, 2, 256))
        a, _ = enc.transform_qk(q, q, pos, pos)
        b, _ = posenc.build(name, dims=ModelDims(32, 2, 256)).half().float().transform_qk(q, q, pos, pos)
        torch.testing.assert_close(a, b)


# ---- xPos ------------------------------------------------------------------------------------


def test_xpos_zeta_known_values():
    close(xpos_zeta(8), [(2 * k + 3.2) / 11.2 for k in range(4)])
    close(xpos_zeta(8), [0.2857142857142857, 0.4642857142857143, 0.6428571428571429, 0.8214285714285714])
    close(xpos_zeta(64)[0], 0.4 / 1.4)


def xpos_ref(x, positions, r, sign, centre, interleaved, scale_base=512.0):
    out = rotate_ref(x, positions, theta(r, 10000.0), interleaved=interleaved)
    zeta = torch.tensor([(2 * k + 0.4 * r) / (1.4 * r) for k in range(r // 2)], dtype=torch.float64)
    scale = zeta ** (sign * (positions.double()[:, None, :, None] - centre) / scale_base)
    scale = scale.repeat_interleave(2, dim=-1) if interleaved else torch.cat((scale, scale), dim=-1)
    return torch.cat((out[..., :r] * scale, out[..., r:]), dim=-1)


@pytest.mark.parametrize("pairing", ["half_split", "interleaved"])
@pytest.mark.parametrize("center", [None, 3, "length"])
def test_xpos_matches_reference_and_cancels_for_equal_offsets(pairing, center):
    torch.manual_seed(0)
    enc = XPos(16, max_len=64, rotary_dim=12, pairing=pairing, center=center, scale_base=64).double()
    q, k = torch.randn(1, 2, 20, 16, dtype=torch.float64), torch.randn(1, 2, 20, 16, dtype=torch.float64)
    pos = torch.arange(20)[None]
    rq, rk = enc.transform_qk(q, k, pos, pos)
    c = {None: 32, 3: 3, "length": 10}[center]
    inter = pairing == "interleaved"
    close(rq, xpos_ref(q, pos, 12, 1.0, c, inter, 64.0), 1e-10)
    close(rk, xpos_ref(k, pos, 12, -1.0, c, inter, 64.0), 1e-10)
    # score(i+s, j+s) == score(i, j): the same q and k content moved by s
    rq2, rk2 = enc.transform_qk(q, k, pos + 7, pos + 7)
    close(rq2 @ rk2.transpose(-1, -2), rq @ rk.transpose(-1, -2), 1e-9)
    # and the decay is real: a key further back gets zeta^((i-j)/B) < 1 on each pair
    one = torch.zeros(1, 1, 1, 16, dtype=torch.float64)
    one[..., 0] = 1.0
    a, _ = enc.transform_qk(one, one, torch.tensor([[40]]), torch.tensor([[40]]))
    _, b = enc.transform_qk(one, one, torch.tensor([[40]]), torch.tensor([[0]]))
    _, b_same = enc.transform_qk(one, one, torch.tensor([[40]]), torch.tensor([[40]]))
    assert abs(float((a * b).sum())) < abs(float((a * b_same).sum()))


def test_xpos_is_causal_only_and_checks_input():
    enc = XPos(16)
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(ValueError, match="causal attention only"):
        posenc.attend(q, q, q, q_pos=torch.arange(4), kv_pos=torch.arange(4), encoding=enc)
    with pytest.raises(ValueError, match="rotary_dim must be .*even.*7"):
        XPos(16, rotary_dim=7)
    with pytest.raises(TypeError, match="center must be an int, 'length' or None"):
        XPos(16, center="middle")
    with pytest.raises(ValueError, match="scale_base must be a positive number"):
        XPos(16, scale_base=0)


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: RotaryEncoding(8, rotary_dim=7), "rotary_dim must be .*even.*7"),
        (lambda: scaled("linear", 8, 10000.0, factor=0.5), "factor must be .*>= 1.*0.5"),
        (lambda: scaled("ntk", 8, 10000.0, factor=float("nan")), "factor must be a finite number"),
        (lambda: scaled("ntk", 2, 10000.0, factor=2.0), "ntk scaling needs rotary_dim >= 4"),
        (lambda: scaled("linear", 8, 1.0, factor=2.0), "base must be .*> 1.*1.0"),
        (lambda: scaled("dynamic_ntk", 8, 1e4, factor=2.0, original_max_len=0), "original_max_len must be a positive int.*0"),
        (lambda: scaled("yarn", 8, 1e4, factor=2.0, original_max_len=64, beta_fast=1.0, beta_slow=32.0),
         "beta_fast must be greater than beta_slow, got beta_fast=1.0, beta_slow=32.0"),
        (lambda: scaled("yarn", 8, 1e4, factor=2.0, original_max_len=64, attention_factor=-1.0), "attention_factor must be .*(> 0|positive)"),
        (lambda: scaled("llama3", 8, 1e4, low_freq_factor=4.0, high_freq_factor=1.0),
         "low_freq_factor must be smaller than high_freq_factor, got 4.0 and 1.0"),
        (lambda: scaled("longrope", 8, 1e4, short_factor=[1.0] * 3, long_factor=[1.0] * 4, factor=2.0, original_max_len=64),
         "short_factor must hold rotary_dim/2 = 4 numbers, got 3"),
        (lambda: scaled("longrope", 8, 1e4, short_factor=[1.0] * 4, long_factor=[1.0, 0.0, 1.0, 1.0], factor=2.0,
                        original_max_len=64), "long_factor must be finite and positive"),
        (lambda: rs.LongRoPEScaling((1.0,), (1.0,), 64, select="medium"), "select must be 'by_length', 'short' or 'long'"),
        (lambda: posenc.build("rope_yarn", dims=ModelDims(32, 2, 64), factor=0.9), "factor must be .*>= 1.*0.9"),
        (lambda: posenc.build("rope_llama3", dims=ModelDims(32, 2, 4)), r"max_len // factor = 4 // 8.0 is 0"),
        (lambda: posenc.build("rope_longrope", dims=ModelDims(32, 2, 64), long_factor=[1.0] * 5),
         "long_factor must hold rotary_dim/2 = 8 numbers, got 5"),
        (lambda: RotaryEncoding(8, scaling={"rope_type": "linear"}), "scaling must be a RopeScaling config"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_every_scaled_rope_builds_with_defaults_and_keeps_partial_rotary():
    for name in SCALED:
        enc = posenc.build(name, dims=ModelDims(64, 4, 1024))
        assert enc.rotary_dim == 16 and enc.inv_freq.dtype == torch.float64
        part = posenc.build(name, dims=ModelDims(64, 4, 1024), rotary_dim=8, pairing="interleaved")
        q = torch.randn(1, 4, 5, 16)
        out, _ = part.transform_qk(q, q, torch.arange(5)[None], torch.arange(5)[None])
        torch.testing.assert_close(out[..., 8:], q[..., 8:])


@pytest.mark.parametrize("scaling", [None, "yarn"])
@pytest.mark.parametrize("pairing", ["half_split", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_decoding_reads_cos_sin_from_a_kept_table_with_the_same_bits(scaling, pairing, dtype):
    """A call of a few integer positions shared by q and k (a cached decoding step) reads cos/sin
    from a table kept by position (doubling past 256): bit for bit the computed rotation, with an
    attention factor, both pairings, bf16; longer calls, float and negative positions, positions
    past the table's bound and a kv_pos of their own are computed as before."""
    from posenc.seq.rope_scaling import YaRNScaling

    enc = RotaryEncoding(16, rotary_dim=12, pairing=pairing,
                         scaling=YaRNScaling(original_max_len=64, factor=4.0) if scaling else None)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 1, 16, generator=gen).to(dtype), torch.randn(2, 3, 1, 16, generator=gen).to(dtype)

    def computed(q_pos, kv_pos):
        enc._kept_tables = lambda *args: None  # no table: the angles computed
        try:
            return enc.transform_qk(q, k, q_pos, kv_pos)
        finally:
            del enc._kept_tables

    for p in (0, 7, 255, 256, 1000, 40000):
        pos = torch.tensor([[p]])
        got, want = enc.transform_qk(q, k, pos, pos), computed(pos, pos)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), p
        assert enc._tables._key[0] == max(256, 1 << p.bit_length())
    pos = torch.tensor([[3], [9]])  # one position per batch row
    assert all(torch.equal(g, w) for g, w in zip(enc.transform_qk(q, k, pos, pos), computed(pos, pos)))
    kept = enc._tables._value
    for pos in (torch.tensor([[-2]]), torch.tensor([[2.5]]), torch.tensor([[70000]])):  # 70000: past the table's bound
        torch.testing.assert_close(enc.transform_qk(q, k, pos, pos), computed(pos, pos), rtol=0, atol=0)
    assert enc._tables._value is kept  # (neither call used or rebuilt the table)
    assert enc._kept_tables(torch.tensor([[4]]), torch.tensor([[4]]), q) is None  # kv_pos not q_pos's object
