"""The shared attention core: hooks, masks, kernels, blocks, registry and trainer.

``common`` imports no modality; shared primitives (sinusoid tables, rotary application) live here.
"""

from .attention import BACKENDS, MultiheadAttention, attend, choose_backend
from .block import MLP, TransformerBlock, TransformerEncoder
from .encoding import Hook, PositionEncoding
from .kv_cache import KVCache, LayerKVCache
from .masks import AttentionMask
from .pairwise import PairwiseBias
from .registry import EncodingInfo, ModelDims, available, build, register
from .rotary import apply_rotary, rotary_angles
from .sinusoid import sinusoid_frequencies, sinusoid_table

__all__ = [
    "BACKENDS", "MultiheadAttention", "attend", "choose_backend", "MLP", "TransformerBlock",
    "TransformerEncoder", "Hook", "PositionEncoding", "KVCache", "LayerKVCache", "AttentionMask",
    "PairwiseBias", "EncodingInfo", "ModelDims", "available", "build", "register", "apply_rotary",
    "rotary_angles", "sinusoid_frequencies", "sinusoid_table",
]
