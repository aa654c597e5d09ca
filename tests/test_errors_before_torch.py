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
    (["train", "seq", "--encoding", "rope", "--device", "cuda:x"], "argument --device: expected auto, cpu, cuda, cuda:N"),
    (["bench", "hf", "--device", "cpu", "--variants", "alibj"], "unknown variant 'alibj'"),
    # the benches whose modules import torch only when they run (generate, hf, models, length-generalization)
    (["bench", "generate", "--encodings", "rop"], "--encodings: unknown encoding 'rop' (did you mean 'rope'"),
    (["bench", "generate", "--encodings", "rope,rope_longrope"], "'rope_longrope' refuses a KV cache"),
    (["bench", "generate", "--encodings", "rope2d_axial"], "'rope2d_axial' is a vision encoding"),
    (["bench", "generate", "--dim", "30", "--heads", "4"], "dim (30) must be divisible by heads (4)"),
    (["bench", "generate", "--out", "README.md/run"], "--out 'README.md/run'"),
    (["bench", "hf", "--encodings", "alibj"], "unrecognized arguments: --encodings alibj"),
    (["bench", "hf", "--variants", "hf,alibj"], "--variants: unknown variant 'alibj' (did you mean 'alibi'?)"),
    (["bench", "hf", "--variants", "sine_spe"], "--variants: 'sine_spe' is defined for linear attention only"),
    (["bench", "hf", "--variants", "peg1d"], "--variants: 'peg1d' sits between blocks"),
    (["bench", "hf", "--variants", "rope2d_axial"], "registered sequence encoding (it is a vision encoding)"),
    (["bench", "hf", "--variants", "hf,hf"], "--variants: a name is repeated"),
    (["bench", "hf", "--dim", "18", "--heads", "4"], "--dim (18) must be divisible by --heads (4)"),
    (["bench", "hf", "--out", "README.md/run"], "--out 'README.md/run'"),
    (["bench", "models", "--lm-encodings", "alibj"], "--lm-encodings: unknown encoding 'alibj' (did you mean 'alibi'?)"),
    (["bench", "models", "--lm-encodings", "rope,sine_spe"], "'sine_spe' runs on linear attention only"),
    (["bench", "models", "--lm-encodings", "rope2d_axial"], "'rope2d_axial' is a vision encoding"),
    (["bench", "models", "--vit-encodings", "sincos3d"], "--vit-encodings: 'sincos3d' is a video encoding"),
    (["bench", "models", "--gps-encodings", "rope"], "--gps-encodings: 'rope' is a seq encoding"),
    (["bench", "models", "--models", "vitt"], "--models: unknown pair 'vitt' (did you mean 'vit'?)"),
    (["bench", "models", "--models", "convtran", "--convtran-repo", "no/such/dir"], "convtran_repo must be a checkout"),
    (["bench", "models", "--out", "README.md/run"], "--out 'README.md/run'"),
    (["bench", "length-generalization", "--encodings", "alibj"], "--encodings: unknown encoding 'alibj' (did you "
                                                                  "mean 'alibi'"),
    (["bench", "length-generalization", "--tasks", "revrse"], "--tasks: unknown task 'revrse' (did you mean "
                                                              "'reverse'?)"),
    (["bench", "length-generalization", "--lm-encodings", "alibj"], "--lm-encodings: unknown encoding 'alibj'"),
    (["bench", "length-generalization", "--tasks", "copy,copy"], "--tasks: a name is repeated"),
    (["bench", "length-generalization", "--tasks", "flipflop", "--train-len", "1"], "--train-len 1: task flipflop "
                                                                                    "trains at sizes from 2"),
    (["bench", "length-generalization", "--dim", "10", "--heads", "3"], "--dim (10) must be divisible by --heads (3)"),
    (["bench", "length-generalization", "--out", "README.md/run"], "--out 'README.md/run'"),
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


def test_every_bench_module_builds_its_parser_without_torch():
    """The command line imports the module of the bench it runs to build its parser: none of them
    imports torch at its top (their torch work sits in sibling modules imported by ``run``)."""
    code = ("import importlib, json, sys\n"
            "from posenc.cli.bench import BENCHMARKS\n"
            "loaded = {}\n"
            "for name, (module, _) in BENCHMARKS.items():\n"
            "    importlib.import_module(module)\n"
            "    loaded[name] = 'torch' in sys.modules\n"
            "print(json.dumps(loaded))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded and not any(loaded.values()), [name for name, torch_in in loaded.items() if torch_in]


def test_the_torch_free_names_agree_with_the_library():
    from posenc.cli.bench.length_settings import LENGTH_TASKS, TASK_SIZES
    from posenc.cli.models.convtran import bundled_dataset_names
    from posenc.cli.models.vit import DIGIT_TASKS
    from posenc.cli.options import SEQ_TASKS
    from posenc.seq.length_tasks import LENGTH_TASKS as LIVE_LENGTH
    from posenc.seq.length_tasks import length_suite
    from posenc.seq.tasks import TASKS as LIVE_SEQ
    from posenc.timeseries.datasets import bundled_datasets
    from posenc.vision.data import TASKS as LIVE_DIGITS

    assert tuple(SEQ_TASKS) == tuple(LIVE_SEQ) and tuple(DIGIT_TASKS) == tuple(LIVE_DIGITS)
    assert set(bundled_datasets()) <= set(bundled_dataset_names())
    # bench length-generalization's tasks and their sizes, as the suites have them
    assert LENGTH_TASKS == LIVE_LENGTH and tuple(TASK_SIZES) == LIVE_LENGTH
    assert {n: (length_suite(n).train_max, length_suite(n).train_min) for n in LIVE_LENGTH} == TASK_SIZES


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
