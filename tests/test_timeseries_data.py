"""The .ts reader on edge cases, the bundled UEA datasets, and arrays as input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posenc.timeseries.datasets import (
    bundled_datasets,
    collate_series,
    find_dataset,
    from_arrays,
    load_dataset,
)
from posenc.timeseries.ts_format import TsFormatError, read_ts, read_ts_text

HEADER = """# a comment
@problemName Toy
@timeStamps false
@missing true
@univariate false
@dimensions 2
@equalLength false
@classLabel true a b
@data
"""


def test_reader_multivariate_unequal_lengths_and_missing_values():
    data = read_ts_text(HEADER + "1,2,3:4,5,6:a\n\n7,?:8,9:b\n1,2,3,4:5,6:a\n")
    assert data.problem_name == "Toy" and data.class_labels == ["a", "b"] and data.labels == ["a", "b", "a"]
    assert data.num_channels == 2 and data.lengths.tolist() == [3, 2, 4]
    np.testing.assert_array_equal(data.series[0], [[1, 2, 3], [4, 5, 6]])
    assert math.isnan(data.series[1][0, 1]) and data.series[1][1].tolist() == [8, 9]
    # a shorter dimension within one case is padded with NaN to the case's length
    assert data.series[2][1, :2].tolist() == [5, 6] and np.isnan(data.series[2][1, 2:]).all()


def test_reader_univariate_without_dimensions_and_regression_targets():
    uni = read_ts_text("@problemName U\n@univariate true\n@classLabel true 1 2\n@data\n0.5,1e3,-2:2\n")
    assert uni.num_channels == 1 and uni.series[0].tolist() == [[0.5, 1000.0, -2.0]]
    reg = read_ts_text("@targetLabel true\n@data\n1,2:3,4:0.25\n")
    assert reg.labels is None and reg.targets.tolist() == [0.25] and reg.num_channels == 2
    unlabelled = read_ts_text("@classLabel false\n@data\n1,2\n")
    assert unlabelled.labels is None and unlabelled.series[0].tolist() == [[1, 2]]


@pytest.mark.parametrize(
    "body,line,message",
    [
        ("1,2,x:4,5,6:a\n", 10, "dimension 0: 'x' is not a number"),
        ("1,2:a\n", 10, "expected 2 dimension\\(s\\) separated by ':'; got 1"),
        ("1,2:3,4:c\n", 10, "class label 'c' is not among the declared \\['a', 'b'\\]"),
        ("1,2:3,4:a\n1,2\n", 11, "expected the series followed by ':<label>'"),
        (":3,4:a\n", 10, "dimension 0 is empty \\(an empty series\\)"),
        ("1,2:3,4:\n", 10, "the class label is empty"),
        ("(0,1),(1,2):(0,3):a\n", 10, "time-stamped values"),
    ],
)
def test_reader_errors_name_the_line(body, line, message):
    with pytest.raises(TsFormatError, match=f"^toy.ts:{line}: ({message})") as info:
        read_ts_text(HEADER + body, source="toy.ts")
    assert info.value.line == line


@pytest.mark.parametrize(
    "text,message",
    [
        ("@problemName X\n@bogus 1\n@data\n1:a\n", "2: unknown header key @bogus"),
        ("@problemName X\n1,2,3\n", "2: expected a header line '@key value' before @data"),
        ("@problemName X\n@missing maybe\n@data\n", "2: @missing must be true or false; got 'maybe'"),
        ("@dimensions two\n@data\n", "1: @dimensions must be an integer; got 'two'"),
        ("@classLabel true\n@data\n", "1: @classLabel true must list the class labels"),
        ("@problemName X\n", "1: no @data line"),
        ("@classLabel false\n@data\n", "2: no cases after @data"),
        ("@timeStamps true\n@data\n(0,1):a\n", "2: time-stamped files"),
        ("@univariate true\n@dimensions 3\n@data\n", "3: @univariate true contradicts @dimensions 3"),
        ("@equalLength true\n@seriesLength 3\n@classLabel false\n@data\n1,2,3\n1,2\n", "6: @equalLength true with @seriesLength 3"),
        ("@equalLength true\n@classLabel false\n@data\n1,2,3\n1,2\n", "5: @equalLength true, but the cases differ"),
    ],
)
def test_reader_header_errors(text, message):
    with pytest.raises(TsFormatError, match=f"^f.ts:{message}"):
        read_ts_text(text, source="f.ts")


def test_read_ts_file_reports_its_path(tmp_path):
    path = tmp_path / "Bad_TRAIN.ts"
    path.write_text(HEADER + "1,2:3,4:a\n1,2:3,oops:b\n")
    with pytest.raises(TsFormatError, match=f"^{path}:11: dimension 1: 'oops' is not a number"):
        read_ts(path)


def test_bundled_datasets_have_the_published_shapes():
    names = bundled_datasets()
    assert {"BasicMotions", "JapaneseVowels"} <= set(names)
    train, test = load_dataset("BasicMotions")
    assert (len(train), len(test), train.num_channels, len(train.classes)) == (40, 40, 6, 4)
    assert {s.shape for s in train.series + test.series} == {(6, 100)}
    assert train.classes == ["Badminton", "Running", "Standing", "Walking"]
    train, test = load_dataset("JapaneseVowels")
    assert (len(train), len(test), train.num_channels, len(train.classes)) == (270, 370, 12, 9)
    lengths = [s.shape[1] for s in train.series + test.series]
    assert min(lengths) == 7 and max(lengths) == 29
    assert train.classes == [str(i) for i in range(1, 10)] and sorted(set(test.labels.tolist())) == list(range(9))
    x, lengths, y = collate_series([train[0], train[1]])
    assert x.shape == (2, 12, max(lengths.tolist())) and (x[0, :, lengths[0]:] == 0).all()


def test_unknown_dataset_lists_the_bundled_ones():
    with pytest.raises(ValueError, match="dataset 'BasicMotion' is neither a bundled dataset .*bundled: .*BasicMotions.*JapaneseVowels"):
        find_dataset("BasicMotion")


def test_users_own_ts_folder_and_test_labels_missing_from_training(tmp_path):
    (tmp_path / "Toy_TRAIN.ts").write_text(HEADER + "1,2,3:4,5,6:a\n7,?:8,9:b\n")
    (tmp_path / "Toy_TEST.ts").write_text(HEADER + "1,2:3,4:b\n")
    train, test = load_dataset(tmp_path)
    assert train.classes == ["a", "b"] and test.labels.tolist() == [1]
    assert train.series[1][0].tolist() == [7, 0]  # missing -> 0
    train2, _ = load_dataset(tmp_path / "Toy_TRAIN.ts")
    assert len(train2) == 2
    (tmp_path / "Toy_TRAIN.ts").write_text(HEADER + "1,2,3:4,5,6:a\n")
    with pytest.raises(ValueError, match=r"the test set has label\(s\) \['b'\] missing from the training classes \['a'\]"):
        load_dataset(tmp_path)
    with pytest.raises(ValueError, match="has no test split beside it"):
        load_dataset(_only_train(tmp_path))


def _only_train(tmp_path):
    folder = tmp_path / "solo"
    folder.mkdir()
    (folder / "Solo_TRAIN.ts").write_text(HEADER + "1,2:3,4:a\n")
    return folder


def test_arrays_as_input_and_channel_normalisation():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(10, 3, 20))
    y = ["up", "down"] * 5
    train, test = from_arrays(x, y, x[:4], y[:4], normalize="channel")
    assert train.classes == ["down", "up"] and train.labels.tolist() == [1, 0] * 5
    steps = np.concatenate(train.series, axis=1)
    np.testing.assert_allclose(steps.mean(1), 0, atol=1e-5)
    np.testing.assert_allclose(steps.std(1), 1, atol=1e-4)
    np.testing.assert_allclose(test.series[0], train.series[0], atol=1e-6)  # training statistics reused
    with pytest.raises(ValueError, match="test series have 2 channels; the training series have 3"):
        from_arrays(x, y, x[:2, :2], y[:2])
    with pytest.raises(ValueError, match=r"train series\[1\] is an empty series \(0 time steps\)"):
        from_arrays([x[0], x[1, :, :0]], ["a", "b"])
    with pytest.raises(ValueError, match=r"the test set has label\(s\) \['sideways'\] missing from the training classes"):
        from_arrays(x, y, x[:1], ["sideways"])
    with pytest.raises(ValueError, match=r"x_train must be \[N, channels, time\]"):
        from_arrays(x[0], y)
    with pytest.raises(ValueError, match="normalize must be one of none, channel; got 'zscore'"):
        from_arrays(x, y, normalize="zscore")
