"""``posenc bench spline``: the Spline-based Transformer against positional-encoding baselines on
synthetic 2D curves (Chandran et al., ECCV 2024, https://arxiv.org/abs/2504.02797, small).

::

    posenc bench spline --out runs/spline
    posenc bench spline --models spline,spline+rope,alibi,rope --steps 500 --scales 1,2,4,8

Every model is a sequence autoencoder with the same skeleton, width, depth, bottleneck and
training (same seed, same curves in the same order, same steps and schedule); they differ only
in how the decoder knows where each output point goes:

- ``spline``: :class:`posenc.seq.SplineTransformer`, no positional encoding anywhere. The
  encoder (causal mask, so that it sees order) turns the input points and ``K`` control tokens
  into ``K`` control points; the decoder reads a cubic B-spline through them, sampled at
  ``t_i = i / (N - 1)``.
- ``spline+NAME`` (default ``spline+alibi``): the same, but the *encoder* (bidirectional) has the
  registered encoding NAME; the decoder still has none. It separates what the spline decoder
  brings from how hard order is to learn without any encoding.
- any registered sequence encoding (default ``alibi``, ``sinusoidal``):
  :class:`posenc.seq.PositionalAutoencoder` with that encoding. The encoder turns the input
  points and ``K`` latent tokens into ``K`` codes; the decoder's ``N`` queries (one learned
  vector) get their positions from the encoding (ALiBi: the symmetric bias; sinusoidal: added to
  the queries and inputs).

Both have ``K x dim`` numbers between encoder and decoder (``--control-points``) and the same
parameter count up to one vector (the baselines' query); the table lists the counts.

Data: random smooth open curves (:class:`posenc.seq.SmoothCurves`), trained at ``--length``
points (a fresh batch of curves each step), scored on ``--eval-curves`` held-out curves.
Metric: mean squared error per coordinate between the reconstruction and the true curve.
What "at k x" means (``--scales``; ``1x`` is plain reconstruction at the training length):

- ``k x longer``: the same held-out curves sampled at ``k L`` points go in, ``k L`` points come
  out (a longer sequence than any in training). The spline model's encoder sees ``k L`` tokens and
  its decoder samples the trajectory at ``k L`` times; the baselines see positions
  ``0 .. kL-1``, beyond the trained ``0 .. L-1`` (their native extrapolation).
- ``k x finer``: the curves at the training length ``L`` go in, ``k L`` points come out
  (resampling at a finer step). The spline model decodes its trajectory at ``k L`` times; the
  baselines' queries sit at the fractional positions ``i (L - 1) / (kL - 1)``, which span the
  trained range.

The reference line ``mean-point`` is the error of outputting each curve's mean point everywhere
(the curves' variance): a model at that level has learned nothing about the shape.

Outputs (with ``--out``): ``spline.txt`` (the table), ``spline.json`` and ``spline.png``
(three held-out curves per model: truth and reconstruction at 1x, 4x longer, 4x finer; the
largest scale when 4 is not among ``--scales``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..argtypes import device_name, int_list, positive_float, positive_int, seed_value
from ..errors import usage_error
from ..outputs import out_error, save_figure, write_file, write_json_file
from ..sizes import Work, add_allow_large, defaults_of, size_error, transformer
from ...training.report import format_table
from .load import format_load_average, load_average

if TYPE_CHECKING:
    import torch

PROG = "posenc bench spline"
DEFAULT_MODELS = ("spline", "spline+alibi", "alibi", "sinusoidal")
SPLINE = "spline"


def _spline_encoder(name: str) -> tuple[bool, str | None]:
    """``(is a spline model, its encoder's encoding)`` for a ``--models`` name."""
    if name == SPLINE:
        return True, None
    if name.startswith(SPLINE + "+"):
        return True, name[len(SPLINE) + 1:]
    return False, None


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated model names, got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=_names, default=list(DEFAULT_MODELS),
                        help=f"'spline', 'spline+ENCODING' (an encoding in the spline encoder only) and/or registered "
                             f"sequence encodings for the baseline (default {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--length", type=positive_int, default=32, help="points per curve in training (default 32)")
    parser.add_argument("--scales", type=int_list(minimum=1), default=[1, 2, 4],
                        help="evaluation lengths as multiples of --length (default 1,2,4)")
    parser.add_argument("--steps", type=positive_int, default=1000, help="training steps per model (default 1000)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="examples per batch")
    parser.add_argument("--lr", type=positive_float, default=3e-3, help="peak learning rate (warm-up then cosine; default 3e-3)")
    parser.add_argument("--dim", type=positive_int, default=64, help="model width")
    parser.add_argument("--depth", type=positive_int, default=2, help="blocks in the encoder and in the decoder (default 2)")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads (must divide --dim)")
    parser.add_argument("--control-points", type=positive_int, default=8,
                        help="K: spline control points, and the baselines' latent tokens (default 8)")
    parser.add_argument("--degree", type=positive_int, default=3, help="B-spline degree (default 3, cubic)")
    parser.add_argument("--encoder-mask", choices=("causal", "full"), default="causal",
                        help="the attention of the 'spline' model's encoder (default causal: order without positional "
                             "encoding; 'spline+ENCODING' encoders are always bidirectional)")
    parser.add_argument("--eval-curves", type=positive_int, default=256, help="held-out curves (default 256)")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the data, the initialisation and dropout")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--out", default=None, help="directory for spline.{txt,json,png}")
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    add_allow_large(parser)


