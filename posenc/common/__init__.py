"""The shared attention core: hooks, masks, kernels, blocks and the registry.

``common`` imports no modality and none of :mod:`posenc.primitives` (the parts encodings of
several modalities share: rotary application, sinusoid tables, SPE).
The names below are imported on first use (module ``__getattr__``), so that the torch-free parts
(:mod:`.checks`, :mod:`.registry`'s tables) can be imported without torch: the command line
(with :mod:`posenc.cli.catalog`) parses its arguments before anything imports torch.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

# public name -> the submodule defining it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("PreparedCall", "attend", "attend_with_weights", "make_plan", "plan",
                     "prepare", "run"), "attention"),
    **dict.fromkeys(("MLP", "TransformerBlock", "TransformerEncoder"), "block"),
    **dict.fromkeys(("AttentionNeeds", "Hook", "PositionEncoding"), "encoding"),
    **dict.fromkeys(("KVCache", "LayerKVCache", "TokenRows"), "kv_cache"),
    **dict.fromkeys(("DecodingState", "LayerDecodingState"), "decoding_state"),
    **dict.fromkeys(("EluFeatureMap", "FavorFeatureMap", "FeatureMap", "linear_attention"), "linear_attention"),
    "AttentionMask": "masks",
    "MultiheadAttention": "multihead",
    "PairwiseBias": "pairwise",
    "AttentionCall": "call",
    **dict.fromkeys(("BACKENDS", "Plan", "PlanInputs", "decide"), "planning"),
    **dict.fromkeys(("EncodingInfo", "ModelDims", "available", "build", "register"), "registry"),
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later reads skip this hook
    return value


class _Package(ModuleType):
    """Keeps a public function over the submodule of the same name (``linear_attention``): the
    import system binds a submodule onto its package when it loads, which the eager imports of
    old overwrote with the function."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "BACKENDS", "MultiheadAttention", "attend", "attend_with_weights", "plan", "Plan",
    "AttentionCall", "PreparedCall", "PlanInputs", "prepare", "run", "make_plan", "decide",
    "AttentionNeeds", "MLP", "TransformerBlock",
    "TransformerEncoder", "Hook", "PositionEncoding", "KVCache", "LayerKVCache", "AttentionMask",
    "DecodingState", "LayerDecodingState",
    "PairwiseBias", "EncodingInfo", "ModelDims", "available", "build", "register", "FeatureMap", "EluFeatureMap",
    "FavorFeatureMap",
    "linear_attention",
]
