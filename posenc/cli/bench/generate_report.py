"""What ``posenc bench generate`` reports: a row's cells (one per context and batch), the ratios to
posenc RoPE's tokens/s, the tables and the plot. Nothing here needs torch (the figures are
numbers by now); :mod:`.generate_rows` measures them, :mod:`.generate` is the command."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..outputs import save_figure
from ...training.report import format_table
from .generate_config import REFERENCE
from .load import format_load_average
from .timing import paired_ratio


@dataclass
class Cell:
    """One row at one context and batch; None where it failed or was skipped."""

    context: int
    batch: int
    prefill_ms: float | None = None
    step_ms: float | None = None  # one decode step (B new tokens)
    tokens_per_s: float | None = None
    prefill_times_ms: list[float] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)
    error: str | None = None
    round_robin: bool = True  # decoded in the same rounds as the other rows of its context and batch
    cache_mb: float | None = None  # what the decoder holds between steps after the last round, capacity included


@dataclass
class Row:
    name: str
    impl: str
    cells: list[Cell] = field(default_factory=list)
    error: str | None = None

    def cell(self, context: int, batch: int) -> Cell | None:
        return next((c for c in self.cells if c.context == context and c.batch == batch), None)


@dataclass
class GenerateResult:
    config: dict
    rows: list[Row]
    notes: list[str]

    def to_json(self) -> dict:
        return {"config": self.config, "rows": [asdict(r) for r in self.rows], "notes": self.notes,
                "ratios": ratios(self)}


def ratios(result: GenerateResult) -> dict[str, dict[str, float | None]]:
    """Per row, ``"T/B"`` -> its tok/s over posenc RoPE's at the same context and batch."""
    ref = next((r for r in result.rows if r.name == REFERENCE and r.impl == "posenc"), None)
    out: dict[str, dict[str, float | None]] = {}
    for row in result.rows:
        per = {}
        for cell in row.cells:
            base = ref.cell(cell.context, cell.batch) if ref is not None else None
            if not (cell.tokens_per_s and base is not None and base.tokens_per_s):
                per[f"{cell.context}/{cell.batch}"] = None
            elif cell.round_robin and base.round_robin:  # tok/s over rope's: rope's step over the row's
                per[f"{cell.context}/{cell.batch}"] = paired_ratio(base.step_times_ms, cell.step_times_ms)
            else:
                per[f"{cell.context}/{cell.batch}"] = cell.tokens_per_s / base.tokens_per_s
        out[f"{row.impl}:{row.name}"] = per
    return out


# --- output -----------------------------------------------------------------------------------


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(result: GenerateResult) -> str:
    cfg = result.config
    contexts, batches = cfg["contexts"], cfg["batches"]
    lines = [
        f"cached decoding: dim={cfg['dim']} depth={cfg['depth']} heads={cfg['heads']} vocab={cfg['vocab']}, "
        f"{cfg['dtype']} on {cfg['device']} ({cfg['threads']} CPU threads); {cfg['decode_tokens']} greedy tokens per round, "
        f"{cfg['repeats']} rounds after {cfg['warmup']} warm-up",
        f"background load: {cfg['background_load']}; load average at the end: {format_load_average(cfg['load_average'])}",
        "prefill: ms for the prompt; tok/s: decoded tokens per second over the batch; x rope: tok/s over posenc rope's "
        "(median over rounds of the two rows' ratio in the same round); "
        f"ms/step {contexts[-1]}/{contexts[0]}: growth of one step's cost with the context",
    ]
    rel = ratios(result)
    for b in batches:
        lines += ["", f"batch {b}"]
        headers = ["name", "impl"]
        for t in contexts:
            headers += [f"prefill ms@{t}", f"tok/s@{t}", f"x rope@{t}"]
        headers.append(f"ms/step {contexts[-1]}/{contexts[0]}")
        body = []
        for row in result.rows:
            cells = [row.name, row.impl]
            for t in contexts:
                c = row.cell(t, b)
                if c is None or c.error:
                    cells += ["-", "-", "-"]
                    continue
                cells += [_num(c.prefill_ms, ".1f"), _num(c.tokens_per_s, ".1f"),
                          _num(rel[f"{row.impl}:{row.name}"].get(f"{t}/{b}"), ".2f")]
            a, z = row.cell(contexts[0], b), row.cell(contexts[-1], b)
            growth = z.step_ms / a.step_ms if a and z and a.step_ms and z.step_ms and len(contexts) > 1 else None
            cells.append(_num(growth, ".2f"))
            body.append(cells)
        lines.append(format_table(headers, body, align="ll" + "r" * (len(headers) - 2)))
    lines += ["", cache_table(result)]
    errors = [(r.name, r.error) for r in result.rows if r.error]
    errors += [(f"{r.name} T={c.context} B={c.batch}", c.error) for r in result.rows for c in r.cells if c.error]
    if errors:
        lines += ["", "errors:"] + [f"  {name}: {err}" for name, err in errors]
    if result.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in result.notes]
    return "\n".join(lines)


