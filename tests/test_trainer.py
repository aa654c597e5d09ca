"""Tests of posenc.training.trainer: schedule, learning, data order, checkpoints, exact resume, DDP."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from posenc.training.checkpoint import save_atomic
from posenc.training.trainer import (
    ResumeMismatch,
    TrainConfig,
    Trainer,
    epoch_batches,
    epoch_seed,
    lr_factor,
    move_to_device,
)

TESTS = Path(__file__).parent
REPO = TESTS.parent


def _regression_data(n: int = 64, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.tensor([[2.0], [-1.0], [0.5]]) + 0.3
    return TensorDataset(x, y)


class TinyNet(nn.Module):
    def __init__(self, hidden: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, hidden)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.tanh(self.fc1(x))))


class OtherNet(TinyNet):
    pass


def _mse(model: nn.Module, batch):
    x, y = batch
    loss = ((model(x) - y) ** 2).mean()
    return loss, {"rmse": loss.detach().sqrt().item()}


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=10, batch_size=8, lr=1e-2, warmup_steps=2, progress=False, device="cpu", log_every=1)
    base.update(kw)
    return TrainConfig(**base)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- schedule -----------------------------------------------------------------------------------


def test_lr_schedule_matches_warmup_cosine_formula(tmp_path):
    steps, warmup, base, ratio = 20, 5, 0.01, 0.1
    torch.manual_seed(0)
    trainer = Trainer(TinyNet(), _regression_data(), _mse,
                      _cfg(steps=steps, warmup_steps=warmup, lr=base, min_lr_ratio=ratio, out_dir=str(tmp_path)))
    seen = []
    for _ in range(steps):
        seen.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        trainer.scheduler.step()

    def expected(s: int) -> float:
        if s < warmup:
            return base * (s + 1) / warmup
        p = (s - warmup) / (steps - warmup)
        return base * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * p)))

    assert seen == pytest.approx([expected(s) for s in range(steps)], rel=1e-12, abs=0)
    # chosen points: first warm-up step, peak, cosine midpoint, floor at `steps`
    assert seen[0] == pytest.approx(base / warmup)
    assert seen[warmup - 1] == pytest.approx(base)
    assert seen[warmup] == pytest.approx(base)
    mid = warmup + (steps - warmup) // 2 if (steps - warmup) % 2 == 0 else None
    if mid is not None:
        assert seen[mid] == pytest.approx(base * (ratio + (1 - ratio) * 0.5))
    assert lr_factor(steps, steps=steps, warmup_steps=warmup, min_lr_ratio=ratio) == pytest.approx(ratio)
    assert all(a >= b for a, b in zip(seen[warmup:], seen[warmup + 1:]))  # monotone decay


def test_logged_lr_is_the_lr_of_that_step(tmp_path):
    steps, warmup, base = 6, 2, 0.02
    torch.manual_seed(0)
    Trainer(TinyNet(), _regression_data(), _mse,
            _cfg(steps=steps, warmup_steps=warmup, lr=base, out_dir=str(tmp_path))).fit()
    train = [r for r in _read_jsonl(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    for r in train:
        assert r["lr"] == pytest.approx(base * lr_factor(r["step"] - 1, steps=steps, warmup_steps=warmup))
        assert {"loss", "rmse", "grad_norm", "elapsed"} <= set(r)


# ---- learning -----------------------------------------------------------------------------------


def test_tiny_regression_reduces_loss():
    data = _regression_data(128)
    torch.manual_seed(0)
    model = TinyNet(hidden=16)
    x, y = data.tensors
    with torch.no_grad():
        before = ((model(x) - y) ** 2).mean().item()
    out = Trainer(model, data, _mse, _cfg(steps=150, batch_size=16, lr=3e-2, warmup_steps=10, weight_decay=0.0),
                  eval_fn=lambda m: {"val_mse": ((m(x) - y) ** 2).mean().item()}).fit()
    with torch.no_grad():
        after = ((model(x) - y) ** 2).mean().item()
    assert after < 0.1 * before
    assert out["val_mse"] == pytest.approx(after, rel=1e-5)
    assert math.isfinite(out["train_loss"]) and "train_rmse" in out


def test_weight_decay_skips_biases_and_1d_params():
    trainer = Trainer(TinyNet(), _regression_data(), _mse, _cfg(weight_decay=0.1))
    by_decay = {g["weight_decay"]: {p.ndim for p in g["params"]} for g in trainer.optimizer.param_groups}
    assert by_decay == {0.1: {2}, 0.0: {1}}


def test_progress_redirected_is_plain_lines_with_the_loss(capsys):
    # capsys's stderr is not a terminal: plain lines, no carriage returns (log files stay readable)
    Trainer(TinyNet(), _regression_data(), _mse, _cfg(steps=4, progress=True, log_every=2)).fit()
    err = capsys.readouterr().err
    assert "train: 4/4 (100%)" in err and "loss " in err and "\r" not in err


def test_progress_on_a_terminal_redraws_one_line():
    import io

    from posenc.training.report import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    bar = Progress(3, "train", stream=stream)
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 3 and "3/3" in text and text.endswith("\n")


# ---- data order ---------------------------------------------------------------------------------


def test_epoch_batches_deterministic_sharded_and_drop_last():
    a = epoch_batches(23, 4, seed=1, epoch=0)
    assert a == epoch_batches(23, 4, seed=1, epoch=0)
    assert a != epoch_batches(23, 4, seed=1, epoch=1)
    assert a != epoch_batches(23, 4, seed=2, epoch=0)
    seeds = {epoch_seed(s, e) for s in range(20) for e in range(20)}
    assert len(seeds) == 400 and all(0 <= x < 2**32 for x in seeds)
    assert len(a) == 5 and all(len(b) == 4 for b in a)  # 23 // 4, last partial batch dropped
    assert len({i for b in a for i in b}) == 20
    r0 = epoch_batches(23, 4, seed=1, epoch=3, rank=0, world_size=2)
    r1 = epoch_batches(23, 4, seed=1, epoch=3, rank=1, world_size=2)
    assert len(r0) == len(r1) == 2  # 11 samples per rank
    s0, s1 = {i for b in r0 for i in b}, {i for b in r1 for i in b}
    assert not s0 & s1
    # interleaved shards of the single permutation, like DistributedSampler
    perm = torch.randperm(23, generator=torch.Generator().manual_seed(epoch_seed(1, 3))).tolist()
    assert [i for b in r0 for i in b] == perm[0:22:2][:8]
    assert [i for b in r1 for i in b] == perm[1:22:2][:8]


def test_trainer_walks_epochs_in_permutation_order():
    data = TensorDataset(torch.arange(10).float().unsqueeze(1), torch.zeros(10, 1))
    seen = []

    def loss_fn(model, batch):
        seen.append(batch[0].squeeze(1).long().tolist())
        return (model(batch[0]) ** 2).mean(), {}

    Trainer(nn.Linear(1, 1), data, loss_fn, _cfg(steps=7, batch_size=3, seed=4)).fit()
    expected = [b for e in range(3) for b in epoch_batches(10, 3, seed=4, epoch=e)][:7]
    assert seen == expected


def test_worker_processes_give_the_same_run():
    def run(num_workers: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = TinyNet(dropout=0.2)
        Trainer(model, _regression_data(), _mse, _cfg(steps=10, num_workers=num_workers)).fit()
        return _params(model)

    a, b = run(0), run(2)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_batch_is_moved_recursively():
    Pair = namedtuple("Pair", "a b")
    batch = {"x": torch.ones(2), "nest": [Pair(torch.zeros(1), (torch.ones(1), 3))], "name": "s"}
    moved = move_to_device(batch, torch.device("meta"))
    assert moved["x"].device.type == "meta"
    assert isinstance(moved["nest"][0], Pair)
    assert moved["nest"][0].a.device.type == "meta" and moved["nest"][0].b[0].device.type == "meta"
    assert moved["nest"][0].b[1] == 3 and moved["name"] == "s"


# ---- checkpoints --------------------------------------------------------------------------------


def test_checkpoint_contents_load_with_weights_only(tmp_path):
    torch.manual_seed(0)
    model = TinyNet(dropout=0.1)
    cfg = _cfg(steps=7, out_dir=str(tmp_path), seed=5)
    Trainer(model, _regression_data(), _mse, cfg, model_config={"hidden": 8, "dropout": 0.1}).fit()
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 7
    assert (ckpt["epoch"], ckpt["batch"]) == (0, 7)  # 64 // 8 = 8 batches per epoch
    assert ckpt["model_class"] == "TinyNet"
    assert ckpt["model_config"] == {"hidden": 8, "dropout": 0.1}
    assert ckpt["config"]["seed"] == 5 and ckpt["config"]["steps"] == 7
    for k, v in model.state_dict().items():
        assert torch.equal(ckpt["model"][k], v)
    assert set(ckpt["optimizer"]) == {"state", "param_groups"}
    assert ckpt["scheduler"]["last_epoch"] == 7
    rng = ckpt["rng"][0]
    assert torch.equal(rng["torch"], torch.get_rng_state())
    assert rng["python"][1].tolist() == list(random.getstate()[1])
    assert rng["numpy"][1].tolist() == np.random.get_state()[1].tolist()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_epoch_boundary_position(tmp_path):
    Trainer(TinyNet(), _regression_data(), _mse, _cfg(steps=8, out_dir=str(tmp_path))).fit()
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (ckpt["step"], ckpt["epoch"], ckpt["batch"]) == (8, 1, 0)


def test_atomic_save_keeps_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"a": torch.ones(3)}, path)
    with pytest.raises(Exception):
        save_atomic({"a": torch.zeros(3), "bad": lambda: None}, path)  # a lambda cannot be pickled
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["checkpoint.pt"]


def _write_checkpoint(out_dir: Path, model: nn.Module, model_config: dict | None) -> None:
    torch.manual_seed(0)
    Trainer(model, _regression_data(), _mse, _cfg(steps=2, out_dir=str(out_dir)), model_config=model_config).fit()


@pytest.mark.parametrize(
    "model, model_config, expect",
    [
        (OtherNet(), {"hidden": 8}, ["model class", "expected 'OtherNet'", "found 'TinyNet'"]),
        (TinyNet(), {"hidden": 16}, ["model_config", "hidden: expected 16, found 8"]),
        (TinyNet(hidden=4), {"hidden": 8}, ["shape mismatches", "fc1.weight: expected (4, 3), found (8, 3)"]),
    ],
    ids=["class", "model_config", "shapes"],
)
def test_resume_from_another_model_raises(tmp_path, model, model_config, expect):
    _write_checkpoint(tmp_path, TinyNet(), {"hidden": 8})
    before = _params(model)
    trainer = Trainer(model, _regression_data(), _mse, _cfg(steps=4, out_dir=str(tmp_path), resume=True),
                      model_config=model_config)
    with pytest.raises(ValueError) as err:
        trainer.fit()
    msg = str(err.value)
    assert "checkpoint.pt" in msg
    for piece in expect:
        assert piece in msg
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


def test_resume_with_missing_and_extra_keys_names_them(tmp_path):
    _write_checkpoint(tmp_path, TinyNet(), None)
    model = TinyNet()
    model.extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"missing from the checkpoint: extra\.weight, extra\.bias"):
        Trainer(model, _regression_data(), _mse, _cfg(out_dir=str(tmp_path), resume=True)).fit()


def test_resume_missing_checkpoint_starts_fresh(tmp_path, caplog):
    torch.manual_seed(0)
    model = TinyNet()
    with caplog.at_level(logging.WARNING, logger="posenc.trainer"):
        Trainer(model, _regression_data(), _mse, _cfg(steps=3, out_dir=str(tmp_path / "new"), resume=True)).fit()
    assert "no checkpoint" in caplog.text and "starting fresh" in caplog.text
    assert torch.load(tmp_path / "new" / "checkpoint.pt", weights_only=True)["step"] == 3


def test_resume_of_finished_run_is_a_no_op_and_changed_settings_are_refused(tmp_path):
    torch.manual_seed(0)
    model = TinyNet()
    first = Trainer(model, _regression_data(), _mse, _cfg(steps=5, out_dir=str(tmp_path))).fit()
    done = _params(model)
    torch.manual_seed(1)
    again = TinyNet()  # different init, overwritten by the checkpoint
    out = Trainer(again, _regression_data(), _mse, _cfg(steps=5, out_dir=str(tmp_path), resume=True)).fit()
    assert all(torch.equal(done[k], v) for k, v in again.state_dict().items())
    assert out["train_loss"] == pytest.approx(first["train_loss"])
    # more steps would change the learning-rate schedule of the steps already taken: refused, as
    # are the other settings that shape training; the run is left as it was
    for change in ({"steps": 8}, {"lr": 0.5}, {"warmup_steps": 3}, {"weight_decay": 0.5}):
        with pytest.raises(ResumeMismatch, match=f"{next(iter(change))}=") as err:
            Trainer(again, _regression_data(), _mse, _cfg(**{"steps": 5, **change}, out_dir=str(tmp_path), resume=True)).fit()
        assert err.value.field == next(iter(change))
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 5


def test_a_run_never_overwrites_another(tmp_path):
    Trainer(TinyNet(), _regression_data(), _mse, _cfg(steps=2, out_dir=str(tmp_path))).fit()
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match="already holds a run.*resume=True"):
        Trainer(TinyNet(), _regression_data(), _mse, _cfg(steps=2, out_dir=str(tmp_path)))
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_evaluation_does_not_change_the_trajectory(tmp_path):
    """eval_fn draws random numbers; training must not notice how often it runs."""

    def run(eval_every: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = TinyNet(dropout=0.3)

        def eval_fn(m):
            assert not m.training and not torch.is_grad_enabled()
            return {"r": torch.rand(1).item() + random.random() + np.random.rand()}

        Trainer(model, _regression_data(), _mse, _cfg(steps=9, eval_every=eval_every), eval_fn=eval_fn).fit()
        return _params(model)

    a, b = run(0), run(2)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _run_script(out_dir: Path, params: Path, *extra: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(TESTS / "resume_train_script.py"), str(out_dir), str(params), "--steps", "20", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> None:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out.decode(errors="replace")


def test_resume_after_sigkill_equals_uninterrupted_run(tmp_path):
    """A run SIGKILLed after its step-7 checkpoint (mid-epoch: 5 batches per epoch) and resumed to
    step 20 ends with exactly the parameters of an uninterrupted 20-step run."""
    full = _run_script(tmp_path / "full", tmp_path / "full.pt", "--checkpoint-every", "7")
    marker = tmp_path / "hanging"
    killed = _run_script(tmp_path / "cut", tmp_path / "unused.pt", "--checkpoint-every", "7",
                         "--hang-at-call", "10", "--marker", str(marker))
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert killed.poll() is None, killed.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the training subprocess never reached the hang point"
            time.sleep(0.05)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "unused.pt").exists()
    ckpt = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert (ckpt["step"], ckpt["epoch"], ckpt["batch"]) == (7, 1, 2)
    logged = [r["step"] for r in _read_jsonl(tmp_path / "cut" / "metrics.jsonl")]
    assert logged == [3, 6, 9]  # steps 8 and 9 ran after the checkpoint (log_every=3)

    _finish(_run_script(tmp_path / "cut", tmp_path / "resumed.pt", "--checkpoint-every", "7", "--resume"))
    _finish(full)
    a = torch.load(tmp_path / "full.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    assert not torch.equal(a["net.0.weight"], ckpt["model"]["net.0.weight"])  # it trained after step 7
    # the resumed log replaces the lines after the checkpoint instead of repeating them
    logged = [r["step"] for r in _read_jsonl(tmp_path / "cut" / "metrics.jsonl")]
    assert logged == [3, 6, 9, 12, 15, 18, 20]
    full_log = _read_jsonl(tmp_path / "full" / "metrics.jsonl")
    cut_log = _read_jsonl(tmp_path / "cut" / "metrics.jsonl")
    # equal means, also for the window (steps 7..9) that the checkpoint cut in two
    for key in ("step", "lr", "loss", "weight", "grad_norm"):
        assert [r[key] for r in full_log] == [r[key] for r in cut_log], key


# ---- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", 0), ("steps", -5), ("batch_size", 0), ("lr", 0.0), ("lr", -1e-3), ("lr", float("nan")),
        ("weight_decay", -0.1), ("warmup_steps", -1), ("min_lr_ratio", 1.5), ("min_lr_ratio", -0.1),
        ("grad_clip", 0.0), ("grad_clip", -1.0), ("seed", -1), ("log_every", -1), ("eval_every", -2),
        ("checkpoint_every", -1), ("num_workers", -1), ("device", "not-a-device"),
    ],
)
def test_bad_config_value_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field}\b"):
        TrainConfig(**{field: value})


@pytest.mark.parametrize("field, value", [("steps", 10.0), ("batch_size", "8"), ("amp", 1), ("steps", True)])
def test_wrong_config_type_raises_naming_the_field(field, value):
    with pytest.raises(TypeError, match=rf"TrainConfig\.{field}\b"):
        TrainConfig(**{field: value})


def test_resume_without_out_dir_raises():
    with pytest.raises(ValueError, match=r"resume.*out_dir"):
        TrainConfig(resume=True)


def test_batch_size_larger_than_dataset_raises():
    with pytest.raises(ValueError, match=r"batch_size=100 is larger than .*64 samples"):
        Trainer(TinyNet(), _regression_data(64), _mse, _cfg(batch_size=100))


def test_bad_model_config_and_loss_fn_output():
    with pytest.raises(TypeError, match="model_config"):
        Trainer(TinyNet(), _regression_data(), _mse, _cfg(), model_config={"act": nn.GELU()})
    with pytest.raises(TypeError, match="scalar tensor loss"):
        Trainer(TinyNet(), _regression_data(), lambda m, b: (m(b[0]), {}), _cfg()).fit()


# ---- distributed --------------------------------------------------------------------------------


@pytest.mark.slow
def test_ddp_two_cpu_processes_end_with_equal_parameters(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = ([str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--standalone", "--nproc_per_node", "2", str(TESTS / "ddp_train_script.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["world_size"] == r1["world_size"] == 2
    for k in r0["final"]:
        assert torch.equal(r0["init"][k], r1["init"][k]), f"{k}: DDP did not broadcast the initial parameters"
        assert torch.equal(r0["final"][k], r1["final"][k]), f"{k} differs between ranks"
        assert not torch.equal(r0["init"][k], r0["final"][k]), f"{k} did not move"
    # disjoint shards of one permutation per epoch: 48 samples / 2 ranks = 24 each = 4 batches of 6
    for step, (a, b) in enumerate(zip(r0["seen"], r1["seen"])):
        assert not set(a) & set(b)
        epoch, idx = divmod(step, 4)
        assert a == epoch_batches(48, 6, seed=3, epoch=epoch, rank=0, world_size=2)[idx]
        assert b == epoch_batches(48, 6, seed=3, epoch=epoch, rank=1, world_size=2)[idx]
    assert r0["train_loss"] == pytest.approx(r1["train_loss"])  # averaged over ranks
    # rank 0 alone wrote the files
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint.pt", "metrics.jsonl"]
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert [r["step"] for r in _read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_default_warmup_is_a_tenth_of_a_short_run_and_explicit_values_are_kept():
    assert TrainConfig(steps=6).warmup_steps == 0
    assert TrainConfig(steps=300).warmup_steps == 30
    assert TrainConfig(steps=5000).warmup_steps == 100
    assert TrainConfig(steps=6, warmup_steps=10).warmup_steps == 10  # documented: the whole run is warm-up


def test_run_directory_writes_stay_inside_and_stale_temporaries_go(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (out / ".checkpoint.pt.abc123.tmp").write_bytes(b"partial")  # a killed checkpoint write
    Trainer(TinyNet(), _regression_data(), _mse, _cfg(steps=2, out_dir=str(out))).fit()
    assert not list(out.glob(".*.tmp"))
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert len(set(modes.values())) == 1, modes  # checkpoint.pt as the others, not tempfile's 0600
    # a symbolic link where the trainer writes is refused, and its target is untouched
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(ValueError, match="metrics.jsonl is a symbolic link"):
        Trainer(TinyNet(), _regression_data(), _mse, _cfg(steps=2, out_dir=str(out), resume=True)).fit()
    assert outside.read_text() == "keep me"


def test_results_json_replaces_a_link_instead_of_writing_through_it(tmp_path):
    from posenc.training.report import write_json

    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (tmp_path / "results.json").symlink_to(outside)
    write_json(tmp_path / "results.json", {"a": float("nan")})
    assert outside.read_text() == "keep me" and not (tmp_path / "results.json").is_symlink()
    assert (tmp_path / "results.json").read_text() == '{\n  "a": null\n}\n'
