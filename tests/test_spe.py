"""Stochastic positional encoding (sine_spe, conv_spe, conv_spe2d): the estimate converges to
the kernel like 1 / sqrt(R), the kernel depends on the offset only, the conv kernel is the
filters' cross-correlation, the codes are the noise through the filters at any positions, and
the encodings run on linear attention only."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import posenc.primitives.spe as spe_mod
from posenc import AttentionMask, EluFeatureMap, attend, linear_attention
from posenc.primitives.spe import conv_cross_correlation, positional_noise
from posenc.seq import ConvSPE, SineSPE
from posenc.seq.models import CausalLM
from posenc.vision import ConvSPE2d

H, D = 2, 4


def _perturbed(enc):
    """Move the parameters off their initial values (so kernels are not all alike)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return enc.double().eval()


def _make(kind: str, r: int, gated: bool = True, seed: int = 0):
    torch.manual_seed(1)  # the parameters do not depend on R: same kernel for every R
    if kind == "sine":
        enc = SineSPE(H, D, num_sines=3, num_realizations=r, gated=gated, seed=seed)
    elif kind == "conv":
        enc = ConvSPE(H, D, kernel_size=4, num_realizations=r, gated=gated, seed=seed)
    else:
        enc = ConvSPE2d(H, D, kernel_size=3, num_realizations=r, gated=gated, seed=seed)
    return _perturbed(enc)


def _positions(kind: str, shift: int):
    if kind == "conv2d":
        rows, cols = torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij")
        return torch.stack((rows.flatten(), cols.flatten()), -1)[None] + shift  # [1, 9, 2]
    return torch.tensor([[0, 1, 2, 4, 7, 8]]) + shift


def _offsets(pos):
    return pos[0][:, None] - pos[0][None, :]  # [T, T(, 2)]


def _exact_scores(enc, q, k, pos):
    return torch.einsum("bhmd,bhnd,hdmn->bhmn", q, k, enc.gated_kernel(_offsets(pos)))


@torch.no_grad()
def _rms_error(enc, q, k, pos, draws: int) -> float:
    exact = _exact_scores(enc, q, k, pos)
    errs = []
    for s in range(draws):
        enc.seed = 1000 + s
        qh, kh = enc.transform_qk(q, k, pos, pos)
        errs.append(((qh @ kh.transpose(-1, -2) - exact) ** 2).mean())
    return float(torch.stack(errs).mean().sqrt())


@pytest.mark.parametrize("kind", ["sine", "conv", "conv2d"])
def test_the_estimate_converges_to_the_kernel_like_one_over_sqrt_r(kind):
    g = torch.Generator().manual_seed(0)
    pos = _positions(kind, 0)
    t = pos.shape[1]
    q = torch.randn(1, H, t, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, H, t, D, generator=g, dtype=torch.float64)
    rs = [16, 64, 256, 1024]
    errors = [_rms_error(_make(kind, r), q, k, pos, draws=12) for r in rs]
    slope = (math.log(errors[-1]) - math.log(errors[0])) / (math.log(rs[-1]) - math.log(rs[0]))
    assert -0.65 < slope < -0.35, f"{kind}: error against R {dict(zip(rs, errors))} falls with slope {slope:.2f}"
    assert all(a > b for a, b in itertools.pairwise(errors)), errors
    # shifted positions: the same kernel in expectation (relative-shift invariance)
    scale = _exact_scores(_make(kind, 16), q, k, pos).abs().mean().item()
    shifted = _rms_error(_make(kind, 1024), q, k, _positions(kind, 5000), draws=12)
    assert shifted < 0.25 * scale and shifted < 1.5 * errors[-1], (shifted, errors[-1], scale)


