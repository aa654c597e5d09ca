"""The ConvTran-style classifier: masks, bad input, every encoding through one model, training,
and the train/bench command lines."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from posenc import cli
from posenc.timeseries import ERPE, TAPE
from posenc.timeseries.classify import ClassifierSettings, train_classifier
from posenc.timeseries.convtran import ConvTranClassifier
from posenc.timeseries.datasets import from_arrays

from .threads import torch_threads


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models: two OpenMP threads mostly wait on each other (and on a busy machine, much longer).
    with torch_threads(1):
        yield


def _model(encoding="tape+erpe", **kw) -> ConvTranClassifier:
    torch.manual_seed(0)
    return ConvTranClassifier(3, 4, 20, dim=16, num_heads=8, ff_dim=32, dropout=0.0, encoding=encoding, **kw)


@pytest.mark.parametrize("encoding", ["tape+erpe", "erpe_vector", "sinusoidal", "none"])
def test_padding_does_not_change_the_outputs_of_real_series(encoding):
    model = _model(encoding)
    gen = torch.Generator().manual_seed(1)
    series = [torch.randn(3, n, generator=gen) for n in (20, 13, 6)]
    padded = torch.zeros(3, 3, 20)
    for i, s in enumerate(series):
        padded[i, :, : s.shape[1]] = s + 5.0  # garbage in the padding must not matter...
        padded[i, :, s.shape[1]:] = 7.0
    lengths = torch.tensor([20, 13, 6])
    model.eval()
    with torch.no_grad():
        batched = model(padded, lengths)
        for i, s in enumerate(series):
            alone = model(s[None] + 5.0)
            torch.testing.assert_close(batched[i], alone[0], rtol=1e-4, atol=1e-5)
    # ...in training mode too: BatchNorm's statistics skip padded steps (no dropout here)
    model.train()
    short = torch.stack([padded[1, :, :13], padded[2, :, :13]])
    a = model(short, torch.tensor([13, 6]))
    b = model(torch.cat([short, torch.full((2, 3, 7), 3.0)], dim=2), torch.tensor([13, 6]))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_model_builds_convtrans_pieces():
    model = _model()
    assert isinstance(model.input_encoding, TAPE) and model.input_encoding.max_len == 20
    assert isinstance(model.attention.encoding, ERPE) and model.attention.encoding.weight.shape == (8, 39)
    assert model.attention.scale == pytest.approx(16 ** -0.5)  # d_model, as ConvTran
    assert _model(attn_scale="head_dim").attention.scale == pytest.approx(2 ** -0.5)
    assert model.temporal.kernel_size == (1, 8) and model.spatial.kernel_size == (3, 1)
    assert model.attention.query.bias is None
    # tAPE feeds the attention only; the residual carries the plain embedding: with the attention
    # silenced, removing tAPE changes nothing, while with it in place it does
    torch.manual_seed(3)
    x = torch.randn(2, 3, 20)
    model.eval()
    with torch.no_grad():
        with_tape = model(x)
        tape, model.input_encoding = model.input_encoding, None
        assert not torch.allclose(with_tape, model(x))
        model.attention = _Silent()
        without = model(x)
        model.input_encoding = tape
        torch.testing.assert_close(model(x), without)


class _Silent(torch.nn.Module):
    def forward(self, x, positions, mask=None):
        return torch.zeros_like(x)


def test_bad_input_gives_clear_errors():
    model = _model().eval()
    with pytest.raises(ValueError, match="x has 5 channels; this model was built for in_channels=3"):
        model(torch.randn(2, 5, 10))
    with pytest.raises(ValueError, match="x is an empty series \\(0 time steps\\)"):
        model(torch.randn(2, 3, 0))
    with pytest.raises(ValueError, match="x has 21 time steps; this model was built for max_len=20"):
        model(torch.randn(2, 3, 21))
    with pytest.raises(ValueError, match="lengths must be in 1..10 .*\\(an empty series\\)"):
        model(torch.randn(2, 3, 10), torch.tensor([10, 0]))
    with pytest.raises(ValueError, match="x must be a \\[batch, channels, time\\] tensor"):
        model(torch.randn(3, 10))
    with pytest.raises(ValueError, match="dim \\(10\\) must be divisible by num_heads \\(4\\)"):
        ConvTranClassifier(3, 2, 10, dim=10, num_heads=4)


def test_training_learns_a_toy_task_and_checkpoints(tmp_path):
    rng = np.random.default_rng(0)
    t = np.arange(24)
    x, y = [], []
    for i in range(48):
        label = i % 2
        n = int(rng.integers(12, 25))
        wave = np.sin(t[:n] * (0.3 if label else 1.2))
        x.append(np.stack([wave, rng.normal(0, 0.1, n)]).astype(np.float32))
        y.append(["slow", "fast"][label])
    train, test = from_arrays(x[:32], y[:32], x[32:], y[32:])
    settings = ClassifierSettings(dim=8, num_heads=2, ff_dim=16, epochs=8, batch_size=8, seed=0)
    model, metrics = train_classifier(train, test, settings, progress=False, out_dir=str(tmp_path))
    assert metrics["test_accuracy"] >= 0.9 and metrics["steps"] == 32
    assert (tmp_path / "checkpoint.pt").is_file() and (tmp_path / "metrics.jsonl").is_file()
    with pytest.raises(ValueError, match="x has 3 channels; this model was built for in_channels=2"):
        model(torch.zeros(1, 3, 10))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "timeseries", "--encoding", "tape+foo"], "unknown encoding 'foo'"),
        (["train", "timeseries", "--dataset", "NoSuchSet"], "--dataset: unknown dataset 'NoSuchSet'; choose from ACSF1"),
        (["train", "timeseries", "--dim", "10", "--heads", "4"], "--dim (10) must be divisible by --heads (4)"),
        (["train", "timeseries", "--epochs", "0"], "argument --epochs: expected a positive integer, got '0'"),
        (["train", "timeseries", "--resume"], "--resume needs --out"),
        (["train", "timeseries", "--encoding", "alibi"], "'alibi' is defined for causal attention only"),
        (["train", "timeseries", "--encoding", "lap"], "'lap' is a graph encoding; the ConvTran classifier takes"),
        (["train", "timeseries", "--encoding", "erpe", "--encoding-option", "bogus=1"], "--encoding-option: 'erpe' takes no option 'bogus'; it takes"),
        (["train", "timeseries", "--encoding-option", "variant=vector"], "name the part (tape.variant=...)"),
        (["train", "timeseries", "--seed", "-1"], "argument --seed: expected a seed in [0, 2**32), got '-1'"),
        (["train", "timeseries", "--device", "bogus"], "argument --device: expected auto, cpu, cuda, cuda:N, mps or xpu, got 'bogus'"),
        (["bench", "timeseries", "--seeds", "a,b"], "argument --seeds: expected comma-separated integers"),
        (["bench", "timeseries", "--encodings", "tape+bogus"], "--encodings: unknown encoding 'bogus'"),
        (["bench", "timeseries", "--datasets", "Nope"], "--datasets: unknown dataset 'Nope'; choose from"),
    ],
)
def test_cli_bad_arguments_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_train_and_bench_run_and_write_results(tmp_path, capsys):
    out = tmp_path / "train"
    assert cli.main(["train", "timeseries", "--dataset", "BasicMotions", "--epochs", "1", "--no-progress",
                     "--out", str(out)]) == 0
    assert "test accuracy" in capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    assert result["encoding"] == "tape+erpe" and result["command"] == "train timeseries"
    assert result["model_config"]["num_classes"] == 4 and set(result["metrics"]) == {"test_accuracy", "test_loss"}
    # the finished run resumes as a no-op; more epochs would change its schedule; another model is refused
    assert cli.main(["train", "timeseries", "--epochs", "1", "--no-progress", "--out", str(out), "--resume"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "timeseries", "--epochs", "2", "--no-progress", "--out", str(out), "--resume"]) == 2
    assert "made with --epochs/--steps (steps) 2, this one asks for 4" in capsys.readouterr().err
    assert cli.main(["train", "timeseries", "--epochs", "1", "--dim", "32", "--no-progress", "--out", str(out),
                     "--resume"]) == 2
    assert "checkpoint" in capsys.readouterr().err
    assert cli.main(["train", "timeseries", "--epochs", "1", "--no-progress", "--out", str(out)]) == 2
    assert "already holds files" in capsys.readouterr().err
    bench = tmp_path / "bench"
    assert cli.main(["bench", "timeseries", "--datasets", "BasicMotions", "--encodings", "tape+erpe,none",
                     "--seeds", "0,1", "--epochs", "1", "--no-progress", "--out", str(bench)]) == 0
    printed = capsys.readouterr().out
    assert "mean acc" in printed and "tape+erpe" in printed and "1.000" in printed  # the paper's column
    result = json.loads((bench / "timeseries.json").read_text())
    assert len(result["runs"]) == 4 and {r["encoding"] for r in result["summary"]} == {"tape+erpe", "none"}
    assert all(r["runs"] == 2 and 0 <= r["mean"] <= 1 for r in result["summary"])
    assert (bench / "timeseries.png").read_bytes()[:4] == b"\x89PNG"
