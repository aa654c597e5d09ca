"""Saving and reloading a model by its constructor arguments: ``save_pretrained`` / ``from_pretrained``.

A model class that inherits :class:`PretrainedMixin` records the arguments it was constructed
with (:attr:`PretrainedMixin.model_config`, plain values only). ``model.save_pretrained(dir)``
writes two files:

``config.json``  ``{"format": 1, "model_class": "CausalLM", "config": {constructor arguments},
                 "state": {...}}``: what to build (``state`` holds what changed after construction,
                 as a class declares it: a RoPE model's context extension);
``model.pt``     the ``state_dict``, by ``torch.save`` to a temporary file and an atomic rename
                 (safetensors is not a dependency), read back with ``weights_only=True``.

``Class.from_pretrained(dir)`` builds the model from the config, loads the weights and returns it
in eval mode; :func:`posenc.load` does the same for any reference model, and also reads the run
directories of ``posenc train``. Every failure is one line: a missing file
(``FileNotFoundError``), a config key the constructor does not take, weights of another shape, a
directory written for another class (``ValueError``).

Modality-free: the classes live in their modalities; this module only reads and writes.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from pathlib import Path
from typing import Any, Mapping, TypeVar

import torch
from torch import nn

from .json_input import read_json
from .report import write_atomic
from .checkpoint import check_plain, save_atomic, state_dict_problems

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"
PRETRAINED_FORMAT = 1

M = TypeVar("M", bound="PretrainedMixin")


def _jsonable(value: Any) -> Any:
    """Tuples as lists (JSON has no tuples; the constructors take either)."""
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def write_json_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``obj`` as indented JSON at ``path``, written atomically (:func:`posenc.training.report.write_atomic`)."""
    text = json.dumps(obj, indent=2) + "\n"
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def read_pretrained_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The checked contents of ``directory/config.json``: a dict with ``model_class`` (str),
    ``config`` (dict) and ``state`` (dict)."""
    path = Path(directory) / CONFIG_FILE
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{os.fspath(directory)!r} is not a directory (save_pretrained writes one)")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {os.fspath(directory)!r} was not written by save_pretrained")
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("model_class"), str) or not isinstance(data.get("config"), dict):
        raise ValueError(f"{path} must hold a JSON object with 'model_class' (a name) and 'config' (an object)")
    if data.get("format") != PRETRAINED_FORMAT:
        raise ValueError(f"{path}: expected format {PRETRAINED_FORMAT}, found {data.get('format')!r}")
    state = data.get("state", {})
    if not isinstance(state, dict):
        raise ValueError(f"{path}: 'state' must be a JSON object, found {type(state).__name__}")
    return {"model_class": data["model_class"], "config": data["config"], "state": state}


def build_from_config(cls: type[M], config: Mapping[str, Any], where: str) -> M:
    """``cls(**config)``, with a config key the constructor does not take (or a missing required
    one) as one ValueError naming ``where``."""
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    unknown = sorted(set(config) - set(accepted))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for {cls.__name__}, which takes "
                         f"{', '.join(accepted)}")
    missing = [n for n, p in params.items() if n != "self" and p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in config]
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(map(repr, missing))} that {cls.__name__} requires")
    try:
        return cls(**config)
    except (TypeError, ValueError) as exc:  # the constructor's checks name the key; say which file it is in
        raise ValueError(f"{where}: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type when the message is empty (torch
    raises some with none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def load_weights(model: nn.Module, path: str | os.PathLike, where: str) -> None:
    """Load the state dict at ``path`` (``weights_only``) into ``model``, refusing one that does not
    match it with one ValueError listing the differences."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {where} has a config but no weights")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes): not a weights file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- any unreadable file is the same one-line error
        raise ValueError(f"{path} is not a readable weights file: {type(exc).__name__}: {first_line(exc)}") from None
    load_state_checked(model, state, str(path))


