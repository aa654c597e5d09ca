"""Vision data with no network: digits on a canvas (placement, labels, sizes) and image folders."""

from __future__ import annotations

import pytest
import torch

from posenc.vision.data import DigitsCanvas, digits_at_size, image_folder, load_digit_images, split_indices


@pytest.fixture(scope="module")
def digits():
    return load_digit_images()


def _digit_of(ds: DigitsCanvas, i: int) -> torch.Tensor:
    return ds.digits[i % len(ds.digits)]


def test_split_is_fixed_disjoint_and_complete():
    train, test = split_indices(1797, 0.2, seed=0)
    again_train, again_test = split_indices(1797, 0.2, seed=0)
    assert torch.equal(train, again_train) and torch.equal(test, again_test)
    assert len(test) == 359 and len(train) == 1797 - 359
    assert torch.equal(torch.cat([train, test]).sort().values, torch.arange(1797))
    other_train, _ = split_indices(1797, 0.2, seed=1)
    assert not torch.equal(train, other_train)
    with pytest.raises(ValueError, match="test_fraction must be in \\(0, 1\\); got 1.5"):
        split_indices(10, 1.5)


def test_placement_is_deterministic_in_bounds_and_pastes_the_digit(digits):
    images, labels = digits
    a = DigitsCanvas("train", canvas_size=24, digit_size=10, repeats=2, seed=3)
    b = DigitsCanvas("train", canvas_size=24, digit_size=10, repeats=2, seed=3)
    c = DigitsCanvas("train", canvas_size=24, digit_size=10, repeats=2, seed=4)
    assert len(a) == 2 * (1797 - 359)
    assert torch.equal(a.offsets, b.offsets)
    assert not torch.equal(a.offsets, c.offsets)
    assert a.offsets.min() >= 0 and a.offsets.max() <= 24 - 10
    # the two placements of one digit differ (repeats are new positions, not copies)
    n = len(a.digits)
    assert (a.offsets[:n] != a.offsets[n:]).any(dim=1).float().mean() > 0.8
    train_idx, _ = split_indices(1797)
    for i in (0, 1, 17, n + 5):
        x, y = a[i]
        x2, _ = b[i]
        assert x.shape == (1, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.long
        assert torch.equal(x, x2)
        r, col = a.offsets[i].tolist()
        window = x[0, r : r + 10, col : col + 10]
        torch.testing.assert_close(window, _digit_of(a, i)[0])
        outside = x.clone()
        outside[0, r : r + 10, col : col + 10] = 0
        assert outside.abs().sum() == 0  # nothing outside the digit's box
        assert int(y) == int(labels[train_idx[i % n]])  # the label is the digit's class
    # the 8x8 digit at its own size is pasted unchanged
    native = DigitsCanvas("test", canvas_size=16, digit_size=8)
    _, test_idx = split_indices(1797)
    x, _ = native[0]
    r, col = native.offsets[0].tolist()
    torch.testing.assert_close(x[0, r : r + 8, col : col + 8], images[test_idx[0]])


def test_where_task_labels_the_quadrant_of_the_centre():
    ds = DigitsCanvas("test", canvas_size=20, digit_size=9, task="where", repeats=2)
    assert ds.num_classes == 40
    centre = ds.offsets.float() + 9 / 2
    assert (centre != 10).all()  # never on a midline
    expected_quadrant = 2 * (centre[:, 0] > 10).long() + (centre[:, 1] > 10).long()
    assert torch.equal(ds.quadrants, expected_quadrant)
    assert set(ds.quadrants.tolist()) == {0, 1, 2, 3}
    for i in range(0, len(ds), 97):
        _, y = ds[i]
        cls = int(ds.digit_labels[i % len(ds.digits)])
        assert int(y) == cls + 10 * int(expected_quadrant[i])


def test_scale_mode_resizes_the_same_images_and_grow_mode_keeps_the_digit_size():
    base = DigitsCanvas("test", canvas_size=32, digit_size=16)
    scaled = digits_at_size(base, 64, "scale")
    assert torch.equal(scaled.offsets, base.offsets) and scaled.size == 64
    for i in (0, 3):
        x, y = base[i]
        x2, y2 = scaled[i]
        assert x2.shape == (1, 64, 64) and int(y2) == int(y)
        # downsampling the 2x image by 2x2 averages gives back the original up to bilinear blur
        back = torch.nn.functional.avg_pool2d(x2[None], 2)[0]
        assert (back - x).abs().mean() < 0.02
        nz = x2[0].nonzero()
        r, c = base.offsets[i].tolist()
        assert nz[:, 0].min() >= 2 * r - 1 and nz[:, 0].max() <= 2 * (r + 16)
        assert nz[:, 1].min() >= 2 * c - 1 and nz[:, 1].max() <= 2 * (c + 16)
    grown = digits_at_size(base, 48, "grow")
    assert grown.size == 48 and grown.digit_size == 16
    assert grown.offsets.max() <= 48 - 16 and grown.offsets.max() > 32 - 16  # uses the larger canvas
    x, _ = grown[1]
    r, c = grown.offsets[1].tolist()
    torch.testing.assert_close(x[0, r : r + 16, c : c + 16], base.digits[1][0])
    half = digits_at_size(base, 48, "scale")
    assert half[0][0].shape == (1, 48, 48)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"split": "valid"}, "split must be one of train, test; got 'valid'"),
        ({"task": "quadrant"}, "task must be one of class, where; got 'quadrant'"),
        ({"canvas_size": 0}, "canvas_size must be a positive int; got 0"),
        ({"digit_size": 40}, "digit_size \\(40\\) must not exceed canvas_size \\(32\\)"),
        ({"task": "where", "canvas_size": 17}, "task='where' needs canvas_size >= digit_size \\+ 2"),
        ({"resize_to": -8}, "resize_to must be a positive int or None; got -8"),
    ],
)
def test_digits_canvas_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DigitsCanvas(**kwargs)
    with pytest.raises(ValueError, match="mode must be one of scale, grow; got 'zoom'"):
        digits_at_size(DigitsCanvas("test", canvas_size=16, digit_size=8), 32, "zoom")


