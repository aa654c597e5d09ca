"""One results vocabulary: old keys of runs already on disk read in today's words."""

from __future__ import annotations

import json

import pytest

from posenc.training.vocabulary import current_key, current_keys, read_results


@pytest.mark.parametrize("old, new", [
    ("test_acc", "test_accuracy"), ("val_acc", "val_accuracy"), ("train_acc", "train_accuracy"),
    ("acc@32", "accuracy@32"), ("bpb@128", "bits_per_byte@128"), ("exact@8", "exact_match@8"),
    ("test_accuracy", "test_accuracy"), ("bits_per_byte@64", "bits_per_byte@64"), ("test_mae", "test_mae"),
    ("train_loss", "train_loss"), ("acc", "acc"), ("model_config", "model_config"),
])
def test_current_key(old, new):
    assert current_key(old) == new


def test_an_old_results_file_reads_in_todays_vocabulary(tmp_path):
    old = {"command": "train graph", "metric": "acc", "test_acc": 0.5, "metrics": {"test_acc": 0.5, "val_acc": 0.25},
           "model_config": {"dim": 8, "dropout": 0.0}, "eval": {"16": 1.0}, "sources": [{"bpb@16": 2.0}]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old))
    new = read_results(path)
    assert new == {"command": "train graph", "metric": "accuracy", "test_accuracy": 0.5,
                   "metrics": {"test_accuracy": 0.5, "val_accuracy": 0.25}, "model_config": {"dim": 8, "dropout": 0.0},
                   "eval": {"16": 1.0}, "sources": [{"bits_per_byte@16": 2.0}]}
    assert current_keys(new) == new  # today's keys stay
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not an object"):
        read_results(path)