SIZE_FLAGS = ("steps", "batch_size", "length", "scales", "eval_curves", "dim", "depth", "control_points")
OUTPUTS = ("spline.txt", "spline.json", "spline.png")


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): per model, the training steps of an encoder and a decoder
    at ``--length`` points, and the held-out curves at every scale, longer and finer; memory: the
    curves (training ones made at once, the held-out ones at every scale) and the longest pass."""
    k = args.control_points
    train = transformer(args.batch_size, args.length + k, args.dim, 2 * args.depth, steps=args.steps)
    tests = transformer(args.eval_curves, args.length + k, args.dim, 2 * args.depth, train=False)
    for scale in args.scales:
        tests = tests + transformer(args.eval_curves, scale * args.length + k, args.dim, 2 * args.depth, train=False) * 2
    points = args.steps * args.batch_size * args.length + args.eval_curves * args.length * (1 + sum(args.scales))
    data = Work(bytes=4 * 2 * 3 * points)  # x and y of the truth, the reconstructions
    return (train + tests) * len(args.models) + data


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, or None."""
    from ..catalog import names, suggest

    if len(set(args.models)) != len(args.models):
        return f"--models: a name is repeated in {','.join(args.models)}"
    for name in args.models:  # from the catalog: answered before torch loads
        is_spline, encoding = _spline_encoder(name)
        if is_spline and encoding is None:
            continue
        if (encoding if is_spline else name) not in names():
            hint = suggest(encoding if is_spline else name, names(("seq",))) or " (posenc list --modality seq)"
            return f"--models: {name!r} is not 'spline', 'spline+ENCODING' nor a registered encoding{hint}"
    if args.dim % args.heads:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads})"
    if args.control_points < args.degree + 1:
        return (f"--control-points ({args.control_points}) must be at least --degree + 1 ({args.degree + 1}) for a "
                f"degree-{args.degree} B-spline")
    if args.seed < 0:
        return f"--seed must be >= 0, got {args.seed}"
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments)) or out_error(args.out, OUTPUTS)
    if error is not None:
        return error
    for name in args.models:  # build each once, so that a bad combination fails before any training
        try:
            _build(args, name)
        except (ValueError, TypeError) as exc:
            return f"--models {name}: {exc}"
    return None


def _build(args: argparse.Namespace, name: str) -> torch.nn.Module:
    from ...seq.latent_autoencoder import PositionalAutoencoder
    from ...seq.spline import SplineTransformer

    max_len = args.length * max(args.scales)
    is_spline, encoding = _spline_encoder(name)
    if is_spline:
        return SplineTransformer(
            2, args.dim, args.depth, args.heads, num_control_points=args.control_points, degree=args.degree,
            encoder_mask=args.encoder_mask if encoding is None else "full", encoder_encoding=encoding, max_len=max_len,
        )
    return PositionalAutoencoder(2, args.dim, args.depth, args.heads, num_latents=args.control_points, encoding=name,
                                 max_len=max_len)


