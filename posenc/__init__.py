"""posenc: positional encodings for transformers on one fast attention core.

``posenc.available()`` lists every encoding; ``posenc.build(name, ...)`` constructs one.

Nothing here imports torch: the public names (``posenc.attend``, ``from posenc import build``, ...)
are read from :mod:`posenc.common` on first use, and the modalities (``posenc.seq``,
``posenc.vision``, ``posenc.graph``, ``posenc.timeseries``) are imported on first use too -- an
attribute access, or the first registry lookup. So ``import posenc`` is cheap, and the command
line answers ``--help``, ``list`` and argument errors before torch is loaded.
"""

from __future__ import annotations

import importlib

from .common.registry import add_loader
from .common.threads import set_threads  # torch-free: the one thread policy (posenc.common.threads)

__version__ = "0.1.0"

MODALITY_PACKAGES = ("seq", "vision", "graph", "timeseries")

# the names re-exported from posenc.common, read on first use
_COMMON_EXPORTS = (
    "BACKENDS", "AttentionMask", "DecodingState", "EluFeatureMap", "FavorFeatureMap", "Hook", "KVCache", "ModelDims",
    "MultiheadAttention", "PairwiseBias", "Plan", "PositionEncoding", "TransformerBlock",
    "TransformerEncoder", "attend", "available", "build", "linear_attention", "plan", "register",
)


def _load_modalities() -> None:
    """Import every modality, which registers its encodings."""
    for name in MODALITY_PACKAGES:
        importlib.import_module(f"{__name__}.{name}")


add_loader(_load_modalities)


def load(path):
    """The reference model saved at ``path``: a ``save_pretrained`` directory, a ``posenc train
    --out`` directory or a ``posenc extend`` output; on the CPU, in eval mode. See
    :mod:`posenc.loading`."""
    from .loading import load as _load

    return _load(path)


def __getattr__(name: str):
    if name in _COMMON_EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.common"), name)
        globals()[name] = value  # later reads skip this hook
        return value
    if name == "TorchMultiheadAttention":
        value = importlib.import_module(f"{__name__}.torch_attention").TorchMultiheadAttention
        globals()[name] = value
        return value
    if name in MODALITY_PACKAGES or name == "functional":  # posenc.functional imports seq and vision
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_COMMON_EXPORTS) | set(MODALITY_PACKAGES) | {"TorchMultiheadAttention"})


__all__ = [
    "BACKENDS", "AttentionMask", "DecodingState", "EluFeatureMap", "FavorFeatureMap", "Hook", "KVCache", "ModelDims",
    "MultiheadAttention",
    "PairwiseBias", "Plan", "PositionEncoding", "TorchMultiheadAttention", "TransformerBlock", "TransformerEncoder",
    "attend", "available", "build",
    "linear_attention", "load", "plan", "register", "set_threads",
]
