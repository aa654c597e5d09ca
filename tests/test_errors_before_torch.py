"""Every misuse the arguments and the registry's catalogue can decide is refused before torch is
imported: each command runs in a fresh interpreter, and the probe reports its exit status, its
one error line and whether ``torch`` was in ``sys.modules`` when it returned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = (
    "import contextlib, io, json, sys\n"
    "from posenc.cli import main\n"
    "err = io.StringIO()\n"
    "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
    "    rc = main(sys.argv[1:])\n"
    "print(json.dumps([rc, 'torch' in sys.modules, err.getvalue()]))\n"
)

MISTAKES = [
    # the three
    (["train", "vision", "--encoding", "lap"], "--encoding: 'lap' is a graph encoding; a ViT takes vision or seq"),
    (["train", "timeseries", "--dataset", "BasicMotion"], "--dataset: unknown dataset 'BasicMotion' (did you mean "
                                                          "'BasicMotions'"),
    (["train", "seq", "--encoding", "rope_yarn", "--encoding-option", "fator=4"],
     "--encoding-option: 'rope_yarn' takes no option 'fator' (did you mean 'factor'?)"),
    # the rest of what the names decide
    (["train", "seq", "--encoding", "alibi", "--encoding-option", "symetric=true"], "(did you mean 'symmetric'?)"),
    (["train", "seq", "--encoding", "none", "--encoding-option", "factor=4"], "--encoding-option needs an encoding"),
    (["train", "seq", "--encoding", "sine_spe"], "is defined for linear attention only"),
    (["train", "seq", "--encoding", "alibi", "--feature-map", "elu"], "linear attention never forms the scores"),
    (["train", "vision", "--encoding", "sincos3d"], "is a 3D (video) encoding"),
    (["train", "vision", "--video", "--encoding", "sincos2d"], "is a 2D (image) encoding"),
    (["train", "vision", "--encoding", "sincos2d", "--encoding-option", "layot=mae"], "(did you mean 'layout'?)"),
    (["train", "vision", "--encoding", "peg", "--task", "were"], "--task: unknown task 'were'"),
    (["train", "graph", "--dataset", "cls", "--encoding", "lap"], "--dataset: 'cls' is not a built-in dataset (did "
                                                                   "you mean 'csl'?)"),
    (["train", "graph", "--dataset", "csl", "--encoding", "lapp"], "(did you mean 'lap'"),
    (["train", "timeseries", "--encoding", "erpe+tape"], "the input encoding comes first, as in tape+erpe; write "
                                                         "tape+erpe"),
    (["train", "timeseries", "--encoding", "tape+erpe", "--encoding-option", "erpe.varaint=vector"],
     "--encoding-option: 'erpe' takes no option 'varaint'"),
    (["train", "timeseries", "--encoding", "tape+erpe", "--encoding-option", "max_len=9"], "name the part"),
    (["demo", "--seq-encodings", "rop"], "--seq-encodings: unknown encoding 'rop' (did you mean 'rope'"),
    (["demo", "--graph-encodings", "rope"], "--graph-encodings: 'rope' is a seq encoding"),
    (["demo", "--ts-dataset", "GunPont"], "(did you mean 'GunPoint'?)"),
    (["bench", "extrapolation", "--encodings", "rope,alibj"], "--encodings: unknown encoding 'alibj' (did you mean"),
    (["bench", "extrapolation", "--task", "revrse"], "(did you mean 'reverse'?)"),
    (["bench", "resolution", "--encodings", "pge"], "(did you mean 'peg'?)"),
    (["bench", "timeseries", "--datasets", "JapaneseVowel"], "(did you mean 'JapaneseVowels'?)"),
    (["bench", "spline", "--models", "spline,alibj"], "(did you mean 'alibi'?)"),
]


def _probe(argv: list[str]) -> tuple[int, bool, str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    rc, torch_loaded, err = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, torch_loaded, err


@pytest.mark.parametrize("argv, needle", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_misuse_is_one_line_before_torch_is_imported(argv, needle):
    if "--dataset" in argv or "--ts-dataset" in argv or "--datasets" in argv:
        pytest.importorskip("sktime")  # the bundled names come from sktime's wheel
    rc, torch_loaded, err = _probe(argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and needle in lines[0], (argv, err)
    assert not torch_loaded, f"posenc {' '.join(argv)} imported torch before refusing"


def test_the_torch_free_names_agree_with_the_library():
    from posenc.cli.models.convtran import bundled_dataset_names
    from posenc.cli.models.vit import DIGIT_TASKS
    from posenc.cli.options import SEQ_TASKS
    from posenc.seq.tasks import TASKS as LIVE_SEQ
    from posenc.timeseries.datasets import bundled_datasets
    from posenc.vision.data import TASKS as LIVE_DIGITS

    assert tuple(SEQ_TASKS) == tuple(LIVE_SEQ) and tuple(DIGIT_TASKS) == tuple(LIVE_DIGITS)
    assert set(bundled_datasets()) <= set(bundled_dataset_names())


def test_the_catalog_options_are_what_build_accepts():
    import posenc
    from posenc.cli.catalog import option_error

    assert option_error("rope_yarn", ["factor", "original_max_len"]) is None
    with pytest.raises(TypeError, match="unknown argument"):
        posenc.build("rope_yarn", fator=4, head_dim=8)
    assert "'fator'" in option_error("rope_yarn", ["fator"])


def test_the_library_refuses_the_other_order_of_a_combination():
    from posenc.timeseries.convtran import build_encodings

    tape, erpe = build_encodings("tape+erpe", dim=16, num_heads=2, max_len=32)
    assert type(tape).__name__ == "TAPE" and type(erpe).__name__ == "ERPE"
    with pytest.raises(ValueError, match="the input encoding comes first, as in 'tape\\+erpe'; write tape\\+erpe"):
        build_encodings("erpe+tape", dim=16, num_heads=2, max_len=32)
