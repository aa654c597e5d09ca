"""What the length-generalisation bench trains: encodings at their papers' settings scaled to the
training length, addition with index hints, the curriculum, and the scales' keys."""

from __future__ import annotations

import argparse

import pytest
import torch

from posenc.cli.bench import length_generalization as lg
from posenc.cli.bench import length_train
from posenc.cli.bench.length_settings import (
    CPU, ENCODING_SETTINGS, PAPER, PAPERS, encoding_options, settings_rows, task_rows, task_settings,
)
from posenc.seq.kerple import KERPLE, kerple_bias
from posenc.seq.length_tasks import LENGTH_TASKS, length_suite
from posenc.seq.tasks import NUM_SPECIAL, PLUS, SEP, Addition, curriculum_largest


def test_at_the_papers_training_lengths_the_settings_are_the_papers():
    assert encoding_options("fire", {}, 2048) == {"init_threshold": 512}  # FIRE trains at 2048
    assert encoding_options("t5", {}, 512) == {"max_distance": 128, "num_buckets": 32}  # T5 at 512
    assert encoding_options("kerple", {"variant": "log"}, 512) == {"variant": "log", "init_distance_scale": 1.0}
    assert encoding_options("cope", {}, 512) == {"npos_max": 513}  # block size + 1


def test_settings_scaled_to_short_training():
    assert encoding_options("fire", {}, 128) == {"init_threshold": 32}
    assert encoding_options("kerple_power", {"variant": "power"}, 128)["init_distance_scale"] == 4
    assert encoding_options("t5", {}, 19) == {"max_distance": 16, "num_buckets": 16}  # floors: exact below 8
    assert encoding_options("t5", {}, 128) == {"max_distance": 32, "num_buckets": 32}
    assert encoding_options("cape_fire", {"base": "fire"}, 128) == {
        "base": "fire", "hidden": 32, "base_options": {"init_threshold": 32}}
    assert encoding_options("cape_alibi", {"base": "alibi"}, 128) == {"base": "alibi", "hidden": 32}
    assert encoding_options("rope", {}, 128) == {}
    headers, rows = settings_rows({"byte LM": 128, "copy": 19})
    assert len(rows) == len(ENCODING_SETTINGS) and headers[-2:] == ["byte LM (L=128)", "copy (L=19)"]
    assert rows[0][:2] == ["fire", "init_threshold"] and rows[0][-2:] == ["32", "4.75"]


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_init_distance_scale_starts_at_the_papers_kernel_stretched(variant):
    torch.manual_seed(3)
    paper = KERPLE(4, variant).double()
    torch.manual_seed(3)
    scaled = KERPLE(4, variant, init_distance_scale=8.0).double()
    d = torch.arange(0, 50, dtype=torch.float64)[:, None]
    ours = kerple_bias(d, scaled.r1, scaled.r2, variant)
    theirs = kerple_bias(8.0 * d, paper.r1, paper.r2, variant)
    # equal up to the 0.01 floor both keep r1 and r2 above
    keep = (paper.r1 > 0.021) & (paper.r2 > 0.021)
    torch.testing.assert_close(ours[:, keep], theirs[:, keep], rtol=1e-6, atol=1e-9)
    torch.manual_seed(3)
    same = KERPLE(4, variant, init_distance_scale=1.0)
    torch.manual_seed(3)
    torch.testing.assert_close(same.r1, KERPLE(4, variant).r1)  # the default draws exactly as before
    with pytest.raises(ValueError, match="init_distance_scale"):
        KERPLE(4, variant, init_distance_scale=0.0)


