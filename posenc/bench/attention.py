"""``posenc bench attention``: forward + backward of causal self-attention, per encoding.

Every row times the same unit -- a multi-head attention module with its q/k/v/out projections --
on ``x [B, T, C]`` (``C = H * D``), forward and backward with a fixed random output gradient:

``sdpa (bare causal)`` (impl ``torch``)
    four ``nn.Linear(C, C)`` around ``F.scaled_dot_product_attention(..., is_causal=True)``: the
    baseline every ratio is taken against, measured in the same run.
``none`` (impl ``posenc``)
    :class:`posenc.MultiheadAttention` with a causal :class:`posenc.AttentionMask`, no encoding.
one row per registered sequence and time-series encoding (impl ``posenc``)
    built with ``posenc.build(name, dims=ModelDims(C, H, T))``; attention hooks go into the
    attention module, an input hook is applied to ``x`` first (positions ``0 .. T-1``).
``NAME (frozen)`` (impl ``posenc``, with ``--frozen``)
    the same encoding with its parameters frozen (``requires_grad_(False)``), as at inference or
    fine-tuning with a fixed encoding: a learned bias is then a constant for the fused kernel.
    Added after the posenc rows for every selected encoding that has parameters.
peer rows (impl ``x-transformers`` / ``attention-smithy``)
    the same unit from those libraries with RoPE and with ALiBi, when they are installed
    (``pip install 'posenc[bench]'``); ``--no-peers`` leaves them out.

Rows are timed round robin (see :mod:`.timing`); each row reports its median, the ratio to the
baseline's median, the peak memory of one step above what was allocated before it (see
:mod:`.memory`) and the kernel path its attention took. A row that fails is reported with its
error; the others still run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common import kernels
from ..common.attention import MultiheadAttention
from ..common.encoding import Hook, PositionEncoding, attention_part
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, available, build
from .memory import MB, peak_memory_bytes
from .report import format_table
from .timing import Progress, error_text, synchronize, time_interleaved

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("cpu", "cuda")
BASELINE = "sdpa (bare causal)"
NO_ENCODING = "none"

# Peer libraries: import name, distribution name, and the rows built from each.
PEERS: dict[str, tuple[str, str]] = {
    "x-transformers": ("x_transformers", "x-transformers"),
    "attention-smithy": ("attention_smithy", "attention-smithy"),
}
PEER_ENCODINGS = ("rope", "alibi")


@dataclass(frozen=True)
class AttentionBenchConfig:
    """Sizes and settings of one run; defaults are the issue's B=4, H=8, T=1024, D=64."""

    device: str = "cpu"
    dtype: str = "float32"
    seq_len: int = 1024
    batch: int = 4
    heads: int = 8
    head_dim: int = 64
    repeats: int = 10
    warmup: int = 2
    encodings: tuple[str, ...] | None = None  # None: "none" and every registered encoding
    peers: bool = True
    seed: int = 0
    frozen: bool = False  # also time every encoding with parameters frozen ("NAME (frozen)" rows)

    def __post_init__(self) -> None:
        if self.device.split(":")[0] not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        for name in ("seq_len", "batch", "heads", "head_dim", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0; got {self.warmup}")
        if self.encodings is not None:
            known = encoding_names()
            unknown = [e for e in self.encodings if e not in known]
            if unknown:
                raise ValueError(f"unknown encoding(s) {', '.join(unknown)}; choose from {', '.join(known)}")

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def rows(self) -> tuple[str, ...]:
        """The posenc rows after the baseline: "none" and the selected encodings."""
        return tuple(encoding_names()) if self.encodings is None else self.encodings


BENCH_MODALITIES = ("seq", "timeseries")  # encodings of 1D positions; 2D and graph ones have their own benches


def encoding_names() -> list[str]:
    """``"none"`` followed by every registered sequence and time-series encoding."""
    return [NO_ENCODING] + [info.name for m in BENCH_MODALITIES for info in available(m)]


@dataclass
class Row:
    """One line of the result. ``ms``/``ratio``/``peak_mb`` are None when the row failed."""

    name: str
    impl: str
    path: str = "-"
    ms: float | None = None
    ratio: float | None = None
    peak_mb: float | None = None
    times_ms: list[float] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class BenchResult:
    config: dict
    rows: list[Row]
    notes: list[str]

    def to_json(self) -> dict:
        return {"config": self.config, "rows": [r.to_json() for r in self.rows], "notes": self.notes}


# --- the units -------------------------------------------------------------------------------


class BareCausalAttention(nn.Module):
    """The baseline: q/k/v/out ``nn.Linear(C, C)`` around SDPA with ``is_causal=True``.

    Shapes: ``x [B, T, C]`` -> ``[B, T, C]``.
    """

    kernel_path = "sdpa"

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        def heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class PosencAttention(nn.Module):
    """:class:`posenc.MultiheadAttention` under a causal mask, with an encoding's input hook applied first.

    Shapes: ``x [B, T, C]`` -> ``[B, T, C]`` (``T <= seq_len``).
    """

    def __init__(self, dim: int, num_heads: int, seq_len: int, encoding: PositionEncoding | None = None) -> None:
        super().__init__()
        hooks = encoding.hooks if encoding is not None else frozenset()
        self.input_encoding = encoding if Hook.INPUT in hooks else None
        self.attn = MultiheadAttention(dim, num_heads, encoding=attention_part(encoding))
        self.mask = AttentionMask(causal=True)
        self.register_buffer("positions", torch.arange(seq_len).unsqueeze(0), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.input_encoding is not None:
            x = self.input_encoding.encode_input(x, self.positions[:, : x.shape[1]])
        return self.attn(x, mask=self.mask)


class XTransformersAttention(nn.Module):
    """x-transformers' ``Attention`` (causal, flash = SDPA) with its RoPE or ALiBi."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, encoding: str) -> None:
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its import warns about torch.jit.script
            from x_transformers.x_transformers import AlibiPositionalBias, Attention, RotaryEmbedding
        self.attn = Attention(dim=dim, dim_head=head_dim, heads=num_heads, causal=True, flash=True)
        self.rotary = RotaryEmbedding(head_dim) if encoding == "rope" else None
        self.alibi = AlibiPositionalBias(heads=num_heads, total_heads=num_heads) if encoding == "alibi" else None
        if self.rotary is None and self.alibi is None:
            raise ValueError(f"x-transformers rows are {', '.join(PEER_ENCODINGS)}; got {encoding!r}")
        self.kernel_path = "sdpa" if self.rotary is not None else "sdpa+bias"

    def forward(self, x: Tensor) -> Tensor:
        if self.rotary is not None:
            return self.attn(x, rotary_pos_emb=self.rotary.forward_from_seq_len(x.shape[1]))
        return self.attn(x, rel_pos=self.alibi)


class AttentionSmithyAttention(nn.Module):
    """AttentionSmithy's ``MultiheadAttention`` (standard causal method) with its RoPE or ALiBi."""

    kernel_path = "math"

    def __init__(self, dim: int, num_heads: int, head_dim: int, encoding: str) -> None:
        super().__init__()
        from attention_smithy.attention import StandardAttentionMethod
        from attention_smithy.components import MultiheadAttention as SmithyMultiheadAttention
        from attention_smithy.numeric_embeddings import (
            ALiBiPositionEmbedding,
            NumericEmbeddingManager,
            RotaryPositionEmbedding,
        )

        if encoding == "rope":
            strategy = RotaryPositionEmbedding(head_dim)
        elif encoding == "alibi":
            strategy = ALiBiPositionEmbedding(num_heads)
        else:
            raise ValueError(f"attention-smithy rows are {', '.join(PEER_ENCODINGS)}; got {encoding!r}")
        self.manager = NumericEmbeddingManager([strategy])
        self.attn = SmithyMultiheadAttention(dim, num_heads, StandardAttentionMethod(is_causal_masking=True))

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.attn(x, x, x, numeric_embedding_manager=self.manager, padding_and_loss_attention_mask=None)
        return out


@dataclass(frozen=True)
class Candidate:
    """A row to build: ``factory()`` returns the unit (``forward(x) -> out``)."""

    name: str
    impl: str
    factory: Callable[[], nn.Module]


FROZEN_SUFFIX = " (frozen)"


def _build_encoding(config: AttentionBenchConfig, name: str) -> PositionEncoding:
    return build(name, dims=ModelDims(dim=config.dim, num_heads=config.heads, max_len=config.seq_len))


def _posenc_unit(config: AttentionBenchConfig, name: str, frozen: bool = False) -> nn.Module:
    encoding = None
    if name != NO_ENCODING:
        encoding = _build_encoding(config, name)
        if frozen:
            encoding.requires_grad_(False)
    return PosencAttention(config.dim, config.heads, config.seq_len, encoding)


def _has_parameters(config: AttentionBenchConfig, name: str) -> bool:
    return name != NO_ENCODING and any(True for _ in _build_encoding(config, name).parameters())


def candidates(config: AttentionBenchConfig, notes: list[str]) -> list[Candidate]:
    """The rows of a run, in order: baseline, posenc rows, then peer rows (missing peers noted)."""
    c, h, d = config.dim, config.heads, config.head_dim
    rows = [Candidate(BASELINE, "torch", functools.partial(BareCausalAttention, c, h))]
    rows += [Candidate(n, "posenc", functools.partial(_posenc_unit, config, n)) for n in config.rows]
    if config.frozen:
        rows += [
            Candidate(n + FROZEN_SUFFIX, "posenc", functools.partial(_posenc_unit, config, n, frozen=True))
            for n in config.rows if _has_parameters(config, n)
        ]
    if not config.peers:
        return rows
    units = {"x-transformers": XTransformersAttention, "attention-smithy": AttentionSmithyAttention}
    for impl, (module, dist) in PEERS.items():
        if importlib.util.find_spec(module) is None:
            notes.append(f"{impl} is not installed (pip install {dist}, or posenc[bench]); its rows are skipped")
            continue
        rows += [
            Candidate(f"{impl} {enc}", impl, functools.partial(units[impl], c, h, d, enc)) for enc in PEER_ENCODINGS
        ]
    return rows


# --- kernel-path tracing ---------------------------------------------------------------------

_KERNEL_LABELS = {
    "sdpa_path": "sdpa",
    "dense_path": "dense",
    "flex_path": "flex",
    "math_path": "math",
    "prob_bias_term": "prob_bias",
}


@contextlib.contextmanager
def trace_kernel_paths() -> Iterator[list[str]]:
    """Record which of posenc's kernel paths run inside the block (labels, in call order)."""
    calls: list[str] = []
    saved: dict[str, Callable] = {}

    def recording(fn: Callable, label: str) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            calls.append(label)
            return fn(*args, **kwargs)

        return wrapper

    for attr, label in _KERNEL_LABELS.items():
        fn = getattr(kernels, attr, None)
        if callable(fn):
            saved[attr] = fn
            setattr(kernels, attr, recording(fn, label))
    try:
        yield calls
    finally:
        for attr, fn in saved.items():
            setattr(kernels, attr, fn)


def _path_label(calls: list[str]) -> str:
    return "+".join(dict.fromkeys(calls)) or "-"


# --- the run ---------------------------------------------------------------------------------


def _peer_versions() -> dict[str, str]:
    versions = {}
    for impl, (_, dist) in PEERS.items():
        try:
            versions[impl] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def _config_json(config: AttentionBenchConfig, device: torch.device) -> dict:
    out = asdict(config)
    out["encodings"] = list(config.rows)
    out["dim"] = config.dim
    out["baseline"] = BASELINE
    out["torch"] = torch.__version__
    out["threads"] = torch.get_num_threads()
    out["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    out["timing"] = "median of `repeats` timed rounds after `warmup` untimed rounds, rows round robin"
    if config.peers:
        out["peer_versions"] = _peer_versions()
    return out


def run_benchmark(config: AttentionBenchConfig, *, progress: bool = True) -> BenchResult:
    """Build, check, time and measure every row of ``config``; failures are kept per row."""
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False")
    dtype = DTYPES[config.dtype]
    notes: list[str] = []
    torch.manual_seed(config.seed)
    b, t, c = config.batch, config.seq_len, config.dim
    x = torch.randn(b, t, c, device=device, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(b, t, c, device=device, dtype=dtype)

    rows: list[Row] = []
    units: dict[str, nn.Module] = {}
    todo = candidates(config, notes)
    bar = Progress(len(todo), "building", enabled=progress)
    for cand in todo:
        row = Row(cand.name, cand.impl)
        rows.append(row)
        try:
            torch.manual_seed(config.seed)
            unit = cand.factory().to(device=device, dtype=dtype)
            # One checked step (untimed): catches failures early and records the kernel path.
            with trace_kernel_paths() as calls:
                unit(x).backward(grad_out)
            row.path = getattr(unit, "kernel_path", None) or _path_label(calls)
            units[cand.name] = unit
        except Exception as exc:  # reported in the table
            row.error = error_text(exc)
        finally:
            x.grad = None
        bar.update(note=cand.name)
    bar.close()

    def make_step(unit: nn.Module) -> Callable[[], None]:
        def step() -> None:
            unit(x).backward(grad_out)

        return step

    def make_clear(unit: nn.Module) -> Callable[[], None]:
        def clear() -> None:
            unit.zero_grad(set_to_none=True)
            x.grad = None

        return clear

    steps = {name: make_step(u) for name, u in units.items()}
    clears = {name: make_clear(u) for name, u in units.items()}
    timings = time_interleaved(
        steps, repeats=config.repeats, warmup=config.warmup, device=device, before_step=clears, progress=progress
    )

    bar = Progress(len(units), "memory", enabled=progress)
    by_name = {row.name: row for row in rows}
    for name, unit in units.items():
        row, timing = by_name[name], timings[name]
        row.times_ms = [round(v, 4) for v in timing.times_ms]
        if timing.error is not None:
            row.error = timing.error
            bar.update(note=name)
            continue
        row.ms = timing.median_ms
        try:
            clears[name]()
            gc.collect()
            synchronize(device)
            row.peak_mb = peak_memory_bytes(steps[name], device) / MB
        except Exception as exc:
            row.error = f"memory: {error_text(exc)}"
        finally:
            clears[name]()
        bar.update(note=name)
    bar.close()

    base = by_name[BASELINE].ms
    for row in rows:
        if row.ms is not None and base:
            row.ratio = row.ms / base
    if not base:
        notes.append(f"the baseline row failed ({by_name[BASELINE].error}); no ratios")
    return BenchResult(_config_json(config, device), rows, notes)


# --- output ----------------------------------------------------------------------------------


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(result: BenchResult) -> str:
    """The result as text: a header, the aligned table, then failures and notes."""
    cfg = result.config
    lines = [
        f"causal self-attention, forward + backward: B={cfg['batch']} H={cfg['heads']} T={cfg['seq_len']} "
        f"D={cfg['head_dim']} (C={cfg['dim']}), {cfg['device']} {cfg['dtype']}, torch {cfg['torch']}, "
        f"{cfg['threads']} threads",
        f"median of {cfg['repeats']} timed rounds after {cfg['warmup']} warm-up, rows interleaved; "
        f"ratio = row median / '{BASELINE}' median; peak MB above memory allocated before the step",
        "",
    ]
    table = [
        [r.name, r.impl, r.path, _num(r.ms, ".2f"), _num(r.ratio, ".3f"), _num(r.peak_mb, ".1f")]
        + (["FAILED"] if r.error else [""])
        for r in result.rows
    ]
    lines.append(format_table(["name", "impl", "path", "ms", "ratio", "peak MB", ""], table, align="lllrrrl"))
    failed = [r for r in result.rows if r.error]
    if failed:
        lines += ["", "failures:"] + [f"  {r.name} ({r.impl}): {r.error}" for r in failed]
    if result.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in result.notes]
    return "\n".join(lines)


# --- command line ----------------------------------------------------------------------------


def _int_at_least(low: int, what: str):
    """argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "an integer >= 0")


def _encoding_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    known = encoding_names()
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        what = f"unknown encoding(s) {', '.join(map(repr, unknown))}" if unknown else f"no encodings in {text!r}"
        raise argparse.ArgumentTypeError(f"{what}; choose from {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def _device(text: str) -> str:
    if text not in DEVICES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DEVICES)}, got {text!r}")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("'cuda' requested but no CUDA device is available (torch.cuda.is_available() is False)")
    return text


def _json_path(text: str) -> str:
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"directory {parent!r} of {text!r} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``posenc bench attention``."""
    d = AttentionBenchConfig()
    parser.add_argument("--device", type=_device, default=d.device, metavar="{cpu,cuda}", help="default: %(default)s")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=d.dtype, help="default: %(default)s")
    parser.add_argument("--seq-len", type=_positive_int, default=d.seq_len, metavar="T", help="tokens (default: %(default)s)")
    parser.add_argument("--batch", type=_positive_int, default=d.batch, metavar="B", help="default: %(default)s")
    parser.add_argument("--heads", type=_positive_int, default=d.heads, metavar="H", help="default: %(default)s")
    parser.add_argument("--head-dim", type=_positive_int, default=d.head_dim, metavar="D", help="default: %(default)s")
    parser.add_argument("--repeats", type=_positive_int, default=d.repeats, metavar="N", help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=_non_negative_int, default=d.warmup, metavar="N", help="untimed rounds first (default: %(default)s)")
    parser.add_argument(
        "--encodings", type=_encoding_list, default=None, metavar="A,B,...",
        help="rows to run besides the baseline: 'none' and/or registered encoding names (default: all)",
    )
    parser.add_argument("--json", type=_json_path, default=None, metavar="PATH", help="also write the result as JSON")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="leave out x-transformers and AttentionSmithy rows")
    parser.add_argument(
        "--frozen", action="store_true",
        help="also time each encoding that has parameters with them frozen, as rows 'NAME (frozen)'",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="default: %(default)s")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress on stderr")


def config_from_args(args: argparse.Namespace) -> AttentionBenchConfig:
    return AttentionBenchConfig(
        device=args.device, dtype=args.dtype, seq_len=args.seq_len, batch=args.batch, heads=args.heads,
        head_dim=args.head_dim, repeats=args.repeats, warmup=args.warmup, encodings=args.encodings,
        peers=args.peers, seed=args.seed, frozen=args.frozen,
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write JSON. 0 on success, 1 if the baseline failed, 2 on bad input."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"posenc bench attention: {exc}", file=sys.stderr)
        return 2
    result = run_benchmark(config, progress=args.progress)
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_json(), f, indent=2)
            f.write("\n")
        print(f"\nwrote {args.json}")
    return 0 if any(r.name == BASELINE and r.ms is not None for r in result.rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m posenc.bench.attention``: the same as ``posenc bench attention``."""
    parser = argparse.ArgumentParser(prog="posenc bench attention", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
