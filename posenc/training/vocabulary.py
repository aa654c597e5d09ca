"""One results vocabulary for every modality: the metric names in ``results.json``,
``metrics.jsonl`` and the benches' JSON.

* ``{split}_accuracy`` (``test_accuracy``, ``val_accuracy``, ``train_accuracy``) and ``{split}_mae``
  for a whole split; ``train_loss``, ``test_loss``;
* ``METRIC@SIZE`` for one evaluation size: ``accuracy@48`` (vision, image side in pixels),
  ``bits_per_byte@512`` (text, window in bytes), ``exact_match@16`` (synthetic tasks, task size).

Runs written before this vocabulary used shorter keys (``test_acc``, ``acc@32``, ``bpb@128``,
``exact@8``, ``"metric": "bpb"``); :data:`OLD_KEYS` maps them to the new ones in one place, and
:func:`current_keys` renames them when a record is read back (:func:`posenc.load`,
``posenc extend``), so runs already on disk keep working.
"""

from __future__ import annotations

from typing import Any

# old metric name (a whole key, or the METRIC of METRIC@SIZE / the suffix of SPLIT_METRIC) -> new one
OLD_KEYS: dict[str, str] = {
    "acc": "accuracy",
    "bpb": "bits_per_byte",
    "exact": "exact_match",
}
SPLITS = ("train", "val", "test")


def at(metric: str, size: int) -> str:
    """The key of ``metric`` at one evaluation size: ``at("accuracy", 48) == "accuracy@48"``."""
    return f"{metric}@{size}"


def current_key(key: str) -> str:
    """``key`` in today's vocabulary (``acc@32`` -> ``accuracy@32``, ``test_acc`` -> ``test_accuracy``)."""
    metric, sep, size = key.partition("@")
    if sep:
        return f"{OLD_KEYS.get(metric, metric)}@{size}"
    split, sep, metric = key.partition("_")
    if sep and split in SPLITS and metric in OLD_KEYS:
        return f"{split}_{OLD_KEYS[metric]}"
    return key


def current_keys(record: Any) -> Any:
    """``record`` (a results.json object) with every metric key, and the value of ``"metric"``,
    in today's vocabulary; nested objects too. Other keys and values are left as they are."""
    if isinstance(record, list):
        return [current_keys(v) for v in record]
    if not isinstance(record, dict):
        return record
    out = {}
    for key, value in record.items():
        if key == "metric" and isinstance(value, str):
            value = OLD_KEYS.get(value, value)
        out[current_key(key) if isinstance(key, str) else key] = current_keys(value)
    return out


def read_results(path) -> dict[str, Any]:
    """The ``results.json`` at ``path`` in today's vocabulary (:func:`current_keys`), read by the
    strict JSON reader (:func:`posenc.training.json_input.read_json`: size, depth, encoding). Raises
    one ``ValueError`` naming the file when it cannot be read or is not a JSON object."""
    from .json_input import read_json

    record = read_json(path)
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a JSON {type(record).__name__}, not an object")
    return current_keys(record)
