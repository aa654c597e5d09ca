"""posenc: positional encodings for transformers on one fast attention core.

``posenc.available()`` lists every encoding; ``posenc.build(name, ...)`` constructs one.
"""

from . import graph, seq, timeseries, vision  # noqa: F401  (importing registers the encodings)
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
    TransformerBlock,
    TransformerEncoder,
    attend,
    available,
    linear_attention,
    build,
    plan,
    register,
)

__version__ = "0.1.0"

__all__ = [
    "BACKENDS", "AttentionMask", "EluFeatureMap", "FavorFeatureMap", "Hook", "KVCache", "ModelDims", "MultiheadAttention", "PairwiseBias", "Plan",
    "PositionEncoding", "TransformerBlock", "TransformerEncoder", "attend", "available", "build", "linear_attention", "plan",
    "register",
]
