"""Spline-based Transformer: B-spline evaluation against hand-worked values and the formulas, the
model's encode / edit / decode API, the baseline autoencoder and the curve data."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.seq import PositionalAutoencoder, SmoothCurves, SplineTransformer, evaluate_spline
from posenc.seq.latent_autoencoder import spread_positions
from posenc.seq.spline import bspline_basis, clamped_uniform_knots, greville_abscissae, uniform_times

from .threads import torch_threads


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models: two OpenMP threads mostly wait on each other (and on a busy machine, much longer).
    with torch_threads(1):
        yield


# ----------------------------------------------------------------------------------------------
# evaluate_spline


def test_knots_are_clamped_and_uniform():
    assert clamped_uniform_knots(6, 3).tolist() == [0, 0, 0, 0, 1 / 3, 2 / 3, 1, 1, 1, 1]
    assert clamped_uniform_knots(4, 3).tolist() == [0] * 4 + [1] * 4  # no interior knot: Bezier
    assert greville_abscissae(6, 3).tolist() == pytest.approx([0, 1 / 9, 1 / 3, 2 / 3, 8 / 9, 1])


def test_cubic_with_four_points_is_the_bernstein_bezier():
    # K = p + 1: B_j(t) = C(3, j) t^j (1 - t)^(3 - j); at t = 1/2: (1, 3, 3, 1) / 8 (worked by hand)
    assert bspline_basis(torch.tensor([0.5], dtype=torch.float64), 4, 3)[0].tolist() == [0.125, 0.375, 0.375, 0.125]
    t = torch.linspace(0, 1, 11, dtype=torch.float64)
    bern = torch.stack([math.comb(3, j) * t**j * (1 - t) ** (3 - j) for j in range(4)], -1)
    torch.testing.assert_close(bspline_basis(t, 4, 3), bern)


def test_hand_worked_interior_values():
    # K = 4, p = 2: knots 0,0,0,1/2,1,1,1. At t = 1/4: B = (1/4, 5/8, 1/8, 0) (Cox-de Boor by hand);
    # at the interior knot t = 1/2: (0, 1/2, 1/2, 0).
    b = bspline_basis(torch.tensor([0.25, 0.5], dtype=torch.float64), 4, 2)
    assert b[0].tolist() == [0.25, 0.625, 0.125, 0.0]
    assert b[1].tolist() == [0.0, 0.5, 0.5, 0.0]
    # degree 1 is piecewise-linear interpolation of the control points at t = j / (K - 1)
    cp = torch.tensor([[[0.0], [2.0], [-1.0]]], dtype=torch.float64)
    out = evaluate_spline(cp, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64), degree=1)
    assert out[0, :, 0].tolist() == [0.0, 1.0, 2.0, 0.5, -1.0]


@pytest.mark.parametrize("k, p", [(4, 3), (8, 3), (5, 2), (10, 4), (3, 1)])
def test_partition_of_unity_endpoints_and_linear_precision(k, p):
    t = torch.cat([torch.linspace(0, 1, 101, dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64)])
    basis = bspline_basis(t, k, p)
    assert basis.shape == (103, k) and (basis >= 0).all()
    torch.testing.assert_close(basis.sum(-1), torch.ones(103, dtype=torch.float64))
    cp = torch.randn(2, k, 3, dtype=torch.float64)
    ends = evaluate_spline(cp, torch.tensor([0.0, 1.0], dtype=torch.float64), p)
    torch.testing.assert_close(ends[:, 0], cp[:, 0])  # clamped: s(0) = c_1, s(1) = c_K
    torch.testing.assert_close(ends[:, 1], cp[:, -1])
    # control points a + b * xi_j (Greville abscissae) give the straight line a + b t
    a, b = torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([3.0, 0.5], dtype=torch.float64)
    line = a + greville_abscissae(k, p)[:, None] * b
    torch.testing.assert_close(evaluate_spline(line[None], t, p)[0], a + t[:, None] * b)


def test_matches_scipy_bspline():
    scipy_interp = pytest.importorskip("scipy.interpolate")
    k, p = 7, 3
    cp = torch.randn(1, k, 2, dtype=torch.float64)
    t = torch.rand(50, dtype=torch.float64)
    ref = scipy_interp.BSpline(clamped_uniform_knots(k, p).numpy(), cp[0].numpy(), p)(t.numpy())
    torch.testing.assert_close(evaluate_spline(cp, t, p)[0], torch.from_numpy(ref))


def test_local_support():
    # c_j moves s(t) only on [u_j, u_{j+p+1}): with K = 8, p = 3 (spans of 1/5), c_0 acts on [0, 1/5)
    k, p = 8, 3
    cp = torch.randn(1, k, 2, dtype=torch.float64)
    edited = cp.clone()
    edited[0, 0] += 1.0
    t = torch.linspace(0, 1, 201, dtype=torch.float64)
    diff = (evaluate_spline(edited, t, p) - evaluate_spline(cp, t, p)).abs().sum(-1)[0]
    assert (diff[t >= 0.2] == 0).all() and (diff[t < 0.2] > 0).all()


def test_any_number_of_points_and_batched_times():
    cp = torch.randn(3, 6, 4)
    for n in (1, 2, 7, 1000):
        assert evaluate_spline(cp, uniform_times(n), 3).shape == (3, n, 4)
    t = torch.rand(3, 9)
    per_row = evaluate_spline(cp, t)
    for i in range(3):
        torch.testing.assert_close(per_row[i], evaluate_spline(cp[i:i + 1], t[i])[0])
    # more points than ever used: samples of the same curve (the coarse grid is a subset of the fine one)
    coarse, fine = evaluate_spline(cp, uniform_times(5)), evaluate_spline(cp, uniform_times(17))
    torch.testing.assert_close(fine[:, ::4], coarse)


def test_gradcheck_float64():
    cp = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    # times away from the knots (0, 1/3, 2/3, 1), where the basis is smooth in t
    t = torch.tensor([0.1, 0.25, 0.5, 0.6, 0.9], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c, tt: evaluate_spline(c, tt, 3), (cp, t))
    t2 = torch.tensor([[0.05, 0.4], [0.7, 0.95]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c, tt: evaluate_spline(c, tt, 3), (cp, t2))


@pytest.mark.parametrize(
    "cp, t, degree, exc, needle",
    [
        (torch.randn(1, 3, 2), torch.rand(4), 3, ValueError, "control_points: a degree-3 B-spline needs at least 4"),
        (torch.randn(3, 2), torch.rand(4), 3, ValueError, "control_points must be [batch, num_control, dim]"),
        (torch.randn(1, 5, 2), torch.rand(2, 2, 2), 3, ValueError, "t must be [num_points] or [batch=1"),
        (torch.randn(2, 5, 2), torch.rand(3, 4), 3, ValueError, "t must be [num_points] or [batch=2"),
        (torch.randn(1, 5, 2), torch.tensor([0.5, 1.5]), 3, ValueError, "t must lie in [0, 1]"),
        (torch.randn(1, 5, 2), torch.tensor([-0.1]), 3, ValueError, "t must lie in [0, 1]"),
        (torch.randn(1, 5, 2), torch.tensor([float("nan")]), 3, ValueError, "t must lie in [0, 1]"),
        (torch.randn(1, 5, 2), torch.tensor([0, 1]), 3, TypeError, "t must be a floating-point tensor"),
        (torch.randn(1, 5, 2), torch.rand(3), 0, ValueError, "degree must be an int >= 1"),
        (torch.ones(1, 5, 2, dtype=torch.long), torch.rand(3), 3, TypeError, "control_points must be floating point"),
    ],
)
def test_bad_input_names_the_argument(cp, t, degree, exc, needle):
    with pytest.raises(exc, match=None) as info:
        evaluate_spline(cp, t, degree)
    assert needle in str(info.value)


# ----------------------------------------------------------------------------------------------
# SplineTransformer


def _model(depth: int = 1, **kw) -> SplineTransformer:
    torch.manual_seed(0)
    return SplineTransformer(2, 32, depth, 2, num_control_points=6, **kw).eval()


def test_encode_edit_decode_round_trip():
    model = _model()
    x = torch.randn(3, 20, 2)
    cp = model.encode(x)
    assert cp.shape == (3, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.decode(cp, 20))
        for n in (1, 20, 80):
            assert model.decode(cp, n).shape == (3, n, 2)
        assert model(x, out_length=57).shape == (3, 57, 2)
        # the trajectory the decoder reads starts and ends at the first and last control points
        traj = model.trajectory(cp, 9)
        torch.testing.assert_close(traj[:, 0], cp[:, 0])
        torch.testing.assert_close(traj[:, -1], cp[:, -1])


def test_editing_a_control_point_changes_the_output_locally():
    # K = 6, p = 3: spans of 1/3; c_0 acts on t < 1/3, i.e. on samples 0..19 of 61 (t_i = i / 60)
    n = 61
    x = torch.randn(1, 20, 2)
    windowed = _model(decoder_window=3)  # one block, window 3: the edit spreads at most 2 samples
    with torch.no_grad():
        cp = windowed.encode(x)
        edited = cp.clone()
        # a random direction: a shift along (1, ..., 1) would be invisible behind the blocks' LayerNorms
        edited[0, 0] += torch.randn(32, generator=torch.Generator().manual_seed(0))
        before, after = windowed.trajectory(cp, n), windowed.trajectory(edited, n)
        moved = (after - before).abs().sum(-1)[0] > 0
        assert moved[:20].all() and not moved[20:].any()
        out_moved = (windowed.decode(edited, n) - windowed.decode(cp, n)).abs().sum(-1)[0] > 0
        assert out_moved[:20].all() and not out_moved[22:].any()
        # with full attention the decoder mixes every sample: the output changes most where the trajectory did
        full = _model()
        change = (full.decode(edited, n) - full.decode(cp, n)).norm(dim=-1)[0]
        assert change[:20].mean() > 2 * change[30:].mean()


def test_causal_encoder_sees_order_and_full_encoder_does_not():
    x = torch.randn(2, 12, 2)
    rev = x.flip(1)
    with torch.no_grad():
        full = _model(2, encoder_mask="full")
        torch.testing.assert_close(full.encode(x), full.encode(rev), rtol=1e-4, atol=1e-5)  # a set, not a sequence
        causal = _model(2)
        assert (causal.encode(x) - causal.encode(rev)).abs().max() > 1e-3
        # one causal block is not enough: the control tokens read the inputs once, as a set
        one = _model(1)
        torch.testing.assert_close(one.encode(x), one.encode(rev), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("encoding", ["alibi", "sinusoidal", "rope"])
def test_an_encoder_encoding_gives_a_bidirectional_encoder_order(encoding):
    x = torch.randn(2, 12, 2)
    with torch.no_grad():
        model = _model(1, encoder_mask="full", encoder_encoding=encoding)
        assert (model.encode(x) - model.encode(x.flip(1))).abs().max() > 1e-4
        assert model(x, out_length=30).shape == (2, 30, 2)
    assert all(block.attn.encoding is None for block in model.decoder.blocks)  # never in the decoder


def test_training_step_reduces_the_loss():
    model = _model().train()
    x = SmoothCurves(16, 16, seed=0).data
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.mse_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize(
    "call, exc, needle",
    [
        (lambda m: m(torch.randn(2, 5, 2), out_length=0), ValueError, "out_length must be an int >= 1"),
        (lambda m: m(torch.randn(2, 5, 2), out_length=2.5), ValueError, "out_length must be an int >= 1"),
        (lambda m: m(torch.randn(5, 2)), ValueError, "x must be [batch, length >= 1, in_dim=2]"),
        (lambda m: m(torch.randn(2, 5, 3)), ValueError, "x must be [batch, length >= 1, in_dim=2]"),
        (lambda m: m.decode(torch.randn(2, 5, 32), 4), ValueError, "control_points must be [batch, num_control_points=6"),
        (lambda m: m.decode(torch.randn(2, 6, 32), 0), ValueError, "length must be an int >= 1"),
    ],
)
def test_model_bad_input(call, exc, needle):
    with pytest.raises(exc) as info:
        call(_model())
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"num_control_points": 3}, "num_control_points: a degree-3 B-spline needs at least 4"),
        ({"degree": 0}, "degree must be an int >= 1"),
        ({"encoder_mask": "left"}, "encoder_mask must be one of causal, full"),
        ({"decoder_window": 0}, "decoder_window must be a positive int; got 0"),
        ({"encoder_encoding": "fire"}, "encoder_encoding 'fire' is defined for causal attention only"),
        ({"encoder_encoding": "alibi", "encoding_options": {"symmetric": False}}, "causal attention only"),
        ({"encoder_encoding": "nope2"}, "encoder_encoding: unknown encoding 'nope2'"),
        ({"encoding_options": {"base": 10.0}}, "encoding_options needs an encoding name"),
    ],
)
def test_constructor_bad_input(kw, needle):
    args = {"num_control_points": 6, **kw}
    with pytest.raises(ValueError) as info:
        SplineTransformer(2, 32, 1, 2, **args)
    assert needle in str(info.value)


# ----------------------------------------------------------------------------------------------
# the baseline and the data


def test_spread_positions():
    pos = torch.arange(8).unsqueeze(0)
    assert spread_positions(pos, 4).tolist() == [[0.875, 2.625, 4.375, 6.125]]  # 7 * (k + 1/2) / 4


@pytest.mark.parametrize("encoding", ["alibi", "sinusoidal"])
def test_positional_autoencoder_shapes_and_positions(encoding):
    torch.manual_seed(0)
    model = PositionalAutoencoder(2, 32, 1, 2, num_latents=6, encoding=encoding).eval()
    x = torch.randn(3, 10, 2)
    with torch.no_grad():
        z = model.encode(x)
        assert z.shape == (3, 6, 32)
        assert model(x).shape == (3, 10, 2) and model(x, 40).shape == (3, 40, 2)
        assert model(x, 19, out_positions=torch.linspace(0, 9, 19)).shape == (3, 19, 2)  # a finer grid, float positions
    # the queries differ only by their positions: without an encoding every output element is the same
    plain = PositionalAutoencoder(2, 32, 1, 2, num_latents=6, encoding=None).eval()
    with torch.no_grad():
        out = plain(x)
    torch.testing.assert_close(out, out[:, :1].expand_as(out))


def test_positional_autoencoder_bad_input():
    with pytest.raises(ValueError, match="causal attention only"):
        PositionalAutoencoder(2, 32, 1, 2, encoding="alibi", encoding_options={"symmetric": False})
    with pytest.raises(ValueError, match="encoding: unknown encoding 'nope2'"):
        PositionalAutoencoder(2, 32, 1, 2, encoding="nope2")
    model = PositionalAutoencoder(2, 32, 1, 2, num_latents=6)
    with pytest.raises(ValueError, match="out_length must be an int >= 1"):
        model(torch.randn(1, 4, 2), 0)


def test_curves_resample_the_same_curves():
    coarse = SmoothCurves(5, 9, seed=3)
    assert coarse.data.shape == (5, 9, 2) and len(coarse) == 5 and coarse[2].shape == (9, 2)
    fine = coarse.points(33)
    torch.testing.assert_close(fine[:, ::4], coarse.data)
    torch.testing.assert_close(SmoothCurves(5, 33, seed=3).data, fine)
    assert not torch.allclose(SmoothCurves(5, 9, seed=4).data, coarse.data)
    # open curves: the two ends differ
    assert ((coarse.data[:, 0] - coarse.data[:, -1]).norm(dim=-1) > 1e-3).all()
    with pytest.raises(ValueError, match="length must be a positive int"):
        coarse.points(0)