def cache_table(result: GenerateResult) -> str:
    """The memory each row's cache holds after its last round (``context + decode_tokens`` tokens):
    every tensor storage reachable from it, spare capacity included, in MB; and over posenc RoPE's."""
    cfg = result.config
    shapes = [(t, b) for b in cfg["batches"] for t in cfg["contexts"]]
    ref = next((r for r in result.rows if r.name == REFERENCE and r.impl == "posenc"), None)
    headers = ["name", "impl"] + [f"MB@{t}/b{b}" for t, b in shapes] + [f"x rope@{t}/b{b}" for t, b in shapes[-1:]]
    body = []
    for row in result.rows:
        cells = [row.name, row.impl]
        for t, b in shapes:
            c = row.cell(t, b)
            cells.append(_num(None if c is None or c.error else c.cache_mb, ".2f"))
        last, base = row.cell(*shapes[-1]), ref.cell(*shapes[-1]) if ref is not None else None
        ok = last is not None and base is not None and last.cache_mb is not None and base.cache_mb
        cells.append(_num(last.cache_mb / base.cache_mb if ok else None, ".2f"))
        body.append(cells)
    title = (f"cache held after the last round (MB at context/batch, {cfg['decode_tokens']} decoded tokens on top: "
             "every tensor the decoder keeps between steps, spare capacity included)")
    return title + "\n" + format_table(headers, body, align="ll" + "r" * (len(headers) - 2))


def plot(result: GenerateResult, path: str | os.PathLike) -> bool:
    """tok/s against the context length (log-log), one panel per batch; False without matplotlib."""
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return False
    cfg = result.config
    batches = cfg["batches"]
    from ..plots import legend_outside, plain_log_axis, series_style

    fig, axes = plt.subplots(1, len(batches), figsize=(6.0 * len(batches) + 2.2, 4.8), squeeze=False,
                             layout="constrained")
    colors = plt.get_cmap("tab10").colors + plt.get_cmap("tab20").colors[1::2]  # neighbours in distinct hues
    for ax, b in zip(axes[0], batches):
        for i, row in enumerate(result.rows):
            pts = [(c.context, c.tokens_per_s) for c in row.cells if c.batch == b and c.tokens_per_s]
            if not pts:
                continue
            peer = row.impl != "posenc"
            style = dict(color="black", linestyle="--" if row.impl == "transformers" else ":", linewidth=2.0,
                         marker="o", markersize=3) if peer else dict(color=colors[i % len(colors)], **series_style(i))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=row.name if ax is axes[0][0] else None, **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg["contexts"], [str(t) for t in cfg["contexts"]])
        ax.set_xlabel("context length (tokens in the cache)")
        plain_log_axis(ax, "decoded tokens / s (log scale)")
        ax.set_title(f"batch {b}")
        ax.grid(True, which="both", alpha=0.3)
    legend_outside(fig, [axes[0][0]])
    fig.suptitle(f"cached greedy decoding, dim={cfg['dim']} depth={cfg['depth']} heads={cfg['heads']}, "
                 f"{cfg['dtype']}, background load: {cfg['background_load']}")
    save_figure(fig, Path(path).parent, Path(path).name, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


__all__ = ["Cell", "GenerateResult", "Row", "cache_table", "plot", "ratios", "render"]
