"""The timing of ``posenc bench models`` (see :mod:`.models`): the rows of each model (every
pair of the lm, the vit, ...) built, one checked training step each, then timed round robin together, their peak memory, and with compiling the graph
breaks and the compiled rounds; the table of the result."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn

from ...training.report import Progress, format_table
from .devices import require_available
from .load import background_load, describe, format_load_average, load_average
from .memory import MB, peak_memory_bytes
from .models_config import ModelsBenchConfig
from .models_units import Unit, candidates
from .peers import versions
from .timing import error_text, paired_ratio, time_interleaved

PEER_DISTS = {"x-transformers": "x-transformers", "timm": "timm", "torch_geometric": "torch_geometric"}


@dataclass
class Row:
    pair: str
    name: str
    impl: str
    ms: float | None = None
    steps_per_s: float | None = None
    peak_mb: float | None = None
    vs_peer: float | None = None  # this row's ms over the peer's (posenc rows)
    vs_none: float | None = None  # this row's ms over the same model's without an encoding (posenc rows)
    graph_breaks: int | None = None
    graphs: int | None = None
    compiled_ms: float | None = None
    compile_speedup: float | None = None
    break_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    compile_error: str | None = None


@dataclass
class ModelsResult:
    config: dict
    rows: list[Row]
    notes: list[str]

    def to_json(self) -> dict:
        return {"config": self.config, "rows": [asdict(r) for r in self.rows], "notes": self.notes}


def _autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` in ``dtype`` on ``device``; off for None (float32)."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def _train_step(unit: Unit, module: nn.Module, opt: torch.optim.Optimizer, device: torch.device,
                autocast: torch.dtype | None) -> Callable[[], None]:
    """One training step; ``autocast``: the forward pass and loss under ``torch.autocast`` in that dtype."""
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with _autocast(device, autocast):
            loss = unit.loss_of(unit.apply(module))
        loss.backward()
        opt.step()

    return step


def _explain(unit: Unit, device: torch.device, autocast: torch.dtype | None) -> tuple[int, int, list[str]]:
    """``(graph breaks, graphs, reasons)`` of the forward pass under ``torch._dynamo.explain``."""
    import torch._dynamo

    torch._dynamo.reset()
    with _autocast(device, autocast):
        info = torch._dynamo.explain(lambda: unit.apply(unit.model))()
    reasons = []
    for b in info.break_reasons:
        where = b.user_stack[-1] if getattr(b, "user_stack", None) else None
        place = f" ({os.path.basename(where.filename)}:{where.lineno})" if where is not None else ""
        reasons.append(" ".join(str(b.reason).split())[:160] + place)
    return info.graph_break_count, info.graph_count, list(dict.fromkeys(reasons))


def _kind(pair: str) -> str:
    """The model a pair trains (``"vit/peg"`` -> ``"vit"``): the rows of one kind are timed together."""
    return pair.split("/", 1)[0]


def _measure(cfg: ModelsBenchConfig, *, progress: bool) -> ModelsResult:
    notes: list[str] = []
    todo = candidates(cfg, notes)
    rows = [Row(c.pair, c.name, c.impl) for c in todo]
    keys = [f"{c.pair} {c.impl} {c.name}" for c in todo]  # one key per row: a kind's posenc rows share a model name
    kinds = list(dict.fromkeys(_kind(c.pair) for c in todo))
    bar = Progress(len(kinds), "models", enabled=progress)
    device = require_available(cfg.device)
    autocast = torch.bfloat16 if cfg.dtype == "bfloat16" else None
    for kind in kinds:
        # every row of a kind in the same rounds: its encodings compare with one another and
        # with the kind's ``none`` row, not only within a pair (the machine drifts between minutes)
        members = [(c, r, k) for c, r, k in zip(todo, rows, keys) if _kind(c.pair) == kind]
        steps, units = {}, {}
        for cand, row, key in members:
            try:
                torch.manual_seed(cfg.seed)
                unit = cand.factory()
                unit.model.to(device).train()
                opt = torch.optim.AdamW(unit.model.parameters(), lr=1e-4)
                step = _train_step(unit, unit.model, opt, device, autocast)
                step()  # one checked step before timing
                steps[key], units[key] = step, (unit, opt)
            except Exception as exc:
                row.error = error_text(exc)
        timings = time_interleaved(steps, repeats=cfg.repeats, warmup=cfg.warmup, device=device, progress=False)
        for cand, row, key in members:
            if key not in steps:
                continue
            t = timings[key]
            row.error = t.error
            row.ms = t.median_ms
            row.steps_per_s = 1e3 / row.ms if row.ms else None
            try:
                row.peak_mb = peak_memory_bytes(steps[key], device) / MB
            except Exception as exc:
                row.error = row.error or f"memory: {error_text(exc)}"
        if cfg.compile:
            compiled_steps = {}
            for cand, row, key in members:
                if key not in units or row.error:
                    continue
                unit, _ = units[key]
                try:
                    row.graph_breaks, row.graphs, row.break_reasons = _explain(unit, device, autocast)
                    torch._dynamo.reset()
                    compiled = torch.compile(unit.model)  # the same parameters, compiled
                    cstep = _train_step(unit, compiled, torch.optim.AdamW(unit.model.parameters(), lr=1e-4), device, autocast)
                    cstep()  # compiles
                    compiled_steps[key] = cstep
                except Exception as exc:
                    row.compile_error = error_text(exc)
            # at least one untimed round: the first calls after compiling may still recompile
            ctimes = time_interleaved(compiled_steps, repeats=cfg.repeats, warmup=max(1, cfg.warmup), device=device,
                                      progress=False)
            for cand, row, key in members:
                if key in compiled_steps:
                    t = ctimes[key]
                    row.compile_error = row.compile_error or t.error
                    row.compiled_ms = t.median_ms
                    if row.compiled_ms and row.ms:
                        row.compile_speedup = row.ms / row.compiled_ms
        _paired_ratios(members, timings)
        bar.update(note=kind)
    bar.close()
    config = asdict(cfg)
    config.update(
        torch=torch.__version__, threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
        machine=platform.processor() or platform.machine(), background_load=describe(cfg.background_processes),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        load_average=load_average(), peer_versions=versions(PEER_DISTS),
        timing="training step (AdamW) median of repeats after warmup; the rows of a model (lm, vit, ...) round robin",
    )
    return ModelsResult(config, rows, notes)


def _paired_ratios(members: list, timings: dict) -> None:
    """``vs_peer`` of each pair's posenc row and ``vs_none`` of each posenc row against the kind's
    posenc ``none`` row, round by round: every row of a kind ran in the same rounds."""
    times = {key: timings[key].times_ms for _, row, key in members if key in timings and row.ms}
    posenc = [(c, r, k) for c, r, k in members if r.impl == "posenc" and k in times]
    base = next((k for c, r, k in posenc if c.pair.endswith("/none")), None)
    for cand, row, key in posenc:
        peer = next((k for c, r, k in members if c.pair == cand.pair and r.impl != "posenc" and k in times), None)
        if peer is not None:
            row.vs_peer = paired_ratio(times[key], times[peer])
        if base is not None:
            row.vs_none = paired_ratio(times[key], times[base])


def run_benchmark(cfg: ModelsBenchConfig, *, progress: bool = True) -> ModelsResult:
    n = cfg.background_processes
    with background_load(n > 0, max(n, 1)):
        return _measure(cfg, progress=progress)


# --- output -----------------------------------------------------------------------------------


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _precision(config: dict) -> str:
    return "bfloat16 autocast" if config["dtype"] == "bfloat16" else "float32"


def render(result: ModelsResult) -> str:
    c = result.config
    lines = [
        f"training steps (AdamW), {_precision(c)} on {c.get('device_name') or c['device']} ({c['threads']} CPU threads): "
        f"lm B={c['batch']} T={c['seq_len']} dim={c['lm_dim']} "
        f"depth={c['lm_depth']} heads={c['lm_heads']}; vit {c['img_size']}px/{c['patch']} dim={c['vit_dim']} "
        f"depth={c['vit_depth']} heads={c['vit_heads']} B={c['batch']}; gps {c['graphs']} graphs x {c['nodes']} nodes "
        f"dim={c['gps_dim']} depth={c['gps_depth']}; convtran B={c['series']} C={c['series_channels']} "
        f"T={c['series_len']}",
        f"background load: {c['background_load']}; load average at the end: {format_load_average(c['load_average'])}",
        "vs peer: median over rounds of posenc ms / peer ms in the same round (target <= 1.10); "
        "vs none: the same against posenc's model without an encoding (a 'none' row); "
        "the rows of a model run in the same rounds; breaks: torch._dynamo.explain graph breaks of the forward; "
        "compiled x: eager ms / compiled ms",
        "",
    ]
    headers = ["pair", "model", "impl", "ms/step", "steps/s", "peak MB", "vs peer", "vs none", "breaks", "compiled ms",
               "compiled x"]
    body = [[r.pair, r.name, r.impl, _num(r.ms, ".1f"), _num(r.steps_per_s, ".2f"), _num(r.peak_mb, ".1f"),
             _num(r.vs_peer, ".2f"), _num(r.vs_none, ".2f"), "-" if r.graph_breaks is None else str(r.graph_breaks),
             _num(r.compiled_ms, ".1f"), _num(r.compile_speedup, ".2f")] for r in result.rows]
    lines.append(format_table(headers, body, align="lll" + "r" * 8))
    reasons = [(r, why) for r in result.rows for why in r.break_reasons]
    if reasons:
        lines += ["", "graph breaks:"] + [f"  {r.pair} {r.impl}: {why}" for r, why in reasons]
    errors = [(r, r.error or r.compile_error) for r in result.rows if r.error or r.compile_error]
    if errors:
        lines += ["", "errors:"] + [f"  {r.pair} {r.impl}: {e}" for r, e in errors]
    if result.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in result.notes]
    return "\n".join(lines)


__all__ = ["ModelsResult", "Row", "render", "run_benchmark"]
