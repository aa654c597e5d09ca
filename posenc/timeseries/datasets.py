"""Classification data for the time-series models: the UEA/UCR datasets that ship inside the
sktime wheel (found offline, without importing sktime), the user's own ``.ts`` files, and numpy
arrays.

Preprocessing follows ConvTran (https://github.com/Navidfoumani/ConvTran, ``load_UEA_data``):

* No normalisation by default (ConvTran's ``--Norm`` defaults to False). ``normalize="channel"``
  z-scores each channel with the mean and standard deviation of the *training* split's real
  (non-padded, non-missing) steps, and applies the same statistics to the test split.
* Missing values (``?`` in a ``.ts`` file, NaN in an array) become 0 after normalisation.
  ConvTran fills them with uniform noise in ``[0, 0.001)``, i.e. about zero; a constant keeps
  runs reproducible.
* Unequal lengths: ConvTran pads every series with zeros to the longest and lets the model see
  the padding. Here each series keeps its length; batches are zero-padded to their longest series
  and the model masks the padding (attention keys and pooling).
* Class labels are mapped to ``0 .. K-1`` in the sorted order of the training split's labels;
  a test label that the training split lacks is an error.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .ts_format import TsData, read_ts

NORMALIZATIONS = ("none", "channel")


def bundled_data_dir() -> Path | None:
    """The folder of sktime's bundled datasets, found with ``importlib.util.find_spec`` (which does
    not import sktime: that takes seconds); None when sktime is not installed."""
    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        folder = Path(root) / "datasets" / "data"
        if folder.is_dir():
            return folder
    return None


def bundled_datasets() -> list[str]:
    """Names of the bundled classification datasets (a ``NAME_TRAIN.ts`` and ``NAME_TEST.ts``
    pair with class labels), sorted."""
    folder = bundled_data_dir()
    if folder is None:
        return []
    names = []
    for sub in sorted(folder.iterdir()):
        train, test = sub / f"{sub.name}_TRAIN.ts", sub / f"{sub.name}_TEST.ts"
        if train.is_file() and test.is_file() and _declares_class_labels(train):
            names.append(sub.name)
    return names


def _declares_class_labels(path: Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            low = line.strip().lower()
            if low.startswith("@classlabel"):
                return "true" in low.split()[1:2]
            if low.startswith("@data"):
                return False
    return False


def find_dataset(name_or_path: str | os.PathLike) -> tuple[Path, Path]:
    """``(train.ts, test.ts)`` of a bundled dataset name, of a folder holding ``NAME_TRAIN.ts``
    and ``NAME_TEST.ts``, or of a ``..._TRAIN.ts`` file (its ``_TEST.ts`` sibling is the test split)."""
    text = os.fspath(name_or_path)
    path = Path(text)
    if path.is_dir():
        trains = sorted(path.glob("*_TRAIN.ts"))
        if len(trains) != 1:
            raise ValueError(f"dataset folder {text!r} must hold exactly one *_TRAIN.ts file; found {len(trains)}")
        return trains[0], _test_sibling(trains[0])
    if path.is_file():
        if not path.name.endswith("_TRAIN.ts"):
            raise ValueError(f"dataset file {text!r} must be a NAME_TRAIN.ts file (with NAME_TEST.ts beside it)")
        return path, _test_sibling(path)
    folder = bundled_data_dir()
    available = bundled_datasets()
    if text in available:
        return folder / text / f"{text}_TRAIN.ts", folder / text / f"{text}_TEST.ts"
    where = "no bundled datasets (sktime is not installed)" if folder is None else f"bundled: {', '.join(available)}"
    raise ValueError(f"dataset {text!r} is neither a bundled dataset nor an existing folder or _TRAIN.ts file; {where}")


def _test_sibling(train: Path) -> Path:
    test = train.with_name(train.name[: -len("_TRAIN.ts")] + "_TEST.ts")
    if not test.is_file():
        raise ValueError(f"{train} has no test split beside it: {test} does not exist")
    return test


@dataclass
class SeriesSet(Dataset):
    """Labelled series for classification: a map-style dataset of ``(x [C, T_i], label)``.

    Attributes:
        series: float32 arrays ``[C, T_i]``, missing values already filled.
        labels: int64 ``[N]`` class indices into ``classes``.
        classes: the class names, index = label.
    """

    series: list[np.ndarray]
    labels: np.ndarray
    classes: list[str]

    def __len__(self) -> int:
        return len(self.series)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return torch.from_numpy(self.series[i]), int(self.labels[i])

    @property
    def num_channels(self) -> int:
        return self.series[0].shape[0]

    @property
    def max_length(self) -> int:
        return max(s.shape[1] for s in self.series)

    def padded(self) -> tuple[Tensor, Tensor, Tensor]:
        """The whole set as ``(x [N, C, T_max], lengths [N], labels [N])``."""
        return collate_series([self[i] for i in range(len(self))])


def collate_series(items: Sequence[tuple[Tensor, int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Zero-pad a batch to its longest series: ``(x [B, C, T], lengths [B], labels [B])``."""
    lengths = torch.tensor([x.shape[1] for x, _ in items], dtype=torch.long)
    channels = items[0][0].shape[0]
    x = torch.zeros(len(items), channels, int(lengths.max()), dtype=torch.float32)
    for i, (s, _) in enumerate(items):
        x[i, :, : s.shape[1]] = s
    return x, lengths, torch.tensor([y for _, y in items], dtype=torch.long)


