"""What every figure of the ``posenc`` commands follows, so that it reads right at a glance.

* An accuracy is drawn on a y-axis from 0 to 1 with the chance level as a labelled dashed line:
  an axis zoomed to the data makes noise look like a collapse, and without the chance line a
  model at chance looks like one that learned something.
* The legend stands outside the data (right of the panels), so it never covers a bar or a line.
* Lines that lie on top of each other stay visible: each series has its own marker (open, shrinking
  from one series to the next, so coinciding points show as nested rings) and dash, and a note
  under the figure names the series that coincide.
* Memory is drawn on a linear MB axis with plain numbers (a log axis labelled ``6x10^0`` hides
  the differences the reader looks for).

Figures are made with the constrained layout, which leaves room for the outside legend and the
note. The callers save them (:mod:`posenc.cli.outputs`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
DASHES = ("-", "--", "-.", ":")
CHANCE_COLOR = "0.35"


def series_style(i: int) -> dict:
    """Marker, dash and size of the ``i``-th series: no two of the first 40 alike, and each marker
    smaller than the one before (in a cycle of five), so a point hidden under another still shows
    as a ring around or inside it."""
    return {"marker": MARKERS[i % len(MARKERS)], "linestyle": DASHES[(i // len(MARKERS)) % len(DASHES)],
            "markersize": 9.0 - 1.4 * (i % 5), "markerfacecolor": "none", "markeredgewidth": 1.3,
            "linewidth": 1.4}


def accuracy_axis(ax, chance: float | None, label: str = "accuracy") -> None:
    """A y-axis from 0 to 1 for an accuracy (a hair of margin so points at 0 or 1 are not cut),
    with the chance level drawn and labelled when there is one."""
    ax.set_ylim(-0.02, 1.02)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel(label)
    if chance is not None:
        chance_line(ax, chance)


def chance_line(ax, chance: float, text: str | None = None) -> None:
    """A dashed grey line at ``chance`` across the panel, labelled just above its left end (where
    the curves of these figures start high: the training size, the first length)."""
    ax.axhline(chance, color=CHANCE_COLOR, linestyle=(0, (5, 3)), linewidth=1.1, zorder=1.5)
    ax.annotate(text or f"chance {chance:.3g}", xy=(0.0, chance), xycoords=("axes fraction", "data"),
                xytext=(3, 2), textcoords="offset points", ha="left", va="bottom", fontsize=8,
                color=CHANCE_COLOR, backgroundcolor=(1, 1, 1, 0.7))


def legend_outside(fig, axes: Sequence | None = None, title: str | None = None) -> None:
    """One legend for the figure, right of the panels (the labelled artists of ``axes``, default all
    of them; each label once)."""
    handles, labels = [], []
    for ax in (axes if axes is not None else fig.axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False, title=title,
                   title_fontsize=8)


def overlapping(series: Mapping[str, Sequence[float | None]], xs: Sequence, tolerance: float) -> list[str]:
    """The groups of series (lines over the points ``xs``) that are drawn on top of each other: two
    or more whose values lie within ``tolerance`` of each other at both ends of a segment. One text
    per group, ``"a = b = c (16 to 32)"``, in the order met; a single point counts as a segment
    when there is only one."""
    found: dict[tuple[str, ...], list] = {}
    spans = [(k, k + 1) for k in range(len(xs) - 1)] or [(0, 0)] * bool(xs)
    for k, m in spans:
        live = [n for n in series if _value(series[n], k) is not None and _value(series[n], m) is not None]
        placed: set[str] = set()
        for a in live:
            if a in placed:
                continue
            group = [a] + [b for b in live if b != a and b not in placed
                           and abs(_value(series[a], k) - _value(series[b], k)) <= tolerance
                           and abs(_value(series[a], m) - _value(series[b], m)) <= tolerance]
            if len(group) > 1:
                placed.update(group)
                where = found.setdefault(tuple(group), [])
                for x in (xs[k], xs[m]):
                    if x not in where:
                        where.append(x)
    return [" = ".join(group) + (f" ({where[0]} to {where[-1]})" if len(where) > 1 else f" (at {where[0]})")
            for group, where in found.items()]


def _value(values: Sequence[float | None], k: int) -> float | None:
    value = values[k] if k < len(values) else None
    return _number(value)


def note(fig, texts: Sequence[str], what: str = "on top of each other") -> str | None:
    """Write ``what: text; text`` under the figure (the series a reader cannot tell apart on the
    axes), if there is any text; returns the note."""
    if not texts:
        return None
    line = f"{what}: " + "; ".join(texts)
    fig.supxlabel(line, fontsize=8, color="0.25")
    return line


def mb_axis(ax, label: str = "peak MB") -> None:
    """A linear y-axis from 0 in MB, its ticks plain numbers."""
    ax.set_yscale("linear")
    ax.set_ylim(bottom=0)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_ylabel(label)


def plain_log_axis(ax, label: str) -> None:
    """A log y-axis whose tick labels are plain numbers (``6``, ``20``, ``300``), minor ones included,
    instead of ``6x10^0``."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_ylabel(label)