def test_sine_codes_have_exactly_the_kernel_as_cross_covariance_at_any_shift():
    """With the noise replaced by an orthonormal basis, sum_r Qbar Kbar is the exact cross-covariance."""
    enc = _make("sine", 8, gated=False)
    two_k = 2 * enc.num_sines
    eye = torch.eye(two_k, dtype=torch.float64).expand(H, D, two_k, two_k)
    for shift in (0, 12345.5, 1e6):
        pos = torch.tensor([[0.0, 1.0, 3.0, 10.0, 10.5]], dtype=torch.float64) + shift
        cq = enc._codes(pos, 0, eye, True, None, torch.float64)[0]  # [H, T, D, 2K]
        ck = enc._codes(pos, 0, eye, False, None, torch.float64)[0]
        cov = torch.einsum("hmdr,hndr->hdmn", cq, ck)
        torch.testing.assert_close(cov, enc.kernel(_offsets(pos)), rtol=1e-6, atol=1e-6)


@torch.no_grad()
def test_sine_kernel_is_the_sum_of_its_sinusoids():
    enc = _make("sine", 8, gated=False)
    f, theta, lam = enc.frequencies(), enc.phases, enc.gains()
    tau = torch.tensor([-3.0, 0.0, 2.5, 40.0], dtype=torch.float64)
    h, d = 1, 2
    expected = [sum(lam[h, d, i] ** 2 * math.cos(2 * math.pi * f[h, d, i] * t + theta[h, d, i]) for i in range(3)) for t in tau]
    torch.testing.assert_close(enc.kernel(tau)[h, d], torch.stack(expected).to(torch.float64))
    assert (f > 0).all() and (f < 0.5).all()


def test_conv_kernel_is_the_filters_cross_correlation():
    enc = _make("conv", 8)
    fq, fk = enc.filter_q[1, 3], enc.filter_k[1, 3]
    length = enc.kernel_size
    for tau in range(-length - 1, length + 2):
        expected = sum(fq[l] * fk[l + tau] for l in range(length) if 0 <= l + tau < length)
        got = enc.kernel(torch.tensor([tau]))[1, 3, 0]
        torch.testing.assert_close(got, torch.as_tensor(expected, dtype=torch.float64), msg=f"tau={tau}")
    enc2 = _make("conv2d", 8)
    fq, fk = enc2.filter_q[0, 1], enc2.filter_k[0, 1]
    for dy, dx in [(0, 0), (1, -2), (-2, 2), (3, 0)]:
        expected = sum(fq[a, b] * fk[a + dy, b + dx] for a in range(3) for b in range(3)
                       if 0 <= a + dy < 3 and 0 <= b + dx < 3)
        got = enc2.kernel(torch.tensor([[dy, dx]]))[0, 1, 0]
        torch.testing.assert_close(got, torch.as_tensor(expected, dtype=torch.float64))
    assert conv_cross_correlation(torch.ones(1, 2), torch.ones(1, 2)).tolist() == [[1.0, 2.0, 1.0]]


@pytest.mark.parametrize("positions", [[0, 1, 2, 3], [5, 6, 7, 200, 201, 0, 1], [-9, -8, 64, 63, 130]])
def test_conv_codes_are_the_noise_through_the_filter_at_any_positions(positions):
    enc = _make("conv", 3)
    pos = torch.tensor([positions])
    codes = enc._codes(pos, 42, None, True, None, torch.float64)[0].transpose(0, 1)  # [T, H, D, R]
    length = enc.kernel_size
    for i, p in enumerate(positions):
        z = positional_noise(42, (p,), (p + length,), (3, H * D), pos.device, torch.float64)  # [R, HD, L]
        manual = torch.einsum("rcl,cl->cr", z, enc.filter_q.reshape(H * D, length)).reshape(H, D, 3)
        torch.testing.assert_close(codes[i], manual)


def test_conv2d_codes_are_the_noise_through_the_filter():
    enc = _make("conv2d", 2)
    pos = torch.tensor([[[0, 0], [2, 1], [1, 3], [5, 0]]])
    codes = enc._codes(pos, 9, None, False, None, torch.float64)[0].transpose(0, 1)  # [T, H, D, R]
    for i, (r, c) in enumerate(pos[0].tolist()):
        z = positional_noise(9, (r, c), (r + 3, c + 3), (2, H * D), pos.device, torch.float64)  # [R, HD, 3, 3]
        manual = torch.einsum("rcab,cab->cr", z, enc.filter_k.reshape(H * D, 3, 3)).reshape(H, D, 2)
        torch.testing.assert_close(codes[i], manual)


