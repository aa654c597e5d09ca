"""Space-time encodings (sincos3d, axial3d, rope3d), the video path of the ViT, the moving-digit
clips and ``posenc train vision --video``.

Values are checked against hand-worked cases and the formulas, RoPE against its offset
invariance, the ViT against frame permutations (a model that sees time changes its answer, a
model with no encoding and symmetric pooling cannot).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.cli import main
from posenc.common.encoding import PositionEncoding
from posenc.vision import (
    Axial3D,
    Rope2DAxial,
    Rope3D,
    SinCos3D,
    ViT,
    grid_positions,
    grid_positions3d,
    sincos2d_table,
    sincos3d_table,
)
from posenc.vision.data import DIRECTIONS, MovingDigits

VIDEO = ["sincos3d", "axial3d", "rope3d"]
SMALL = dict(img_size=8, patch_size=4, in_chans=1, num_classes=4, dim=32, depth=2, num_heads=2)


def test_the_3d_encodings_are_registered_as_vision_encodings():
    infos = {i.name: i for i in posenc.available("vision")}
    for name in VIDEO:
        assert infos[name].cls.grid_ndim == 3
    assert infos["sincos3d"].hooks == ("input",) and infos["axial3d"].hooks == ("input",)
    assert infos["rope3d"].hooks == ("qk",)


def test_grid_positions3d_is_raster_order_with_time_outermost():
    pos = grid_positions3d(2, 2, 3, num_prefix_tokens=1)
    assert pos.shape == (1, 1 + 12, 3) and pos[0, 0].tolist() == [0, 0, 0]
    expected = [[t, r, c] for t in range(2) for r in range(2) for c in range(3)]
    assert pos[0, 1:].tolist() == expected
    assert torch.equal(grid_positions(2, 3)[0], pos[0, 1:7, 1:])  # each frame is the 2D grid
    with pytest.raises(ValueError, match="frames=0"):
        grid_positions3d(0, 2, 2)


# ------------------------------------------------------------------------------------ sincos3d


def test_sincos3d_hand_worked_values():
    # dim 6, time_dim 2: one frequency (omega = 1) per axis, layout [sin t, cos t, sin c, cos c, sin r, cos r].
    pe = sincos3d_table(torch.tensor([[1.0, 2.0, 3.0]]), 6, time_dim=2)[0]
    t, r, c = 1.0, 2.0, 3.0
    expected = [math.sin(t), math.cos(t), math.sin(c), math.cos(c), math.sin(r), math.cos(r)]
    assert pe.tolist() == pytest.approx(expected, abs=1e-15)
    # dim 12, time_dim 4: each axis 4 wide, omega = (1, 10000^(-2/4) = 0.01), sines first then cosines.
    pe = sincos3d_table(torch.tensor([[1.0, 2.0, 3.0]]), 12, time_dim=4)[0]
    expected = []
    for p in (t, c, r):
        expected += [math.sin(p), math.sin(0.01 * p), math.cos(p), math.cos(0.01 * p)]
    assert pe.tolist() == pytest.approx(expected, abs=1e-15)


def test_sincos3d_default_split_and_its_spatial_part_is_the_mae_2d_table():
    # dim 32: time 8 (a quarter), then 12 for columns and 12 for rows (3d/8 each), as in MAE-ST / UMT.
    torch.manual_seed(0)
    coords = torch.cat((torch.randint(0, 5, (7, 1)), torch.randint(0, 9, (7, 2))), dim=-1).double()
    pe = sincos3d_table(coords, 32)
    time = sincos3d_table(coords, 32)[:, :8]
    omega = 10000.0 ** (-torch.arange(4, dtype=torch.float64) * 2 / 8)
    angles = coords[:, :1] * omega
    torch.testing.assert_close(time, torch.cat((angles.sin(), angles.cos()), dim=-1))
    torch.testing.assert_close(pe[:, 8:], sincos2d_table(coords[:, 1:], 24, layout="mae"))


def test_sincos3d_encodes_patch_tokens_only_and_follows_any_grid():
    enc = SinCos3D(32, num_prefix_tokens=1)
    pos = grid_positions3d(3, 2, 2, num_prefix_tokens=1)
    x = torch.randn(2, 13, 32)
    out = enc.encode_input(x, pos)
    assert torch.equal(out[:, 0], x[:, 0])
    torch.testing.assert_close(out[:, 1:] - x[:, 1:], sincos3d_table(pos[0, 1:], 32).float().expand(2, -1, -1))
    # float positions are fine (nothing is stored)
    assert enc.encode_input(x, pos.double() * 0.5).shape == x.shape


def test_sincos3d_errors_name_the_argument():
    with pytest.raises(ValueError, match="multiple of 16"):
        SinCos3D(24)  # time 6, space 18: not two even halves
    with pytest.raises(ValueError, match="time_dim=3"):
        SinCos3D(16, time_dim=3)
    enc = SinCos3D(16)
    with pytest.raises(ValueError, match=r"3D positions \[batch or 1, tokens, 3\] as \(t, row, col\)"):
        enc.encode_input(torch.randn(1, 4, 16), grid_positions(2, 2))
    with pytest.raises(ValueError, match="token count"):
        enc.encode_input(torch.randn(1, 5, 16), grid_positions3d(1, 2, 2))


# ------------------------------------------------------------------------------------- axial3d


@pytest.mark.parametrize("mode", ["sum", "concat"])
def test_axial3d_is_its_tables_at_the_training_grid(mode):
    torch.manual_seed(1)
    enc = Axial3D(16, grid_size=(2, 3, 4), mode=mode, num_prefix_tokens=1)
    e_t, e_r, e_c = (t.detach() for t in enc.tables)
    if mode == "concat":
        assert enc.axis_dims == (4, 6, 6) and e_t.shape == (2, 4) and e_c.shape == (4, 6)
    pos = grid_positions3d(2, 3, 4, num_prefix_tokens=1)
    x = torch.randn(1, 1 + 24, 16)
    pe = (enc.encode_input(x, pos) - x)[0]
    assert torch.equal(pe[0], torch.zeros(16))
    for i, (t, r, c) in enumerate(pos[0, 1:].tolist(), start=1):
        want = e_t[t] + e_r[r] + e_c[c] if mode == "sum" else torch.cat((e_t[t], e_r[r], e_c[c]))
        torch.testing.assert_close(pe[i], want)
    assert all(a is b for a, b in zip(enc.tables_for((2, 3, 4)), enc.tables))  # exactly the identity


def test_axial3d_resamples_each_axis_to_a_new_grid():
    enc = Axial3D(2, grid_size=(2, 3, 3), new_grid="linear")
    with torch.no_grad():
        enc.tables[0].copy_(torch.tensor([[1.0, 0.0], [5.0, 2.0]]))
    e_t, e_r, e_c = enc.tables_for((4, 3, 5))
    # Time 2 -> 4, linear, align_corners=False: sources -0.25, 0.25, 0.75, 1.25, clamped to [0, 1].
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([5.0, 2.0])
    torch.testing.assert_close(e_t, torch.stack((a, 0.75 * a + 0.25 * b, 0.25 * a + 0.75 * b, b)))
    assert e_r is enc.tables[1]  # the row axis did not change
    ref = F.interpolate(enc.tables[2].detach().t()[None], size=5, mode="linear", align_corners=False)[0].t()
    torch.testing.assert_close(e_c.detach(), ref)
    # The encoding reads the grid from the positions and uses the resampled tables.
    pos = grid_positions3d(4, 3, 5)
    pe = enc.encode_input(torch.zeros(1, 60, 2), pos)[0]
    t, r, c = pos[0, 37].tolist()
    torch.testing.assert_close(pe[37], (e_t[t] + e_r[r] + e_c[c]).detach(), check_dtype=False)
    # Bicubic by default; refuse when asked.
    assert Axial3D(8, grid_size=2).encode_input(torch.zeros(1, 27, 8), grid_positions3d(3, 3, 3)).shape == (1, 27, 8)
    strict = Axial3D(8, grid_size=(2, 2, 2), new_grid="refuse")
    with pytest.raises(ValueError, match=r"built for the grid \(2, 2, 2\).*got the grid \(3, 2, 2\)"):
        strict.encode_input(torch.zeros(1, 12, 8), grid_positions3d(3, 2, 2))


def test_axial3d_errors():
    with pytest.raises(ValueError, match="add up to dim=16"):
        Axial3D(16, grid_size=2, mode="concat", axis_dims=(4, 4, 4))
    with pytest.raises(ValueError, match="axis_dims applies to mode='concat'"):
        Axial3D(16, grid_size=2, axis_dims=(4, 6, 6))
    with pytest.raises(TypeError, match="grid_size must be an int or a triple"):
        Axial3D(16, grid_size=(2, 2))
    enc = Axial3D(4, grid_size=2)
    with pytest.raises(ValueError, match="integer positions"):
        enc.encode_input(torch.zeros(1, 8, 4), grid_positions3d(2, 2, 2).double() + 0.5)
    with pytest.raises(ValueError, match=r"\(t, row, col\) positions >= 0"):
        enc.encode_input(torch.zeros(1, 8, 4), grid_positions3d(2, 2, 2) - 1)


# --------------------------------------------------------------------------------------- rope3d


def _scores(enc, q, k, pos):
    q2, k2 = enc.transform_qk(q, k, pos, pos)
    return q2 @ k2.transpose(-1, -2), q2, k2


@pytest.mark.parametrize("pairing,axis_pairs", [("interleaved", None), ("half_split", None), ("interleaved", (1, 2, 1))])
def test_rope3d_scores_depend_only_on_the_3d_offset_and_on_every_axis(pairing, axis_pairs):
    enc = Rope3D(head_dim=12, axis_pairs=axis_pairs, num_prefix_tokens=1, pairing=pairing)
    torch.manual_seed(2)
    q, k = torch.randn(1, 2, 9, 12, dtype=torch.float64), torch.randn(1, 2, 9, 12, dtype=torch.float64)
    pos = torch.cat((torch.zeros(1, 1, 3), torch.randint(-4, 9, (1, 8, 3)).double()), dim=1)
    base, q2, k2 = _scores(enc, q, k, pos)
    for shift in ([1.0, 3.0, -5.0], [0.5, -0.25, 1.75], [-7.0, 10.0, 2.0]):
        moved = pos.clone()
        moved[:, 1:] += torch.tensor(shift, dtype=torch.float64)
        torch.testing.assert_close(_scores(enc, q, k, moved)[0][..., 1:, 1:], base[..., 1:, 1:])
    for axis in range(3):  # moving one token along any single axis changes its scores
        one = pos.clone()
        one[0, 4, axis] += 1.0
        assert not torch.allclose(_scores(enc, q, k, one)[0][..., 4, 1:], base[..., 4, 1:])
    torch.testing.assert_close(q2.norm(dim=-1), q.norm(dim=-1))
    assert torch.equal(q2[:, :, 0], q[:, :, 0]) and torch.equal(k2[:, :, 0], k[:, :, 0])


def test_rope3d_hand_worked_rotation_and_default_split():
    # head_dim 6: one pair per axis, each with theta = 1: pair 0 turns by t, pair 1 by col, pair 2 by row.
    enc = Rope3D(head_dim=6)
    assert enc.axis_pairs == (1, 1, 1)
    q = torch.tensor([[[[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]]]], dtype=torch.float64)
    pos = torch.tensor([[[0.5, 0.25, 1.0]]], dtype=torch.float64)  # (t, row, col)
    out, _ = enc.transform_qk(q, q, pos, pos)
    expected = [math.cos(0.5), math.sin(0.5), math.cos(1.0), math.sin(1.0), math.cos(0.25), math.sin(0.25)]
    assert out[0, 0, 0].tolist() == pytest.approx(expected, abs=1e-15)
    # Default split: as equal as possible, the spare pairs to time; each axis its own ladder 100^(-j/n).
    assert Rope3D(head_dim=24).axis_pairs == (4, 4, 4) and Rope3D(head_dim=16).axis_pairs == (4, 2, 2)
    enc = Rope3D(head_dim=16, axis_pairs=(2, 3, 2), base=100.0)  # 7 of 8 pairs: the last two features pass
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    t, r, c = 2.0, 3.0, 5.0
    out, _ = enc.transform_qk(q, q, torch.tensor([[[t, r, c]]]), torch.tensor([[[t, r, c]]]))
    angles = [t * 100 ** (-j / 2) for j in range(2)] + [c * 100 ** (-j / 2) for j in range(2)]
    angles += [r * 100 ** (-j / 3) for j in range(3)]
    for pair, angle in enumerate(angles):
        a, b = q[0, 0, 0, 2 * pair].item(), q[0, 0, 0, 2 * pair + 1].item()
        assert out[0, 0, 0, 2 * pair].item() == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-12)
        assert out[0, 0, 0, 2 * pair + 1].item() == pytest.approx(b * math.cos(angle) + a * math.sin(angle), abs=1e-12)
    assert torch.equal(out[..., 14:], q[..., 14:])


@pytest.mark.parametrize("pairing", ["interleaved", "half_split"])
def test_rope3d_without_time_pairs_is_rope2d_axial_per_frame(pairing):
    torch.manual_seed(3)
    q, k = torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)
    pos3 = grid_positions3d(3, 2, 2)
    ours = Rope3D(head_dim=8, axis_pairs=(0, 2, 2), pairing=pairing).transform_qk(q, k, pos3, pos3)
    pos2 = pos3[..., 1:]
    theirs = Rope2DAxial(head_dim=8, pairing=pairing).transform_qk(q, k, pos2, pos2)
    torch.testing.assert_close(ours, theirs)


def test_rope3d_errors():
    with pytest.raises(ValueError, match="at most head_dim / 2 = 4 pairs"):
        Rope3D(head_dim=8, axis_pairs=(2, 2, 2))
    with pytest.raises(ValueError, match="positive even"):
        Rope3D(head_dim=7)
    with pytest.raises(TypeError, match="three ints"):
        Rope3D(head_dim=8, axis_pairs=(2, 2))
    enc = Rope3D(head_dim=8)
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="3D positions"):
        enc.transform_qk(q, q, grid_positions(2, 2), grid_positions(2, 2))
    with pytest.raises(ValueError, match="head_dim=8"):
        enc.transform_qk(q[..., :6], q[..., :6], grid_positions3d(1, 2, 2), grid_positions3d(1, 2, 2))


# ------------------------------------------------------------------------------------- the ViT


def _video_vit(encoding, **kw):
    return ViT(**{**SMALL, "num_frames": 4, "tubelet_size": 1, **kw}, encoding=encoding)


@pytest.mark.parametrize("name", VIDEO + ["rope"])
def test_permuting_frames_changes_a_time_aware_vit(name):
    torch.manual_seed(4)
    model = _video_vit(name, pool="avg").eval()
    clip = torch.randn(2, 1, 4, 8, 8)
    permuted = clip[:, :, [2, 0, 3, 1]]
    with torch.no_grad():
        assert not torch.allclose(model(clip), model(permuted), atol=1e-4)


@pytest.mark.parametrize("pool", ["avg", "cls"])
def test_permuting_frames_leaves_a_vit_without_encoding_unchanged(pool):
    torch.manual_seed(5)
    model = _video_vit(None, pool=pool).eval()
    clip = torch.randn(2, 1, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(clip[:, :, [2, 0, 3, 1]]), model(clip), atol=1e-5, rtol=1e-5)


def test_tubelets_see_the_order_inside_them_even_without_an_encoding():
    torch.manual_seed(6)
    model = _video_vit(None, pool="avg", tubelet_size=2).eval()
    clip = torch.randn(1, 1, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(clip[:, :, [2, 3, 0, 1]]), model(clip), atol=1e-5, rtol=1e-5)  # whole tubelets
        assert not torch.allclose(model(clip[:, :, [1, 0, 3, 2]]), model(clip), atol=1e-4)  # inside tubelets


@pytest.mark.parametrize("name", VIDEO + ["rope", None])
def test_video_vit_forward_backward_shapes_at_the_training_clip_and_others(name):
    torch.manual_seed(7)
    model = _video_vit(name, tubelet_size=2, num_register_tokens=1)
    assert isinstance(model.patch_embed, torch.nn.Conv3d) and model.patch_embed.kernel_size == (2, 4, 4)
    assert model.train_grid == (2, 2, 2) and model.num_prefix_tokens == 2
    for frames, h, w in [(4, 8, 8), (6, 8, 12), (2, 12, 8)]:
        clip = torch.randn(3, 1, frames, h, w)
        tokens = model.forward_features(clip)
        assert tokens.shape == (3, 2 + (frames // 2) * (h // 4) * (w // 4), 32)
        logits = model(clip)
        assert logits.shape == (3, 4)
    model.zero_grad()
    model(torch.randn(2, 1, 6, 8, 12)).pow(2).sum().backward()
    assert model.patch_embed.weight.grad.shape == (32, 1, 2, 4, 4)
    params = [(n, p) for m in model.modules() if isinstance(m, PositionEncoding) for n, p in m.named_parameters()]
    for n, p in params:
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient for {n}"
    if name == "axial3d":
        enc = model.encoder.encoding
        assert enc.grid_size == (2, 2, 2) and enc.num_prefix_tokens == 2 and len(params) == 3


def test_images_keep_working_unchanged():
    image = ViT(**SMALL, encoding="sincos2d")
    assert isinstance(image.patch_embed, torch.nn.Conv2d) and image.num_frames is None
    assert image(torch.randn(2, 1, 8, 8)).shape == (2, 4)


def test_bad_video_input_and_construction_give_clear_errors():
    model = _video_vit("rope3d", tubelet_size=2)
    with pytest.raises(ValueError, match=r"videos must be \[batch, channels, frames, height, width\].*num_frames=4"):
        model(torch.randn(2, 1, 8, 8))
    with pytest.raises(ValueError, match="5 frames; this ViT needs a positive multiple of tubelet_size=2"):
        model(torch.randn(1, 1, 5, 8, 8))
    with pytest.raises(ValueError, match="patch_size=4"):
        model(torch.randn(1, 1, 4, 8, 6))
    with pytest.raises(ValueError, match="in_chans=1"):
        model(torch.randn(1, 3, 4, 8, 8))
    with pytest.raises(ValueError, match=r"videos need a ViT built with num_frames"):
        ViT(**SMALL, encoding="sincos2d")(torch.randn(1, 1, 4, 8, 8))
    with pytest.raises(ValueError, match="num_frames=5 must be divisible by tubelet_size=2"):
        _video_vit(None, num_frames=5, tubelet_size=2)
    with pytest.raises(ValueError, match="tubelet_size=2 is for video"):
        ViT(**SMALL, tubelet_size=2)
    with pytest.raises(ValueError, match=r"'sincos2d' is a 2D \(image\) encoding.*axial3d, rope3d, sincos3d"):
        _video_vit("sincos2d")
    with pytest.raises(ValueError, match="'peg' is a 2D"):
        _video_vit("peg")
    with pytest.raises(ValueError, match="'rope3d' is a 3D \\(video\\) encoding.*num_frames"):
        ViT(**SMALL, encoding="rope3d")
    with pytest.raises(ValueError, match="SinCos3D.*3D \\(video\\)"):
        ViT(**SMALL, encoding=SinCos3D(32, num_prefix_tokens=1))
    # A grid that does not match the tokens.
    q = torch.randn(1, 2, 1 + 16, 16)
    with pytest.raises(ValueError, match="token count"):
        model.encoder.blocks[0].attn.encoding.transform_qk(q, q, model.video_positions(2, 2, 3), model.video_positions(2, 2, 3))
    with pytest.raises(ValueError, match=r"positions must have shape \[17\]"):
        model.encoder(torch.randn(1, 17, 32), positions=model.video_positions(2, 2, 3))


# ------------------------------------------------------------------------------------ the data


def test_moving_digits_are_seeded_in_bounds_and_follow_their_path():
    a = MovingDigits("test", frames=5, canvas_size=16, digit_size=8, max_speed=2, seed=1)
    b = MovingDigits("test", frames=5, canvas_size=16, digit_size=8, max_speed=2, seed=1)
    c = MovingDigits("test", frames=5, canvas_size=16, digit_size=8, max_speed=2, seed=2)
    assert len(a) == 359 and a.num_classes == 4 and DIRECTIONS == ("right", "left", "down", "up")
    assert torch.equal(a.starts, b.starts) and torch.equal(a.directions, b.directions)
    assert not torch.equal(a.starts, c.starts)
    assert set(a.speeds.tolist()) == {1, 2} and set(a.directions.tolist()) == {0, 1, 2, 3}
    steps = {0: (0, 1), 1: (0, -1), 2: (1, 0), 3: (-1, 0)}
    for i in range(40):
        path = a.path(i)
        assert path.min() >= 0 and path.max() <= 16 - 8
        delta = (path[1:] - path[:-1]).tolist()
        v = int(a.speeds[i])
        assert all(tuple(d) == (steps[int(a.directions[i])][0] * v, steps[int(a.directions[i])][1] * v) for d in delta)
        clip, label = a[i]
        assert clip.shape == (1, 5, 16, 16) and int(label) == int(a.directions[i])
        for f, (r, col) in enumerate(path.tolist()):
            torch.testing.assert_close(clip[0, f, r : r + 8, col : col + 8], a.digits[i % len(a.digits)][0])
            assert clip[0, f].sum().item() == pytest.approx(a.digits[i % len(a.digits)].sum().item(), rel=1e-5)


def test_moving_digits_reversed_is_the_opposite_direction_with_the_same_frames():
    data = MovingDigits("train", frames=4, canvas_size=12, digit_size=6, max_speed=2, seed=0)
    free = 12 - 6
    opposite = {0: 1, 1: 0, 2: 3, 3: 2}
    for i in range(30):
        path = data.path(i)
        reverse = path.flip(0)
        delta = reverse[1] - reverse[0]
        # The reversed clip is a path in the opposite direction at the same speed, inside the canvas:
        # a clip the set draws with the other label, so only the frame order tells them apart.
        v = int(data.speeds[i])
        unit = {(0, v): 0, (0, -v): 1, (v, 0): 2, (-v, 0): 3}[tuple(delta.tolist())]
        assert unit == opposite[int(data.directions[i])]
        assert reverse.min() >= 0 and reverse.max() <= free
    counts = torch.bincount(data.directions, minlength=4)
    assert counts.min() > 0.2 * len(data)


def test_moving_digits_reject_paths_that_do_not_fit():
    with pytest.raises(ValueError, match=r"\(frames - 1\) \* max_speed = 14 pixels, must fit in canvas_size - digit_size = 8"):
        MovingDigits(frames=8, canvas_size=16, digit_size=8, max_speed=2)
    with pytest.raises(ValueError, match="frames must be at least 2"):
        MovingDigits(frames=1)


# ------------------------------------------------------------------------------------- the CLI

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--repeats", "1", "--batch-size", "16", "--no-progress"]
CLIP = ["--img-size", "16", "--digit-size", "8", "--frames", "4", "--patch", "8"]


def test_train_vision_video_smoke(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "vision", "--video", "--encoding", "axial3d", "--tubelet", "2", "--steps", "3",
            "--out", str(out), *CLIP, *TINY]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "axial3d on moving digits (direction) on a 16px canvas, 4 frames" in printed
    result = json.loads((out / "results.json").read_text())
    assert result["steps"] == 3 and result["video"] == {"frames": 4, "tubelet": 2, "max_speed": 2}
    assert 0 <= result["accuracy"]["16"] <= 1
    config = result["model_config"]
    assert config["num_frames"] == 4 and config["tubelet_size"] == 2 and config["num_classes"] == 4
    assert (out / "checkpoint.pt").is_file()


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--encoding", "rope3d"], "--encoding: 'rope3d' is a 3D (video) encoding of (t, row, col) positions (posenc train vision --video)"),
        (["--encoding", "rope3d", "--frames", "4"], "--frames is for --video runs"),
        (["--video", "--encoding", "sincos2d"], "--encoding: 'sincos2d' is a 2D (image) encoding; with --video use"),
        (["--video", "--encoding", "rope3d", "--task", "where"], "--task is for images"),
        (["--video", "--encoding", "rope3d", "--eval-scales", "1,2"], "--eval-scales and --eval-mode are for images"),
        (["--video", "--encoding", "rope3d", "--data", "/tmp"], "--data is for images"),
        (["--video", "--encoding", "rope3d", "--frames", "7", "--tubelet", "2"], "--frames 7 is not divisible by --tubelet 2"),
        (["--video", "--encoding", "rope3d", "--frames", "12"], "--frames 12 at --max-speed 2 make a path of 22 pixels"),
        (["--video", "--encoding", "rope3d", "--tubelet", "0"], "argument --tubelet: expected a positive integer, got '0'"),
        (["--video", "--encoding", "rope3d", "--img-size", "36"], "--img-size 36 is not divisible by --patch 8"),
        (["--video", "--encoding", "sincos3d", "--dim", "40"], "multiple of 16"),
    ],
)
def test_train_vision_video_bad_arguments_exit_2(extra, message, capsys):
    assert main(["train", "vision", *extra, "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