def _progress(args: argparse.Namespace, text: str) -> None:
    if not args.no_progress:
        print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    error = _check(args)
    if error is not None:
        return usage_error(PROG, error)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch

    from ...seq.curves import SmoothCurves

    start = time.perf_counter()
    scales = sorted(set(args.scales))
    train = SmoothCurves(args.steps * args.batch_size, args.length, seed=2 * args.seed + 1)
    held_out = SmoothCurves(args.eval_curves, args.length, seed=2 * args.seed + 2)
    truth = {k: held_out.points(k * args.length) for k in {1, *scales}}
    mean_point = {k: _mse(truth[k].mean(1, keepdim=True).expand_as(truth[k]), truth[k]) for k in truth}
    plot_scale = 4 if 4 in scales else scales[-1]  # 1 when only 1x is asked: then one column
    rows, drawings = [], {}
    for i, name in enumerate(args.models, start=1):
        _progress(args, f"[{i}/{len(args.models)}] {name}: training {args.steps} steps at {args.length} points")
        row, drawing = _one(args, name, train, held_out, truth, scales, plot_scale)
        drawing["truth"] = truth
        _progress(args, f"[{i}/{len(args.models)}] {name}: {row['train_s']:.0f} s, train loss {row['train_loss']:.4f}, "
                        f"1x MSE {row['mse']['1']:.4f}")
        rows.append(row)
        drawings[name] = drawing
    table = _table(rows, scales, mean_point)
    what = (f"reconstruction MSE on {args.eval_curves} held-out curves (trained at {args.length} points; lower is "
            f"better). kx longer: kL points in and out; kx finer: L points in, kL out")
    load = load_average()
    total = time.perf_counter() - start
    footer = (f"mean-point: the error of outputting each curve's mean point (the data's variance)\n"
              f"device {_device(args)}, {torch.get_num_threads()} threads, load average at the end "
              f"{format_load_average(load)}, total {total:.0f} s")
    print(f"\n{what}\n{table}\n{footer}")
    if args.out is not None:
        out = Path(args.out)
        write_file(out, "spline.txt", f"{what}\n{table}\n{footer}\n")
        config = {k: getattr(args, k) for k in ("models", "length", "scales", "steps", "batch_size", "lr", "dim", "depth",
                                                "heads", "control_points", "degree", "encoder_mask", "eval_curves",
                                                "seed")}
        config["threads"] = torch.get_num_threads()
        result = {
            "metric": "mse", "config": config, "mean_point_mse": {str(k): v for k, v in mean_point.items()},
            "results": rows, "device": _device(args), "load_average": load, "total_s": round(total, 1),
        }
        write_json_file(out, "spline.json", result)
        _plot(drawings, args, plot_scale, out / "spline.png")
        print(f"written to {out}/spline.{{txt,json,png}}")
    return 0


def _device(args: argparse.Namespace) -> str:
    import torch

    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device


def _one(args, name, train, held_out, truth, scales, plot_scale) -> tuple[dict, dict]:
    """Train one model, score it at every scale in both modes; also return the curves to draw."""
    import torch

    from ...training.trainer import TrainConfig, Trainer

    torch.manual_seed(args.seed)
    model = _build(args, name)
    params = sum(p.numel() for p in model.parameters())

    def loss_fn(m, x):
        return torch.nn.functional.mse_loss(m(x), x), {}

    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, device=args.device,
                         progress=False, log_every=0)
    t0 = time.perf_counter()
    metrics = Trainer(model, train, loss_fn, config).fit()
    train_s = time.perf_counter() - t0
    model.eval()
    device = next(model.parameters()).device
    x1 = held_out.data.to(device)  # the held-out curves at the training length
    with torch.no_grad():
        out1 = model(x1)
        mse: dict[str, object] = {"1": _mse(out1, x1), "longer": {}, "finer": {}}
        drawing = {"1x": out1[:3].cpu()}
        for k in scales:
            if k == 1:
                continue
            n, target = k * args.length, truth[k].to(device)
            longer = _reconstruct(model, target, n, args.length, finer=False)
            finer = _reconstruct(model, x1, n, args.length, finer=True)
            mse["longer"][str(k)], mse["finer"][str(k)] = _mse(longer, target), _mse(finer, target)
            if k == plot_scale:
                drawing[f"{k}x longer"], drawing[f"{k}x finer"] = longer[:3].cpu(), finer[:3].cpu()
    row = {
        "model": name, "kind": _kind(name),
        "params": params, "train_loss": round(metrics["train_loss"], 5), "train_s": round(train_s, 1), "mse": mse,
    }
    return row, drawing


