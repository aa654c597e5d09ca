"""``posenc bench length-generalization``'s report: the settings of the run, means and spreads over
seeds, the evidence the claims are judged on (:mod:`.length_claims`), the text tables and the heat map."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...training.report import format_table
from .length_claims import CLAIMS, LEARNED_BPB, LEARNED_EXACT, RULE, judge, mean_sd
from .length_settings import settings_rows, task_rows

LM_ITEM = "byte LM"  # the one item of the LM scores


def settings_text(args: argparse.Namespace) -> str:
    """The run's settings: per task, what the papers used and what runs here; and the encodings'
    settings scaled to the training length (none under ``--scale uniform``)."""
    headers, body = task_rows(args.scale, args.settings)
    text = f"settings (--scale {args.scale})\n" + format_table(headers, body)
    if args.scale == "uniform":
        return text + "\n(encodings at their registry defaults: no setting scaled to the training length)"
    lengths = {name: args.suites[name].max_total_length() for name in args.tasks}
    if args.lm_encodings:
        lengths = {"byte LM": args.lm_train_len, **lengths}
    headers, body = settings_rows(lengths)
    return text + "\n\nencodings at their papers' settings scaled to the training length\n" + format_table(headers, body)



def _stat(values: list[float]) -> dict:
    m, sd = mean_sd(values)
    return {"mean": m, "sd": sd, "values": values}


def aggregate(args: argparse.Namespace, results: list[dict]) -> dict:
    """Means and spreads over seeds, the evidence the claims are judged on, and the claims.

    ``args.suites``: task name -> its :class:`~posenc.seq.length_tasks.LengthSuite`;
    ``args.settings``: task name -> its :class:`.length_settings.TaskSettings`."""
    tasks: dict[str, dict] = {}
    evidence: dict[str, dict] = {}
    for name in args.tasks:
        suite = args.suites[name]
        rows = [r for r in results if r["kind"] == "task" and r["task"] == name]
        in_label = next(s.label for s in suite.splits if not s.ood)
        ood_labels = [s.label for s in suite.splits if s.ood]
        encodings = {}
        for label in args.encodings:
            mine = sorted((r for r in rows if r["encoding"] == label), key=lambda r: r["seed"])
            if not mine:
                continue
            per_seed_ood = [sum(r["exact_match"][lab] for lab in ood_labels) / len(ood_labels) for r in mine]
            encodings[label] = {
                "seeds": [r["seed"] for r in mine],
                "exact_match": {s.label: _stat([r["exact_match"][s.label] for r in mine]) for s in suite.splits},
                "ood": _stat(per_seed_ood), "train_s": _stat([r["train_s"] for r in mine]),
            }
            evidence.setdefault(f"ood_{suite.family}", {}).setdefault(name, {})[label] = {
                r["seed"]: (r["exact_match"][in_label], v) for r, v in zip(mine, per_seed_ood)}
        tasks[name] = {"family": suite.family, "train_sizes": [suite.train_min, suite.train_max],
                       "in_distribution": in_label,
                       "splits": [{"label": s.label, "size": s.size, "ood": s.ood} for s in suite.splits],
                       "cpu_learned": args.scale != "cpu" or args.settings[name].cpu_learned,
                       "encodings": encodings}
    lm = _aggregate_lm(args, results, evidence)
    claims = judge(CLAIMS, evidence)
    return {"tasks": tasks, "lm": lm, "claims": claims, "claim_evidence": _jsonable(evidence)}


def _jsonable(evidence: dict) -> dict:
    """The evidence with string seed keys (JSON objects)."""
    return {score: {item: {enc: {str(s): list(v) for s, v in seeds.items()} for enc, seeds in by_enc.items()}
                    for item, by_enc in items.items()} for score, items in evidence.items()}


def _aggregate_lm(args: argparse.Namespace, results: list[dict], evidence: dict) -> dict:
    lens = sorted(args.lm_eval_lens)
    base = args.lm_train_len if args.lm_train_len in lens else lens[0]
    longest = lens[-1]
    encodings = {}
    for label in args.lm_encodings:
        mine = sorted((r for r in results if r["kind"] == "lm" and r["encoding"] == label), key=lambda r: r["seed"])
        if not mine:
            continue
        g = [r["bpb"][str(longest)] - r["bpb"][str(base)] for r in mine]
        encodings[label] = {"seeds": [r["seed"] for r in mine],
                            "bpb": {str(n): _stat([r["bpb"][str(n)] for r in mine]) for n in lens},
                            "growth": _stat(g), "train_s": _stat([r["train_s"] for r in mine])}
        trained = [r["bpb"][str(base)] for r in mine]
        evidence.setdefault("lm_growth", {}).setdefault(LM_ITEM, {})[label] = {
            r["seed"]: (t, v) for r, t, v in zip(mine, trained, g)}
        evidence.setdefault("lm_long", {}).setdefault(LM_ITEM, {})[label] = {
            r["seed"]: (t, r["bpb"][str(longest)]) for r, t in zip(mine, trained)}
    return {"train_len": args.lm_train_len, "eval_lens": lens, "base_len": base, "longest": longest,
            "encodings": encodings}


def _cell(stat: dict | None) -> str:
    if stat is None:
        return "-"
    return f"{stat['mean']:.2f}" if stat["sd"] is None else f"{stat['mean']:.2f}±{stat['sd']:.2f}"


def in_distribution_rows(summary: dict) -> tuple[list[str], list[list]]:
    """Per task: the best encoding at the training size, and how many encodings learned it
    (mean exact match at least :data:`.length_claims.LEARNED_EXACT`)."""
    headers = ["task", "L", "best encoding in distribution", f"learned (>= {LEARNED_EXACT})", "run on CPU"]
    rows = []
    for name, task in summary["tasks"].items():
        label = task["in_distribution"]
        scored = {e: r["exact_match"][label] for e, r in task["encodings"].items()}
        if not scored:
            continue
        best = max(scored, key=lambda e: scored[e]["mean"])
        learned = sum(1 for s in scored.values() if s["mean"] >= LEARNED_EXACT)
        rows.append([name, label, f"{best} {_cell(scored[best])}", f"{learned} of {len(scored)}",
                     "yes" if task["cpu_learned"] else "not learned in budget: for a device"])
    return headers, rows


def render(summary: dict) -> str:
    """The text report: a table per task, the in-distribution table, the LM table and the claims
    table with its rule."""
    parts = []
    for name, task in summary["tasks"].items():
        labels = [s["label"] for s in task["splits"]]
        headers = ["encoding", *labels, "OOD", "seeds"]
        body = [[enc, *[_cell(row["exact_match"][lab]) for lab in labels], _cell(row["ood"]), len(row["seeds"])]
                for enc, row in task["encodings"].items()]
        lo, hi = task["train_sizes"]
        mark = "" if task["cpu_learned"] else " [not learned on CPU in budget: a task for a device, --scale paper]"
        parts.append(f"task {name}: exact match, mean±sd over seeds (trained at sizes {lo}..{hi}; "
                     f"OOD = mean of the splits other than @{hi}){mark}\n"
                     + format_table(headers, body, align="l" + "r" * (len(labels) + 2)))
    headers, body = in_distribution_rows(summary)
    if body:
        parts.append("in distribution: exact match at the training size, mean±sd over seeds\n"
                     + format_table(headers, body, align="lllrl"))
    lm = summary["lm"]
    if lm["encodings"]:
        headers = ["encoding", *[f"@{n}" for n in lm["eval_lens"]], f"growth @{lm['longest']}-@{lm['base_len']}", "seeds"]
        body = [[enc, *[_cell(row["bpb"][str(n)]) for n in lm["eval_lens"]], _cell(row["growth"]), len(row["seeds"])]
                for enc, row in lm["encodings"].items()]
        parts.append(f"byte LM: bits per byte on held-out pydoc text (trained at {lm['train_len']} bytes; lower is "
                     f"better; learned: <= {LEARNED_BPB} at @{lm['base_len']})\n"
                     + format_table(headers, body, align="l" + "r" * (len(lm["eval_lens"]) + 2)))
    body = [[c["paper"], c["claim"], "; ".join(c["numbers"]) or "-", c["verdict"]] for c in summary["claims"]]
    parts.append(f"claims ({RULE})\n" + format_table(["paper", "claim", "our numbers", "verdict"], body))
    return "\n\n".join(parts)


def plot_heat_map(summary: dict, path: Path, order) -> bool:
    """Encodings (in ``order``) x tasks, mean OOD exact match; False when matplotlib is missing."""
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return False
    tasks = list(summary["tasks"])
    encodings = [e for e in order if any(e in summary["tasks"][t]["encodings"] for t in tasks)]
    if not tasks or not encodings:
        return False
    import numpy as np

    grid = np.full((len(encodings), len(tasks)), np.nan)
    for j, t in enumerate(tasks):
        for i, e in enumerate(encodings):
            row = summary["tasks"][t]["encodings"].get(e)
            if row is not None:
                grid[i, j] = row["ood"]["mean"]
    fig, ax = plt.subplots(figsize=(1.1 * len(tasks) + 2.5, 0.42 * len(encodings) + 1.6))
    image = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_yticks(range(len(encodings)), encodings)
    for i in range(len(encodings)):
        for j in range(len(tasks)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if grid[i, j] > 0.6 else "white")
    fig.colorbar(image, ax=ax, label="OOD exact match")
    ax.set_title("Length generalisation: out-of-distribution exact match")
    fig.tight_layout()
    from ..outputs import save_figure  # the one writer: never through a link planted in --out

    save_figure(fig, path.parent, path.name, dpi=120)
    plt.close(fig)
    return True


__all__ = ["LM_ITEM", "aggregate", "in_distribution_rows", "plot_heat_map", "render", "settings_text"]
