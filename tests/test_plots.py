"""Every figure of the commands, rendered from a small made-up result, follows posenc.cli.plots:
accuracies on a 0-to-1 axis with a labelled chance line, the legend outside the panels,
coinciding lines named in a note, memory on a linear MB axis. Each test keeps the figures that
were saved (Figure.savefig is wrapped) and reads them back; the PNGs land in tmp_path."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402


@pytest.fixture
def saved(monkeypatch):
    """The figures saved during the test, in order."""
    figures: list[Figure] = []
    original = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _chance_lines(ax) -> list[float]:
    """The y of each horizontal line across the panel drawn in the chance colour."""
    from posenc.cli.plots import CHANCE_COLOR

    ys = []
    for line in ax.get_lines():
        y = line.get_ydata()
        if line.get_color() == CHANCE_COLOR and len(y) == 2 and y[0] == y[1]:
            ys.append(float(y[0]))
    return ys


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def _assert_accuracy_axis(ax, chance: float | None) -> None:
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
    if chance is not None:
        assert _chance_lines(ax) == [pytest.approx(chance)]
        assert any(t.startswith("chance") for t in _texts(ax)), _texts(ax)


def _assert_legend_outside(fig) -> None:
    assert fig.legends, "no figure legend"
    assert all(ax.get_legend() is None for ax in fig.axes), "a legend inside a panel"


def _note(fig) -> str:
    return fig._supxlabel.get_text() if fig._supxlabel is not None else ""


def test_resolution_plot(tmp_path, saved):
    from posenc.cli.bench.resolution import plot

    def stats(*means):
        return {str(s): {"mean": m} for s, m in zip((32, 48, 64), means)}

    result = {"modes": ["scale", "grow"], "sizes": [32, 48, 64], "encodings": ["learned2d", "peg", "rope2d_mixed"],
              "train_size": 32, "chance": 0.1,
              "summary": {"scale": {"learned2d": stats(0.97, 0.70, 0.12), "peg": stats(0.97, 0.88, 0.30),
                                    "rope2d_mixed": stats(0.96, 0.85, 0.25)},
                          "grow": {"learned2d": stats(0.97, 0.0851, 0.0851), "peg": stats(0.97, 0.0852, 0.0852),
                                   "rope2d_mixed": stats(0.96, 0.40, 0.20)}}}
    assert plot(result, tmp_path / "resolution.png") and _is_png(tmp_path / "resolution.png")
    (fig,) = saved
    for ax in fig.axes:
        _assert_accuracy_axis(ax, 0.1)
    _assert_legend_outside(fig)
    assert "grow: learned2d = peg (32 to 64)" in _note(fig), _note(fig)


def test_timeseries_plot(tmp_path, saved):
    from posenc.cli.bench.timeseries import plot

    runs = [{"dataset": d, "encoding": e, "seed": s, "test_accuracy": a}
            for d, e, accs in [("BasicMotions", "tape+erpe", (1.0, 0.975)), ("BasicMotions", "none", (0.5, 0.6)),
                               ("GunPoint", "tape+erpe", (0.98, 0.95)), ("GunPoint", "none", (0.49, 0.84))]
            for s, a in enumerate(accs)]
    rows = [{"dataset": d, "encoding": e, "mean": float(np.mean(a)), "std": float(np.std(a)), "min": min(a), "max": max(a)}
            for d, e, a in [("BasicMotions", "tape+erpe", (1.0, 0.975)), ("BasicMotions", "none", (0.5, 0.6)),
                            ("GunPoint", "tape+erpe", (0.98, 0.95)), ("GunPoint", "none", (0.49, 0.84))]]
    plot(rows, runs, str(tmp_path / "timeseries.png"), {"BasicMotions": 0.25, "GunPoint": 0.5})
    assert _is_png(tmp_path / "timeseries.png")
    (fig,) = saved
    for ax, chance in zip(fig.axes, (0.25, 0.5)):
        _assert_accuracy_axis(ax, chance)
    _assert_legend_outside(fig)


def test_extrapolation_plot_tells_lines_at_zero_apart(tmp_path, saved):
    from posenc.cli.bench.extrapolation import _plot

    args = argparse.Namespace(eval_lens=[8, 16, 32], train_len=8, task="reverse")
    rows = [{"encoding": "rope", "eval": {"8": 1.0, "16": 0.0, "32": 0.0}},
            {"encoding": "learned", "eval": {"8": 0.98, "16": 0.0, "32": 0.0}},
            {"encoding": "sinusoidal", "eval": {"8": 0.99, "16": 0.0, "32": 0.0}},
            {"encoding": "nope", "eval": {"8": 1.0, "16": 0.6, "32": 0.2}}]
    _plot(rows, args, "exact_match", tmp_path / "extrapolation.png")
    assert _is_png(tmp_path / "extrapolation.png")
    (fig,) = saved
    (ax,) = fig.axes
    _assert_accuracy_axis(ax, None)
    _assert_legend_outside(fig)
    markers = {line.get_label(): line.get_marker() for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert len(set(markers.values())) == 4, markers  # each line its own marker
    assert "rope = learned = sinusoidal (16 to 32)" in _note(fig), _note(fig)


def test_attention_growth_plot_has_a_linear_mb_axis_and_names_lines_on_the_baseline(tmp_path, saved):
    from posenc.cli.bench.attention import BASELINE, BenchResult, GrowthResult, Row, plot_growth

    def result(t, scale):
        return BenchResult({"seq_len": t}, [Row(BASELINE, "sdpa", ms=1.0 * scale, peak_mb=6.0 * scale),
                                             Row("alibi", "posenc", ms=1.3 * scale, peak_mb=6.0 * scale),
                                             Row("t5", "posenc", ms=2.0 * scale, peak_mb=9.0 * scale)], [])

    config = {"batch": 2, "heads": 4, "head_dim": 16, "device": "cpu", "dtype": "float32", "background_load": "off"}
    growth = GrowthResult(config, [result(256, 1.0), result(512, 2.0), result(1024, 4.0)])
    assert plot_growth(growth, tmp_path / "attention.png") and _is_png(tmp_path / "attention.png")
    (fig,) = saved
    time_ax, memory_ax = fig.axes
    assert time_ax.get_yscale() == "log" and memory_ax.get_yscale() == "linear"
    assert memory_ax.get_ylim()[0] == 0
    labels = [t.get_text() for t in memory_ax.get_yticklabels() if t.get_text()]
    assert labels and all("10^" not in s and "times" not in s and "x" not in s for s in labels), labels
    assert f"{BASELINE} = alibi" in _note(fig)
    _assert_legend_outside(fig)


def test_context_extension_plot(tmp_path, saved):
    from posenc.cli.bench.context_extension import _plot

    lens = [128, 256, 512]
    rows = [{"label": label, "zero_shot": dict(zip(map(str, lens), zs)), "finetuned": dict(zip(map(str, lens), ft))}
            for label, zs, ft in [("none", (2.0, 3.0, 4.0), (2.0, 2.9, 3.8)), ("linear x4", (2.2, 2.3, 2.4), (2.1, 2.2, 2.3)),
                                  ("yarn x4", (2.0, 2.3, 2.4), (2.0, 2.2, 2.3))]]
    _plot(rows, lens, 128, tmp_path / "context_extension.png")
    assert _is_png(tmp_path / "context_extension.png")
    (fig,) = saved
    _assert_legend_outside(fig)
    for ax in fig.axes:
        assert len({line.get_marker() for line in ax.get_lines() if not line.get_label().startswith("_")}) == 3


def test_hf_plot(tmp_path, saved):
    from posenc.cli.bench.hf import _plot

    rows = [{"variant": v, "bits_per_byte": {"64": a, "128": b}, "train_tokens_per_s": s}
            for v, a, b, s in [("llama-rope (sdpa)", 2.5, 3.1, 9000.0), ("posenc rope", 2.5, 3.1, 8800.0),
                               ("alibi", 2.6, 2.6, 8700.0)]]
    args = argparse.Namespace(train_len=64, depth=2, dim=64, heads=4)
    png = _plot(rows, [64, 128], args)
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "hf.png").write_bytes(png)
    (fig,) = saved
    _assert_legend_outside(fig)
    assert "llama-rope (sdpa) = posenc rope" in _note(fig)


def test_generate_plot(tmp_path, saved):
    from posenc.cli.bench.generate_report import Cell, GenerateResult, Row, plot

    config = {"batches": [1, 8], "contexts": [128, 512], "dim": 64, "depth": 2, "heads": 4, "dtype": "float32",
              "background_load": "off"}
    rows = [Row(name, impl, [Cell(c, b, tokens_per_s=tps * b / (1 + c / 512)) for c in (128, 512) for b in (1, 8)])
            for name, impl, tps in [("rope", "posenc", 900.0), ("alibi", "posenc", 850.0), ("llama", "transformers", 950.0)]]
    assert plot(GenerateResult(config, rows, []), tmp_path / "generate.png") and _is_png(tmp_path / "generate.png")
    (fig,) = saved
    _assert_legend_outside(fig)


def test_spline_plot(tmp_path, saved):
    from posenc.cli.bench.spline import _plot

    t = np.linspace(0, 1, 32)
    truth = np.stack([np.stack([np.cos(3 * t + j), np.sin(2 * t + j)], -1) for j in range(3)])
    long_t = np.linspace(0, 1, 128)
    truth4 = np.stack([np.stack([np.cos(3 * long_t + j), np.sin(2 * long_t + j)], -1) for j in range(3)])
    drawings = {name: {"truth": {1: truth, 4: truth4}, "1x": truth + 0.05, "4x longer": truth4 + 0.1,
                       "4x finer": truth4 - 0.1} for name in ("spline", "alibi")}
    _plot(drawings, argparse.Namespace(length=32), 4, tmp_path / "spline.png")
    assert _is_png(tmp_path / "spline.png")
    (fig,) = saved
    _assert_legend_outside(fig)


DEMO_ROWS = {
    "seq": [{"encoding": e, "hook": "-", "train_s": 1.0, "bits_per_byte@64": a, "bits_per_byte@128": b}
            for e, a, b in [("none", 2.9, 3.4), ("rope", 2.4, 2.9), ("alibi", 2.3, 2.4)]],
    "vision": [{"encoding": e, "hook": "input", "train_s": 1.0, "accuracy@32": a, "accuracy@48": b, "accuracy@64": c}
               for e, a, b, c in [("learned2d", 0.97, 0.6, 0.1), ("peg", 0.97, 0.85, 0.0), ("rope2d_mixed", 0.96, 0.8, 0.3)]],
    "graph": [{"encoding": e, "hook": "input", "train_s": 1.0, "test_accuracy": a}
              for e, a in [("none", 0.1), ("lap", 1.0), ("rwse", 0.98)]],
    "timeseries": [{"encoding": e, "steps": 200, "train_s": 1.0, "test_accuracy": a}
                   for e, a in [("tape+erpe", 0.987), ("none", 0.493)]],
}
DEMO_CHANCE = {"seq": 8.0, "vision": 0.1, "graph": 0.1, "timeseries": 0.5}


@pytest.mark.parametrize("part", list(DEMO_ROWS))
def test_each_demo_part_has_a_figure(part, tmp_path):
    import importlib

    module = importlib.import_module(f"posenc.cli.demo.{part}")
    args = argparse.Namespace(ts_dataset="GunPoint")
    fig = module.figure(DEMO_ROWS[part], args, chance=0.5) if part == "timeseries" else module.figure(DEMO_ROWS[part], args)
    fig.savefig(tmp_path / f"{part}.png", dpi=80)
    assert _is_png(tmp_path / f"{part}.png")
    (ax,) = fig.axes
    if part == "seq":
        assert ax.get_ylim()[0] == 0 and _chance_lines(ax) == [8.0]
        assert ax.get_yscale() == "linear"
    else:
        _assert_accuracy_axis(ax, DEMO_CHANCE[part])
    if part in ("seq", "vision"):  # bars of several kinds: a legend, outside
        _assert_legend_outside(fig)
    assert ax.get_legend() is None
    if part == "vision":  # a bar of 0 still shows its value
        assert "0.00" in {t.get_text() for t in ax.texts}


def test_the_timeseries_chance_comes_from_the_dataset_header():
    pytest.importorskip("sktime")
    from posenc.cli.demo.timeseries import class_count

    assert class_count("GunPoint") == 2 and class_count("BasicMotions") == 4
    assert class_count("no-such-dataset") is None


def test_demo_plots_writes_one_figure_per_part(tmp_path):
    from posenc import cli

    plots = tmp_path / "figs"
    argv = ["demo", "--parts", "graph", "--steps", "3", "--graph-per-class", "3", "--graph-encodings", "none,rwse",
            "--no-progress", "--plots", str(plots), "--threads", "1"]
    assert cli.main(argv) == 0
    assert sorted(p.name for p in plots.iterdir()) == ["graph.png"] and _is_png(plots / "graph.png")


def test_demo_plots_into_a_file_is_one_line(tmp_path, capsys):
    from posenc import cli

    (tmp_path / "afile").write_text("x")
    assert cli.main(["demo", "--parts", "graph", "--plots", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plots" in err[0] and "is not a directory" in err[0], err


def test_overlapping_names_each_group_and_the_stretch_it_shares():
    from posenc.cli.plots import overlapping

    series = {"a": [1.0, 0.0, 0.0], "b": [0.9, 0.0, 0.0], "c": [0.5, 0.6, 0.7], "d": [0.5, 0.6, 0.9],
              "e": [None, 0.0, None]}
    assert overlapping(series, [8, 16, 32], 0.01) == ["c = d (8 to 16)", "a = b (16 to 32)"]
    assert overlapping({"a": [0.3], "b": [0.3], "c": [0.5]}, [64], 0.01) == ["a = b (at 64)"]
    assert overlapping({"a": [0.1, 0.2], "b": [0.3, 0.4]}, [1, 2], 0.01) == []
