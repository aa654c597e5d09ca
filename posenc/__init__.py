"""posenc: positional encodings for transformers on one fast attention core.

``posenc.available()`` lists every encoding; ``posenc.build(name, ...)`` constructs one.

The modalities (``posenc.seq``, ``posenc.vision``, ``posenc.graph``, ``posenc.timeseries``) are
imported on first use -- an attribute access, or the first registry lookup -- so that
``import posenc`` and the command line's ``--help`` do not pay for timm or PyG.
"""

from __future__ import annotations

import importlib

from .common import (
    BACKENDS,
    AttentionMask,
    EluFeatureMap,
    FavorFeatureMap,
    Hook,
    KVCache,
    ModelDims,
    MultiheadAttention,
    PairwiseBias,
    Plan,
    PositionEncoding,
    TorchMultiheadAttention,
    TransformerBlock,
    TransformerEncoder,
    attend,
    available,
    build,
    linear_attention,
    plan,
    register,
)
from ._moved import install as _install_moved_paths
from .common.registry import add_loader

_install_moved_paths()  # old paths (posenc.bench, posenc.report, ...) keep working for one release

__version__ = "0.1.0"

MODALITY_PACKAGES = ("seq", "vision", "graph", "timeseries")


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
    if name in MODALITY_PACKAGES or name == "functional":  # posenc.functional imports seq and vision
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS", "AttentionMask", "EluFeatureMap", "FavorFeatureMap", "Hook", "KVCache", "ModelDims", "MultiheadAttention",
    "PairwiseBias", "Plan", "PositionEncoding", "TorchMultiheadAttention", "TransformerBlock", "TransformerEncoder",
    "attend", "available", "build",
    "linear_attention", "load", "plan", "register",
]