def test_positional_noise_depends_on_the_point_not_on_the_box():
    big = positional_noise(3, (-70,), (140,), (2,), torch.device("cpu"), torch.float32)
    torch.testing.assert_close(positional_noise(3, (5,), (9,), (2,), torch.device("cpu"), torch.float32), big[:, 75:79])
    big2 = positional_noise(3, (-3, 60), (70, 130), (1,), torch.device("cpu"), torch.float32)
    small = positional_noise(3, (63, 64), (66, 68), (1,), torch.device("cpu"), torch.float32)
    torch.testing.assert_close(small, big2[:, 66:69, 4:8])
    assert not torch.equal(big, positional_noise(4, (-70,), (140,), (2,), torch.device("cpu"), torch.float32))
    assert 0.8 < float(big.std()) < 1.2


def test_prefix_tokens_get_a_plain_dot_product_in_expectation():
    torch.manual_seed(0)
    enc = _perturbed(SineSPE(H, D, num_realizations=20000, num_prefix_tokens=1))
    q = torch.randn(1, H, 3, D, dtype=torch.float64)
    k = torch.randn(1, H, 3, D, dtype=torch.float64)
    pos = torch.tensor([[0, 0, 1]])
    qh, kh = enc.transform_qk(q, k, pos, pos)
    scores = qh @ kh.transpose(-1, -2)
    plain = q @ k.transpose(-1, -2)
    torch.testing.assert_close(scores[..., 0, 0], plain[..., 0, 0], atol=0.1 * plain.abs().max().item(), rtol=0)


def test_training_redraws_the_noise_and_evaluation_is_fixed():
    enc = SineSPE(H, D, num_realizations=8)
    q, k, pos = torch.randn(1, H, 5, D), torch.randn(1, H, 5, D), torch.arange(5)[None]
    enc.train()
    a, b = enc.transform_qk(q, k, pos, pos)[0], enc.transform_qk(q, k, pos, pos)[0]
    assert not torch.equal(a, b)
    torch.manual_seed(5)
    c = enc.transform_qk(q, k, pos, pos)[0]
    torch.manual_seed(5)
    assert torch.equal(c, enc.transform_qk(q, k, pos, pos)[0])  # torch.manual_seed reproduces a run
    enc.eval()
    assert torch.equal(enc.transform_qk(q, k, pos, pos)[0], enc.transform_qk(q, k, pos, pos)[0])


@pytest.mark.parametrize("kind", ["sine", "conv", "conv2d"])
def test_chunked_recomputed_codes_give_the_same_values_and_gradients(kind, monkeypatch):
    enc = _make(kind, 5)
    pos = _positions(kind, 3)
    t = pos.shape[1]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, H, t, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, H, t, D, generator=g, dtype=torch.float64, requires_grad=True)

    def run():
        qh, kh = enc.transform_qk(q, k, pos, pos)
        loss = (qh.sin() * kh).sum()
        grads = torch.autograd.grad(loss, [q, k, *enc.parameters()])
        return torch.cat([qh.flatten(), kh.flatten()]), grads

    whole, grads_whole = run()
    monkeypatch.setattr(spe_mod, "SPE_CHUNK_TOKENS", 2)
    chunked, grads_chunked = run()
    torch.testing.assert_close(chunked, whole)
    for a, b in zip(grads_chunked, grads_whole):
        torch.testing.assert_close(a, b)


def test_gradcheck_through_the_codes():
    enc = _make("conv", 3)
    pos = torch.tensor([[0, 1, 2, 9]])
    q = torch.randn(1, H, 4, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, H, 4, D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: enc.transform_qk(a, b, pos, pos)[0], (q, k))
    sine = _make("sine", 3)
    assert torch.autograd.gradcheck(lambda a, b: sine.transform_qk(a, b, pos, pos)[1], (q, k))


@pytest.mark.parametrize("mask", [None, AttentionMask(causal=True),
                                  AttentionMask.packed(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2]]))])
def test_attend_runs_linear_attention_on_the_encoded_queries_and_keys(mask):
    enc = _make("sine", 6)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, H, 8, D, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(8)[None]
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, feature_map=EluFeatureMap())
    qh, kh = enc.transform_qk(q, k, pos, pos)
    # (linear_attention itself equals the explicit quadratic form: tests/test_linear_attention.py)
    torch.testing.assert_close(out, linear_attention(qh, kh, v, EluFeatureMap(), mask))
    assert out.shape == v.shape and qh.shape[-1] == 6


