"""Hostile input, round three (issue 51): resumed unit logs (``units.jsonl``).

A resumed ``posenc bench length-generalization`` reads back what an earlier run wrote; a line
that was tampered with (a score out of range, NaN, a line whose encoding or task is not the one its
unit id names, a line that is not an object) is one error naming the file and the line number,
never a wrong number in the report nor a traceback; a partial last line (a run killed while
writing) is still dropped; nothing is appended through a link."""

from __future__ import annotations

import json
import os

import pytest

from posenc import cli
from posenc.cli.bench.length_units import check_line, check_planned
from posenc.cli.bench.unit_log import UnitLog, UnitLogError

TASK = {"unit": "task/copy/rope/1", "config": "abc", "kind": "task", "task": "copy", "encoding": "rope", "seed": 1,
        "train_loss": 0.5, "train_s": 1.0, "eval_s": 0.5, "exact_match": {"@8": 0.75, "@16": 0.25}}
LM = {"unit": "lm/alibi/0", "config": "def", "kind": "lm", "encoding": "alibi", "seed": 0, "train_loss": 1.5,
      "train_s": 2.0, "eval_s": 1.0, "bpb": {"128": 2.1, "256": 2.3}}


def _with(item, **changes):
    out = json.loads(json.dumps(item))
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key)
        elif value and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


_DROP = object()

TAMPERED = [
    (_with(TASK, exact_match={"@8": 7.0}), "exact_match['@8'] must be a number in [0, 1]; got 7.0"),
    (_with(TASK, exact_match={"@16": -5}), "exact_match['@16'] must be a number in [0, 1]; got -5"),
    (_with(TASK, exact_match={"@8": float("nan")}), "exact_match['@8'] must be a number in [0, 1]; got nan"),
    (_with(TASK, exact_match={"@8": True}), "exact_match['@8'] must be a number"),
    (_with(TASK, exact_match={}), "exact_match must be a non-empty object of scores"),
    (_with(TASK, exact_match=_DROP), "exact_match must be a non-empty object of scores; got None"),
    (_with(LM, bpb={"128": -3}), "bpb['128'] must be a number finite and >= 0; got -3"),
    (_with(LM, bpb={"256": float("inf")}), "bpb['256'] must be a number finite and >= 0; got inf"),
    (_with(LM, bpb={"long": 2.0}), "bpb must be keyed by scoring lengths"),
    (_with(TASK, encoding="alibi"), "encoding is 'alibi' but the unit id says 'rope'"),
    (_with(TASK, task="reverse"), "task is 'reverse' but the unit id says 'copy'"),
    (_with(TASK, seed=2), "seed is 2 but the unit id says 1"),
    (_with(TASK, kind="lm"), "kind is 'lm' but the unit id says 'task'"),
    (_with(TASK, kind=_DROP), "kind is None but the unit id says 'task'"),
    (_with(TASK, unit="task/copy/rope"), "is neither task/TASK/ENCODING/SEED nor lm/ENCODING/SEED"),
    (_with(TASK, unit="task/copy/rope/x"), "does not end in a seed"),
    (_with(TASK, train_loss="low"), "train_loss must be a finite number; got 'low'"),
    (_with(LM, train_s=-1.0), "train_s must be a finite number >= 0; got -1.0"),
]


@pytest.mark.parametrize("item, fragment", TAMPERED)
def test_check_line_names_what_is_wrong(item, fragment):
    problem = check_line(item)
    assert problem is not None and fragment in problem, problem


def test_good_lines_pass():
    assert check_line(TASK) is None and check_line(LM) is None
    assert check_planned(TASK, ["@8", "@16"]) is None
    assert check_planned(TASK, ["@8", "@32"]) == "exact_match lacks '@32', which this configuration scores"
    assert check_planned(LM, ["128", "512"]) == "bpb lacks '512', which this configuration scores"


def _log(tmp_path, lines: list[str]) -> UnitLog:
    path = tmp_path / "units.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return UnitLog(path, check=check_line)


@pytest.mark.parametrize("item, fragment", TAMPERED[:3] + TAMPERED[9:11])
def test_a_tampered_line_is_one_error_naming_the_file_and_the_line(item, fragment, tmp_path):
    log = _log(tmp_path, [json.dumps(TASK), json.dumps(LM), json.dumps(item)])
    with pytest.raises(UnitLogError) as info:
        log.load()
    message = str(info.value)
    assert message.startswith(f"{log.path} line 3 (unit {item['unit']!r}): {fragment}"), message
    assert "\n" not in message and "resume into a new --out" in message


