"""Old import paths of modules that moved, kept working for one release with a DeprecationWarning.

The command line's modules now live in :mod:`posenc.cli` (``posenc.bench`` is ``posenc.cli.bench``,
``posenc.train`` is ``posenc.cli.train``, ...) and the results writers in :mod:`posenc.common.report`.
The module ``posenc.common.plan`` is now ``posenc.common.planning`` (the function
``posenc.common.plan`` shadowed it); its old path is a forwarding module in ``sys.modules`` that
warns on each name read, ``make_plan`` keeping its old keyword form.

A finder at the front of ``sys.meta_path`` (before the path finder, which would otherwise load a
second copy of a submodule under its old name) answers only for the old names: it imports the module at its
new path and returns that same module object, so ``posenc.bench.attention is
posenc.cli.bench.attention``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

# old package or module -> new one; submodules follow their package
MOVED: dict[str, str] = {
    "posenc.bench": "posenc.cli.bench",
    "posenc.train": "posenc.cli.train",
    "posenc.demo_parts": "posenc.cli.demo",
    "posenc.demo": "posenc.cli.demo",
    "posenc.argtypes": "posenc.cli.argtypes",
    "posenc.options": "posenc.cli.options",
    "posenc.report": "posenc.common.report",
}


def _old_make_plan(needs=None, **inputs):
    """``posenc.common.plan.make_plan``'s old keyword form: ``decide(PlanInputs(needs, **inputs))``."""
    from .common.encoding import NO_NEEDS
    from .common.planning import PlanInputs, decide

    return decide(PlanInputs(NO_NEEDS if needs is None else needs, **inputs))


class _ForwardingModule(ModuleType):
    """An old module path whose names now live elsewhere: reading one warns and forwards."""

    def __init__(self, name: str, target: str, overrides: dict) -> None:
        super().__init__(name, f"Deprecated: use {target}.")
        self._target, self._overrides = target, overrides

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        warnings.warn(f"{self.__name__} has moved to {self._target}; the old path will be removed in the next release",
                      DeprecationWarning, stacklevel=2)
        if attr in self._overrides:
            return self._overrides[attr]
        return getattr(importlib.import_module(self._target), attr)


def moved_to(name: str) -> str | None:
    """The new path of the module the old ``name`` refers to, or None when ``name`` did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:  # the module ran at its new path
        pass


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names only; every other import passes it by."""

    def find_spec(self, fullname: str, path=None, target=None):
        new = moved_to(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} has moved to {new}; the old path will be removed in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
    sys.modules.setdefault("posenc.common.plan", _ForwardingModule(
        "posenc.common.plan", "posenc.common.planning", {"make_plan": _old_make_plan}))