def test_grouped_query_keys_are_expanded_to_the_query_heads():
    enc = _make("conv", 4)
    q = torch.randn(1, H, 5, D, dtype=torch.float64)
    k = torch.randn(1, 1, 5, D, dtype=torch.float64)
    pos = torch.arange(5)[None]
    qh, kh = enc.transform_qk(q, k, pos, pos)
    assert qh.shape == kh.shape == (1, H, 5, 4)
    v = torch.randn(1, 1, 5, D, dtype=torch.float64)
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, feature_map=EluFeatureMap())
    assert out.shape == (1, H, 5, D)


def test_misuse_is_one_clear_error():
    enc = ConvSPE(H, D, num_realizations=4)
    q = torch.randn(1, H, 3, D)
    with pytest.raises(ValueError, match="linear attention only"):
        attend(q, q, q, q_pos=torch.arange(3), kv_pos=torch.arange(3), encoding=enc)
    with pytest.raises(ValueError, match="integer grid"):
        enc.transform_qk(q, q, torch.tensor([[0.0, 0.5, 1.0]]), torch.tensor([[0.0, 0.5, 1.0]]))
    with pytest.raises(ValueError, match="num_heads=2, head_dim=4"):
        enc.transform_qk(torch.randn(1, 3, 3, D), torch.randn(1, 3, 3, D), torch.arange(3)[None], torch.arange(3)[None])
    with pytest.raises(ValueError, match="shape"):
        ConvSPE2d(H, D).transform_qk(q, q, torch.arange(3)[None], torch.arange(3)[None])
    for bad in ({"num_realizations": 0}, {"kernel_size": True}, {"gated": 1}):
        with pytest.raises((ValueError, TypeError)):
            ConvSPE(H, D, **bad)
    with pytest.raises(ValueError, match="num_sines"):
        SineSPE(H, D, num_sines=0)
    with pytest.raises(ValueError, match="score bias of ALiBi"):
        CausalLM(20, 16, 1, 2, encoding="alibi", feature_map="elu")
    with pytest.raises(ValueError, match="linear attention only"):
        CausalLM(20, 16, 1, 2, encoding="sine_spe")
    with pytest.raises(ValueError, match="feature_map must be one of"):
        CausalLM(20, 16, 1, 2, encoding="sine_spe", feature_map="relu")


def test_favor_features_are_built_for_the_encoded_width():
    model = CausalLM(20, 16, 1, 2, encoding="sine_spe", feature_map="favor",
                                       encoding_options={"num_realizations": 12})
    assert model.encoder.blocks[0].attn.feature_map.head_dim == 12
    out = model(torch.randint(0, 20, (2, 9)))
    assert out.shape == (2, 9, 20) and torch.isfinite(out).all()


@pytest.mark.parametrize("kind", ["sine", "conv", "conv2d"])
def test_per_sequence_positions_give_each_sequence_its_own_codes(kind):
    enc = _make(kind, 5)
    if kind == "conv2d":
        pos = torch.tensor([[[0, 0], [0, 1], [1, 0], [1, 1], [2, 2]], [[3, 3], [0, 1], [1, 0], [1, 1], [0, 0]]])
    else:
        pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 0, 1, 2]])  # a shifted row, a packed row
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, H, 5, D, generator=g, dtype=torch.float64) for _ in range(2))
    qh, kh = enc.transform_qk(q, k, pos, pos)
    for b in range(2):
        qb, kb = enc.transform_qk(q[b:b + 1], k[b:b + 1], pos[b:b + 1], pos[b:b + 1])
        torch.testing.assert_close(qh[b:b + 1], qb)
        torch.testing.assert_close(kh[b:b + 1], kb)
    empty = enc.transform_qk(q[:, :, :0], k[:, :, :0], pos[:, :0], pos[:, :0])
    assert empty[0].shape == (2, H, 0, 5) and empty[1].shape == (2, H, 0, 5)
