"""The command line answers ``--help``, ``list`` and argument errors without importing torch, and
``posenc list`` reads a snapshot of the registry that matches the live one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: report the exit status and whether torch was imported.
_PROBE = (
    "import contextlib, io, sys\n"
    "from posenc.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
    "    rc = main(sys.argv[1:])\n"
    "print(rc, 'torch' in sys.modules)\n"
)

LIGHT = [
    (["--help"], 0),
    (["--version"], 0),
    (["list"], 0),
    (["list", "--modality", "vision", "--wide"], 0),
    (["lst"], 2),
    (["bench", "--help"], 0),
    (["bench", "atention"], 2),
    (["train", "--help"], 0),
    (["train", "seq", "--help"], 0),
    (["train", "seq", "--steps", "-5"], 2),
    (["train", "seq", "--encoding", "rop"], 2),
    (["train", "sequence"], 2),
    (["train", "vision", "--help"], 0),
    (["train", "graph", "--dim", "zero"], 2),
    (["train", "timeseries", "--help"], 0),
    (["demo", "--help"], 0),
    (["demo", "--steps", "0"], 2),
    (["bench", "extrapolation", "--help"], 0),
    (["bench", "resolution", "--help"], 0),
    (["bench", "spline", "--help"], 0),
    (["bench", "graph-pe", "--help"], 0),
    (["bench", "timeseries", "--help"], 0),
    (["bench", "context-extension", "--help"], 0),
    (["bench", "attention", "--help"], 0),
    (["bench", "attention", "--encodings", "alibj"], 2),
    (["bench", "attention", "--seq-len", "0"], 2),
    (["bench", "attention", "--device", "tpu"], 2),
    (["extend", "--help"], 0),
    (["extend", "/nonexistent-run", "--method", "yran"], 2),
]


def _probe(argv: list[str]) -> tuple[int, bool]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    rc, torch_loaded = done.stdout.split()
    return int(rc), torch_loaded == "True"


def test_help_list_and_argument_errors_do_not_import_torch():
    for argv, expected in LIGHT:
        rc, torch_loaded = _probe(argv)
        assert rc == expected, (argv, rc)
        assert not torch_loaded, f"posenc {' '.join(argv)} imported torch"


def test_import_posenc_does_not_import_torch_and_its_names_still_resolve():
    code = ("import sys, posenc\n"
            "assert 'torch' not in sys.modules and posenc.__version__\n"
            "from posenc import build, attend, linear_attention\n"
            "from posenc.common import linear_attention as la\n"
            "assert callable(la) and la is linear_attention and posenc.MultiheadAttention\n"
            "assert 'torch' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_catalog_matches_the_live_registry():
    from posenc.cli import catalog

    assert catalog.DATA_FILE.read_text() == catalog.render(catalog.live_rows()), (
        "posenc/cli/_catalog_data.py is stale: run python -m posenc.cli.catalog")


def test_the_feature_map_names_match_linear_attention():
    from posenc.cli.options import FEATURE_MAPS
    from posenc.common.linear_attention import FEATURE_MAPS as LIVE

    assert FEATURE_MAPS == LIVE


def test_the_context_methods_match_posenc_seq_context():
    from posenc.cli.options import CONTEXT_METHOD_ALIASES, CONTEXT_METHODS
    from posenc.seq.context import METHOD_ALIASES, METHODS

    assert CONTEXT_METHODS == METHODS and CONTEXT_METHOD_ALIASES == METHOD_ALIASES


@pytest.mark.parametrize("wrong, right", [("rop", "rope"), ("alibj", "alibi"), ("sinusoidl", "sinusoidal")])
def test_suggest_names_the_closest(wrong, right):
    from posenc.cli.catalog import names, suggest

    assert f"{right!r}" in suggest(wrong, names())
    assert suggest("zzzzzz", names()) == ""


@pytest.mark.parametrize("argv, expected", [
    (["lst"], "invalid choice: 'lst' (did you mean 'list'?)"),
    (["bench", "atention"], "(did you mean 'attention'?)"),
    (["train", "seq", "--encoding", "rop"], "posenc train seq: error: --encoding: unknown encoding 'rop' (did you mean 'rope' or 'mrope'?)"),
    (["train", "seq", "--task", "copyy"], "(did you mean 'copy'?)"),
    (["demo", "--parts", "sq"], "posenc demo: error: --parts: unknown part(s) sq (did you mean 'seq'?)"),
    (["bench", "attention", "--encodings", "alibj"], "(did you mean 'alibi'?)"),
])
def test_unknown_names_get_the_closest_one_on_one_error_line(argv, expected, capsys):
    from posenc import cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("posenc")
