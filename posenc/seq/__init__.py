"""Sequence encodings: absolute, rotary, relative, NoPE."""

from .alibi import ALiBi, alibi_slopes
from .sinusoidal import SinusoidalEncoding

# --- rotary, absolute, TUPE, DeBERTa (seq-rotary) ---
from .rope import (
    DynamicNTKRoPE,
    LinearRoPE,
    Llama3RoPE,
    LongRoPE,
    NTKRoPE,
    RotaryEncoding,
    YaRNRoPE,
    rope_inv_freq,
)
from .rope_scaling import (
    ROPE_SCALINGS,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    NTKScaling,
    RopeScaling,
    YaRNScaling,
)
from .xpos import XPos, xpos_zeta
from .learned import LearnedEncoding
from .nope import NoPE
from .tupe import TUPE
from .deberta import DeBERTa, deberta_index, log_bucket_position

# --- end seq-rotary ---

# --- relative biases: T5, Shaw, Transformer-XL, KERPLE, FIRE, CAPE, CoPE (seq-bias) ---
from .cape import CAPE, CAPE_BASES
from .cope import CoPE
from .fire import FIRE
from .kerple import KERPLE, KERPLE_VARIANTS, kerple_bias
from .shaw import ShawRelative
from .t5 import T5Bias, t5_bucket
from .transformer_xl import TransformerXLRelative
from .spe import ConvSPE, SineSPE
from .context import METHODS, extend_context, make_scaling, rope_from_hf_config, rotary_layers

# --- end seq-bias ---

__all__ = [
    "ALiBi", "alibi_slopes", "SinusoidalEncoding",
    # seq-rotary
    "RotaryEncoding", "rope_inv_freq", "LinearRoPE", "NTKRoPE", "DynamicNTKRoPE", "YaRNRoPE", "Llama3RoPE",
    "LongRoPE", "ROPE_SCALINGS", "RopeScaling", "LinearScaling", "NTKScaling", "DynamicNTKScaling",
    "YaRNScaling", "Llama3Scaling", "LongRoPEScaling", "XPos", "xpos_zeta",
    "LearnedEncoding", "NoPE", "TUPE", "DeBERTa", "deberta_index", "log_bucket_position",
    # end seq-rotary
    # seq-bias
    "T5Bias", "t5_bucket", "ShawRelative", "TransformerXLRelative", "KERPLE", "KERPLE_VARIANTS", "kerple_bias",
    "FIRE", "CAPE", "CAPE_BASES", "CoPE", "SineSPE", "ConvSPE",
    "METHODS", "extend_context", "make_scaling", "rope_from_hf_config", "rotary_layers",
    # end seq-bias
]
