"""What ``posenc bench length-generalization`` trains, per task and scale, and each encoding's
settings scaled to the training length.

**Scales** (``--scale``):

* ``cpu`` (default): per task, the model size, steps, learning rate, curriculum and format
  chosen so that at least the strongest encoding learns the task in distribution on a 2-core
  CPU (:data:`CPU`); a task marked ``cpu_learned=False`` is not learned there within the
  budget and is meant for a device (its rows say so).
* ``paper``: the papers' model sizes and budgets (:data:`PAPER`), for a device (``--device cuda``).
* ``uniform``: one model size, budget and plain format for every task, set by ``--dim``,
  ``--depth``, ``--heads``, ``--steps``, ``--lr`` and ``--batch-size``, and every encoding at its
  registry defaults: the runs before this table (``results/lengen-full``) reproduce under it.

**Encodings** (:data:`ENCODING_SETTINGS`): under ``cpu`` and ``paper``, the settings of FIRE,
KERPLE, T5, CAPE and CoPE that depend on the training length are their papers' values scaled to
the length a model is trained at (the longest training sequence in tokens; the byte LM's window).

The tasks (:data:`TASK_SIZES`) and the bench's encoding labels (:data:`ENCODINGS`) are named here
without torch: the command checks its flags against them before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

SCALES = ("cpu", "paper", "uniform")

# The tasks of posenc.seq.length_tasks, named here without torch (the command checks its flags
# before torch loads; the tests check they agree): name -> (the task's own largest training size,
# the smallest size it trains at).
TASK_SIZES: dict[str, tuple[int, int]] = {
    "copy": (8, 1), "reverse": (8, 1), "sort": (8, 1), "addition": (4, 1), "summation": (8, 1), "parity": (8, 1),
    "flipflop": (16, 2), "selective_copy": (8, 1), "counting": (16, 1),
}
LENGTH_TASKS = tuple(TASK_SIZES)

# The bench's encodings: label -> (registered name, constructor options), every registered sequence
# encoding that runs in a causal LM with softmax attention (the SPE encodings need linear
# attention; the RoPE context extensions are ``posenc bench context-extension``'s subject).
ENCODINGS: dict[str, tuple[str, dict]] = {
    "nope": ("nope", {}), "sinusoidal": ("sinusoidal", {}), "learned": ("learned", {}), "rope": ("rope", {}),
    "xpos": ("xpos", {}), "alibi": ("alibi", {}), "t5": ("t5", {}), "kerple": ("kerple", {"variant": "log"}),
    "kerple_power": ("kerple", {"variant": "power"}), "fire": ("fire", {}),
    "cape_alibi": ("cape", {"base": "alibi"}), "cape_kerple": ("cape", {"base": "kerple"}),
    "cape_fire": ("cape", {"base": "fire"}), "cope": ("cope", {}), "shaw": ("shaw", {}),
    "transformer_xl": ("transformer_xl", {}), "tupe": ("tupe", {}), "deberta": ("deberta", {}), "peg1d": ("peg1d", {}),
    "fox": ("fox", {}), "fox_alibi": ("fox", {"gate_init": "alibi"}),
}
TABLE_ENCODINGS = frozenset({"learned", "tupe"})  # built with rows up to the longest test sequence


@dataclass(frozen=True)
class TaskSettings:
    """How one task is trained: the largest training size, the model and its optimisation.

    ``curriculum``: the fraction of the steps over which the largest training size grows from the
    smallest to ``train_len`` (0: sizes uniform from the start). ``options``: the task's
    constructor arguments (its format). ``cpu_learned``: False where no encoding learns the task in
    distribution on 2 CPU cores within the budget (a task for a device)."""

    train_len: int
    dim: int
    depth: int
    heads: int
    steps: int
    lr: float
    batch_size: int
    curriculum: float = 0.0
    options: tuple[tuple[str, object], ...] = ()
    cpu_learned: bool = True

    def key(self) -> dict:
        """The fields that decide a unit's result (for the unit log's configuration key)."""
        return {"train": self.train_len, "dim": self.dim, "depth": self.depth, "heads": self.heads,
                "steps": self.steps, "lr": self.lr, "batch_size": self.batch_size, "curriculum": self.curriculum,
                "options": [list(o) for o in self.options]}


# What each task's paper trained (the ``paper`` scale follows it where it is known).
PAPERS: dict[str, str] = {
    "copy": "NoPE: decoder-only T5-base (12 layers, width 768, 12 heads), 40k steps, batch 64, lr 3e-5, 128-token "
            "blocks",
    "reverse": "NoPE: as copy",
    "sort": "NoPE: as copy (single-token sort)",
    "addition": "NoPE: as copy; Zhou et al. 2023 and McLeish et al. 2024: digits least significant first, index "
                "hints (Zhou) or per-digit place embeddings (McLeish)",
    "summation": "NoPE: as copy (sum mod 10)",
    "parity": "NoPE: as copy",
    "flipflop": "CoPE after Liu et al. 2023: 512 tokens at p_ignore 0.8; sparse 0.98, dense 0.1",
    "selective_copy": "CoPE: 128 tokens to copy among 128 blanks; dense 64, sparse 256 blanks",
    "counting": "CoPE's code: 4 layers, width 256, 4 heads, post-norm, dropout 0.1, lr 7e-5, batch 64, 100 epochs "
                "of 10k examples, 512-token blocks, 3 or 5 variables",
}

_SMALL = dict(dim=64, depth=2, heads=4, lr=3e-3, batch_size=32)
_HINTS = (("index_hints", True),)

CPU: dict[str, TaskSettings] = {
    "copy": TaskSettings(8, steps=3000, **_SMALL),
    "reverse": TaskSettings(8, steps=6000, **_SMALL),
    "sort": TaskSettings(8, steps=6000, **_SMALL),
    # reversed digits without index hints: with hints the models tried did not learn it in the CPU budget
    "addition": TaskSettings(4, steps=3000, **_SMALL),
    "summation": TaskSettings(8, steps=8000, **_SMALL),
    "parity": TaskSettings(8, steps=3000, **_SMALL),
    "flipflop": TaskSettings(16, steps=1000, **_SMALL),
    "selective_copy": TaskSettings(8, steps=1000, **_SMALL),
    "counting": TaskSettings(16, steps=1000, **_SMALL),
}

_NOPE = dict(dim=768, depth=12, heads=12, steps=40_000, lr=3e-5, batch_size=64)
_COPE = dict(dim=256, depth=4, heads=4, steps=15_600, lr=7e-5, batch_size=64)  # 100 epochs of 10k at 64
PAPER: dict[str, TaskSettings] = {
    "copy": TaskSettings(20, **_NOPE),
    "reverse": TaskSettings(20, **_NOPE),
    "sort": TaskSettings(20, **_NOPE),
    "addition": TaskSettings(8, options=_HINTS, **_NOPE),
    "summation": TaskSettings(20, **_NOPE),
    "parity": TaskSettings(20, **_NOPE),
    "flipflop": TaskSettings(256, **_COPE),  # 2 tokens an instruction: 514 tokens
    "selective_copy": TaskSettings(128, **_COPE),
    "counting": TaskSettings(256, **_COPE),
}


def task_settings(scale: str, task: str, *, default_len: int, overrides: Mapping[str, object]) -> TaskSettings:
    """The settings of ``task`` at ``scale``; ``overrides`` (the flags given: ``train_len``,
    ``dim``, ``depth``, ``heads``, ``steps``, ``lr``, ``batch_size``) replace the table's values.
    ``uniform`` has no table: every field comes from ``overrides`` (the flags' defaults filled in)
    and ``default_len`` (the task's own size), with no curriculum and the plain format."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if scale == "uniform":
        return TaskSettings(train_len=given.pop("train_len", default_len), **given)
    base = {"cpu": CPU, "paper": PAPER}[scale][task]
    fields = {**base.__dict__, **given}
    return TaskSettings(**fields)


# ---------------------------------------------------------------------------------------------
# encodings


@dataclass(frozen=True)
class EncodingSetting:
    """One constructor argument of the encodings in ``labels`` (bench labels; CAPE's bias takes
    the setting of its base) set from the training length ``L`` in tokens by ``value``."""

    labels: tuple[str, ...]
    option: str
    paper: str
    rule: str
    value: Callable[[int], object]


def _t5_distance(length: int) -> int:
    return max(16, round(length / 4))


ENCODING_SETTINGS: tuple[EncodingSetting, ...] = (
    EncodingSetting(("fire",), "init_threshold", "512, training at 2048 (Li et al. 2024)", "L / 4",
                    lambda n: n / 4),
    EncodingSetting(("kerple", "kerple_power"), "init_distance_scale",
                    "r1, r2 drawn for training at 512 (Chi et al. 2022)",
                    "512 / L: the initial kernel over 0..L is the paper's over 0..512", lambda n: 512 / n),
    EncodingSetting(("t5",), "max_distance", "128, training at 512 (Raffel et al. 2020)",
                    "L / 4, at least 16 (the farthest bucket is trained)", _t5_distance),
    EncodingSetting(("t5",), "num_buckets", "32 (half exact distances), training at 512",
                    "32, at most max_distance (exact distances below it)", lambda n: min(32, _t5_distance(n))),
    EncodingSetting(("cape_alibi", "cape_kerple", "cape_fire"), "hidden",
                    "32, training at 128 and 512 (Zheng et al. 2024)",
                    "32 at any L: the MLP acts on each (query, key) pair's scores", lambda n: 32),
    EncodingSetting(("cope",), "npos_max", "block size + 1 (Golovneva et al. 2024's code)", "L + 1",
                    lambda n: n + 1),
)

_CAPE_BASE = {"cape_alibi": None, "cape_kerple": "kerple", "cape_fire": "fire"}


def encoding_options(label: str, base: Mapping[str, object], length: int) -> dict:
    """The constructor options of bench encoding ``label`` (``base``: its fixed options) trained at
    ``length`` tokens: ``base`` with :data:`ENCODING_SETTINGS` applied (CAPE's bias gets its own
    encoding's settings through ``base_options``)."""
    options = dict(base)
    for setting in ENCODING_SETTINGS:
        if label in setting.labels:
            options[setting.option] = setting.value(length)
    inner = _CAPE_BASE.get(label)
    if inner is not None:
        options["base_options"] = {s.option: s.value(length) for s in ENCODING_SETTINGS if inner in s.labels}
    return options


def _value(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def settings_rows(lengths: Mapping[str, int]) -> tuple[list[str], list[list[str]]]:
    """The encoding settings table: headers and one row per setting, with its value at each
    training length in ``lengths`` (column label -> tokens)."""
    headers = ["encoding", "setting", "paper", "scaling rule (L = training length, tokens)",
               *[f"{name} (L={n})" for name, n in lengths.items()]]
    rows = [[", ".join(s.labels), s.option, s.paper, s.rule, *[_value(s.value(n)) for n in lengths.values()]]
            for s in ENCODING_SETTINGS]
    return headers, rows


def task_rows(scale: str, settings: Mapping[str, TaskSettings]) -> tuple[list[str], list[list[str]]]:
    """The per-task table: what the papers used and what this run uses."""
    headers = ["task", "paper", f"ours ({scale}): L, width x depth, heads, steps, lr, batch, curriculum, format"]
    rows = []
    for name, s in settings.items():
        fmt = ", ".join(f"{k}={v}" for k, v in s.options) or "plain"
        ours = (f"{s.train_len}, {s.dim}x{s.depth}, {s.heads}, {s.steps}, {s.lr:g}, {s.batch_size}, "
                f"{s.curriculum:g}, {fmt}")
        if scale == "cpu" and not s.cpu_learned:
            ours += " [not learned on CPU in budget: for a device, --scale paper]"
        rows.append([name, PAPERS[name], ours])
    return headers, rows


__all__ = [
    "CPU", "ENCODINGS", "ENCODING_SETTINGS", "LENGTH_TASKS", "PAPER", "PAPERS", "SCALES", "TASK_SIZES", "EncodingSetting",
    "TABLE_ENCODINGS", "TaskSettings", "encoding_options", "settings_rows", "task_rows", "task_settings",
]
