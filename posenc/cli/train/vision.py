"""``posenc train vision``: train a ViT with one position encoding on digits placed on a canvas or
on an image folder, and evaluate it at the training size and at larger ones; or, with ``--video``,
on clips of a moving digit whose label is the direction of motion.

::

    posenc train vision --encoding peg                        # digits on a 32x32 canvas, patch 4
    posenc train vision --encoding rope2d_mixed --eval-scales 1,1.5,2,3
    posenc train vision --encoding sincos2d --encoding-option layout=mae --task where
    posenc train vision --encoding learned2d --data ~/pets --img-size 64 --patch 8 --in-chans 3
    torchrun --standalone --nproc_per_node 2 --no-python posenc train vision --encoding axial --out runs/axial
    posenc train vision --video --encoding rope3d --frames 8 --tubelet 1   # moving digits, patch 8

Digits (the default): scikit-learn's 8x8 digits resized to ``--digit-size`` and placed at seeded
random positions on a ``--img-size`` canvas (see :mod:`posenc.vision.data`); ``--task class``
labels the digit, ``--task where`` the digit and its quadrant. An image folder (``--data DIR``):
``DIR/train`` and ``DIR/val`` when present, otherwise a fixed 80/20 split of ``DIR``.

Evaluation: accuracy on the held-out images at each ``--eval-scales`` factor of ``--img-size``
(default 1, 1.5 and 2). ``--eval-mode scale`` resizes the whole image, so the object grows with it
(the protocol of CPVT and RoPE-ViT); ``--eval-mode grow`` (digits only) keeps the digit's size
and enlarges the canvas around it. Training goes through :class:`posenc.training.trainer.Trainer`:
progress bar, ``metrics.jsonl`` and atomic checkpoints in ``--out``, ``--resume``, DDP under
``torchrun``.

Video (``--video``): :class:`posenc.vision.data.MovingDigits`, a ``--digit-size`` digit sliding
across a ``--img-size`` canvas for ``--frames`` frames at 1 .. ``--max-speed`` pixels a frame,
labelled by its direction (right, left, down, up). The set of frames is the same for a path and
its reverse, so only the frame order tells the label: a model blind to time order is capped at
50% (horizontal against vertical). The ViT cuts clips into ``--tubelet`` x ``--patch`` x
``--patch`` tubelets (default 1 x 8 x 8). Take a 3D encoding (``sincos3d``, ``axial3d``,
``rope3d``), a sequence one over the flattened (t, row, col) order, or ``none``; the 2D ones are
refused. With ``--tubelet`` 2 or more, the tubelet embedding itself sees the order of the frames
inside each tubelet, so even ``none`` can learn the direction. A video run is evaluated on
held-out clips of its training size.

The model, training and evaluation helpers live in :mod:`posenc.vision.classify` (shared with
``posenc bench resolution`` and the demo).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from ..argtypes import int_list, positive_float, positive_float_list, positive_int
from ..options import (
    FEATURE_MAP_HELP,
    FEATURE_MAPS,
    add_encoding_arguments,
    add_model_arguments,
    add_optim_arguments,
    add_run_arguments,
    encoding_option_error,
    out_dir_error,
    train_config,
)
from ..models.vit import vit_encoding_error as check_encoding
from ..sizes import Work, defaults_of, size_error, transformer
from ...training.report import format_table

if TYPE_CHECKING:
    from torch.utils.data import Dataset
from . import run_checked, run_dir_error, write_results

PROG = "posenc train vision"

# the ViT's helpers live with it (posenc.vision.classify); kept importable here, read on first use
_VIT_HELPERS = ("accuracy", "build_vit", "classification_loss", "eval_sizes", "evaluate_sizes", "train_vit", "vit_config")


def __getattr__(name: str):
    if name in _VIT_HELPERS:
        from ...vision import classify

        return getattr(classify, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_encoding_arguments(parser, what="a registered vision or seq encoding (posenc list --modality vision)",
                           example="layout=mae")
    parser.add_argument("--feature-map", choices=FEATURE_MAPS, default=None, help=FEATURE_MAP_HELP)
    parser.add_argument("--peg-blocks", type=int_list(minimum=0, allow_empty=True), default=[0],
                        help="peg: blocks (0-based) after which the PEG is applied (default 0)")
    parser.add_argument("--data", default=None, help="an ImageFolder tree (default: digits on a canvas)")
    parser.add_argument("--img-size", type=positive_int, default=32, help="training image side: the canvas for digits")
    parser.add_argument("--digit-size", type=positive_int, default=16, help="digits: side of the digit on the canvas")
    parser.add_argument("--task", default=None,
                        help="digits: 'class' (10 classes, the default) or 'where' (class and quadrant, 40)")
    parser.add_argument("--repeats", type=positive_int, default=10, help="digits: placements per training digit")
    parser.add_argument("--in-chans", type=positive_int, default=None,
                        help="image channels (digits: 1; image folder: 3 for RGB, or 1 for grayscale; default 3)")
    parser.add_argument("--patch", type=positive_int, default=None, help="patch side in pixels (default 4; 8 with --video)")
    parser.add_argument("--eval-scales", type=positive_float_list, default=None,
                        help="evaluation sizes as factors of --img-size (default 1,1.5,2)")
    parser.add_argument("--video", action="store_true",
                        help="train on clips of a moving digit labelled by its direction (3D or seq encodings)")
    parser.add_argument("--frames", type=positive_int, default=None, help="--video: frames per clip (default 8)")
    parser.add_argument("--tubelet", type=positive_int, default=None,
                        help="--video: frames per tubelet (default 1; from 2 on the embedding sees the order inside it)")
    parser.add_argument("--max-speed", type=positive_int, default=None, help="--video: top speed in pixels a frame (default 2)")
    parser.add_argument("--eval-mode", choices=("scale", "grow"), default="scale",
                        help="scale: resize the whole image; grow: digits keep their size on a larger canvas")
    add_model_arguments(parser, dim=96, depth=4, heads=4)
    parser.add_argument("--mlp-ratio", type=positive_float, default=2.0, help="MLP width as a multiple of --dim")
    parser.add_argument("--pool", choices=("cls", "avg"), default="cls", help="class token or global average pooling")
    add_optim_arguments(parser, steps=1000, batch_size=64, lr=1e-3, weight_decay=0.05)
    add_run_arguments(parser)


IMAGE_DEFAULTS = {"patch": 4, "task": "class", "eval_scales": [1.0, 1.5, 2.0]}
VIDEO_DEFAULTS = {"patch": 8, "frames": 8, "tubelet": 1, "max_speed": 2, "eval_scales": [1.0]}
VIDEO_ONLY = ("frames", "tubelet", "max_speed")


def _video_flag_error(args: argparse.Namespace) -> str | None:
    """Flags given for the other kind of run (checked before the defaults are filled in)."""
    video = getattr(args, "video", False)
    if not video:
        for name in VIDEO_ONLY:
            if getattr(args, name, None) is not None:
                return f"--{name.replace('_', '-')} is for --video runs"
        return None
    if args.data is not None:
        return "--data is for images; --video trains on moving digits made in code"
    if args.task is not None:
        return "--task is for images (class, where); the label of a --video clip is the direction of motion"
    if args.eval_scales is not None or args.eval_mode != "scale":
        return "--eval-scales and --eval-mode are for images; a --video run is evaluated on clips of its training size"
    return None


def _fill_defaults(args: argparse.Namespace) -> None:
    """Set the options left at None to the defaults of an image or a ``--video`` run."""
    video = getattr(args, "video", False)
    for name, value in {**IMAGE_DEFAULTS, **(VIDEO_DEFAULTS if video else {})}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, list(value) if isinstance(value, list) else value)


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (before any data is read or model built), or None. Fills
    in the defaults that depend on ``--video`` first."""
    video = getattr(args, "video", False)
    error = _video_flag_error(args)
    if error is not None:
        return error
    _fill_defaults(args)
    error = check_encoding(args.encoding, feature_map=getattr(args, "feature_map", None), video=video)
    if error is None:
        error = encoding_option_error(args.encoding, args.encoding_option)
    if error is not None:
        return error
    if args.dim % args.heads:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads})"
    if args.img_size % args.patch:
        return f"--img-size {args.img_size} is not divisible by --patch {args.patch}"
    for scale in args.eval_scales:
        size = int(round(args.img_size * scale))
        if size % args.patch:
            return (f"--eval-scales: {scale:g} x --img-size {args.img_size} = {size} pixels is not divisible by "
                    f"--patch {args.patch}")
    if video:
        if args.in_chans is not None and args.in_chans != 1:
            return f"--in-chans {args.in_chans}: the moving digits are grayscale (1 channel); leave --in-chans out or pass 1"
        if args.frames < 2:
            return f"--frames must be at least 2 for a motion to have a direction, got {args.frames}"
        if args.frames % args.tubelet:
            return f"--frames {args.frames} is not divisible by --tubelet {args.tubelet}"
        path = (args.frames - 1) * args.max_speed
        if path > args.img_size - args.digit_size:
            return (f"--frames {args.frames} at --max-speed {args.max_speed} make a path of {path} pixels, more than "
                    f"--img-size {args.img_size} minus --digit-size {args.digit_size} leaves")
    elif args.data is None:
        from ..models.vit import DIGIT_TASKS as TASKS  # named without torch

        if args.in_chans is not None and args.in_chans != 1:
            return f"--in-chans {args.in_chans}: the digits are grayscale (1 channel); leave --in-chans out or pass 1"
        if args.task not in TASKS:
            return f"--task: unknown task {args.task!r}; choose from {', '.join(TASKS)}"
        if args.digit_size > args.img_size:
            return f"--digit-size ({args.digit_size}) must not exceed --img-size ({args.img_size})"
        if args.task == "where" and args.img_size < args.digit_size + 2:
            return f"--task where needs --img-size >= --digit-size + 2; got {args.img_size} and {args.digit_size}"
    else:
        if not Path(args.data).is_dir():
            return f"--data: image folder {args.data!r} does not exist"
        if args.in_chans is not None and args.in_chans not in (1, 3):
            return f"--in-chans {args.in_chans}: an image folder is read as RGB (3) or grayscale (1)"
        if args.eval_mode == "grow":
            return "--eval-mode grow is for the digits (it enlarges the canvas around the digit); use scale with --data"
    if args.encoding != "peg" and args.peg_blocks != [0]:
        return f"--peg-blocks is for --encoding peg (got --encoding {args.encoding})"
    if any(b >= args.depth for b in args.peg_blocks):
        return f"--peg-blocks {','.join(map(str, args.peg_blocks))}: block indices must be below --depth {args.depth}"
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments), describe=describe)
    if error is not None:
        return error
    return out_dir_error(args.out, args.resume) or run_dir_error(args.out)


