"""``posenc bench attention``: forward + backward of causal self-attention, per encoding.

::

    posenc bench attention                                   # the default set, B=4 H=8 T=1024 D=64
    posenc bench attention --encodings all --json out.json   # every 1D encoding
    posenc bench attention --seq-lens 1024,2048,4096 --out results/   # growth with T (table, JSON, PNG)
    posenc bench attention --background-load --plans         # under one busy process; why each path

Every row times the same unit -- a multi-head attention module with its q/k/v/out projections --
on ``x [B, T, C]`` (``C = H * D``), forward and backward with a fixed random output gradient:

``sdpa (bare causal)`` (impl ``torch``)
    four ``nn.Linear(C, C)`` around ``F.scaled_dot_product_attention(..., is_causal=True)``: the
    baseline every ratio is taken against, measured in the same run.
``none`` (impl ``posenc``)
    :class:`posenc.MultiheadAttention` with a causal :class:`posenc.AttentionMask`, no encoding.
one row per selected sequence and time-series encoding (impl ``posenc``)
    built with ``posenc.build(name, dims=ModelDims(C, H, T))``; attention hooks go into the
    attention module, an input hook is applied to ``x`` first (positions ``0 .. T-1``). By default
    the representative set :data:`DEFAULT_ENCODINGS`; ``--encodings all`` takes every registered
    one, ``--encodings a,b,c`` those named.
``NAME (linear MAP)`` (impl ``posenc``)
    the same module on linear attention with feature map ``MAP`` (``--feature-map``: ``elu``,
    ``favor``), for :data:`LINEAR_ENCODINGS` (none and the two SPE kernels, whose queries and keys
    leave with width R) beside the default rows, or those of ``--linear-encodings`` (with
    ``--encodings``, only those); ``--linear-encodings off`` leaves them out.
    With ``--seq-lens`` their time and memory should grow linearly in T, the softmax rows'
    time quadratically.
``NAME (frozen)`` (impl ``posenc``, with ``--frozen``)
    the same encoding with its parameters frozen (``requires_grad_(False)``), as at inference or
    fine-tuning with a fixed encoding: a learned bias is then a constant for the fused kernel.
    Added after the posenc rows for every selected encoding that has parameters.
peer rows (impl ``x-transformers`` / ``attention-smithy``)
    the same unit from those libraries with RoPE and with ALiBi, when they are installed
    (``pip install 'posenc[bench]'``); ``--no-peers`` leaves them out.
``--smithy`` rows (impl ``attention-smithy`` / ``attention-smithy+posenc``)
    instead of the peer rows: AttentionSmithy's attention with its own method and with posenc's
    ``PosencAttentionMethod``, for none, rope, alibi, t5 and fire, beside posenc's own rows
    (:mod:`.smithy_rows`); the notes give the ratios between them.

Rows are timed round robin (see :mod:`.timing`); each row reports its median, its ratio to the
baseline round by round (the median over rounds of row / baseline, :func:`.timing.paired_ratio`),
the peak memory of one step above what was allocated before it (see
:mod:`.memory`) and the kernel path its attention took, with the reason for it (``--plans``
prints the reasons). A row that fails is reported with its error; the others still run.

``--seq-lens T1,T2,...`` runs every row at each length (lengths above 1024 with at most
``--long-repeats`` timed rounds) and adds a growth table -- time and peak memory at each length
and their ratio to the first length -- and, with ``--json`` or ``--out``, a PNG of both against T.
``--background-load`` runs one busy process (see :mod:`.load`) for the whole run. The header and
the JSON say whether it was on, and give the load average at the end of the run: figures differ
between machines and loads.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import importlib.util
import os
import platform
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..argtypes import int_list, json_path, nonnegative_int, out_directory, positive_int, seed_value
from ..catalog import entries, suggest
from ..errors import usage_error
from ..options import FEATURE_MAPS
from ..outputs import out_error, save_figure, write_file, write_json_file
from ..sizes import Work, add_allow_large, defaults_of, size_error, transformer
from ...common.registry import ModelDims, build
from ...training.report import Progress, format_table
from .caveats import falling_growth, few_rounds, print_warnings, short_timing
from .devices import bench_device, device_arg, require_available
from .load import background_load, describe, format_load_average, load_average
from .memory import MB, peak_memory_bytes
from .peers import versions
from .timing import error_text, paired_ratio, synchronize, time_interleaved

if TYPE_CHECKING:  # torch is imported when a row is built: --help and argument errors answer without it
    import torch
    from torch import Tensor, nn

    from ...common.encoding import PositionEncoding

PROG = "posenc bench attention"

DTYPE_NAMES = ("float32", "bfloat16", "float16")  # torch dtypes of these names
BASELINE = "sdpa (bare causal)"
NO_ENCODING = "none"
ALL = "all"  # --encodings all: every registered sequence and time-series encoding

# The rows run by default: no encoding, an input encoding, rotary, the score biases (fixed,
# learned per bucket, learned MLP), the probability bias, and the content-dependent heavy ones.
DEFAULT_ENCODINGS = (
    "none", "sinusoidal", "rope", "alibi", "t5", "fire", "erpe", "shaw", "transformer_xl", "deberta", "cape",
)
# Linear-attention rows run by default (issue 11): no encoding and the two SPE kernels, each on
# linear attention with --feature-map; named "NAME (linear MAP)".
LINEAR_ENCODINGS = ("none", "sine_spe", "conv_spe")
# With --seq-lens: lengths above LONG_SEQ_LEN get at most --long-repeats timed rounds.
LONG_SEQ_LEN = 1024
LONG_REPEATS = 3

# Peer libraries: import name and distribution name; the rows built from each are its unit (.attention_units)
# with each of attention_units.PEER_ENCODINGS.
PEERS: dict[str, tuple[str, str]] = {
    "x-transformers": ("x_transformers", "x-transformers"),
    "attention-smithy": ("attention_smithy", "attention-smithy"),
}

# the encodings of the AttentionSmithy row set without --encodings (:mod:`.smithy_rows`, imported when its
# rows are built, builds them for the encodings the config names)
SMITHY_ENCODINGS = ("none", "rope", "alibi", "t5", "fire")


@dataclass(frozen=True)
class AttentionBenchConfig:
    """Sizes and settings of one run; defaults are the issue's B=4, H=8, T=1024, D=64.

    ``encodings``: None for :data:`DEFAULT_ENCODINGS`, ``tuple(encoding_names())`` for all.
    ``background_processes``: busy processes run alongside (0: none; see :mod:`.load`).
    """

    device: str = "cpu"
    dtype: str = "float32"
    seq_len: int = 1024
    batch: int = 4
    heads: int = 8
    head_dim: int = 64
    repeats: int = 5
    warmup: int = 1
    encodings: tuple[str, ...] | None = None  # None: DEFAULT_ENCODINGS
    peers: bool = True
    seed: int = 0
    frozen: bool = False  # also time every encoding with parameters frozen ("NAME (frozen)" rows)
    background_processes: int = 0
    # None: LINEAR_ENCODINGS with the default rows, none when ``encodings`` names the rows; () for none
    linear_encodings: tuple[str, ...] | None = None
    feature_map: str = "elu"
    smithy: bool = False  # the AttentionSmithy row set (see :mod:`.smithy_rows`)

    def __post_init__(self) -> None:
        bench_device(self.device)
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}; got {self.dtype!r}")
        for name in ("seq_len", "batch", "heads", "head_dim", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0; got {self.warmup}")
        if self.background_processes < 0:
            raise ValueError(f"background_processes must be >= 0; got {self.background_processes}")
        if self.encodings is not None:
            known = encoding_names()
            unknown = [e for e in self.encodings if e not in known]
            if unknown:
                raise ValueError(f"unknown encoding(s) {', '.join(unknown)}; choose from {', '.join(known)}")
        if self.linear_encodings is not None:
            known = linear_encoding_names()
            unknown = [e for e in self.linear_encodings if e not in known]
            if unknown:
                raise ValueError(f"not encodings of linear attention: {', '.join(unknown)}; choose from {', '.join(known)}")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {', '.join(FEATURE_MAPS)}; got {self.feature_map!r}")

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def rows(self) -> tuple[str, ...]:
        """The posenc rows after the baseline: "none" and the selected encodings."""
        if self.encodings is None:
            return SMITHY_ENCODINGS if self.smithy else DEFAULT_ENCODINGS
        return self.encodings

    @property
    def linear_rows(self) -> tuple[str, ...]:
        """The encodings run on linear attention (rows "NAME (linear MAP)"): :data:`LINEAR_ENCODINGS`
        beside the default rows; only those asked for when ``encodings`` names the rows."""
        if self.linear_encodings is None:
            return LINEAR_ENCODINGS if self.encodings is None and not self.smithy else ()
        return self.linear_encodings


BENCH_MODALITIES = ("seq", "timeseries")  # encodings of 1D positions; 2D and graph ones have their own benches


def encoding_names() -> list[str]:
    """``"none"`` followed by every registered sequence and time-series encoding of softmax attention."""
    return [NO_ENCODING] + [info.name for m in BENCH_MODALITIES for info in entries(m) if not info.linear_only]


def linear_encoding_names() -> list[str]:
    """``"none"`` and the registered 1D encodings that linear attention can run: those acting on
    the input or on q and k only (no score bias, no after-softmax term)."""
    names = [NO_ENCODING]
    for m in BENCH_MODALITIES:
        for info in entries(m):  # the registry's snapshot: the names are checked before torch loads
            hooks = set(info.hooks) - {"input", "qk"}
            if not hooks and not info.causal_only:
                names.append(info.name)
    return names


@dataclass
class Row:
    """One line of the result. ``ms``/``ratio``/``peak_mb`` are None when the row failed.

    ``path`` is the kernel path's label, ``reason`` why that path was taken and ``chunk_rows`` the
    query rows per chunk of a chunked kernel (None: not chunked, or not known).
    """

    name: str
    impl: str
    path: str = "-"
    reason: str | None = None
    chunk_rows: int | None = None
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

    @property
    def warnings(self) -> list[str]:
        """Figures below the noise at these settings (see :mod:`.caveats`)."""
        base = next((r.ms for r in self.rows if r.name == BASELINE), None)
        texts = [few_rounds(self.config.get("repeats"), self.config.get("warmup"), advice="--repeats 5 --warmup 1"),
                 short_timing(f"the baseline at T={self.config.get('seq_len')}", base, advice="raise --seq-len or --batch")]
        return [t for t in texts if t is not None]

    def to_json(self) -> dict:
        return {"config": self.config, "rows": [r.to_json() for r in self.rows], "notes": self.notes,
                "warnings": self.warnings}


@dataclass(frozen=True)
class Candidate:
    """A row to build: ``factory()`` returns the unit (``forward(x) -> out``)."""

    name: str
    impl: str
    factory: Callable[[], nn.Module]


FROZEN_SUFFIX = " (frozen)"


def _build_encoding(config: AttentionBenchConfig, name: str) -> PositionEncoding:
    return build(name, dims=ModelDims(dim=config.dim, num_heads=config.heads, max_len=config.seq_len))


def _posenc_unit(config: AttentionBenchConfig, name: str, frozen: bool = False, linear: bool = False) -> nn.Module:
    from .attention_units import PosencAttention

    encoding = None
    if name != NO_ENCODING:
        encoding = _build_encoding(config, name)
        if frozen:
            encoding.requires_grad_(False)
    return PosencAttention(config.dim, config.heads, config.seq_len, encoding,
                           feature_map=config.feature_map if linear else None)


def linear_row_name(name: str, feature_map: str) -> str:
    return f"{name} (linear {feature_map})"


def _has_parameters(config: AttentionBenchConfig, name: str) -> bool:
    return name != NO_ENCODING and any(True for _ in _build_encoding(config, name).parameters())


def candidates(config: AttentionBenchConfig, notes: list[str]) -> list[Candidate]:
    """The rows of a run, in order: baseline, posenc rows, then peer rows (missing peers noted)."""
    from .attention_units import PEER_ENCODINGS, AttentionSmithyAttention, BareCausalAttention, XTransformersAttention

    c, h, d = config.dim, config.heads, config.head_dim
    rows = [Candidate(BASELINE, "torch", functools.partial(BareCausalAttention, c, h))]
    rows += [Candidate(n, "posenc", functools.partial(_posenc_unit, config, n)) for n in config.rows]
    rows += [
        Candidate(linear_row_name(n, config.feature_map), "posenc", functools.partial(_posenc_unit, config, n, linear=True))
        for n in config.linear_rows
    ]
    if config.frozen:
        rows += [
            Candidate(n + FROZEN_SUFFIX, "posenc", functools.partial(_posenc_unit, config, n, frozen=True))
            for n in config.rows if _has_parameters(config, n)
        ]
    if config.smithy:  # replaces the generic peer rows
        from . import smithy_rows

        if not smithy_rows.available():
            notes.append("attention-smithy is not installed (pip install 'posenc[smithy]'); the --smithy rows are skipped")
            return rows
        return rows + smithy_rows.candidates(c, h, config.seq_len, Candidate, tuple(config.rows))
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


# --- kernel paths ----------------------------------------------------------------------------


def _plan_text(label: str, chunk_rows: int | None, reason: str | None) -> str:
    """``"dense (chunk 128 rows) -- score bias on CPU: chunked flash kernel"``."""
    chunk = f" (chunk {chunk_rows} rows)" if chunk_rows else ""
    return f"{label}{chunk}" + (f" -- {reason}" if reason else "")


def _checked_step(unit: nn.Module, row: Row, x: Tensor, grad_out: Tensor) -> None:
    """One untimed step of ``unit``, recording in ``row`` the kernel path and why it was taken.

    posenc rows ask ``MultiheadAttention.plan``; the baseline and peer rows say their own path.
    """
    plan_of = getattr(unit, "plan", None)
    plan = None
    if plan_of is not None:
        try:
            plan = plan_of(x)
        except Exception as exc:  # the step below still runs; the row says why there is no path
            row.path, row.reason = "?", f"plan failed: {error_text(exc)}"
    if plan is not None:
        row.path, row.reason, row.chunk_rows = plan.label, plan.reason, plan.chunk_rows
    elif hasattr(unit, "kernel_path"):
        row.path, row.reason = unit.kernel_path, getattr(unit, "path_reason", None)
    unit(x).backward(grad_out)


# --- the run ---------------------------------------------------------------------------------


def _config_json(config: AttentionBenchConfig, device: torch.device) -> dict:
    import torch

    out = asdict(config)
    out["encodings"] = list(config.rows)
    out["dim"] = config.dim
    out["baseline"] = BASELINE
    out["torch"] = torch.__version__
    out["threads"] = torch.get_num_threads()
    out["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    out["cpu_count"] = os.cpu_count()
    out["timing"] = "median of `repeats` timed rounds after `warmup` untimed rounds, rows round robin"
    out["background_load"] = describe(config.background_processes)
    out["load_average"] = load_average()  # at the end of the run (1, 5, 15 min)
    if config.peers:
        out["peer_versions"] = versions({impl: dist for impl, (_, dist) in PEERS.items()})
    return out


def _measure(config: AttentionBenchConfig, *, progress: bool) -> BenchResult:
    """Build, check, time and measure every row of ``config`` (any background load is the caller's)."""
    import torch
    from ...common import chunk_pool

    device = require_available(config.device)
    dtype = getattr(torch, config.dtype)
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
            _checked_step(unit, row, x, grad_out)
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
            row.ratio = paired_ratio(row.times_ms, by_name[BASELINE].times_ms)
    if device.type == "cpu":
        notes.append(
            "CPU peak memory is measured with each chunked path's chunks on the calling thread (the profiler sees "
            f"only that one); run on the {chunk_pool.workers()} workers, up to one chunk's working set per worker "
            "is alive at once"
        )
    if config.smithy:
        from . import smithy_rows

        notes += smithy_rows.summary(rows)
    if not base:
        notes.append(f"the baseline row failed ({by_name[BASELINE].error}); no ratios")
    return BenchResult(_config_json(config, device), rows, notes)


def run_benchmark(config: AttentionBenchConfig, *, progress: bool = True) -> BenchResult:
    """Build, check, time and measure every row of ``config``; failures are kept per row.

    With ``config.background_processes`` > 0 that many busy processes run for the whole call.
    """
    n = config.background_processes
    with background_load(n > 0, max(n, 1)):
        return _measure(config, progress=progress)


def repeats_at(config: AttentionBenchConfig, seq_len: int, long_repeats: int = LONG_REPEATS) -> int:
    """Timed rounds at ``seq_len`` in a growth run: ``config.repeats``, at most ``long_repeats`` above 1024."""
    return min(config.repeats, long_repeats) if seq_len > LONG_SEQ_LEN else config.repeats


@dataclass
class GrowthRow:
    """One encoding across the lengths of a growth run; the growth lists are value / first value."""

    name: str
    impl: str
    ms: list[float | None]
    peak_mb: list[float | None]
    time_growth: list[float | None]
    memory_growth: list[float | None]

    def to_json(self) -> dict:
        return asdict(self)


def _growth(values: list[float | None]) -> list[float | None]:
    first = values[0] if values else None
    if not first:  # None or 0: no growth factor
        return [None] * len(values)
    return [None if v is None else v / first for v in values]


@dataclass
class GrowthResult:
    """A ``--seq-lens`` run: one :class:`BenchResult` per length, in the order of ``seq_lens``."""

    config: dict
    results: list[BenchResult]

    @property
    def seq_lens(self) -> list[int]:
        return [r.config["seq_len"] for r in self.results]

    def growth(self) -> list[GrowthRow]:
        """A row per name (first appearance order), with its time and peak memory at each length."""
        names: dict[str, str] = {}
        for result in self.results:
            for row in result.rows:
                names.setdefault(row.name, row.impl)
        by_length = [{row.name: row for row in result.rows} for result in self.results]
        out = []
        for name, impl in names.items():
            cells = [rows.get(name) for rows in by_length]
            ms = [None if r is None else r.ms for r in cells]
            mb = [None if r is None else r.peak_mb for r in cells]
            out.append(GrowthRow(name, impl, ms, mb, _growth(ms), _growth(mb)))
        return out

    @property
    def warnings(self) -> list[str]:
        """Growth figures below the noise: the baseline too fast at the first length, or a row
        whose time falls as T grows (see :mod:`.caveats`)."""
        advice = "use longer --seq-lens, e.g. 1024,2048,4096, or a larger --batch"
        out = list(self.results[0].warnings) if self.results else []
        falling = [g.name for g in self.growth() if falling_growth(g.name, self.seq_lens, g.time_growth, advice=advice)]
        if falling:
            out.append(f"time falls as T grows for {', '.join(falling)}: growth ratios below the noise ({advice})")
        return out

    def to_json(self) -> dict:
        return {
            "config": self.config,
            "lengths": [r.to_json() for r in self.results],
            "growth": [g.to_json() for g in self.growth()],
            "warnings": self.warnings,
        }


def run_growth(
    config: AttentionBenchConfig, seq_lens: Sequence[int], *, long_repeats: int = LONG_REPEATS, progress: bool = True
) -> GrowthResult:
    """Every row of ``config`` at each of ``seq_lens`` (same B, H, D; ``config.seq_len`` is ignored).

    Lengths above :data:`LONG_SEQ_LEN` get ``min(config.repeats, long_repeats)`` timed rounds.
    The background load, if any, runs once for all lengths.
    """
    if not seq_lens or any(t < 1 for t in seq_lens):
        raise ValueError(f"seq_lens must be positive integers; got {list(seq_lens)}")
    if long_repeats < 1:
        raise ValueError(f"long_repeats must be a positive integer; got {long_repeats}")
    n = config.background_processes
    results = []
    with background_load(n > 0, max(n, 1)):
        for t in seq_lens:
            if progress:
                print(f"T={t}:", file=sys.stderr, flush=True)
            one = replace(config, seq_len=t, repeats=repeats_at(config, t, long_repeats))
            results.append(_measure(one, progress=progress))
    common = dict(results[0].config)
    for key in ("seq_len", "repeats", "load_average"):
        common.pop(key, None)
    common.update(
        seq_lens=list(seq_lens), repeats=config.repeats, long_repeats=long_repeats,
        repeats_per_length=[r.config["repeats"] for r in results],
        load_average=results[-1].config["load_average"],
    )
    return GrowthResult(common, results)


# --- output ----------------------------------------------------------------------------------


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _load_line(cfg: dict) -> str:
    return (f"background load: {cfg['background_load']}; "
            f"load average at the end: {format_load_average(cfg.get('load_average'))}; {cfg.get('cpu_count')} CPUs")


def render(result: BenchResult, *, plans: bool = False) -> str:
    """The result as text: a header, the aligned table, then (``plans``) each row's path and
    reason, failures and notes."""
    cfg = result.config
    lines = [
        f"causal self-attention, forward + backward: B={cfg['batch']} H={cfg['heads']} T={cfg['seq_len']} "
        f"D={cfg['head_dim']} (C={cfg['dim']}), {cfg['device']} {cfg['dtype']}, torch {cfg['torch']}, "
        f"{cfg['threads']} threads",
        _load_line(cfg),
        f"median of {cfg['repeats']} timed rounds after {cfg['warmup']} warm-up, rows interleaved; "
        f"ratio = median over rounds of row / '{BASELINE}' in the same round; peak MB above memory allocated before the step",
        "",
    ]
    table = [
        [r.name, r.impl, r.path, _num(r.ms, ".2f"), _num(r.ratio, ".3f"), _num(r.peak_mb, ".1f")]
        + (["FAILED"] if r.error else [""])
        for r in result.rows
    ]
    lines.append(format_table(["name", "impl", "path", "ms", "ratio", "peak MB", ""], table, align="lllrrrl"))
    if plans:
        lines += ["", "plans:"] + [
            f"  {r.name}: {_plan_text(r.path, r.chunk_rows, r.reason)}" for r in result.rows if not r.error
        ]
    failed = [r for r in result.rows if r.error]
    if failed:
        lines += ["", "failures:"] + [f"  {r.name} ({r.impl}): {r.error}" for r in failed]
    if result.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in result.notes]
    return "\n".join(lines)