def _check_series(series: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    out = []
    channels = None
    for i, s in enumerate(series):
        s = np.asarray(s, dtype=np.float32)
        if s.ndim != 2:
            raise ValueError(f"{what}[{i}] must be [channels, time]; got shape {s.shape}")
        if s.shape[1] == 0:
            raise ValueError(f"{what}[{i}] is an empty series (0 time steps)")
        if channels is None:
            channels = s.shape[0]
        elif s.shape[0] != channels:
            raise ValueError(f"{what}[{i}] has {s.shape[0]} channels; the first series has {channels}")
        out.append(s)
    if not out:
        raise ValueError(f"{what} holds no series")
    return out


def _encode_labels(labels: Sequence, classes: list[str], what: str) -> np.ndarray:
    index = {c: i for i, c in enumerate(classes)}
    names = [str(y) for y in labels]
    unknown = sorted(set(names) - set(index))
    if unknown:
        raise ValueError(f"{what} has label(s) {unknown} missing from the training classes {classes}")
    return np.array([index[n] for n in names], dtype=np.int64)


def _sort_key(label: str):
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def make_splits(
    train_series: Sequence[np.ndarray],
    train_labels: Sequence,
    test_series: Sequence[np.ndarray] | None = None,
    test_labels: Sequence | None = None,
    *,
    normalize: str = "none",
) -> tuple[SeriesSet, SeriesSet | None]:
    """Build the training (and test) :class:`SeriesSet` from raw series ``[C, T_i]`` and labels.

    Classes come from the training labels (sorted; numerically when they are numbers). Test
    series must have the training channel count and only training labels.
    """
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {', '.join(NORMALIZATIONS)}; got {normalize!r}")
    train = _check_series(train_series, "train series")
    if len(train_labels) != len(train):
        raise ValueError(f"train labels: got {len(train_labels)} for {len(train)} series")
    classes = sorted({str(y) for y in train_labels}, key=_sort_key)
    y_train = _encode_labels(train_labels, classes, "the training set")
    test = y_test = None
    if test_series is not None:
        test = _check_series(test_series, "test series")
        if test_labels is None or len(test_labels) != len(test):
            raise ValueError(f"test labels: got {None if test_labels is None else len(test_labels)} for {len(test)} series")
        if test[0].shape[0] != train[0].shape[0]:
            raise ValueError(f"test series have {test[0].shape[0]} channels; the training series have {train[0].shape[0]}")
        y_test = _encode_labels(test_labels, classes, "the test set")
    if normalize == "channel":
        steps = np.concatenate(train, axis=1)
        mean = np.nanmean(steps, axis=1, keepdims=True)
        std = np.nanstd(steps, axis=1, keepdims=True)
        mean = np.nan_to_num(mean)
        std = np.where(np.isfinite(std) & (std > 0), std, 1.0)
        train = [(s - mean) / std for s in train]
        test = None if test is None else [(s - mean) / std for s in test]
    train = [np.nan_to_num(s, nan=0.0).astype(np.float32) for s in train]
    test = None if test is None else [np.nan_to_num(s, nan=0.0).astype(np.float32) for s in test]
    return SeriesSet(train, y_train, classes), (None if test is None else SeriesSet(test, y_test, classes))


def from_arrays(
    x_train: np.ndarray,
    y_train: Sequence,
    x_test: np.ndarray | None = None,
    y_test: Sequence | None = None,
    *,
    normalize: str = "none",
) -> tuple[SeriesSet, SeriesSet | None]:
    """Splits from numpy arrays ``[N, C, T]`` (or lists of ``[C, T_i]`` arrays) and labels."""
    def series(x, what):
        if isinstance(x, np.ndarray):
            if x.ndim != 3:
                raise ValueError(f"{what} must be [N, channels, time] (or a list of [channels, time]); got shape {x.shape}")
            return list(x)
        return list(x)

    return make_splits(
        series(x_train, "x_train"), y_train, None if x_test is None else series(x_test, "x_test"), y_test,
        normalize=normalize,
    )


def _labelled(data: TsData, path: Path) -> list[str]:
    if data.labels is None:
        raise ValueError(f"{path} has no class labels (@classLabel false): it cannot train a classifier")
    return data.labels


def load_dataset(name_or_path: str | os.PathLike, *, normalize: str = "none") -> tuple[SeriesSet, SeriesSet]:
    """Train and test :class:`SeriesSet` of a bundled dataset (``"BasicMotions"``), a folder with
    ``NAME_TRAIN.ts``/``NAME_TEST.ts``, or a ``NAME_TRAIN.ts`` file."""
    train_path, test_path = find_dataset(name_or_path)
    train, test = read_ts(train_path), read_ts(test_path)
    try:
        return make_splits(
            train.series, _labelled(train, train_path), test.series, _labelled(test, test_path), normalize=normalize
        )
    except ValueError as exc:
        raise ValueError(f"{train_path.parent}: {exc}") from None
