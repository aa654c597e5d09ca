"""Issue 51's audit: every hostile case the issue names, and more of our own on the same surfaces,
tried one by one; a markdown table per surface and a summary.

    .venv/bin/python scripts/hostile_audit.py                 # everything (a few minutes on 2 cores)
    .venv/bin/python scripts/hostile_audit.py --only sizes    # the surfaces whose name holds 'sizes'

Command-line cases run as subprocesses (``python -m posenc.cli ...``) under a
:data:`CLI_TIMEOUT`-second limit: a command still running then has not refused before work ("runs
for ever"). Library cases run in this process (:mod:`hostile_audit_library`,
:mod:`hostile_audit_bridges`). Each case ends in one of three classes:

* clear refusal: one line (exit status 2 for a command, a ValueError or TypeError in Python) that
  names the argument and the value (the case's fragments) and says what was expected;
* right answer: the result equals the reference (the case's own check);
* problem: anything else (a traceback, another exception, a silent answer, a run that goes on,
  a message that does not name what is wrong, a file written through a link).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the library cases beside the commands: one thread each
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the repository: the cases reuse the tests' fixtures (tests.*)
from hostile_audit_cli import CLI_TIMEOUT, CliCase, cli_cases  # noqa: E402 (after the path)
# words of a message that says what was expected (or what to do instead)
EXPECTED = re.compile(r"must|expected|expects|needs?\b|should|at most|over the limit|is not|not a|only|choose|"
                      r"instead|give|refus|lower|remove|neither|but the unit|did you mean|cannot|is a |are not|"
                      r"does not|unknown|no such|lacks|either|required", re.IGNORECASE)


@dataclass
class Outcome:
    surface: str
    case: str
    kind: str  # "refusal", "right" or "problem"
    line: str  # the message's first line (or the answer's check)
    why: str = ""  # a problem's reason


def _first(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _cell(text: str, width: int = 160) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def judge_message(message: str, names: tuple[str, ...]) -> str | None:
    """Why ``message`` is not a clear refusal naming ``names``, or None."""
    lines = [line for line in message.splitlines() if line.strip()]
    if len(lines) != 1:
        return f"{len(lines)} lines, not one"
    if "Traceback" in message:
        return "a traceback"
    missing = [n for n in names if n.lower() not in message.lower()]
    if missing:
        return f"does not name {', '.join(map(repr, missing))}"
    if not EXPECTED.search(message):
        return "does not say what was expected"
    return None


# ---- command-line cases --------------------------------------------------------------------------


def _is_notice(line: str) -> bool:
    return ": note: " in line


def run_cli(case: CliCase, root: Path, index: int) -> Outcome:
    directory = root / f"case{index:03d}"
    directory.mkdir()
    if case.setup is not None:
        case.setup(directory)
    argv = [a.replace("{dir}", str(directory)) for a in case.argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "posenc.cli", *argv], cwd=directory, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the command and anything it started
        out, err = proc.communicate()
        return Outcome(case.surface, case.case, "problem", _first(err) or _first(out),
                       f"runs for ever (still running after {CLI_TIMEOUT} s, no refusal)")
    left = None if case.after is None else case.after(directory)
    if case.right is not None:
        why = f"exit {proc.returncode}" if proc.returncode != 0 else case.right(directory, out, err)
        why = why or left
        return Outcome(case.surface, case.case, "problem" if why else "right", _first(err) or _first(out), why or "")
    message = "\n".join(line for line in err.splitlines() if not _is_notice(line))
    if proc.returncode != 2:
        why = f"exit {proc.returncode}, not 2" + ("" if proc.returncode else " (accepted)")
        return Outcome(case.surface, case.case, "problem", _first(message) or _first(out), why)
    why = judge_message(message, case.names) or left
    return Outcome(case.surface, case.case, "problem" if why else "refusal", _first(message), why or "")


def run_library(case) -> Outcome:
    try:
        result = case.call()
    except (ValueError, TypeError) as exc:
        message = str(exc)
        if case.right is not None:
            return Outcome(case.surface, case.case, "problem", _first(message), f"{type(exc).__name__} where an answer "
                                                                                "was expected")
        why = judge_message(message, case.names)
        return Outcome(case.surface, case.case, "problem" if why else "refusal", f"{type(exc).__name__}: {_first(message)}",
                       why or "")
    except Exception as exc:  # noqa: BLE001 - any other exception is the finding
        return Outcome(case.surface, case.case, "problem", f"{type(exc).__name__}: {_first(str(exc))}",
                       f"{type(exc).__name__}, not a ValueError/TypeError naming the argument")
    if case.right is None:
        return Outcome(case.surface, case.case, "problem", _cell(repr(type(result).__name__)), "accepted without a word")
    try:
        why = case.right(result)
    except Exception as exc:  # noqa: BLE001
        why = f"the check failed: {type(exc).__name__}: {exc}"
    return Outcome(case.surface, case.case, "problem" if why else "right", "equals the reference" if not why else "",
                   why or "")


# ---- report --------------------------------------------------------------------------------------

KIND_TEXT = {"refusal": "clear refusal", "right": "right answer", "problem": "PROBLEM"}


def report(outcomes: list[Outcome]) -> str:
    surfaces = list(dict.fromkeys(o.surface for o in outcomes))
    parts = []
    for surface in surfaces:
        rows = [o for o in outcomes if o.surface == surface]
        parts.append(f"### {surface}\n\n| case | outcome | first line of the message |\n|---|---|---|")
        for o in rows:
            outcome = KIND_TEXT[o.kind] + (f": {o.why}" if o.why else "")
            parts.append(f"| {_cell(o.case, 70)} | {_cell(outcome, 90)} | {_cell(o.line)} |")
        parts.append("")
    parts.append("### Summary\n\n| surface | cases tried | clear refusals | right answers | left (with reason) |\n"
                 "|---|---|---|---|---|")
    for surface in [*surfaces, "all"]:
        rows = [o for o in outcomes if surface in ("all", o.surface)]
        left = [o for o in rows if o.kind == "problem"]
        text = "; ".join(f"{o.case}: {o.why}" for o in left) if surface != "all" else str(len(left))
        parts.append(f"| {surface} | {len(rows)} | {sum(o.kind == 'refusal' for o in rows)} | "
                     f"{sum(o.kind == 'right' for o in rows)} | {_cell(text, 400) if left else 'none'} |")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="surfaces whose name holds this text")
    parser.add_argument("--jobs", type=int, default=2, help="command-line cases run at once")
    parser.add_argument("--json", default=None, help="also write the outcomes as JSON to this file")
    args = parser.parse_args(argv)
    from hostile_audit_library import attention_cases, functional_cases, kv_cases, log_cases, policy_cases

    root = Path(tempfile.mkdtemp(prefix="posenc-audit-"))
    try:
        cli = [c for c in cli_cases(root) if args.only is None or args.only in c.surface]
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = [pool.submit(run_cli, case, root, i) for i, case in enumerate(cli)]
            library = []
            for make in (policy_cases, attention_cases, functional_cases, kv_cases, log_cases, _hf, _smithy):
                library += [c for c in make() if args.only is None or args.only in c.surface]
            outcomes = [run_library(case) for case in library]  # beside the commands
            outcomes = [f.result() for f in futures] + outcomes
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(outcomes))
    if args.json:
        Path(args.json).write_text(json.dumps([o.__dict__ for o in outcomes], indent=1) + "\n")
    return 1 if any(o.kind == "problem" for o in outcomes) else 0


def _hf():
    from hostile_audit_bridges import hf_cases

    return hf_cases()


def _smithy():
    from hostile_audit_bridges import smithy_cases

    return smithy_cases()


if __name__ == "__main__":
    sys.exit(main())