# the size flags of the policy (posenc.cli.sizes)
SIZE_FLAGS = ("steps", "batch_size", "img_size", "eval_scales", "repeats", "patch", "frames", "dim", "depth",
              "mlp_ratio", "digit_size")
DIGITS = 1797  # scikit-learn's digits: about 80% train, 20% test
FOLDER_IMAGES = 1000  # an image folder's test images, unknown before it is read


def _value(args: argparse.Namespace, name: str):
    """``args.name``, or the default of an image or ``--video`` run where it is left at None."""
    value = getattr(args, name, None)
    if value is None:
        value = {**IMAGE_DEFAULTS, **(VIDEO_DEFAULTS if getattr(args, "video", False) else {})}.get(name)
    return value


def _tokens(args: argparse.Namespace, size: float) -> int:
    frames = _value(args, "frames") // _value(args, "tubelet") if getattr(args, "video", False) else 1
    return frames * int(size // _value(args, "patch")) ** 2 + 1


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): the training steps, the data made in memory (digits:
    ``--repeats`` placements of each, as float32 images), each evaluation at every size."""
    sizes = [args.img_size * s for s in _value(args, "eval_scales")] + [args.img_size]
    dim = args.dim * math.sqrt((8 + 4 * args.mlp_ratio) / 24)  # the cost model's MLP is 4x wide, this one --mlp-ratio
    train = transformer(args.batch_size, _tokens(args, args.img_size), dim, args.depth, steps=args.steps)
    test = FOLDER_IMAGES if args.data is not None else DIGITS // 5
    frames = _value(args, "frames") if getattr(args, "video", False) else 1
    images = DIGITS * args.repeats if args.data is None else 0
    data = Work(bytes=4 * images * frames * args.img_size ** 2)
    one_eval = Work()
    for size in sizes:
        one_eval = one_eval + transformer(test, _tokens(args, size), dim, args.depth, train=False)
    evaluations = 1 + (args.steps // args.eval_every if args.eval_every else 0)
    return train + one_eval * evaluations + data


def describe(args: argparse.Namespace) -> str:
    largest = max([args.img_size * s for s in _value(args, "eval_scales")] + [args.img_size])
    return (f"{args.steps} steps at batch {args.batch_size} x {_tokens(args, args.img_size)} tokens, width {args.dim}, "
            f"depth {args.depth}, evaluated at {_tokens(args, largest)} tokens")


def run(args: argparse.Namespace) -> int:
    return run_checked(PROG, args, check, _train)


def _datasets(args: argparse.Namespace) -> tuple[Dataset, dict[int, Dataset], str, int, int]:
    """(train set, {size: test set}, a description, in_chans, num_classes)."""
    from ...vision.classify import eval_sizes
    from ...vision.data import DigitsCanvas, MovingDigits, digits_at_size, image_folder

    if args.video:
        common = dict(frames=args.frames, canvas_size=args.img_size, digit_size=args.digit_size,
                      max_speed=args.max_speed, seed=args.seed)
        train = MovingDigits("train", repeats=args.repeats, **common)
        test = MovingDigits("test", **common)
        source = (f"moving digits (direction) on a {args.img_size}px canvas, {args.frames} frames, digit "
                  f"{args.digit_size}px, speed 1..{args.max_speed}px a frame")
        return train, {args.img_size: test}, source, 1, train.num_classes

    sizes = eval_sizes(args.img_size, args.eval_scales)
    if args.data is None:
        train = DigitsCanvas("train", canvas_size=args.img_size, digit_size=args.digit_size, task=args.task,
                             repeats=args.repeats, seed=args.seed)
        test = DigitsCanvas("test", canvas_size=args.img_size, digit_size=args.digit_size, task=args.task,
                            seed=args.seed)
        sets = {s: test if s == args.img_size else digits_at_size(test, s, args.eval_mode) for s in sizes}
        source = f"digits ({args.task}) on a {args.img_size}px canvas, digit {args.digit_size}px"
        return train, sets, source, 1, train.num_classes
    in_chans = 3 if args.in_chans is None else args.in_chans
    train = image_folder(args.data, args.img_size, split="train", in_chans=in_chans)
    sets = {s: image_folder(args.data, s, split="test", in_chans=in_chans) for s in sizes}
    return train, sets, f"image folder {args.data}", in_chans, train.num_classes


def _train(args: argparse.Namespace) -> int:
    from ...vision.classify import train_vit, vit_config

    train, sets, source, in_chans, num_classes = _datasets(args)
    model_config = vit_config(
        args.encoding, img_size=args.img_size, patch_size=args.patch, in_chans=in_chans, num_classes=num_classes,
        dim=args.dim, depth=args.depth, num_heads=args.heads, mlp_ratio=args.mlp_ratio, pool=args.pool,
        encoding_options=dict(args.encoding_option), peg_blocks=args.peg_blocks, feature_map=getattr(args, "feature_map", None),
        dropout=args.dropout, **({"num_frames": args.frames, "tubelet_size": args.tubelet} if args.video else {}),
    )
    config = train_config(args)
    model, metrics, trainer = train_vit(model_config, train, sets, config)
    if not trainer.is_main:
        return 0
    params = sum(p.numel() for p in model.parameters())
    print(f"\n{args.encoding} on {source}: {params / 1e6:.2f}M parameters, {trainer.step} steps, "
          f"final train loss {metrics['train_loss']:.4f}")
    if args.video:
        print(f"test accuracy on held-out clips (chance 0.25; blind to frame order at most 0.5), tubelet "
              f"{args.tubelet} x {args.patch} x {args.patch}:")
        rows = [[s, args.frames, _fmt(metrics[f"accuracy@{s}"])] for s in sets]
        print(format_table(["size", "frames", "accuracy"], rows, align="rrr"))
    else:
        print(f"test accuracy by image size (eval mode {args.eval_mode}; trained at {args.img_size}):")
        rows = [[s, f"{s / args.img_size:g}x", _fmt(metrics[f"accuracy@{s}"])] for s in sets]
        print(format_table(["size", "scale", "accuracy"], rows, align="rrr"))
    result = {
        "command": "train vision", "encoding": args.encoding, "model_config": model_config,
        "train_config": config.to_dict(), "steps": trainer.step, "train_loss": metrics["train_loss"],
        "metrics": {f"accuracy@{s}": _json_number(metrics[f"accuracy@{s}"]) for s in sets},
        "source": source, "eval_mode": args.eval_mode, "train_size": args.img_size,
        "accuracy": {str(s): _json_number(metrics[f"accuracy@{s}"]) for s in sets},
    }
    if args.video:
        result["video"] = {"frames": args.frames, "tubelet": args.tubelet, "max_speed": args.max_speed}
        del result["eval_mode"]
    write_results(args.out, result)
    return 0


def _json_number(value: float) -> float | None:
    return None if math.isnan(value) else value  # JSON has no NaN: a refused size is null


def _fmt(value: float) -> str:
    return "refused" if math.isnan(value) else f"{value:.4f}"
