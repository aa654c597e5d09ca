"""Sequence encodings (absolute, rotary and its context extensions, relative biases, NoPE, SPE,
the conditional 1D PEG), the reference models (:class:`CausalLM`, :class:`SequenceEncoder`) and
post-hoc context extension of trained RoPE models (:func:`extend_context`)."""

# absolute and input encodings
from .alibi import ALiBi, alibi_slopes
from .learned import LearnedEncoding
from .nope import NoPE
from .sinusoidal import SinusoidalEncoding

# conditional (between blocks)
from .peg1d import PEG1d, peg1d, peg1d_term

# rotary and its context extensions
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
from .context import METHODS, extend_context, make_scaling, rope_from_hf_config, rotary_layers

# relative encodings
from .cape import CAPE, CAPE_BASES
from .cope import CoPE
from .deberta import DeBERTa, deberta_index, log_bucket_position
from .fire import FIRE
from .kerple import KERPLE, KERPLE_VARIANTS, kerple_bias
from .shaw import ShawRelative
from .t5 import T5Bias, t5_bucket
from .transformer_xl import TransformerXLRelative
from .tupe import TUPE

# stochastic positional encodings (linear attention)
from .spe import ConvSPE, SineSPE

# reference models
from .models import CausalLM, SequenceEncoder

__all__ = [
    "ALiBi", "alibi_slopes", "LearnedEncoding", "NoPE", "SinusoidalEncoding",
    "RotaryEncoding", "rope_inv_freq", "LinearRoPE", "NTKRoPE", "DynamicNTKRoPE", "YaRNRoPE", "Llama3RoPE",
    "LongRoPE", "ROPE_SCALINGS", "RopeScaling", "LinearScaling", "NTKScaling", "DynamicNTKScaling",
    "YaRNScaling", "Llama3Scaling", "LongRoPEScaling", "XPos", "xpos_zeta",
    "METHODS", "extend_context", "make_scaling", "rope_from_hf_config", "rotary_layers",
    "CAPE", "CAPE_BASES", "CoPE", "DeBERTa", "deberta_index", "log_bucket_position", "FIRE", "KERPLE",
    "KERPLE_VARIANTS", "kerple_bias", "ShawRelative", "T5Bias", "t5_bucket", "TransformerXLRelative", "TUPE",
    "SineSPE", "ConvSPE", "PEG1d", "peg1d", "peg1d_term",
    "CausalLM", "SequenceEncoder",
]
