"""Vision encodings: PEG, 2D sinusoidal, learned 2D, axial, 2D RoPE, 2D relative bias.

Each is checked against its formula (computed independently here), its invariances, and, for the
score bias, every kernel path against the float64 reference.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.common.attention import attend
from posenc.vision import (
    PEG,
    AxialEncoding,
    Learned2D,
    PatchTokensOnly,
    RelativePositionBias2D,
    Rope2DAxial,
    Rope2DMixed,
    SinCos2D,
    grid_positions,
    resample_grid,
)
from tests import reference


def _grid(x_tokens: torch.Tensor, rows: int, cols: int, prefix: int) -> torch.Tensor:
    """Patch tokens of ``[B, P + R*C, D]`` as ``[B, R, C, D]``."""
    return x_tokens[:, prefix:].reshape(x_tokens.shape[0], rows, cols, -1)


# ---------------------------------------------------------------------------------------- PEG


@pytest.mark.parametrize("kernel_size", [3, 5])
def test_peg_is_translation_equivariant_away_from_the_borders(kernel_size):
    torch.manual_seed(0)
    rows, cols, dim, prefix = 9, 11, 4, 1
    peg = PEG(dim, kernel_size=kernel_size, num_prefix_tokens=prefix)
    pos = grid_positions(rows, cols, num_prefix_tokens=prefix)
    content = torch.randn(2, rows, cols, dim)
    dr, dc = 1, 2
    shifted = torch.zeros_like(content)
    shifted[:, dr:, dc:] = content[:, : rows - dr, : cols - dc]  # content moves down 1, right 2

    def run(grid):
        x = torch.cat((torch.randn(2, prefix, dim), grid.reshape(2, rows * cols, dim)), dim=1)
        return _grid(peg(x, pos), rows, cols, prefix)

    y, y_shift = run(content), run(shifted)
    band = kernel_size // 2
    checked = 0
    for r in range(rows):
        for c in range(cols):
            src = (r - dr, c - dc)
            inside = all(band <= a < n - band for a, n in ((r, rows), (c, cols), (src[0], rows), (src[1], cols)))
            if inside:
                torch.testing.assert_close(y_shift[:, r, c], y[:, src[0], src[1]])
                checked += 1
    assert checked >= 10
    # At a border the zero padding breaks the equivariance: with the content rolled (same token,
    # now at the corner) the output there is not the rolled output.
    y_roll = run(torch.roll(content, shifts=(dr, dc), dims=(1, 2)))
    assert not torch.allclose(y_roll[:, 0, 0], y[:, rows - dr, cols - dc])


def test_peg_zero_padding_leaks_position_at_the_borders():
    torch.manual_seed(1)
    rows, cols, dim = 6, 7, 3
    peg = PEG(dim, kernel_size=3)
    x = torch.ones(1, rows * cols, dim)
    y = _grid(peg(x, grid_positions(rows, cols)), rows, cols, 0)[0]
    interior = y[1:-1, 1:-1].reshape(-1, dim)
    torch.testing.assert_close(interior, interior[:1].expand_as(interior))  # constant input: equal inside
    for r, c in [(0, 0), (0, 3), (5, 6), (2, 0)]:  # corners and edges differ from the interior
        assert not torch.allclose(y[r, c], interior[0])


def test_peg_keeps_prefix_tokens_out_and_follows_the_positions():
    torch.manual_seed(2)
    rows, cols, dim, prefix = 4, 5, 6, 2
    peg = PEG(dim, num_prefix_tokens=prefix)
    pos = grid_positions(rows, cols, num_prefix_tokens=prefix)
    x = torch.randn(3, prefix + rows * cols, dim)
    term = peg(x, pos)
    assert torch.equal(term[:, :prefix], torch.zeros(3, prefix, dim))
    out = peg.encode_input(x, pos)
    assert torch.equal(out[:, :prefix], x[:, :prefix])
    torch.testing.assert_close(out, x + term)
    # The same tokens in another order (positions permuted alongside) give the same per-token output.
    perm = torch.cat((torch.arange(prefix), prefix + torch.randperm(rows * cols)))
    torch.testing.assert_close(peg(x[:, perm], pos[:, perm]), term[:, perm])
    # The module matches an explicit depthwise convolution of the grid.
    grid = x[:, prefix:].reshape(3, rows, cols, dim).permute(0, 3, 1, 2)
    ref = torch.nn.functional.conv2d(grid, peg.proj.weight, peg.proj.bias, padding=1, groups=dim)
    torch.testing.assert_close(term[:, prefix:], ref.flatten(2).transpose(1, 2))


def test_peg_errors():
    peg = PEG(4, num_prefix_tokens=1)
    x = torch.randn(1, 1 + 12, 4)
    with pytest.raises(ValueError, match="token count"):
        peg(x, grid_positions(4, 4, num_prefix_tokens=1))
    with pytest.raises(ValueError, match="2D positions"):
        peg(x, torch.arange(13)[None])
    dup = grid_positions(3, 4, num_prefix_tokens=1).clone()
    dup[0, 2] = dup[0, 1]
    with pytest.raises(ValueError, match="share"):
        peg(x, dup)
    with pytest.raises(ValueError, match="odd"):
        PEG(4, kernel_size=4)


# ------------------------------------------------------------------------------ 2D sinusoidal


def _sincos_reference(r: float, c: float, dim: int, layout: str) -> list[float]:
    q = dim // 4
    out = [0.0] * dim
    for k in range(q):
        w = 10000.0 ** (-k / q)
        if layout == "timm":  # [sin r, sin c, cos r, cos c]
            out[k], out[q + k], out[2 * q + k], out[3 * q + k] = (
                math.sin(r * w), math.sin(c * w), math.cos(r * w), math.cos(c * w))
        else:  # MAE: column first, [sin c, cos c, sin r, cos r]
            out[k], out[q + k], out[2 * q + k], out[3 * q + k] = (
                math.sin(c * w), math.cos(c * w), math.sin(r * w), math.cos(r * w))
    return out


@pytest.mark.parametrize("layout", ["timm", "mae"])
def test_sincos2d_matches_its_formula_in_both_layouts(layout):
    dim, rows, cols = 16, 3, 5
    enc = SinCos2D(dim, layout=layout, num_prefix_tokens=1)
    pos = grid_positions(rows, cols, num_prefix_tokens=1)
    out = enc.encode_input(torch.zeros(1, 1 + rows * cols, dim, dtype=torch.float64), pos)
    assert torch.equal(out[0, 0], torch.zeros(dim, dtype=torch.float64))  # class token: zero PE
    for t in range(rows * cols):
        r, c = divmod(t, cols)
        expected = torch.tensor(_sincos_reference(r, c, dim, layout), dtype=torch.float64)
        torch.testing.assert_close(out[0, 1 + t], expected, rtol=0, atol=1e-12)
    # Float positions follow the same formula (any grid, any scale).
    fpos = torch.tensor([[[0.0, 0.0], [2.5, -1.25]]])
    fout = enc.encode_input(torch.zeros(1, 2, dim, dtype=torch.float64), fpos)
    torch.testing.assert_close(
        fout[0, 1], torch.tensor(_sincos_reference(2.5, -1.25, dim, layout), dtype=torch.float64), rtol=0, atol=1e-12
    )


def test_sincos2d_layouts_differ_and_dim_is_checked():
    pos = grid_positions(2, 3)
    x = torch.zeros(1, 6, 8)
    assert not torch.allclose(SinCos2D(8, layout="timm").encode_input(x, pos), SinCos2D(8, layout="mae").encode_input(x, pos))
    with pytest.raises(ValueError, match="multiple of 4"):
        SinCos2D(6)
    with pytest.raises(ValueError, match="layout"):
        SinCos2D(8, layout="xy")


# --------------------------------------------------------------------------------- learned 2D


def test_learned2d_same_grid_is_the_identity():
    torch.manual_seed(3)
    enc = Learned2D(5, grid_size=(3, 4), num_prefix_tokens=1)
    assert resample_grid(enc.table, (3, 4)) is enc.table
    x = torch.randn(2, 1 + 12, 5)
    out = enc.encode_input(x, grid_positions(3, 4, num_prefix_tokens=1))
    assert torch.equal(out[:, 0], x[:, 0])
    assert torch.equal(out[:, 1:], x[:, 1:] + enc.table.reshape(12, 5))


def test_learned2d_resampling_is_bicubic_and_keeps_a_linear_table_linear_inside():
    rows, cols, dim = 6, 8, 3
    enc = Learned2D(dim, grid_size=(rows, cols))
    r = torch.arange(rows, dtype=torch.float32)[:, None, None]
    c = torch.arange(cols, dtype=torch.float32)[None, :, None]
    slope = torch.tensor([1.0, -2.0, 0.5])
    with torch.no_grad():
        enc.table.copy_(0.3 * r * slope + 0.7 * c - 1.0 + 0 * slope)
    new = (12, 12)
    table = enc.table_for(new)
    assert table.shape == (12, 12, dim)
    # align_corners=False: new index i sits at source coordinate (i + 0.5) * old / new - 0.5.
    checked = 0
    for i in range(new[0]):
        for j in range(new[1]):
            sr, sc = (i + 0.5) * rows / new[0] - 0.5, (j + 0.5) * cols / new[1] - 0.5
            if 1 <= sr <= rows - 2 and 1 <= sc <= cols - 2:  # the 4-tap support stays inside
                expected = 0.3 * sr * slope + 0.7 * sc - 1.0
                torch.testing.assert_close(table[i, j], expected, rtol=0, atol=1e-4)
                checked += 1
    assert checked > 20
    # It is what timm does: bicubic, antialiased, align_corners=False, on a [1, D, R, C] image.
    ref = torch.nn.functional.interpolate(
        enc.table.permute(2, 0, 1)[None], size=new, mode="bicubic", align_corners=False, antialias=True
    )[0].permute(1, 2, 0)
    torch.testing.assert_close(table, ref)
    # The encoding uses the resampled table for a larger image.
    x = torch.zeros(1, 144, dim)
    torch.testing.assert_close(enc.encode_input(x, grid_positions(*new))[0], table.reshape(144, dim))


def test_learned2d_errors():
    enc = Learned2D(4, grid_size=3, new_grid="refuse")
    with pytest.raises(ValueError, match="refuse"):
        enc.encode_input(torch.randn(1, 16, 4), grid_positions(4, 4))
    with pytest.raises(ValueError, match="token count"):
        enc.encode_input(torch.randn(1, 10, 4), grid_positions(3, 3))
    with pytest.raises(ValueError, match="integer"):
        enc.encode_input(torch.randn(1, 9, 4), grid_positions(3, 3).float() + 0.5)
    with pytest.raises(ValueError, match=">= 0"):
        enc.encode_input(torch.randn(1, 9, 4), grid_positions(3, 3) - 1)


# --------------------------------------------------------------------------------------- axial


@pytest.mark.parametrize("mode", ["sum", "concat"])
def test_axial_formula_and_resampling(mode):
    torch.manual_seed(4)
    dim, rows, cols = 8, 3, 5
    enc = AxialEncoding(dim, grid_size=(rows, cols), mode=mode, num_prefix_tokens=1)
    x = torch.zeros(1, 1 + rows * cols, dim)
    out = enc.encode_input(x, grid_positions(rows, cols, num_prefix_tokens=1))
    assert torch.equal(out[0, 0], torch.zeros(dim))
    for t in range(rows * cols):
        r, c = divmod(t, cols)
        if mode == "sum":
            expected = enc.row_table[r] + enc.col_table[c]
        else:
            expected = torch.cat((enc.row_table[r], enc.col_table[c]))
        torch.testing.assert_close(out[0, 1 + t], expected)
    n_params = sum(p.numel() for p in enc.parameters())
    assert n_params == ((rows + cols) * dim if mode == "sum" else rows * 4 + cols * 4)
    # A new grid resamples each axis on its own; the training length is kept exactly.
    row_t, col_t = enc.tables_for((6, cols))
    assert row_t.shape[0] == 6 and col_t is enc.col_table
    big = enc.encode_input(torch.zeros(1, 1 + 6 * 10, dim), grid_positions(6, 10, num_prefix_tokens=1))
    assert big.shape == (1, 61, dim)


def test_axial_refuses_when_asked():
    enc = AxialEncoding(8, grid_size=4, new_grid="refuse")
    with pytest.raises(ValueError, match="refuse"):
        enc.encode_input(torch.zeros(1, 25, 8), grid_positions(5, 5))
    with pytest.raises(ValueError, match="row_dim"):
        AxialEncoding(8, grid_size=4, mode="concat", row_dim=8)


# ------------------------------------------------------------------------------------- 2D RoPE


def _rope_encodings():
    torch.manual_seed(5)
    return {
        "axial": Rope2DAxial(head_dim=8, num_prefix_tokens=1),
        "axial_half": Rope2DAxial(head_dim=8, num_prefix_tokens=1, pairing="half_split"),
        "mixed": Rope2DMixed(head_dim=8, num_heads=2, num_prefix_tokens=1),
    }


def _scores(enc, q, k, pos):
    q2, k2 = enc.transform_qk(q, k, pos, pos)
    return q2 @ k2.transpose(-1, -2), q2, k2


@pytest.mark.parametrize("kind", ["axial", "axial_half", "mixed"])
def test_rope2d_scores_depend_only_on_the_2d_offset(kind):
    enc = _rope_encodings()[kind]
    torch.manual_seed(6)
    q, k = torch.randn(1, 2, 7, 8, dtype=torch.float64), torch.randn(1, 2, 7, 8, dtype=torch.float64)
    pos = torch.cat((torch.zeros(1, 1, 2), torch.randint(-5, 9, (1, 6, 2)).double()), dim=1)
    base, q2, k2 = _scores(enc, q, k, pos)
    for shift in ([3.0, -5.0], [0.5, 1.25], [-10.0, 7.0]):
        moved = pos.clone()
        moved[:, 1:] += torch.tensor(shift, dtype=torch.float64)
        # Among patch tokens (the prefix token is not rotated, so its scores do move).
        torch.testing.assert_close(_scores(enc, q, k, moved)[0][..., 1:, 1:], base[..., 1:, 1:])
    # ... but they do depend on the offset: moving one token changes its scores.
    one = pos.clone()
    one[0, 3] += torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert not torch.allclose(_scores(enc, q, k, one)[0][..., 3, :], base[..., 3, :])
    one = pos.clone()
    one[0, 3] += torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert not torch.allclose(_scores(enc, q, k, one)[0][..., 3, :], base[..., 3, :])
    # Norms are preserved and the prefix token is not rotated.
    torch.testing.assert_close(q2.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(k2.norm(dim=-1), k.norm(dim=-1))
    assert torch.equal(q2[:, :, 0], q[:, :, 0]) and torch.equal(k2[:, :, 0], k[:, :, 0])


@pytest.mark.parametrize("pairing", ["interleaved", "half_split"])
def test_rope2d_axial_matches_its_formula(pairing):
    d, base = 8, 100.0
    enc = Rope2DAxial(head_dim=d, pairing=pairing)
    torch.manual_seed(7)
    q = torch.randn(1, 1, 4, d, dtype=torch.float64)
    pos = torch.tensor([[[0, 0], [1, 2], [3, 1], [2, 5]]])
    out, _ = enc.transform_qk(q, q, pos, pos)
    for t in range(4):
        row, col = pos[0, t].tolist()
        for pair in range(d // 2):  # x (column) pairs first, then y (row) pairs
            j = pair % (d // 4)
            angle = (col if pair < d // 4 else row) * base ** (-4.0 * j / d)
            i0, i1 = (2 * pair, 2 * pair + 1) if pairing == "interleaved" else (pair, pair + d // 2)
            a, b = q[0, 0, t, i0].item(), q[0, 0, t, i1].item()
            expected = (a * math.cos(angle) - b * math.sin(angle), b * math.cos(angle) + a * math.sin(angle))
            assert out[0, 0, t, i0].item() == pytest.approx(expected[0], abs=1e-12)
            assert out[0, 0, t, i1].item() == pytest.approx(expected[1], abs=1e-12)


def test_rope2d_mixed_initialisation_and_learned_frequencies():
    torch.manual_seed(8)
    d, heads = 16, 3
    enc = Rope2DMixed(head_dim=d, num_heads=heads)
    fx, fy = enc.freqs.detach()
    assert enc.freqs.shape == (2, heads, d // 2) and enc.freqs.requires_grad
    mag = torch.tensor([10.0 ** (-4.0 * j / d) for j in range(d // 4)])
    torch.testing.assert_close(torch.hypot(fx, fy), torch.cat((mag, mag)).expand(heads, -1))
    # Second half of the pairs points at alpha + pi/2: orthogonal directions, one alpha per head.
    first = torch.stack((fx[:, 0], fy[:, 0]), -1) / mag[0]
    second = torch.stack((fx[:, d // 4], fy[:, d // 4]), -1) / mag[0]
    torch.testing.assert_close((first * second).sum(-1), torch.zeros(heads), atol=1e-6, rtol=0)
    alpha = torch.atan2(fy, fx)[:, : d // 4]
    torch.testing.assert_close(alpha, alpha[:, :1].expand_as(alpha))
    assert len({round(a, 4) for a in alpha[:, 0].tolist()}) == heads
    # Gradients reach the frequencies through attention.
    q, k, v = (torch.randn(2, heads, 10, d) for _ in range(3))
    pos = grid_positions(3, 3, num_prefix_tokens=1)
    enc = Rope2DMixed(head_dim=d, num_heads=heads, num_prefix_tokens=1)
    attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc).pow(2).sum().backward()
    assert enc.freqs.grad is not None and enc.freqs.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="heads"):
        enc.transform_qk(q, k[:, :1], pos, pos)


def test_rope2d_errors():
    with pytest.raises(ValueError, match="multiple of 4"):
        Rope2DAxial(head_dim=6)
    enc = Rope2DAxial(head_dim=8)
    with pytest.raises(ValueError, match="2D positions"):
        enc.transform_qk(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), torch.arange(4)[None], torch.arange(4)[None])


# ----------------------------------------------------------------------- 2D relative bias


def _relbias_reference(table: torch.Tensor, pos: torch.Tensor, prefix: int, grid: tuple[int, int], prefix_bias: bool):
    """``[1, H, T, T]`` float64 by loops from the Swin/BEiT definition."""
    rows, cols = grid
    heads, t = table.shape[0], pos.shape[1]
    out = torch.zeros(1, heads, t, t, dtype=torch.float64)
    n_off = (2 * rows - 1) * (2 * cols - 1)
    for i in range(t):
        for j in range(t):
            if i < prefix or j < prefix:
                if prefix_bias:
                    slot = n_off + (2 if (i < prefix and j < prefix) else 0 if i < prefix else 1)
                    out[0, :, i, j] = table[:, slot].double()
                continue
            (ri, ci), (rj, cj) = pos[0, i].tolist(), pos[0, j].tolist()
            out[0, :, i, j] = table[:, (ri - rj + rows - 1) * (2 * cols - 1) + (ci - cj + cols - 1)].double()
    return out


@pytest.mark.parametrize("prefix_bias", [False, True])
def test_relbias2d_lands_at_the_right_offsets_on_every_path(prefix_bias):
    torch.manual_seed(9)
    heads, grid, prefix, d = 2, (3, 4), 1, 8
    enc = RelativePositionBias2D(heads, grid, num_prefix_tokens=prefix, prefix_bias=prefix_bias)
    with torch.no_grad():
        enc.table.normal_()
    pos = grid_positions(*grid, num_prefix_tokens=prefix)
    t = pos.shape[1]
    ref_bias = _relbias_reference(enc.table.detach(), pos, prefix, grid, prefix_bias)
    q, k, v = (torch.randn(2, heads, t, d, dtype=torch.float32) for _ in range(3))
    bias = enc.score_bias(q, k, pos, pos)
    dense = bias.dense(1, heads, torch.arange(t), torch.arange(t))
    torch.testing.assert_close(dense.double(), ref_bias)

    ref_table = enc.table.detach().double().requires_grad_(True)
    ref_out = reference.attention(q, k, v, None, score_bias=_relbias_reference(ref_table, pos, prefix, grid, prefix_bias))
    ref_out.pow(2).sum().backward()
    for backend in ["dense", "math", "flex"]:
        enc.table.grad = None
        with torch.set_grad_enabled(backend != "flex"):  # flex has no backward on CPU
            out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, backend=backend)
        torch.testing.assert_close(out.double(), ref_out.detach(), atol=1e-5, rtol=1e-5)
        if backend != "flex":
            out.pow(2).sum().backward()
            torch.testing.assert_close(enc.table.grad.double(), ref_table.grad, atol=1e-4, rtol=1e-4)


def test_relbias2d_new_grids_resample_or_refuse():
    torch.manual_seed(10)
    enc = RelativePositionBias2D(2, (3, 3), num_prefix_tokens=1, prefix_bias=True)
    assert enc.table_for((3, 3)) is enc.table
    bigger = enc.table_for((5, 4))
    assert bigger.shape == (2, 9 * 7 + 3)
    torch.testing.assert_close(bigger[:, -3:], enc.table[:, -3:])
    # The zero offset stays at the centre of a resampled table of a constant-in-offset map.
    with torch.no_grad():
        enc.table.fill_(0.25)
    torch.testing.assert_close(enc.table_for((5, 4)), torch.full((2, 66), 0.25), atol=1e-6, rtol=0)
    q = torch.randn(1, 2, 21, 8)
    pos = grid_positions(5, 4, num_prefix_tokens=1)
    out = attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc)
    assert out.shape == q.shape
    strict = RelativePositionBias2D(2, (3, 3), new_grid="refuse")
    with pytest.raises(ValueError, match="refuse"):
        strict.score_bias(q[:, :, :20], q[:, :, :20], grid_positions(5, 4), grid_positions(5, 4))
    with pytest.raises(ValueError, match="integer"):
        strict.score_bias(q[:, :, :9], q[:, :, :9], grid_positions(3, 3) + 0.5, grid_positions(3, 3) + 0.5)


# -------------------------------------------------------------------- prefix for 1D encodings


def test_patch_tokens_only_keeps_prefix_out_of_a_seq_encoding():
    torch.manual_seed(11)
    rope = posenc.build("rope", head_dim=8)
    wrapped = PatchTokensOnly(rope, 2)
    q, k = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    pos = torch.tensor([[0, 0, 0, 1, 2, 3, 4]])
    q2, k2 = wrapped.transform_qk(q, k, pos, pos)
    assert torch.equal(q2[:, :, :2], q[:, :, :2])
    ref_q, _ = rope.transform_qk(q[:, :, 2:], k[:, :, 2:], pos[:, 2:], pos[:, 2:])
    torch.testing.assert_close(q2[:, :, 2:], ref_q)
    alibi = PatchTokensOnly(posenc.build("alibi", num_heads=2, symmetric=True), 2)
    dense = alibi.score_bias(q, k, pos, pos).dense(1, 2, torch.arange(7), torch.arange(7))
    assert torch.equal(dense[..., :2, :], torch.zeros_like(dense[..., :2, :]))
    assert torch.equal(dense[..., :, :2], torch.zeros_like(dense[..., :, :2]))
    assert dense[0, 0, 2, 6].item() == pytest.approx(-alibi.inner.slopes[0].item() * 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only (compiled FlexAttention with backward)")
def test_relbias2d_flex_on_cuda_matches_the_reference_forward_and_backward():
    torch.manual_seed(12)
    heads, grid, d = 2, (4, 5), 16
    enc = RelativePositionBias2D(heads, grid, num_prefix_tokens=1, prefix_bias=True).cuda()
    with torch.no_grad():
        enc.table.normal_()
    pos = grid_positions(*grid, num_prefix_tokens=1, device="cuda")
    q, k, v = (torch.randn(2, heads, pos.shape[1], d, device="cuda") for _ in range(3))
    ref_table = enc.table.detach().double().cpu().requires_grad_(True)
    ref_out = reference.attention(q.cpu(), k.cpu(), v.cpu(), None,
                                  score_bias=_relbias_reference(ref_table, pos.cpu(), 1, grid, True))
    ref_out.pow(2).sum().backward()
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, backend="flex")
    out.pow(2).sum().backward()
    torch.testing.assert_close(out.double().cpu(), ref_out.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(enc.table.grad.double().cpu(), ref_table.grad, atol=1e-3, rtol=1e-3)


def test_peg_in_the_encoder_slot_refuses_a_mask_or_a_cache():
    peg = PEG(8)
    x, pos = torch.randn(1, 4, 8), grid_positions(2, 2)
    torch.testing.assert_close(peg(x, pos, mask=posenc.AttentionMask()), peg(x, pos))  # an empty mask is fine
    with pytest.raises(ValueError, match="PEG takes no attention mask"):
        peg(x, pos, mask=posenc.AttentionMask(causal=True))
    with pytest.raises(ValueError, match="PEG has no cached decoding"):
        peg(x, pos, cache=posenc.KVCache(1)[0])
