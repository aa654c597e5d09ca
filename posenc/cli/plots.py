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
    """A dashed grey line at ``chance`` across the panel, labelled at its right end."""
    ax.axhline(chance, color=CHANCE_COLOR, linestyle=(0, (5, 3)), linewidth=1.1, zorder=1.5)
    ax.annotate(text or f"chance {chance:.3g}", xy=(1.0, chance), xycoords=("axes fraction", "data"),
                xytext=(-3, 3), textcoords="offset points", ha="right", va="bottom", fontsize=8,
                color=CHANCE_COLOR)


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


def coinciding(series: Mapping[str, Sequence[float | None]], tolerance: float) -> list[list[str]]:
    """Groups (of two or more) of series whose values all lie within ``tolerance`` of each other at
    every shared point: drawn, they hide each other."""
    names = list(series)
    groups: list[list[str]] = []
    placed: set[str] = set()
    for i, a in enumerate(names):
        if a in placed:
            continue
        group = [a]
        for b in names[i + 1:]:
            if b not in placed and _close(series[a], series[b], tolerance):
                group.append(b)
        if len(group) > 1:
            groups.append(group)
            placed.update(group)
    return groups


def _close(a: Sequence[float | None], b: Sequence[float | None], tolerance: float) -> bool:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None
             and not (isinstance(x, float) and math.isnan(x)) and not (isinstance(y, float) and math.isnan(y))]
    return bool(pairs) and all(abs(x - y) <= tolerance for x, y in pairs)


def note_coinciding(fig, series: Mapping[str, Sequence[float | None]], tolerance: float, what: str = "") -> str | None:
    """Write under the figure which series lie on top of each other (within ``tolerance``), if any;
    returns the note."""
    groups = coinciding(series, tolerance)
    if not groups:
        return None
    text = "on top of each other" + (f" ({what})" if what else "") + ": " + "; ".join(" = ".join(g) for g in groups)
    fig.supxlabel(text, fontsize=8, color="0.25")
    return text


def mb_axis(ax, label: str = "peak MB") -> None:
    """A linear y-axis from 0 in MB, its ticks plain numbers."""
    ax.set_yscale("linear")
    ax.set_ylim(bottom=0)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_ylabel(label)


def bar_labels(ax, bars, values: Sequence[float | None], fmt: str = "{:.2f}") -> None:
    """Each bar's value written above it (an accuracy of 0 still shows as a number)."""
    for bar, value in zip(bars, values):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        ax.annotate(fmt.format(value), xy=(bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7)


HATCHES = ("", "//", "..", "xx", "\\\\", "oo")


def bar_chart(plt, rows: Sequence[Mapping[str, object]], keys: Sequence[str], labels: Sequence[str], *,
              ylabel: str, title: str, accuracy: bool, chance: float | None = None, chance_text: str | None = None,
              top: float | None = None):
    """A figure of grouped bars: one group per row (its ``encoding``), one bar per key (labelled
    ``labels``, told apart by hatching as well as colour), each bar's value above it. An accuracy
    gets the 0-to-1 axis; otherwise the axis starts at 0 and ends at ``top`` (default a little above
    the largest value). ``chance`` draws the labelled chance line. Returns the figure."""
    fig, ax = plt.subplots(figsize=(1.1 * len(rows) * max(1, len(keys)) + 3.2, 4.0), layout="constrained")
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
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    legend_outside(fig)
    return fig


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)