def _kind(name: str) -> str:
    is_spline, encoding = _spline_encoder(name)
    if not is_spline:
        return f"positional autoencoder, {name} encoding"
    return "spline, no positional encoding" if encoding is None else f"spline, {encoding} in the encoder only"


def _mse(output, target) -> float:
    return round(float((output - target).pow(2).mean()), 5)


def _reconstruct(model, source, n: int, length: int, *, finer: bool):
    """The model's ``n``-point output for ``source`` (``[B, L', 2]``): for the baselines, ``finer``
    puts the queries at ``i (L - 1) / (n - 1)`` instead of ``0 .. n-1``."""
    import torch

    from ...seq.spline import SplineTransformer

    if isinstance(model, SplineTransformer) or not finer:
        return model(source, out_length=n) if isinstance(model, SplineTransformer) else model(source, n)
    positions = torch.linspace(0.0, float(length - 1), n, device=source.device)
    return model(source, n, out_positions=positions)


def _fmt_params(n: int) -> str:
    return f"{n / 1e3:.1f}k"


def _table(rows: list[dict], scales: list[int], mean_point: dict[int, float]) -> str:
    longer = [k for k in scales if k != 1]
    headers = ["model", "params", "1x", *[f"{k}x longer" for k in longer], *[f"{k}x finer" for k in longer], "train_s"]
    body = []
    for r in rows:
        m = r["mse"]
        body.append([r["model"], _fmt_params(r["params"]), f"{m['1']:.4f}", *[f"{m['longer'][str(k)]:.4f}" for k in longer],
                     *[f"{m['finer'][str(k)]:.4f}" for k in longer], f"{r['train_s']:.0f}"])
    body.append(["mean-point", "-", f"{mean_point[1]:.4f}", *[f"{mean_point[k]:.4f}" for k in longer],
                 *[f"{mean_point[k]:.4f}" for k in longer], "-"])
    return format_table(headers, body, align="l" + "r" * (len(headers) - 1))


def _plot(drawings: dict, args: argparse.Namespace, plot_scale: int, path: Path) -> None:
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return
    columns = ["1x"] + ([f"{plot_scale}x longer", f"{plot_scale}x finer"] if plot_scale != 1 else [])
    names = list(drawings)
    from ..plots import legend_outside

    fig, axes = plt.subplots(len(names), len(columns), figsize=(3.4 * len(columns) + 1.8, 3.0 * len(names)),
                             squeeze=False, layout="constrained")
    colors = ["C0", "C1", "C2"]
    for r, name in enumerate(names):
        d = drawings[name]
        for c, col in enumerate(columns):
            ax = axes[r][c]
            true = d["truth"][1 if col == "1x" else plot_scale]
            rec = d[col]
            for j in range(min(3, rec.shape[0])):
                ax.plot(true[j, :, 0], true[j, :, 1], color=colors[j], linewidth=2.5, alpha=0.3,
                        label="input (truth)" if j == 0 else None)
                ax.plot(rec[j, :, 0], rec[j, :, 1], color=colors[j], linewidth=1.0, linestyle="--",
                        marker="." if col == "1x" else None, markersize=3, label="reconstruction" if j == 0 else None)
                ax.plot(true[j, 0, 0], true[j, 0, 1], marker="o", color=colors[j], markersize=4)
            ax.set_aspect("equal", adjustable="datalim")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(col, fontsize=10)
            if c == 0:
                ax.set_ylabel(name, fontsize=10)
    legend_outside(fig, [axes[0][0]])  # outside: inside, it covered a curve
    fig.suptitle(f"Curve reconstruction (trained at {args.length} points; thick: truth, dashed: model, dot: start)",
                 fontsize=10)
    save_figure(fig, path.parent, path.name, dpi=110)
    plt.close(fig)


__all__ = ["DEFAULT_MODELS", "add_arguments", "run"]