def test_addition_with_index_hints_hand_worked():
    task = Addition(num_symbols=16, index_hints=True)  # 6 hints after the ten digits
    g = torch.Generator().manual_seed(0)
    question, answer = task.example(2, g)
    d, hint0 = NUM_SPECIAL, NUM_SPECIAL + 10
    a, b = [question[1] - d, question[3] - d], [question[6] - d, question[8] - d]  # least significant first
    start = question[0] - hint0
    hints = [hint0 + start + k for k in range(3)]
    assert question == [hints[0], d + a[0], hints[1], d + a[1], PLUS, hints[0], d + b[0], hints[1], d + b[1]]
    total = (a[0] + 10 * a[1]) + (b[0] + 10 * b[1])
    assert answer == [hints[0], d + total % 10, hints[1], d + total // 10 % 10, hints[2], d + total // 100]
    seq, sep = task.sequence(2, g)
    assert seq[sep] == SEP and len(seq) <= task.max_total_length(2) == 18
    starts = {task.example(1, g)[0][0] - hint0 for _ in range(200)}
    assert starts == set(range(5))  # a random start: every hint is seen at short lengths
    with pytest.raises(ValueError, match="6 digits need 7 index hints"):
        task.sequence(6, g)
    with pytest.raises(ValueError, match="need 17 index hints"):
        length_suite("addition", 4, {"index_hints": True, "num_symbols": 20})  # the 4x test needs 17


def test_curriculum_grows_the_largest_size_over_the_steps():
    steps, batch = 20, 4
    largest = curriculum_largest(steps, batch, seed=5, min_length=1, length=8, fraction=0.5)
    from posenc.training.trainer import epoch_batches

    by_step = [{largest[i] for i in b} for b in epoch_batches(steps * batch, batch, seed=5, epoch=0)]
    assert all(len(s) == 1 for s in by_step)  # one largest size per step
    tops = [s.pop() for s in by_step]
    assert tops == [1, 1, 2, 3, 4, 5, 5, 6, 7, 8] + [8] * 10  # 1 + 8 step / 10 over the first half
    with pytest.raises(ValueError, match="curriculum"):
        curriculum_largest(steps, batch, seed=5, min_length=1, length=8, fraction=0.0)


def test_scales_cover_every_task_and_overrides_apply():
    assert set(CPU) == set(PAPER) == set(PAPERS) == set(LENGTH_TASKS)
    s = task_settings("cpu", "copy", default_len=8, overrides={"dim": 32, "steps": None})
    assert s.dim == 32 and s.steps == CPU["copy"].steps
    u = task_settings("uniform", "copy", default_len=8,
                      overrides={"dim": 64, "depth": 2, "heads": 4, "steps": 1000, "lr": 3e-3, "batch_size": 32})
    assert u.train_len == 8 and u.curriculum == 0 and u.options == ()
    headers, rows = task_rows("cpu", CPU)
    assert len(rows) == len(LENGTH_TASKS) and dict((r[0], r[2]) for r in rows)["addition"].endswith("plain")
    headers, rows = task_rows("paper", PAPER)
    assert "index_hints=True" in dict((r[0], r[2]) for r in rows)["addition"]
    marked = {**CPU, "sort": task_settings("cpu", "sort", default_len=8, overrides={})}
    marked["sort"] = type(marked["sort"])(**{**marked["sort"].__dict__, "cpu_learned": False})
    assert "for a device" in dict((r[0], r[2]) for r in task_rows("cpu", marked)[1])["sort"]


def _resolved(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    lg.add_arguments(parser)
    args = parser.parse_args(list(argv))
    lg._resolve(args)
    return args


def test_uniform_reproduces_the_keys_of_the_runs_before_the_settings():
    # results/lengen-full/units.jsonl (--full, before the settings table): copy's and the LM's keys
    args = _resolved("--full", "--scale", "uniform")
    assert length_train._task_key(args, args.suites["copy"], "nope") == "beaa6b7eed1120bc"
    assert length_train._task_key(args, args.suites["addition"], "fire") == "b4ce6e84441cc714"
    assert length_train._lm_key(args, "cape_fire") == "11b97a97f2d83bf0"
    args = _resolved("--full")
    assert length_train._task_key(args, args.suites["copy"], "nope") != "beaa6b7eed1120bc"  # cpu: another configuration
    # under cpu a unit's key holds its own encoding's settings only: adding a label to the bench keeps the others
    assert length_train._task_key(args, args.suites["copy"], "nope") != length_train._task_key(args, args.suites["copy"], "fire")
