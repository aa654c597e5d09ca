"""Image and video data that needs no network: scikit-learn's handwritten digits placed on a larger
canvas, the same digits moving across the frames of a clip, and the user's own images in an
ImageFolder-style tree.

Digits on a canvas (:class:`DigitsCanvas`)
    scikit-learn's ``load_digits`` (1,797 images of 8x8 pixels, 10 classes) is resized to a digit of
    ``digit_size`` pixels (bilinear) and pasted at a random position on an empty ``canvas_size``
    canvas. Where a digit goes is drawn from a generator seeded by ``(seed, split, index,
    canvas_size)``, so item ``i`` is the same image in every run and every process. The 1,797
    digits are split once, by a fixed permutation, into training and test digits
    (:func:`split_indices`); ``repeats`` places each digit several times (item ``i`` is digit
    ``i mod n``), which gives the training set many placements without any randomness per epoch.

    Why position matters. With ``task="class"`` the label is the digit class: the digit appears
    anywhere, so the model has to find it, and with a digit of 16 pixels and 4-pixel patches the
    digit covers 4x4 patches whose arrangement (a 6 against a 9) is what tells the classes apart:
    a model without positions sees an unordered set of digit fragments. With ``task="where"`` the
    label is ``class + 10 * quadrant`` (40 classes; quadrant ``2 * bottom + right`` of the digit's
    centre, which is drawn strictly inside one quadrant): the absolute location on the canvas is
    part of the answer.

    Other resolutions. ``resize_to`` renders the same images (same placements) at ``canvas_size``
    and resizes the whole canvas (bilinear), so the digit grows with the image: this is how CPVT
    and RoPE-ViT test a model at a resolution it was not trained at (ImageNet at 224, then 384
    or 448). Building the set with a larger ``canvas_size`` and the same ``digit_size`` instead
    keeps the digit size and grows the canvas around it (new placements on the larger canvas):
    the positions outgrow the trained range while the patches look as in training.
    :func:`digits_at_size` makes either from a training-size set.

Moving digits (:class:`MovingDigits`)
    A clip of ``frames`` frames in which one digit (resized as above) slides across an empty
    canvas in a straight line at a constant integer speed; the label is the direction of motion
    (``DIRECTIONS``: right, left, down, up). Direction, speed (``1 .. max_speed`` pixels a
    frame), start and the position across the motion are drawn from a generator seeded by
    ``(seed, split, index, ...)``, and the start along the motion is uniform over the positions
    that keep the whole path on the canvas. So the reversed clip of a rightward path is a
    leftward path of the same set, equally likely: the set of frames says nothing about left
    against right (or up against down), only their order does. A model blind to the frame order
    is capped at 50% (it may still tell horizontal from vertical), chance is 25%; a model that
    sees time order can reach 100%.

Image folders (:func:`image_folder`)
    ``root/<class>/<image>`` as :class:`torchvision.datasets.ImageFolder` reads it, resized to a
    square size; ``root/train`` and ``root/val`` (or ``root/test``) are used as the splits when
    present, otherwise the images of ``root`` are split by a fixed permutation.

Images are float tensors ``[C, H, W]`` in ``[0, 1]`` (digits: ``C = 1``), clips ``[C, T, H, W]``;
labels are ``int64``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset, Subset

Split = Literal["train", "test"]
Task = Literal["class", "where"]
Mode = Literal["scale", "grow"]
TASKS: tuple[str, ...] = ("class", "where")
MODES: tuple[str, ...] = ("scale", "grow")
SPLITS: tuple[str, ...] = ("train", "test")


def load_digit_images() -> tuple[Tensor, Tensor]:
    """scikit-learn's digits: images ``[1797, 8, 8]`` float32 in ``[0, 1]`` and labels ``[1797]`` int64."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError("the digits data needs scikit-learn: pip install 'posenc[data]'") from exc
    digits = load_digits()
    images = torch.from_numpy(digits.images).float() / 16.0  # pixel values are 0..16
    return images, torch.from_numpy(digits.target).long()


def split_indices(n: int, test_fraction: float = 0.2, seed: int = 0) -> tuple[Tensor, Tensor]:
    """A fixed split of ``range(n)``: ``(train, test)`` index tensors from one seeded permutation."""
    if n < 2:
        raise ValueError(f"n must be at least 2 to split; got {n}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1); got {test_fraction}")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    return perm[n_test:].sort().values, perm[:n_test].sort().values