def bar_labels(ax, bars, values: Sequence[float | None], fmt: str = "{:.2f}",
               tops: Sequence[float | None] | None = None) -> None:
    """Each bar's value written above it (an accuracy of 0 still shows as a number), above
    ``tops`` where given (the end of an error bar) so that the two do not overlap."""
    for k, (bar, value) in enumerate(zip(bars, values)):
        if _number(value) is None:
            continue
        top = bar.get_height() if tops is None or _number(tops[k]) is None else max(bar.get_height(), tops[k])
        ax.annotate(fmt.format(value), xy=(bar.get_x() + bar.get_width() / 2, top),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7)


HATCHES = ("", "//", "..", "xx", "\\\\", "oo")


def bar_chart(plt, rows: Sequence[Mapping[str, object]], keys: Sequence[str], labels: Sequence[str], *,
              ylabel: str, title: str, accuracy: bool, chance: float | None = None, chance_text: str | None = None,
              top: float | None = None):
    """A figure of grouped bars: one group per row (its ``encoding``), one bar per key (labelled
    ``labels`` in a legend outside the panel, told apart by hatching as well as colour), each bar's
    value above it. An accuracy
    gets the 0-to-1 axis; otherwise the axis starts at 0 and ends at ``top`` (default a little above
    the largest value). ``chance`` draws the labelled chance line. Returns the figure."""
    import textwrap

    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(rows) * max(1, len(keys)) + 3.2), 4.0), layout="constrained")
    width = 0.8 / max(1, len(keys))
    xs = range(len(rows))
    values_all = []
    for k, (key, label) in enumerate(zip(keys, labels)):
        values = [_number(r.get(key)) for r in rows]
        values_all += [v for v in values if v is not None]
        bars = ax.bar([x - 0.4 + width * (k + 0.5) for x in xs], [0 if v is None else v for v in values], width,
                      label=label, color=f"C{k}", hatch=HATCHES[k % len(HATCHES)], edgecolor="white", linewidth=0.5)
        bar_labels(ax, bars, values)
    ax.set_xticks(list(xs), [str(r.get("encoding")) for r in rows])
    if accuracy:
        accuracy_axis(ax, None, ylabel)
    else:
        highest = max(values_all + ([chance] if chance is not None else []), default=1.0)
        ax.set_ylim(0, top if top is not None else 1.12 * highest)
        ax.set_ylabel(ylabel)
    if chance is not None:
        chance_line(ax, chance, chance_text)
    ax.set_title(textwrap.fill(title, 70), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if len(keys) > 1:  # one kind of bar needs no legend: the axis names it
        legend_outside(fig)
    return fig


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)
