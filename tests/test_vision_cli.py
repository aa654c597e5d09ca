"""``posenc train vision`` and the vision demo part: a short run end to end, resume, bad arguments."""

from __future__ import annotations

import argparse
import json

import pytest

from posenc.cli import demo
from posenc.cli import main
from posenc.cli.demo import vision as vision_part

from .cli_helpers import interrupted_at

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--repeats", "1", "--batch-size", "32", "--no-progress"]


def test_train_vision_runs_resumes_and_reports_every_size(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "vision", "--encoding", "rope2d_mixed", "--steps", "6", "--checkpoint-every", "2",
            "--out", str(out), *TINY]
    with interrupted_at(5):  # Ctrl-C after step 5; the checkpoint of step 4 stays
        assert main(args) == 130
    assert main(args) == 2 and "already holds files" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "rope2d_mixed on digits (class) on a 32px canvas" in printed
    for size in ("32", "48", "64"):
        assert f"\n  {size} " in printed
    result = json.loads((out / "results.json").read_text())
    assert result["steps"] == 6 and set(result["accuracy"]) == {"32", "48", "64"}
    assert result["command"] == "train vision" and set(result["metrics"]) == {"accuracy@32", "accuracy@48", "accuracy@64"}
    assert all(0 <= v <= 1 for v in result["accuracy"].values())
    assert result["model_config"]["in_chans"] == 1 and result["model_config"]["num_classes"] == 10
    assert (out / "checkpoint.pt").is_file() and (out / "metrics.jsonl").is_file()


def test_train_vision_on_an_image_folder_with_the_grow_mode_refused(tmp_path, capsys):
    from PIL import Image

    for k, name in enumerate(("a", "b")):
        (tmp_path / "imgs" / name).mkdir(parents=True)
        for j in range(20):
            Image.new("RGB", (12, 9), (120 * k, 10 * j, 50)).save(tmp_path / "imgs" / name / f"{j}.png")
    args = ["train", "vision", "--encoding", "sincos2d", "--data", str(tmp_path / "imgs"), "--img-size", "16",
            "--steps", "2", "--eval-scales", "1,2", *TINY[:6], "--batch-size", "8", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"image folder {tmp_path / 'imgs'}" in printed and "\n  32 " in printed
    assert main([*args, "--eval-mode", "grow"]) == 2
    assert "--eval-mode grow is for the digits" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--encoding", "rope4d"], "--encoding: unknown encoding 'rope4d'"),
        (["--encoding", "erpe"], "--encoding: 'erpe' is a timeseries encoding; a ViT takes vision or seq encodings"),
        (["--encoding", "peg", "--img-size", "30"], "--img-size 30 is not divisible by --patch 4"),
        (["--encoding", "peg", "--eval-scales", "1,1.25"], "--eval-scales: 1.25 x --img-size 32 = 40 pixels is not divisible by --patch 16"),
        (["--encoding", "peg", "--in-chans", "3"], "--in-chans 3: the digits are grayscale (1 channel)"),
        (["--encoding", "peg", "--data", "/nonexistent/x"], "--data: image folder '/nonexistent/x' does not exist"),
        (["--encoding", "peg", "--task", "quadrant"], "--task: unknown task 'quadrant'; choose from class, where"),
        (["--encoding", "sincos2d", "--peg-blocks", "1"], "--peg-blocks is for --encoding peg"),
        (["--encoding", "peg", "--peg-blocks", "9"], "block indices must be below --depth 4"),
        (["--encoding", "peg", "--resume"], "--resume needs --out"),
        (["--encoding", "peg", "--dim", "30", "--heads", "4"], "--dim (30) must be divisible by --heads (4)"),
        (["--encoding", "sincos2d", "--encoding-option", "layout=diagonal"], "layout must be one of"),
        (["--encoding", "conv_spe2d"], "conv_spe2d is defined for linear attention only"),
        (["--encoding", "relbias2d", "--feature-map", "favor"], "score bias of relbias2d cannot apply"),
    ],
)
def test_train_vision_bad_arguments_exit_2_with_a_clear_message(extra, message, capsys):
    patch = ["--patch", "16"] if "--eval-scales" in extra else []
    assert main(["train", "vision", *extra, *patch, "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_wrong_channel_count_for_an_image_folder(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    assert main(["train", "vision", "--encoding", "peg", "--data", str(tmp_path), "--in-chans", "4"]) == 2
    assert "--in-chans 4: an image folder is read as RGB (3) or grayscale (1)" in capsys.readouterr().err


def _demo_args(tmp_path, **over):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--parts", "vision", "--steps", "3", "--no-progress", "--out", str(tmp_path)])
    for k, v in over.items():
        setattr(args, k, v)
    return args


def test_vision_demo_part_trains_each_encoding(tmp_path, capsys):
    assert "vision" in demo.PARTS
    assert demo.run(_demo_args(tmp_path)) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["vision"]
    assert [r["encoding"] for r in rows] == ["learned2d", "peg", "rope2d_mixed"]
    assert [r["hook"] for r in rows] == ["input", "input (between blocks)", "qk"]  # as posenc list names them
    for r in rows:
        assert 0 <= r["accuracy@32"] <= 1 and 0 <= r["accuracy@48"] <= 1 and 0 <= r["accuracy@64"] <= 1
    assert vision_part.TITLE in capsys.readouterr().out
    assert demo.run(_demo_args(tmp_path, vision_encodings="peg,rope9")) == 2
    assert "--vision-encodings: unknown encoding 'rope9'" in capsys.readouterr().err


def test_train_vision_on_linear_attention_with_conv_spe2d(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "vision", "--encoding", "conv_spe2d", "--feature-map", "elu", "--steps", "2",
                 "--out", str(out), *TINY]) == 0
    config = json.loads((out / "results.json").read_text())["model_config"]
    assert config["feature_map"] == "elu" and config["encoding"] == "conv_spe2d"