def load_state_checked(model: nn.Module, state: Any, where: str) -> None:
    """``model.load_state_dict(state)`` with a mismatch as one ValueError listing the differences."""
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise ValueError(f"{where} does not hold a state dict (a mapping of names to tensors)")
    problems = state_dict_problems(model.state_dict(), state, where)
    if problems:
        raise ValueError(f"{where} does not match the {type(model).__name__} of its config: " + " | ".join(problems))
    model.load_state_dict(state)


class PretrainedMixin:
    """``save_pretrained`` / ``from_pretrained`` for a model built from plain constructor arguments.

    A subclass's constructor arguments are recorded on construction (:attr:`model_config`). A class
    whose models change after construction in ways the arguments do not tell (a RoPE model switched
    to a context extension) overrides :meth:`pretrained_state` and :meth:`load_pretrained_state`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        original = cls.__init__
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self, *args: Any, **kw: Any) -> None:
            original(self, *args, **kw)
            # Only the constructor of the instance's own class records (a subclass's constructor
            # calls this one with arguments of its own choosing).
            if type(self).__init__ is __init__:
                bound = signature.bind(self, *args, **kw)
                bound.apply_defaults()
                arguments = dict(bound.arguments)
                arguments.pop("self")
                object.__setattr__(self, "_pretrained_arguments", arguments)

        cls.__init__ = __init__  # type: ignore[method-assign]

    @property
    def model_config(self) -> dict[str, Any]:
        """The constructor arguments of this model (defaults filled in), as given."""
        return dict(getattr(self, "_pretrained_arguments", {}))

    def pretrained_state(self) -> dict[str, Any]:
        """Plain values describing what changed after construction (default: nothing)."""
        return {}

    def load_pretrained_state(self, state: Mapping[str, Any]) -> None:
        """Apply :meth:`pretrained_state`'s values to a freshly built model."""
        if state:
            raise ValueError(f"{type(self).__name__} takes no saved state; found keys {sorted(state)}")

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.pt`` into ``directory`` (created if needed); returns it.

        The config must be plain values (an encoding given by name, not as an instance): anything
        else is a ValueError naming the argument, before anything is written."""
        config = _jsonable(self.model_config)
        state = _jsonable(self.pretrained_state())
        name = type(self).__name__
        try:
            check_plain(config, f"{name}'s constructor arguments")
            check_plain(state, f"{name}'s saved state")
        except TypeError as exc:
            raise ValueError(f"save_pretrained: {exc}; build the model from plain arguments (e.g. an encoding "
                             "by its registered name) to save it") from None
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        assert isinstance(self, nn.Module)
        save_atomic(self.state_dict(), directory / WEIGHTS_FILE)
        # The config last: its presence marks a complete directory.
        write_json_atomic({"format": PRETRAINED_FORMAT, "model_class": name, "config": config, "state": state},
                          directory / CONFIG_FILE)
        return directory

    @classmethod
    def from_pretrained(cls: type[M], directory: str | os.PathLike) -> M:
        """The model saved in ``directory`` by :meth:`save_pretrained`, weights loaded, in eval mode."""
        data = read_pretrained_config(directory)
        if data["model_class"] != cls.__name__:
            raise ValueError(f"{os.fspath(directory)!r} holds a {data['model_class']}, not a {cls.__name__}; "
                             "posenc.load(directory) builds whatever it holds")
        where = os.fspath(Path(directory) / CONFIG_FILE)
        model = build_from_config(cls, data["config"], where)
        model.load_pretrained_state(data["state"])
        load_weights(model, Path(directory) / WEIGHTS_FILE, os.fspath(directory))
        return model.eval()


__all__ = [
    "CONFIG_FILE", "WEIGHTS_FILE", "PRETRAINED_FORMAT", "PretrainedMixin", "read_pretrained_config",
    "build_from_config", "load_weights", "load_state_checked", "write_json_atomic",
]