def split_digits(split: str, digit_size: int, test_fraction: float, split_seed: int) -> tuple[Tensor, Tensor]:
    """The digits of one split, ``([n, 1, digit_size, digit_size] in [0, 1], labels [n])``: the
    seeded train/test split of :func:`split_indices`, resized (bilinear, antialiased when
    shrinking) from 8x8. Shared by :class:`DigitsCanvas` and :class:`MovingDigits`."""
    images, labels = load_digit_images()
    train_idx, test_idx = split_indices(len(images), test_fraction, split_seed)
    chosen = train_idx if split == "train" else test_idx
    digits = images[chosen].unsqueeze(1)  # [n, 1, 8, 8]
    if digit_size != digits.shape[-1]:
        digits = F.interpolate(digits, size=(digit_size, digit_size), mode="bilinear", align_corners=False,
                               antialias=digit_size < digits.shape[-1]).clamp_(0.0, 1.0)
    return digits, labels[chosen]


def _sample_seed(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class DigitsCanvas(Dataset):
    """Digits pasted at seeded random positions on an empty canvas (see the module docstring).

    Args:
        split: "train" or "test" digits.
        canvas_size: side ``S`` of the square canvas the digit is placed on.
        digit_size: side of the resized digit, at most ``canvas_size``.
        task: "class" (label = digit class, 10 classes) or "where" (label = class + 10 * quadrant,
            40 classes).
        repeats: placements per digit; ``len = repeats * digits in the split``.
        seed: seeds the placements (the train/test split of the digits is fixed by ``split_seed``).
        resize_to: render at ``canvas_size``, then resize the whole image to this side (the digit
            scales with the image); None keeps ``canvas_size``.
        test_fraction: share of the 1,797 digits held out for the test split.
        split_seed: seed of that split.

    Item ``i``: ``(image [1, H, W] float32 in [0, 1], label int64)`` with ``H = W = resize_to or
    canvas_size``. :attr:`offsets` ``[len, 2]`` holds each digit's top-left ``(row, col)`` on
    the canvas before any resizing.
    """

    in_chans = 1

    def __init__(
        self,
        split: Split = "train",
        *,
        canvas_size: int = 32,
        digit_size: int = 16,
        task: Task = "class",
        repeats: int = 1,
        seed: int = 0,
        resize_to: int | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
        for name, value in (("canvas_size", canvas_size), ("digit_size", digit_size), ("repeats", repeats)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if digit_size > canvas_size:
            raise ValueError(f"digit_size ({digit_size}) must not exceed canvas_size ({canvas_size})")
        if task == "where" and canvas_size - digit_size < 2:
            raise ValueError(
                f"task='where' needs canvas_size >= digit_size + 2 so that the digit's centre can sit "
                f"inside a quadrant; got canvas_size={canvas_size}, digit_size={digit_size}"
            )
        if resize_to is not None and (not isinstance(resize_to, int) or isinstance(resize_to, bool) or resize_to <= 0):
            raise ValueError(f"resize_to must be a positive int or None; got {resize_to!r}")
        self.digits, self.digit_labels = split_digits(split, digit_size, test_fraction, split_seed)
        self.split, self.task, self.seed = split, task, seed
        self.canvas_size, self.digit_size, self.repeats = canvas_size, digit_size, repeats
        self.resize_to = resize_to
        self.test_fraction, self.split_seed = test_fraction, split_seed
        self.num_classes = 10 if task == "class" else 40
        self.offsets, self.quadrants = self._place(len(self.digits) * repeats)

    @property
    def size(self) -> int:
        """Side of the images this set yields."""
        return self.canvas_size if self.resize_to is None else self.resize_to

    def _place(self, count: int) -> tuple[Tensor, Tensor]:
        """Top-left ``(row, col)`` of every item's digit and its quadrant (``2 * bottom + right``)."""
        free = self.canvas_size - self.digit_size  # offsets 0..free
        offsets = np.empty((count, 2), dtype=np.int64)
        for i in range(count):
            rng = np.random.default_rng(_sample_seed("digits", self.seed, self.split, i, self.canvas_size, self.digit_size, self.task))
            if self.task == "class":
                offsets[i] = rng.integers(0, free + 1, size=2)
            else:
                # The centre p + d/2 lies strictly on one side of S/2  <=>  p < free/2 or p > free/2.
                half = rng.integers(0, 2, size=2)
                low = np.where(half == 0, 0, free // 2 + 1)
                high = np.where(half == 0, (free - 1) // 2, free)  # inclusive
                offsets[i] = low + (rng.random(2) * (high - low + 1)).astype(np.int64)
        offsets_t = torch.from_numpy(offsets)
        centre2 = 2 * offsets_t + self.digit_size  # twice the centre: exact for odd sizes
        bottom_right = (centre2 > self.canvas_size).long()
        return offsets_t, 2 * bottom_right[:, 0] + bottom_right[:, 1]

    def __len__(self) -> int:
        return len(self.offsets)

    def label(self, i: int) -> int:
        cls = int(self.digit_labels[i % len(self.digits)])
        return cls if self.task == "class" else cls + 10 * int(self.quadrants[i])

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} items")
        i = i % len(self)
        canvas = torch.zeros(1, self.canvas_size, self.canvas_size)
        r, c = self.offsets[i].tolist()
        d = self.digit_size
        canvas[:, r : r + d, c : c + d] = self.digits[i % len(self.digits)]
        if self.resize_to is not None and self.resize_to != self.canvas_size:
            canvas = F.interpolate(canvas[None], size=(self.resize_to, self.resize_to), mode="bilinear",
                                   align_corners=False, antialias=self.resize_to < self.canvas_size)[0].clamp_(0.0, 1.0)
        return canvas, torch.tensor(self.label(i), dtype=torch.long)


def digits_at_size(base: DigitsCanvas, size: int, mode: Mode = "scale", *, repeats: int | None = None) -> DigitsCanvas:
    """The digits of ``base`` (same split, task and seed) as ``size x size`` images.

    ``mode="scale"``: the same images as ``base``, resized (the digit scales with the image).
    ``mode="grow"``: a ``size`` canvas with the digit at ``base.digit_size`` (placements drawn on
    the larger canvas).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    common = dict(task=base.task, seed=base.seed, repeats=base.repeats if repeats is None else repeats,
                  test_fraction=base.test_fraction, split_seed=base.split_seed)
    if mode == "scale":
        return DigitsCanvas(base.split, canvas_size=base.canvas_size, digit_size=base.digit_size,
                            resize_to=size, **common)
    return DigitsCanvas(base.split, canvas_size=size, digit_size=base.digit_size, **common)


# ----------------------------------------------------------------------------------------------
# Moving digits (video)

DIRECTIONS: tuple[str, ...] = ("right", "left", "down", "up")
# Unit step (row, col) per direction, in the order of DIRECTIONS.
_STEPS = ((0, 1), (0, -1), (1, 0), (-1, 0))


class MovingDigits(Dataset):
    """Clips of one digit sliding across a canvas; the label is its direction (see the module docstring).

    Args:
        split: "train" or "test" digits.
        frames: frames per clip ``T``.
        canvas_size: side ``S`` of the square frames.
        digit_size: side of the resized digit.
        max_speed: the speed is drawn from ``1 .. max_speed`` pixels a frame; the longest path,
            ``(frames - 1) * max_speed``, must fit in ``canvas_size - digit_size``.
        repeats: clips per digit; ``len = repeats * digits in the split``.
        seed: seeds the motions (the train/test split of the digits is fixed by ``split_seed``).
        test_fraction: share of the 1,797 digits held out for the test split.
        split_seed: seed of that split.

    Item ``i``: ``(clip [1, T, S, S] float32 in [0, 1], label int64 in 0..3)``, the label indexing
    :data:`DIRECTIONS`. :meth:`path` gives the digit's top-left ``(row, col)`` in every frame;
    :attr:`directions`, :attr:`speeds` hold every item's direction and speed.
    """

    in_chans = 1
    num_classes = len(DIRECTIONS)
    task = "direction"

    def __init__(
        self,
        split: Split = "train",
        *,
        frames: int = 8,
        canvas_size: int = 32,
        digit_size: int = 16,
        max_speed: int = 2,
        repeats: int = 1,
        seed: int = 0,
        test_fraction: float = 0.2,
        split_seed: int = 0,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
        for name, value in (("frames", frames), ("canvas_size", canvas_size), ("digit_size", digit_size),
                            ("max_speed", max_speed), ("repeats", repeats)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if frames < 2:
            raise ValueError(f"frames must be at least 2 for a motion to have a direction; got {frames}")
        if (frames - 1) * max_speed > canvas_size - digit_size:
            raise ValueError(
                f"the longest path, (frames - 1) * max_speed = {(frames - 1) * max_speed} pixels, must fit in "
                f"canvas_size - digit_size = {canvas_size - digit_size}; use fewer frames, a lower max_speed, a "
                "larger canvas or a smaller digit"
            )
        self.digits, self.digit_labels = split_digits(split, digit_size, test_fraction, split_seed)
        self.split, self.frames, self.canvas_size, self.digit_size = split, frames, canvas_size, digit_size
        self.max_speed, self.repeats, self.seed = max_speed, repeats, seed
        self.test_fraction, self.split_seed = test_fraction, split_seed
        self.directions, self.speeds, self.starts = self._draw(len(self.digits) * repeats)

    @property
    def size(self) -> int:
        """Side of the frames."""
        return self.canvas_size

    def _draw(self, count: int) -> tuple[Tensor, Tensor, Tensor]:
        """Direction, speed and first-frame top-left ``(row, col)`` of every item."""
        free = self.canvas_size - self.digit_size
        directions = np.empty(count, dtype=np.int64)
        speeds = np.empty(count, dtype=np.int64)
        starts = np.empty((count, 2), dtype=np.int64)
        for i in range(count):
            rng = np.random.default_rng(_sample_seed("moving", self.seed, self.split, i, self.frames, self.canvas_size,
                                                     self.digit_size, self.max_speed))
            d = int(rng.integers(0, len(DIRECTIONS)))
            v = int(rng.integers(1, self.max_speed + 1))
            lo = int(rng.integers(0, free - (self.frames - 1) * v + 1))  # the path's smaller end
            across = int(rng.integers(0, free + 1))
            along = lo if _STEPS[d][0] + _STEPS[d][1] > 0 else lo + (self.frames - 1) * v  # right/down start low
            directions[i], speeds[i] = d, v
            starts[i] = (across, along) if _STEPS[d][0] == 0 else (along, across)
        return torch.from_numpy(directions), torch.from_numpy(speeds), torch.from_numpy(starts)

    def __len__(self) -> int:
        return len(self.directions)

    def path(self, i: int) -> Tensor:
        """Top-left ``(row, col)`` of the digit in each frame of item ``i``: ``[frames, 2]`` long."""
        step = torch.tensor(_STEPS[int(self.directions[i])]) * self.speeds[i]
        return self.starts[i] + torch.arange(self.frames)[:, None] * step

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} items")
        i = i % len(self)
        clip = torch.zeros(1, self.frames, self.canvas_size, self.canvas_size)
        digit, d = self.digits[i % len(self.digits)], self.digit_size
        for f, (r, c) in enumerate(self.path(i).tolist()):
            clip[:, f, r : r + d, c : c + d] = digit
        return clip, self.directions[i].clone()


# ----------------------------------------------------------------------------------------------
# Image folders


def image_folder(
    root: str | Path,
    size: int,
    *,
    split: Split = "train",
    in_chans: int = 3,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> Dataset:
    """An ImageFolder tree as ``(image [in_chans, size, size] in [0, 1], label)`` items.

    ``root/train`` and ``root/val`` (or ``root/test``) are the splits when both exist; otherwise
    ``root`` itself holds the class folders and ``split`` selects part of a fixed permutation of
    its images (``test_fraction`` of them for "test"). Images are converted to RGB (``in_chans=3``)
    or grayscale (``in_chans=1``) and resized to ``size x size`` (bilinear, antialiased).
    The returned dataset has ``classes`` (the class folder names), ``num_classes`` and ``in_chans``.
    """
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    if in_chans not in (1, 3):
        raise ValueError(f"in_chans must be 1 (grayscale) or 3 (RGB) for an image folder; got {in_chans}")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"size must be a positive int; got {size!r}")
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist or is not a directory")
    steps = [transforms.Grayscale(1)] if in_chans == 1 else [transforms.Lambda(_to_rgb)]
    steps += [transforms.Resize((size, size), antialias=True), transforms.ToTensor()]
    transform = transforms.Compose(steps)
    held_out = next((root / name for name in ("val", "test") if (root / name).is_dir()), None)
    if (root / "train").is_dir() and held_out is not None:
        folder = ImageFolder(str(root / "train" if split == "train" else held_out), transform=transform)
        data: Dataset = folder
    else:
        try:
            folder = ImageFolder(str(root), transform=transform)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"image folder {str(root)!r}: {exc}") from None
        if len(folder) < 2:
            raise ValueError(f"image folder {str(root)!r} has {len(folder)} image(s); at least 2 are needed to split")
        train_idx, test_idx = split_indices(len(folder), test_fraction, split_seed)
        data = Subset(folder, (train_idx if split == "train" else test_idx).tolist())
    data.classes = folder.classes  # type: ignore[attr-defined]
    data.num_classes = len(folder.classes)  # type: ignore[attr-defined]
    data.in_chans = in_chans  # type: ignore[attr-defined]
    data.size = size  # type: ignore[attr-defined]
    return data


def _to_rgb(image):
    return image.convert("RGB")
