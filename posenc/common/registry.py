"""The encoding registry: every encoding with its modality, hooks and paper.

Modalities register their encodings with :func:`register`. They are imported lazily: the package
root adds a loader (:func:`add_loader`) that imports every modality, and :func:`available`,
:func:`get` and :func:`build` run it once before their first answer, so nothing here names a
modality and ``import posenc`` stays cheap. :func:`build` constructs by name and checks the
arguments against the constructor, so a typo fails loudly instead of disappearing into
``**kwargs``.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

from .checks import check_int

if TYPE_CHECKING:  # imported on first registration: the registry's tables serve the torch-free command line
    from .encoding import PositionEncoding

MODALITIES = ("seq", "vision", "graph", "timeseries")
# Standard size arguments that :func:`build` fills from :class:`ModelDims` when a constructor takes them.
STANDARD_ARGS = ("dim", "num_heads", "head_dim", "max_len")


@dataclass(frozen=True)
class ModelDims:
    """Sizes of the model an encoding is built for."""

    dim: int
    num_heads: int
    max_len: int

    def __post_init__(self) -> None:
        for name in ("dim", "num_heads", "max_len"):
            check_int(f"ModelDims.{name}", getattr(self, name), minimum=1)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


@dataclass(frozen=True)
class EncodingInfo:
    name: str
    modality: str
    hooks: tuple[str, ...]
    paper: str
    summary: str
    cls: type[PositionEncoding]
    causal_only: bool


_REGISTRY: dict[str, EncodingInfo] = {}
_LOADERS: list[Callable[[], None]] = []
_LOAD_STATE = {"loaded": False, "loading": False}


def add_loader(loader: Callable[[], None]) -> None:
    """Run ``loader`` (which imports modules that :func:`register` encodings) before the next
    lookup; the package root adds the one that imports every modality."""
    _LOADERS.append(loader)
    _LOAD_STATE["loaded"] = False


def _ensure_loaded() -> None:
    if _LOAD_STATE["loaded"] or _LOAD_STATE["loading"]:  # loading: a modality asks while importing
        return
    _LOAD_STATE["loading"] = True
    try:
        for loader in list(_LOADERS):
            loader()
        _LOAD_STATE["loaded"] = True
    finally:
        _LOAD_STATE["loading"] = False


E = TypeVar("E", bound="type[PositionEncoding]")


def register(name: str, *, modality: str, paper: str, summary: str) -> Callable[[E], E]:
    """Class decorator adding an encoding to the registry under ``name``."""
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}; got {modality!r}")

    def deco(cls: E) -> E:
        from .encoding import PositionEncoding

        if not (isinstance(cls, type) and issubclass(cls, PositionEncoding)):
            raise TypeError(f"register({name!r}) expects a PositionEncoding subclass, got {cls!r}")
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"encoding name {name!r} is already registered by {_REGISTRY[name].cls.__name__}")
        _REGISTRY[name] = EncodingInfo(
            name=name,
            modality=modality,
            hooks=tuple(sorted(h.value for h in cls.hooks)),
            paper=paper,
            summary=summary,
            cls=cls,
            causal_only=cls.causal_only,
        )
        return cls

    return deco


def available(modality: str | None = None) -> list[EncodingInfo]:
    """Registered encodings, sorted by modality then name; optionally of one modality."""
    if modality is not None and modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES} or None; got {modality!r}")
    _ensure_loaded()
    infos = [i for i in _REGISTRY.values() if modality is None or i.modality == modality]
    return sorted(infos, key=lambda i: (MODALITIES.index(i.modality), i.name))


def get(name: str) -> EncodingInfo:
    if name not in _REGISTRY:
        _ensure_loaded()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3)
        if close:  # the closest names, not all of them
            raise KeyError(f"unknown encoding {name!r} (did you mean {' or '.join(map(repr, close))}?)")
        raise KeyError(f"unknown encoding {name!r}; posenc.available() (or `posenc list`) names all {len(_REGISTRY)}")
    return _REGISTRY[name]


def build(name: str, *, dims: ModelDims | None = None, **options) -> PositionEncoding:
    """Construct the encoding registered as ``name``.

    Args:
        dims: model sizes; the constructor's standard arguments (``dim``, ``num_heads``,
            ``head_dim``, ``max_len``) are taken from it unless given in ``options``.
        options: constructor arguments, checked against its signature.
    """
    info = get(name)
    if dims is not None and not isinstance(dims, ModelDims):
        raise TypeError(f"{name}: dims must be a ModelDims or None; got {dims!r} ({type(dims).__name__})")
    params = inspect.signature(info.cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"{name}: unknown argument(s) {', '.join(unknown)}; {info.cls.__name__} accepts {', '.join(accepted)}")
    if dims is not None:
        for arg in STANDARD_ARGS:
            if arg in params and arg not in options:
                options[arg] = getattr(dims, arg)
    missing = [
        p.name for p in params.values()
        if p.name != "self" and p.default is inspect.Parameter.empty and p.name not in options
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if missing:
        raise TypeError(f"{name}: missing required argument(s) {', '.join(missing)} (or pass dims=ModelDims(...))")
    return info.cls(**options)