def render_growth(result: GrowthResult) -> str:
    """The growth table: ms and peak MB at each length, and each as a multiple of the first length's."""
    cfg, lens = result.config, result.seq_lens
    first, later = lens[0], lens[1:]
    lines = [
        f"growth with T: B={cfg['batch']} H={cfg['heads']} D={cfg['head_dim']} (C={cfg['dim']}), "
        f"{cfg['device']} {cfg['dtype']}, T = {', '.join(map(str, lens))}; timed rounds per T: "
        f"{', '.join(map(str, cfg['repeats_per_length']))}",
        _load_line(cfg),
        f"ms and peak MB at each T; 'T/{first}' columns: value at T / value at T={first} "
        f"(doubling T: x2 for linear cost, x4 for quadratic)",
        "",
    ]
    headers = (["name", "impl"] + [f"ms@{t}" for t in lens] + [f"ms {t}/{first}" for t in later]
               + [f"MB@{t}" for t in lens] + [f"MB {t}/{first}" for t in later])
    body = [
        [g.name, g.impl]
        + [_num(v, ".2f") for v in g.ms] + [_num(v, ".2f") for v in g.time_growth[1:]]
        + [_num(v, ".1f") for v in g.peak_mb] + [_num(v, ".2f") for v in g.memory_growth[1:]]
        for g in result.growth()
    ]
    lines.append(format_table(headers, body, align="ll" + "r" * (len(headers) - 2)))
    return "\n".join(lines)


