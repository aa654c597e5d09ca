"""The shared attention core: hooks, masks, kernels, blocks, registry and trainer.

``common`` imports no modality; shared primitives (sinusoid tables, rotary application) live here.
"""

from .attention import MultiheadAttention, PreparedCall, attend, attend_with_weights, make_plan, plan, prepare, run
from .block import MLP, TransformerBlock, TransformerEncoder
from .encoding import AttentionNeeds, Hook, PositionEncoding
from .kv_cache import KVCache, LayerKVCache
from .linear_attention import EluFeatureMap, FavorFeatureMap, FeatureMap, linear_attention
from .masks import AttentionMask
from .pairwise import PairwiseBias
from .call import AttentionCall
from .planning import BACKENDS, Plan, PlanInputs, decide
from .registry import EncodingInfo, ModelDims, available, build, register
from .rotary import apply_rotary, rotary_angles
from .sinusoid import sinusoid_frequencies, sinusoid_table
from .torch_attention import TorchMultiheadAttention

__all__ = [
    "BACKENDS", "MultiheadAttention", "TorchMultiheadAttention", "attend", "attend_with_weights", "plan", "Plan",
    "AttentionCall", "PreparedCall", "PlanInputs", "prepare", "run", "make_plan", "decide",
    "AttentionNeeds", "MLP", "TransformerBlock",
    "TransformerEncoder", "Hook", "PositionEncoding", "KVCache", "LayerKVCache", "AttentionMask",
    "PairwiseBias", "EncodingInfo", "ModelDims", "available", "build", "register", "apply_rotary",
    "rotary_angles", "sinusoid_frequencies", "sinusoid_table", "FeatureMap", "EluFeatureMap", "FavorFeatureMap",
    "linear_attention",
]
