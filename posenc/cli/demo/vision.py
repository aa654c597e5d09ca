"""The vision part of ``posenc demo``: a small ViT on digits placed on a 32-pixel canvas, one
encoding per kind (learned with resampling, PEG between blocks, mixed 2D RoPE), evaluated at the
training size and at two larger ones.

The larger sizes are where the papers' finding shows at this scale (``posenc bench resolution``
measured it): the test images resized to 1.5x (CPVT's protocol: the digit grows with the image)
and a 2x canvas with the digit kept at its size ("grow"). Resized to 2x, every encoding collapses
and the comparison says nothing, so the demo does not show it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

TITLE = ("Vision: ViT on digits placed on a 32px canvas; test accuracy at 32px, resized to 48px (accuracy@48, 1.5x), and "
         "on a 64px canvas with the digit kept at 16px (accuracy@64, grow)")

Row = dict[str, object]
IMG_SIZE = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vision-encodings", default="learned2d,peg,rope2d_mixed",
                        help="encodings for the vision part (vision or seq encodings, or none)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with this part's arguments, or None."""
    from ..models.vit import vit_encoding_error as check_encoding

    names = [n for n in args.vision_encodings.split(",") if n]
    if not names:
        return "--vision-encodings: give at least one encoding"
    for name in names:
        error = check_encoding(name, "--vision-encodings")
        if error is not None:
            return error
    return None


def run(args: argparse.Namespace) -> list[Row]:
    """One small ViT per encoding, trained for ``--steps`` steps at 32 pixels."""
    from . import model_done
    from ...training.trainer import TrainConfig
    from ...vision.classify import train_vit, vit_config
    from ...vision.data import DigitsCanvas, digits_at_size

    train = DigitsCanvas("train", canvas_size=IMG_SIZE, digit_size=16, repeats=10, seed=args.seed)
    test = DigitsCanvas("test", canvas_size=IMG_SIZE, digit_size=16, seed=args.seed)
    # 1.5x resized and 2x grown: the settings where resolution changes tell the encodings apart
    eval_sets = {IMG_SIZE: test, IMG_SIZE * 3 // 2: digits_at_size(test, IMG_SIZE * 3 // 2, "scale"),
                 2 * IMG_SIZE: digits_at_size(test, 2 * IMG_SIZE, "grow")}
    rows = []
    for name in (n for n in args.vision_encodings.split(",") if n):
        config = vit_config(name, img_size=IMG_SIZE, patch_size=4, in_chans=1, num_classes=10,
                            dim=48, depth=3, num_heads=4, mlp_ratio=2.0)
        train_config = TrainConfig(
            steps=args.steps, batch_size=64, lr=2e-3, warmup_steps=max(1, args.steps // 10), seed=args.seed,
            progress=not args.no_progress, log_every=max(1, args.steps // 5), device=args.device,
            out_dir=None if args.out is None else str(Path(args.out) / "vision" / name),
        )
        start = time.perf_counter()
        model, metrics, _ = train_vit(config, train, eval_sets, train_config)
        rows.append({
            "encoding": name,
            "hook": _hooks(model),
            "train_s": round(time.perf_counter() - start, 1),
            **{k: round(v, 3) for k, v in metrics.items() if k.startswith("accuracy@")},
        })
        model_done("vision", rows[-1])
    return rows


def _hooks(model) -> str:
    from ...training.report import hook_text

    if model.encoder.conditional:  # the PEG slots between blocks
        return hook_text({"input"}, between_blocks=True)
    enc = model.encoder.encoding
    return "-" if enc is None else hook_text(enc.hooks)


def figure(rows: list[Row], args: argparse.Namespace):
    """Test accuracy per encoding at 32px, resized to 48px and on a 64px canvas (grouped bars, the
    axis from 0 to 1, chance 0.1 marked); None without matplotlib."""
    from ..plots import bar_chart
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return None
    labels = {"accuracy@32": "32px (trained)", "accuracy@48": "48px, resized (1.5x)", "accuracy@64": "64px canvas (grow)"}
    keys = [k for k in rows[0] if k.startswith("accuracy@")] if rows else []
    fig = bar_chart(plt, rows, keys, [labels.get(k, k) for k in keys], accuracy=True, ylabel="test accuracy",
                    chance=0.1, title="ViT on digits placed on a 32px canvas")
    plt.close(fig)  # out of pyplot's list; the caller saves it
    return fig