@pytest.mark.parametrize("line, fragment", [
    ('"a string"', "line 2: the line is a JSON str, not an object"),
    ("[1, 2]", "line 2: the line is a JSON list, not an object"),
    ('{"config": "abc"}', "line 2: 'unit' must be a non-empty string; got None"),
    ('{"unit": 5, "config": "abc"}', "line 2: 'unit' must be a non-empty string; got 5"),
    ('{"unit": "lm/x/0", "config": null}', "line 2 (unit 'lm/x/0'): 'config' must be a non-empty string"),
    ("{not json", "line 2 is not readable JSON"),
    ("\xff\xfe", "line 2 is not UTF-8 text"),
])
def test_lines_that_are_no_unit_are_named_by_line(line, fragment, tmp_path):
    path = tmp_path / "units.jsonl"
    path.write_bytes(json.dumps(TASK).encode() + b"\n" + line.encode("latin-1") + b"\n" + json.dumps(LM).encode() + b"\n")
    with pytest.raises(UnitLogError) as info:
        UnitLog(path, check=check_line).load()
    assert f"{path} {fragment}" in str(info.value) or f"{path} line 2" in str(info.value), str(info.value)
    assert fragment in str(info.value), str(info.value)


def test_a_partial_last_line_is_still_dropped_and_good_lines_kept(tmp_path):
    path = tmp_path / "units.jsonl"
    path.write_text(json.dumps(TASK) + "\n" + json.dumps(LM) + "\n" + '{"unit": "task/copy/rope/2", "conf')
    log = UnitLog(path, check=check_line).load()
    assert log.dropped == 1 and [item["unit"] for item in log.lines] == ["task/copy/rope/1", "lm/alibi/0"]
    assert path.read_text().endswith("}\n") and len(path.read_text().splitlines()) == 2


def test_append_never_writes_through_a_link_placed_after_load(tmp_path):
    path = tmp_path / "units.jsonl"
    log = UnitLog(path, check=check_line).load()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, path)
    with pytest.raises(UnitLogError, match="symbolic link"):
        log.append(TASK)
    with pytest.raises(UnitLogError, match="symbolic link"):
        log.load()
    assert victim.read_text() == "keep me"


TINY = ["--tasks", "copy", "--encodings", "rope", "--seeds", "1", "--steps", "1", "--dim", "16", "--depth", "1",
        "--heads", "2", "--batch-size", "2", "--eval-examples", "2", "--train-len", "2", "--lm-encodings", "none",
        "--no-progress"]


def _bench(out, *extra):
    return cli.main(["bench", "length-generalization", *TINY, "--out", str(out), *extra])


@pytest.mark.parametrize("field, value, fragment", [
    ("exact_match", 7.0, "must be a number in [0, 1]; got 7.0"),
    ("exact_match", float("nan"), "got nan"),
    ("encoding", "alibi", "encoding is 'alibi' but the unit id says 'rope'"),
    ("task", "reverse", "task is 'reverse' but the unit id says 'copy'"),
    ("kind", None, "kind is None but the unit id says 'task'"),
])
def test_a_resumed_bench_refuses_a_tampered_log_naming_file_and_line(field, value, fragment, tmp_path, capsys):
    out = tmp_path / "run"
    assert _bench(out) == 0
    path = out / "units.jsonl"
    item = json.loads(path.read_text().splitlines()[0])
    if field == "exact_match":
        item[field] = {label: value for label in item[field]}
    else:
        item[field] = value
    path.write_text(json.dumps(item) + "\n")
    capsys.readouterr()
    assert _bench(out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"posenc bench length-generalization: error: {path} line 1 (unit 'task/copy/rope/0'): "), err
    assert fragment in err and "\n" not in err and "Traceback" not in err, err


def test_a_resumed_bench_refuses_a_line_missing_a_split_it_reports(tmp_path, capsys):
    out = tmp_path / "run"
    assert _bench(out) == 0
    path = out / "units.jsonl"
    item = json.loads(path.read_text().splitlines()[0])
    dropped = sorted(item["exact_match"])[0]
    del item["exact_match"][dropped]
    path.write_text(json.dumps(item) + "\n")
    capsys.readouterr()
    assert _bench(out) == 2
    err = capsys.readouterr().err.strip()
    assert f"{path} line 1 (unit 'task/copy/rope/0'): exact_match lacks {dropped!r}" in err and "\n" not in err, err


def test_a_resumed_bench_with_a_good_log_reports_the_same_numbers(tmp_path, capsys):
    out = tmp_path / "run"
    assert _bench(out) == 0
    first = json.loads((out / "length_generalization.json").read_text())
    assert _bench(out) == 0  # everything is in the log: nothing runs, the report is rebuilt from it
    again = json.loads((out / "length_generalization.json").read_text())
    assert again["tasks"] == first["tasks"] and again["complete"]