def plot_growth(result: GrowthResult, path: str | os.PathLike) -> bool:
    """Time (log-log) and peak memory (linear MB) against T, one line per row, the baseline in
    black underneath the others; every row its own marker and dash, the legend outside and a note
    naming the rows whose memory lies on the baseline's or on each other's (:mod:`posenc.cli.plots`).

    False (and a message on stderr) without matplotlib.
    """
    from ..plots import legend_outside, mb_axis, note, overlapping, plain_log_axis, series_style
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return False

    lens, growth = result.seq_lens, result.growth()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained")
    colors = plt.get_cmap("tab10").colors + plt.get_cmap("tab20").colors[1::2]  # neighbours in distinct hues
    i = 0
    memory = {}
    for g in growth:
        if g.name == BASELINE:  # drawn first and thick: the rows lying on it stay visible on top
            style = dict(color="black", linestyle="-", linewidth=3.0, alpha=0.45, zorder=1, marker="o", markersize=4)
        else:
            style = dict(color=colors[i % len(colors)], zorder=2, **series_style(i))
            i += 1
        for ax, values in zip(axes, (g.ms, g.peak_mb)):
            pts = [(t, v) for t, v in zip(lens, values) if v is not None and v > 0]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=g.name if ax is axes[0] else None, **style)
        memory[g.name] = list(g.peak_mb)
    cfg = result.config
    for ax, title in zip(axes, ("time, forward + backward", "peak memory")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(t) for t in lens])
        ax.set_xlabel("sequence length T")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    plain_log_axis(axes[0], "ms per step (median, log scale)")
    mb_axis(axes[1], "peak MB of one step")
    legend_outside(fig, [axes[0]])
    top = max((v for values in memory.values() for v in values if v), default=0)
    # within 1% of the largest peak: indistinguishable on the axis
    note(fig, overlapping(memory, lens, 0.01 * top), "peak memory on top of each other (within 1% of the largest)")
    fig.suptitle(
        f"causal self-attention B={cfg['batch']} H={cfg['heads']} D={cfg['head_dim']}, {cfg['device']} {cfg['dtype']}, "
        f"background load: {cfg['background_load']}"
    )
    save_figure(fig, Path(path).parent, Path(path).name, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


# --- command line ----------------------------------------------------------------------------


def _encoding_list(text: str) -> tuple[str, ...]:
    """Comma-separated names; ``all`` stands for every registered 1D encoding (and ``none``)."""
    known = encoding_names()
    names: list[str] = []
    for n in (n.strip() for n in text.split(",")):
        if n:
            names += known if n == ALL else [n]
    unknown = [n for n in names if n not in known]
    if unknown:
        hints = "".join(suggest(n, known) for n in unknown)
        raise argparse.ArgumentTypeError(f"unknown encoding(s) {', '.join(map(repr, unknown))}{hints}; "
                                         f"'{ALL}' runs every one (posenc list --modality seq)")
    if not names:
        raise argparse.ArgumentTypeError(f"no encodings in {text!r}; choose from {ALL}, {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def _linear_encoding_list(text: str) -> tuple[str, ...]:
    """``--linear-encodings``: comma-separated names of encodings linear attention runs, or ``off``."""
    if text.strip() == "off":
        return ()
    known = linear_encoding_names()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        what = f"not encodings of linear attention: {', '.join(map(repr, unknown))}" if unknown else f"no encodings in {text!r}"
        raise argparse.ArgumentTypeError(f"{what}; choose from off, {', '.join(known)}")
    return tuple(dict.fromkeys(names))


_positive_ints = int_list(minimum=1)


def seq_len_list(text: str) -> list[int]:
    """``--seq-lens``: comma-separated positive integers, strictly increasing."""
    values = _positive_ints(text)
    if any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"expected increasing positive integers (e.g. 1024,2048,4096), got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``posenc bench attention``."""
    d = AttentionBenchConfig()
    parser.add_argument("--device", type=device_arg, default=d.device, help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=d.dtype, help="default: %(default)s")
    parser.add_argument("--seq-len", type=positive_int, default=None, metavar="T", help=f"tokens (default: {d.seq_len})")
    parser.add_argument(
        "--seq-lens", type=seq_len_list, default=None, metavar="T1,T2,...",
        help="run every row at each length and add a growth table (and a PNG with --json or --out); "
             "instead of --seq-len",
    )
    parser.add_argument("--batch", type=positive_int, default=d.batch, metavar="B", help="default: %(default)s")
    parser.add_argument("--heads", type=positive_int, default=d.heads, metavar="H", help="default: %(default)s")
    parser.add_argument("--head-dim", type=positive_int, default=d.head_dim, metavar="D", help="default: %(default)s")
    parser.add_argument("--repeats", type=positive_int, default=d.repeats, metavar="N", help="timed rounds (default: %(default)s)")
    parser.add_argument(
        "--long-repeats", type=positive_int, default=LONG_REPEATS, metavar="N",
        help=f"with --seq-lens: timed rounds at lengths above {LONG_SEQ_LEN}, at most --repeats (default: %(default)s)",
    )
    parser.add_argument("--warmup", type=nonnegative_int, default=d.warmup, metavar="N", help="untimed rounds first (default: %(default)s)")
    parser.add_argument(
        "--encodings", type=_encoding_list, default=None, metavar="A,B,...|all",
        help=f"rows besides the baseline: 'none' and/or registered encoding names, or 'all' "
             f"(default: {','.join(DEFAULT_ENCODINGS)})",
    )
    parser.add_argument(
        "--linear-encodings", type=_linear_encoding_list, default=None, metavar="A,B,...|off",
        help=f"rows on linear attention, named 'NAME (linear MAP)', or 'off' (default: {','.join(LINEAR_ENCODINGS)} "
             "beside the default rows, none with --encodings)",
    )
    parser.add_argument("--feature-map", choices=FEATURE_MAPS, default=d.feature_map,
                        help="feature map of the linear rows (default: %(default)s)")
    parser.add_argument("--json", type=json_path, default=None, metavar="PATH",
                        help="also write the result as JSON (and, with --seq-lens, the plot next to it as .png)")
    parser.add_argument("--out", type=out_directory, default=None, metavar="DIR",
                        help="write attention.txt, attention.json and, with --seq-lens, attention.png into DIR")
    parser.add_argument(
        "--smithy", action="store_true",
        help="the AttentionSmithy row set: its MultiheadAttention with its own method and with PosencAttentionMethod, "
             f"beside posenc's own, for {','.join(SMITHY_ENCODINGS)} (or --encodings)",
    )
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="leave out x-transformers and AttentionSmithy rows")
    parser.add_argument(
        "--frozen", action="store_true",
        help="also time each encoding that has parameters with them frozen, as rows 'NAME (frozen)'",
    )
    parser.add_argument(
        "--background-load", dest="background_processes", action="store_const", const=1, default=0,
        help="run one busy process (a Python loop on one core, in its own session) for the whole run; noted in the header and JSON",
    )
    parser.add_argument("--plans", action="store_true", help="after the table, each row's kernel path and why it was taken")
    parser.add_argument("--seed", type=seed_value, default=d.seed, help="default: %(default)s")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress on stderr")
    add_allow_large(parser)


SIZE_FLAGS = ("seq_len", "seq_lens", "batch", "heads", "head_dim", "repeats", "long_repeats", "warmup")
OUTPUTS = ("attention.txt", "attention.json", "attention.png")
PEER_ROWS = 3  # x-transformers' and AttentionSmithy's rows beside posenc's, at most


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): every row (a layer forward and backward, counted as one
    block of the cost model) for its warm-up, timed and memory rounds, at every length."""
    d = AttentionBenchConfig()
    rows = 1 + len(args.encodings or DEFAULT_ENCODINGS) + len(args.linear_encodings or ()) + PEER_ROWS
    rows *= 2 if args.frozen else 1
    lengths = args.seq_lens or [args.seq_len or d.seq_len]
    work = Work()
    for t in lengths:
        repeats = args.repeats if not args.seq_lens or t <= LONG_SEQ_LEN else min(args.repeats, args.long_repeats)
        step = transformer(args.batch, t, args.heads * args.head_dim, 1)
        work = work + step * ((args.warmup + repeats + 1) * rows)
    return work


def config_from_args(args: argparse.Namespace) -> AttentionBenchConfig:
    seq_len = getattr(args, "seq_len", None)
    if seq_len is not None and getattr(args, "seq_lens", None) is not None:
        raise ValueError("--seq-len and --seq-lens: give one of them")
    return AttentionBenchConfig(
        device=args.device, dtype=args.dtype, seq_len=seq_len or AttentionBenchConfig.seq_len, batch=args.batch,
        heads=args.heads, head_dim=args.head_dim, repeats=args.repeats, warmup=args.warmup, encodings=args.encodings,
        peers=args.peers, seed=args.seed, frozen=args.frozen,
        background_processes=getattr(args, "background_processes", 0),
        linear_encodings=getattr(args, "linear_encodings", None), feature_map=getattr(args, "feature_map", "elu"),
        smithy=getattr(args, "smithy", False),
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table(s), write the outputs. 0 on success, 1 if the baseline
    failed (at any length), 2 on bad input."""
    try:
        config = config_from_args(args)
        require_available(config.device)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    error = error or out_error(getattr(args, "out", None), OUTPUTS)
    if error is None and getattr(args, "json", None):
        json_file = Path(args.json)
        error = out_error(json_file.parent, [json_file.name, _png_next_to(json_file).name], flag="--json", create=False)
    if error is not None:
        return usage_error(PROG, error)
    seq_lens = getattr(args, "seq_lens", None)
    plans = getattr(args, "plans", False)
    out_dir = Path(args.out) if getattr(args, "out", None) else None
    if seq_lens:
        result: BenchResult | GrowthResult = run_growth(
            config, seq_lens, long_repeats=getattr(args, "long_repeats", LONG_REPEATS), progress=args.progress
        )
        singles = result.results
        text = "\n\n".join([render(r, plans=plans) for r in singles] + [render_growth(result)])
    else:
        result = run_benchmark(config, progress=args.progress)
        singles = [result]
        text = render(result, plans=plans)
    print(text)
    print_warnings(result.warnings)
    written: list[str] = []
    json_paths = ([Path(args.json)] if args.json else []) + ([out_dir / "attention.json"] if out_dir else [])
    if out_dir:
        written.append(str(write_file(out_dir, "attention.txt", text + "\n")))
    for path in json_paths:
        written.append(str(write_json_file(path.parent, path.name, result.to_json())))
    if isinstance(result, GrowthResult):
        png_paths = ([_png_next_to(Path(args.json))] if args.json else []) + ([out_dir / "attention.png"] if out_dir else [])
        if not png_paths:
            print("\nno plot: pass --json PATH or --out DIR to write one", file=sys.stderr)
        for path in png_paths:
            if not plot_growth(result, path):
                break
            written.append(str(path))
    if written:
        print(f"\nwrote {', '.join(written)}")
    ok = all(any(r.name == BASELINE and r.ms is not None for r in res.rows) for res in singles)
    return 0 if ok else 1


def _png_next_to(json_path: Path) -> Path:
    png = json_path.with_suffix(".png")
    return png if png != json_path else json_path.with_name(json_path.name + ".png")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m posenc.cli.bench.attention``: the same as ``posenc bench attention``."""
    parser = argparse.ArgumentParser(prog="posenc bench attention", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return run(args)


_UNITS = ("BareCausalAttention", "PosencAttention", "XTransformersAttention", "AttentionSmithyAttention")


def __getattr__(name: str):
    """The units (:mod:`.attention_units`, which imports torch) and ``DTYPES``, read on first use."""
    if name in _UNITS:
        from . import attention_units

        return getattr(attention_units, name)
    if name == "DTYPES":
        import torch

        return {n: getattr(torch, n) for n in DTYPE_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
