"""The command-line cases of ``scripts/hostile_audit.py`` (issue 51): absurd sizes, links and
unwritable directories at ``--out``, code from a user-given path, tampered ``units.jsonl`` lines of
a resumed ``posenc bench length-generalization``.

Every command that writes is given tiny sizes, so that a case that is not refused still ends in
seconds and the audit can see what it wrote (through a link or not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CLI_TIMEOUT = 20  # seconds a command may run before it counts as running for ever


@dataclass
class CliCase:
    surface: str
    case: str
    argv: list[str]  # "{dir}" is the case's own directory
    names: tuple[str, ...] = ()
    setup: Callable[[Path], None] | None = None  # prepares the case's directory
    after: Callable[[Path], str | None] | None = None  # what the run must have left alone: None, or why not
    right: Callable[[Path, str, str], str | None] | None = None  # (dir, stdout, stderr) of a run meant to succeed


# ---- absurd sizes --------------------------------------------------------------------------------

ROPE = ["train", "seq", "--encoding", "rope"]
SIZES_OF_THE_ISSUE = [
    ([*ROPE, "--length", "100000"], "--length", "100000"),
    ([*ROPE, "--task", "copy", "--length", "100000"], "--length", "100000"),
    ([*ROPE, "--eval-lens", "100000"], "--eval-lens", "100000"),
    ([*ROPE, "--task", "copy", "--eval-lens", "100000"], "--eval-lens", "100000"),
    (["bench", "generate", "--decode-tokens", "1000000"], "--decode-tokens", "1000000"),
    (["bench", "generate", "--repeats", "1000000000"], "--repeats", "1000000000"),
    (["bench", "generate", "--warmup", "1000000000"], "--warmup", "1000000000"),
    (["bench", "models", "--graphs", "1000000000"], "--graphs", "1000000000"),
    (["bench", "models", "--repeats", "1000000000"], "--repeats", "1000000000"),
    (["bench", "length-generalization", "--seeds", "1000000"], "--seeds", "1000000"),
    (["bench", "hf", "--gen-tokens", "1000000000"], "--gen-tokens", "1000000000"),
    (["bench", "spline", "--scales", "1000000000"], "--scales", "1000000000"),
]
SIZES_OF_OUR_OWN = [
    (["bench", "generate", "--contexts", "100000000"], "--contexts", "100000000"),
    (["bench", "generate", "--batches", "1000000"], "--batches", "1000000"),
    (["bench", "generate", "--vocab", "1000000000"], "--vocab", "1000000000"),
    (["bench", "generate", "--dim", "1000000"], "--dim", "1000000"),
    (["bench", "models", "--batch", "1000000000"], "--batch", "1000000000"),
    (["bench", "models", "--seq-len", "100000000"], "--seq-len", "100000000"),
    (["bench", "models", "--warmup", "1000000000"], "--warmup", "1000000000"),
    (["bench", "hf", "--steps", "1000000000"], "--steps", "1000000000"),
    (["bench", "hf", "--eval-factors", "100000"], "--eval-factors", "100000"),
    (["bench", "hf", "--gen-batch", "1000000000"], "--gen-batch", "1000000000"),
    (["bench", "hf", "--train-len", "100000000"], "--train-len", "100000000"),
    (["bench", "spline", "--length", "1000000000"], "--length", "1000000000"),
    (["bench", "spline", "--control-points", "1000000000"], "--control-points", "1000000000"),
    (["bench", "spline", "--degree", "1000000"], "--degree", "1000000"),
    (["bench", "spline", "--eval-curves", "1000000000"], "--eval-curves", "1000000000"),
    (["bench", "length-generalization", "--jobs", "1000000"], "--jobs", "1000000"),
    (["bench", "length-generalization", "--lm-eval-lens", "100000000"], "--lm-eval-lens", "100000000"),
    (["bench", "length-generalization", "--train-len", "100000000"], "--train-len", "100000000"),
    (["bench", "length-generalization", "--steps", "1000000000"], "--steps", "1000000000"),
    (["bench", "context-extension", "--eval-lens", "100000000"], "--eval-lens", "100000000"),
    (["bench", "extrapolation", "--eval-lens", "100000000"], "--eval-lens", "100000000"),
    (["bench", "resolution", "--scales", "100000"], "--scales", "100000"),
    (["bench", "resolution", "--img-size", "100000"], "--img-size", "100000"),
    (["bench", "graph-pe", "--nodes", "1000000000"], "--nodes", "1000000000"),
    (["bench", "attention", "--seq-lens", "100000000"], "--seq-lens", "100000000"),
    ([*ROPE, "--task", "copy", "--num-symbols", "1000000000"], "--num-symbols", "1000000000"),
    ([*ROPE, "--sample-tokens", "1000000000"], "--sample-tokens", "1000000000"),
    ([*ROPE, "--max-len", "1000000000"], "--max-len", "1000000000"),
    ([*ROPE, "--task", "copy", "--seq-len", "100000"], "--seq-len", "100000"),
]


def size_cases() -> list[CliCase]:
    cases = []
    for rows, where in ((SIZES_OF_THE_ISSUE, "benches: sizes (the issue's)"), (SIZES_OF_OUR_OWN, "benches: sizes (our own)")):
        for argv, flag, value in rows:
            cases.append(CliCase(where, " ".join(argv), argv, (flag, value)))
    return cases


# ---- links and unwritable directories at --out ---------------------------------------------------

TINY = {  # bench -> tiny arguments, and the files it writes into --out
    "generate": (["--contexts", "8", "--batches", "1", "--encodings", "rope", "--no-peers", "--decode-tokens", "1",
                  "--repeats", "1", "--warmup", "0", "--dim", "16", "--depth", "1", "--heads", "2"],
                 ["generate.txt", "generate.json", "generate.png"]),
    "length-generalization": (["--tasks", "copy", "--encodings", "nope", "--seeds", "1", "--lm-encodings", "none",
                               "--steps", "1", "--eval-examples", "2", "--train-len", "2", "--dim", "16", "--depth", "1",
                               "--heads", "2", "--batch-size", "2"],
                              ["units.jsonl", "length_generalization.txt", "length_generalization.json",
                               "length_generalization.png"]),
    "attention": (["--encodings", "alibi", "--no-peers", "--seq-lens", "16,32", "--batch", "1", "--heads", "2",
                   "--head-dim", "8", "--repeats", "1", "--long-repeats", "1", "--warmup", "0",
                   "--linear-encodings", "off"],
                  ["attention.txt", "attention.json", "attention.png"]),
    "extrapolation": (["--encodings", "rope", "--steps", "1", "--dim", "16", "--depth", "1", "--heads", "2",
                       "--train-len", "16", "--eval-lens", "16", "--eval-tokens", "32"],
                      ["extrapolation.txt", "extrapolation.json", "extrapolation.png"]),
    "resolution": (["--encodings", "sincos2d", "--steps", "1", "--seeds", "0", "--scales", "1", "--dim", "16",
                    "--depth", "1", "--heads", "2", "--repeats", "1"], ["resolution.json", "resolution.png"]),
    "spline": (["--models", "spline", "--steps", "1", "--scales", "1", "--eval-curves", "4", "--dim", "16", "--heads",
                "2", "--depth", "1"], ["spline.txt", "spline.json", "spline.png"]),
    "timeseries": (["--seeds", "0", "--encodings", "none", "--datasets", "BasicMotions"],
                   ["timeseries.json", "timeseries.png"]),
    "context-extension": (["--steps", "1", "--finetune-steps", "0", "--methods", "none", "--train-len", "16",
                           "--eval-lens", "16,32", "--eval-tokens", "64", "--dim", "16", "--depth", "1", "--heads",
                           "2"], ["context_extension.txt", "context_extension.json", "context_extension.png"]),
    "hf": (["--variants", "hf", "--steps", "1", "--dim", "16", "--depth", "1", "--heads", "2", "--train-len", "16",
            "--eval-factors", "1", "--eval-tokens", "32", "--gen-tokens", "1", "--gen-batch", "1"],
           ["hf.txt", "hf.json", "hf.png"]),
    "models": (["--models", "lm", "--lm-encodings", "rope", "--no-compile", "--repeats", "1", "--warmup", "0",
                "--batch", "1", "--seq-len", "8"], ["models.txt", "models.json"]),
    "graph-pe": (["--graphs", "2", "--nodes", "8", "--edges", "16", "--repeats", "1", "--workloads", "molecules"],
                 ["graph_pe.json", "graph_pe.txt"]),
}
PLOTTING = ("generate", "length-generalization", "attention", "extrapolation", "resolution", "spline", "timeseries",
            "context-extension")


def _plant(name: str, dangling: bool):
    def setup(directory: Path) -> None:
        (directory / "out").mkdir()
        if not dangling:
            (directory / "victim").write_text("keep me")
        os.symlink(directory / "victim", directory / "out" / name)
    return setup


def _victim_kept(dangling: bool):
    def after(directory: Path) -> str | None:
        victim = directory / "victim"
        if dangling:
            return "wrote where the dangling link points" if victim.exists() else None
        return None if victim.read_text() == "keep me" else "wrote through the link"
    return after


def _afile(directory: Path) -> None:
    (directory / "afile").write_text("")


def output_cases() -> list[CliCase]:
    cases = []
    for bench in PLOTTING:
        args, names = TINY[bench]
        for name in names:
            for dangling in (False, True):
                kind = "dangling" if dangling else "planted"
                cases.append(CliCase("benches: outputs (the issue's)", f"{bench}: a {kind} link at {name}",
                                     ["bench", bench, *args, "--out", "{dir}/out", "--no-progress"], ("--out", name),
                                     setup=_plant(name, dangling), after=_victim_kept(dangling)))
    for bench in [*PLOTTING, "hf", "models", "graph-pe"]:
        args, _ = TINY[bench]
        where = "benches: outputs (the issue's)" if bench in PLOTTING else "benches: outputs (our own)"
        cases.append(CliCase(where, f"{bench} --out afile/run", ["bench", bench, *args, "--out", "{dir}/afile/run"],
                             ("--out", "afile"), setup=_afile))
        cases.append(CliCase(where, f"{bench}: an unwritable --out", ["bench", bench, *args, "--out",
                                                                      "/proc/self/posenc-run"],
                             ("--out", "/proc/self/posenc-run")))
    for bench in ("hf", "models", "graph-pe"):
        args, names = TINY[bench]
        for name in names[:1]:
            cases.append(CliCase("benches: outputs (our own)", f"{bench}: a planted link at {name}",
                                 ["bench", bench, *args, "--out", "{dir}/out", "--no-progress"], ("--out", name),
                                 setup=_plant(name, False), after=_victim_kept(False)))
    attention, _ = TINY["attention"]
    cases.append(CliCase("benches: outputs (our own)", "attention: a planted link at --json's PNG",
                         ["bench", "attention", *attention, "--json", "{dir}/out/a.json"], ("--json", "a.png"),
                         setup=_plant("a.png", False), after=_victim_kept(False)))
    cases.append(CliCase("benches: outputs (our own)", "attention: --out itself a link",
                         ["bench", "attention", *attention, "--out", "{dir}/linked"], ("--out", "symbolic link"),
                         setup=lambda d: (d / "real").mkdir() or os.symlink(d / "real", d / "linked")))
    return cases


# ---- code from a user-given path -----------------------------------------------------------------

from tests.test_hostile_benches import CONVTRAN  # noqa: E402  (the tests' stand-in checkout)


def _repo(directory: Path) -> None:
    (directory / "repo" / "Models").mkdir(parents=True)
    (directory / "repo" / "Models" / "__init__.py").write_text("")
    (directory / "repo" / "Models" / "model.py").write_text(CONVTRAN)


def _notice_first(directory: Path, out: str, err: str) -> str | None:
    lines = [line for line in err.splitlines() if line.strip()]
    want = f"note: --convtran-repo: importing and running the Python code of {directory / 'repo' / 'Models' / 'model.py'}"
    notices = [i for i, line in enumerate(lines) if want in line]
    ran = [i for i, line in enumerate(lines) if line == "user code ran"]
    if not notices:
        return "no notice on stderr"
    if not ran or ran[0] < notices[0]:
        return "the code ran before the notice"
    return None


def code_cases() -> list[CliCase]:
    s = "benches: code from a path"
    models = ["bench", "models", "--models", "convtran", "--no-compile", "--repeats", "1", "--warmup", "0",
              "--no-progress"]
    return [
        CliCase(s, "--convtran-repo DIR: a notice before its code runs", [*models, "--convtran-repo", "{dir}/repo"],
                setup=_repo, right=_notice_first),
        CliCase(s, "--convtran-repo a missing directory", [*models, "--convtran-repo", "{dir}/nowhere"],
                ("--convtran-repo", "nowhere")),
        CliCase(s, "--convtran-repo without Models/model.py", [*models, "--convtran-repo", "{dir}"],
                ("--convtran-repo", "model.py")),
        CliCase(s, "train graph --dataset-module of a missing module",
                ["train", "graph", "--dataset-module", "no_such_module_issue51:graphs", "--encoding", "lap"],
                ("--dataset-module", "no_such_module_issue51")),
    ]


# ---- tampered units.jsonl of a resumed length-generalization ------------------------------------

LENGTH = ["bench", "length-generalization", "--tasks", "copy", "--encodings", "rope", "--seeds", "1", "--steps", "1",
          "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "2", "--eval-examples", "2", "--train-len", "2",
          "--lm-encodings", "alibi", "--lm-steps", "1", "--lm-batch-size", "2", "--lm-train-len", "16",
          "--lm-eval-lens", "16", "--eval-tokens", "32", "--no-progress"]
_BASE: dict[Path, Path] = {}
_LOCK = threading.Lock()


def _base(root: Path) -> Path:
    """A finished tiny run (one task unit, one byte-LM unit), made once and copied by each case."""
    with _LOCK:
        if root not in _BASE:
            out = root / "base"
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
            subprocess.run([sys.executable, "-m", "posenc.cli", *LENGTH, "--out", str(out)], cwd=root, env=env,
                           capture_output=True, timeout=10 * CLI_TIMEOUT, check=True)
            _BASE[root] = out
        return _BASE[root]


def _tampered(root: Path, kind: str, edit):
    """Copy the base run; ``edit(item) -> line text`` rewrites the first line of ``kind``."""
    def setup(directory: Path) -> None:
        shutil.copytree(_base(root), directory / "run")
        path = directory / "run" / "units.jsonl"
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            item = json.loads(line)
            if item.get("kind") == kind:
                lines[i] = edit(item)
                break
        path.write_text("".join(line + "\n" for line in lines))
    return setup


def _scores(value):
    def edit(item):
        key = "exact_match" if item["kind"] == "task" else "bpb"
        item[key] = {label: value for label in item[key]}
        return json.dumps(item)
    return edit


def _field(key, value):
    def edit(item):
        if value is None:
            item.pop(key)
        else:
            item[key] = value
        return json.dumps(item)
    return edit


def _twice(edit):
    """The line kept, then again as ``edit`` makes it (a unit logged twice)."""
    def twice(item):
        return json.dumps(item) + "\n" + edit(json.loads(json.dumps(item)))
    return twice


def _with_report(root: Path, edit):
    def setup(directory: Path) -> None:
        _tampered(root, "task", edit)(directory)
        shutil.copy(directory / "run" / "length_generalization.json", directory / "first.json")
    return setup


def _untimed(value):
    """A report without its timings (a repeated unit's last line gives those)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in ("train_s", "eval_s")}
    return [_untimed(v) for v in value] if isinstance(value, list) else value


def _same_report(directory: Path, out: str, err: str) -> str | None:
    again = json.loads((directory / "run" / "length_generalization.json").read_text())
    first = json.loads((directory / "first.json").read_text())
    same = (_untimed(again["tasks"]), _untimed(again["lm"]), again["complete"]) == (
        _untimed(first["tasks"]), _untimed(first["lm"]), True)
    return None if same else "the report's scores changed"


def log_cases(root: Path) -> list[CliCase]:
    s, own = "resume logs (the issue's)", "resume logs (our own)"
    argv = [*LENGTH, "--out", "{dir}/run"]

    def case(surface, name, kind, edit, names):
        return CliCase(surface, name, argv, ("units.jsonl line", *names), setup=_tampered(root, kind, edit))

    def keep_report(directory: Path) -> None:
        shutil.copytree(_base(root), directory / "run")
        shutil.copy(directory / "run" / "length_generalization.json", directory / "first.json")

    def partial(directory: Path) -> None:
        keep_report(directory)
        with open(directory / "run" / "units.jsonl", "a") as f:
            f.write('{"unit": "task/copy/rope/1", "conf')

    def linked(directory: Path) -> None:
        shutil.copytree(_base(root), directory / "run")
        os.replace(directory / "run" / "units.jsonl", directory / "victim")
        os.symlink(directory / "victim", directory / "run" / "units.jsonl")

    return [
        case(s, "exact match 7.0", "task", _scores(7.0), ("7.0",)),
        case(s, "exact match -5", "task", _scores(-5), ("-5",)),
        case(s, "exact match NaN", "task", _scores(float("nan")), ("nan",)),
        case(s, "bits per byte -3", "lm", _scores(-3), ("-3",)),
        case(s, "encoding not the unit's", "task", _field("encoding", "alibi"), ("encoding", "alibi")),
        case(s, "task not the unit's", "task", _field("task", "reverse"), ("task", "reverse")),
        case(s, "not JSON", "task", lambda item: "{not json", ("JSON",)),
        case(s, "a list", "task", lambda item: json.dumps([item]), ("list",)),
        case(s, "missing keys (kind)", "task", _field("kind", None), ("kind",)),
        case(s, "missing keys (exact_match)", "task", _field("exact_match", None), ("exact_match",)),
        case(s, "missing keys (unit)", "lm", _field("unit", None), ("unit",)),
        case(own, "exact match True", "task", _scores(True), ("True",)),
        case(own, "bits per byte inf", "lm", _scores(float("inf")), ("inf",)),
        case(own, "seed not the unit's", "task", _field("seed", 5), ("seed", "5")),
        case(own, "lm line with a task's kind", "lm", _field("kind", "task"), ("kind", "task")),
        case(own, "train_loss NaN", "lm", _field("train_loss", float("nan")), ("train_loss", "nan")),
        case(own, "the same unit twice, another score", "task", _twice(_scores(0.5)),
             ("line 2", "exact_match")),
        CliCase(own, "the same unit twice, only its timings differ: the same report", argv,
                setup=_with_report(root, _twice(_field("train_s", 1234.5))), right=_same_report),
        CliCase(own, "units.jsonl a link", argv, ("units.jsonl", "symbolic link"), setup=linked,
                after=lambda d: None if (d / "victim").read_text().count("\n") == 2 else "appended through the link"),
        CliCase(own, "a good log: the same report", argv, setup=keep_report, right=_same_report),
        CliCase(own, "a partial last line: dropped, rerun, complete", argv, setup=partial, right=_same_report),
    ]


def cli_cases(root: Path) -> list[CliCase]:
    return [*size_cases(), *output_cases(), *code_cases(), *log_cases(root)]


__all__ = ["cli_cases"]