def _write_tree(root, classes=("cat", "dog"), per_class=3, size=(10, 7)):
    from PIL import Image

    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for j in range(per_class):
            value = 40 * k + 10 * j
            Image.new("RGB", size, (value, 255 - value, 0)).save(root / name / f"{j}.png")


def test_image_folder_loads_resizes_and_splits(tmp_path):
    _write_tree(tmp_path / "flat", per_class=5)
    train = image_folder(tmp_path / "flat", 16, split="train")
    test = image_folder(tmp_path / "flat", 16, split="test")
    assert train.classes == ["cat", "dog"] and train.num_classes == 2 and train.in_chans == 3
    assert len(train) == 8 and len(test) == 2
    assert set(train.indices).isdisjoint(test.indices)
    x, y = train[0]
    assert x.shape == (3, 16, 16) and 0 <= x.min() and x.max() <= 1 and y in (0, 1)
    # the colour of the file survives the resize (a constant image stays constant)
    torch.testing.assert_close(x, x[:, :1, :1].expand_as(x))
    gray = image_folder(tmp_path / "flat", 12, split="test", in_chans=1)
    assert gray[0][0].shape == (1, 12, 12)

    _write_tree(tmp_path / "tree" / "train")
    _write_tree(tmp_path / "tree" / "val", per_class=1)
    tr = image_folder(tmp_path / "tree", 8, split="train")
    va = image_folder(tmp_path / "tree", 8, split="test")
    assert len(tr) == 6 and len(va) == 2
    labels = sorted(int(va[i][1]) for i in range(len(va)))
    assert labels == [0, 1]

    with pytest.raises(FileNotFoundError, match="does not exist"):
        image_folder(tmp_path / "missing", 8)
    with pytest.raises(ValueError, match="in_chans must be 1 \\(grayscale\\) or 3 \\(RGB\\)"):
        image_folder(tmp_path / "flat", 8, in_chans=4)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        image_folder(tmp_path / "empty", 8)
