"""Hugging Face's own model tests, run on posenc: ``attn_implementation="posenc"`` and the identity swap.

transformers' test files are not part of posenc (nor of its wheel or sdist): point ``POSENC_HF_TESTS``
at the ``tests`` directory of a transformers checkout of the installed version, e.g.::

    git clone --depth 1 --branch v5.24.0 https://github.com/huggingface/transformers /tmp/transformers
    POSENC_HF_TESTS=/tmp/transformers/tests python -m pytest tests/peer/test_hf_model_suite.py -q

``POSENC_HF_BASELINE=1`` runs the same tests on the unswapped models (what fails there fails for
reasons of the environment, not of posenc). Without ``POSENC_HF_TESTS`` (or without the files) every test here is skipped. What is run: the test classes of
``models/llama/test_modeling_llama.py`` and ``models/gpt2/test_modeling_gpt2.py`` (with the shared
``test_modeling_common.py``, ``generation/test_utils.py`` and what they import), after making every
Llama and GPT-2 config built during the session record the identity swap
(``config.posenc = {"format": 1, "encoding": "identity", "options": {}}``): with
:func:`posenc.integrations.transformers.register` every model constructed from such a config
swaps its own RoPE / learned table for posenc's and runs attention through ``"posenc"``. Tests that
switch a model to another attention implementation (eager against sdpa, flash, flex) then meet the
swapped model's one-line refusal: those cannot apply to a swapped model.

The directory is loaded as the package ``hf_tests`` (posenc's own ``tests`` package holds the name
``tests``), so the relative imports inside Hugging Face's files resolve to their own copies.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = os.environ.get("POSENC_HF_TESTS")
FILES = ("models/llama/test_modeling_llama.py", "models/gpt2/test_modeling_gpt2.py")
NEEDED = ("test_modeling_common.py", *FILES)
IDENTITY = {"format": 1, "encoding": "identity", "options": {}}

if not ROOT:
    pytest.skip("POSENC_HF_TESTS is not set (see this file's docstring)", allow_module_level=True)
_missing = [f for f in NEEDED if not (Path(ROOT) / f).is_file()]
if _missing:
    pytest.skip(f"POSENC_HF_TESTS={ROOT} lacks {', '.join(_missing)}", allow_module_level=True)
transformers = pytest.importorskip("transformers")

from posenc.integrations import transformers as posenc_hf  # noqa: E402


def _load_package(name: str, path: Path) -> None:
    """Make ``path`` importable as the package ``name`` (its subdirectories as subpackages)."""
    init = path / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init if init.is_file() else None,
                                                  submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if init.is_file():
        spec.loader.exec_module(module)


def _record_identity_swap(config_class) -> None:
    """Every config of ``config_class`` built from now on records the identity swap."""
    original = config_class.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if getattr(self, "posenc", None) is None:
            self.posenc = dict(IDENTITY)

    config_class.__init__ = __init__


posenc_hf.register()
if os.environ.get("POSENC_HF_BASELINE") != "1":  # =1: the same suite on the unswapped models, for comparison
    _record_identity_swap(transformers.LlamaConfig)
    _record_identity_swap(transformers.GPT2Config)
_load_package("hf_tests", Path(ROOT))

_llama = importlib.import_module("hf_tests.models.llama.test_modeling_llama")
_gpt2 = importlib.import_module("hf_tests.models.gpt2.test_modeling_gpt2")

# pytest collects the unittest classes found here; the integration (slow, hub) classes skip themselves.
for _module in (_llama, _gpt2):
    for _name, _value in vars(_module).items():
        if isinstance(_value, type) and _name.endswith("Test") and _value.__module__ == _module.__name__:
            globals()[f"{_module.__name__.rsplit('.', 1)[-1]}__{_name}"] = _value
del _module, _name, _value  # (the last one would be collected a second time)
