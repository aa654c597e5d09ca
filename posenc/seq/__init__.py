"""Sequence encodings (absolute, rotary and its context extensions, relative biases, NoPE, SPE,
the conditional 1D PEG), the reference models (:class:`CausalLM`, :class:`SequenceEncoder`),
post-hoc context extension of trained RoPE models (:func:`extend_context`), and the Spline-based
Transformer (:class:`SplineTransformer`, an autoencoder without positional encoding) with its
baseline (:class:`PositionalAutoencoder`) and synthetic curves (:class:`SmoothCurves`)."""

# absolute and input encodings
from .alibi import ALiBi, alibi_bias, alibi_penalty, alibi_slopes

# relative encodings
from .cape import CAPE, CAPE_BASES
from .context import METHODS, extend_context, make_scaling, rope_from_hf_config, rotary_layers
from .cope import CoPE

# spline-based transformer (no positional encoding) and its positional baseline
from .curves import SmoothCurves
from .deberta import DeBERTa, deberta_index, log_bucket_position
from .fire import FIRE
from .fox import ForgettingGate, fox_bias, fox_log_gates
from .hf_layers import hf_layer_encodings, hf_layer_kinds
from .kerple import KERPLE, KERPLE_VARIANTS, kerple_bias
from .latent_autoencoder import PositionalAutoencoder

# schedules of encodings across a model's layers (iRoPE, Gemma's local and global layers)
from .layer_schedule import irope_schedule, local_global_schedule
from .learned import LearnedEncoding

# reference models
from .models import CausalLM, SequenceEncoder

# multimodal RoPE and its position ids
from .mrope import MRoPE, apply_mrope
from .mrope_positions import MRopePositions, mrope_next_positions, mrope_position_ids
from .nope import NoPE
from .nope_temperature import NoPETemperature, attention_temperature

# conditional (between blocks)
from .peg1d import PEG1d, peg1d, peg1d_term

# rotary and its context extensions
from .rope import (
    RotaryEncoding,
    apply_rope,
    rope_cos_sin,
    rope_frequencies,
    rope_inv_freq,
)
from .rope_scaled import (
    DynamicNTKRoPE,
    LinearRoPE,
    Llama3RoPE,
    LongRoPE,
    NTKRoPE,
    ProportionalRoPE,
    YaRNRoPE,
)
from .rope_scaling import (
    ROPE_SCALING_ENTRIES,
    ROPE_SCALINGS,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    NTKScaling,
    ProportionalScaling,
    RopeScaling,
    YaRNScaling,
    rope_scaling_config,
    rope_scaling_entries,
    rope_scaling_entry,
    rope_scaling_from_dict,
)
from .shaw import ShawRelative
from .sinusoidal import SinusoidalEncoding

# stochastic positional encodings (linear attention)
from .spe import ConvSPE, SineSPE
from .spline import SplineTransformer, bspline_basis, evaluate_spline
from .t5 import T5Bias, t5_bias, t5_bucket, t5_relative_buckets
from .transformer_xl import TransformerXLRelative
from .tupe import TUPE
from .xpos import XPos, xpos_zeta

__all__ = [
    "ALiBi", "alibi_slopes", "alibi_bias", "alibi_penalty", "LearnedEncoding", "NoPE", "SinusoidalEncoding",
    "RotaryEncoding", "rope_inv_freq", "rope_frequencies", "rope_cos_sin", "apply_rope", "LinearRoPE", "NTKRoPE",
    "DynamicNTKRoPE", "YaRNRoPE", "Llama3RoPE", "LongRoPE", "ProportionalRoPE", "ROPE_SCALING_ENTRIES",
    "ROPE_SCALINGS", "RopeScaling", "LinearScaling",
    "NTKScaling", "DynamicNTKScaling", "YaRNScaling", "Llama3Scaling", "LongRoPEScaling", "ProportionalScaling",
    "rope_scaling_config", "rope_scaling_entries", "rope_scaling_entry", "rope_scaling_from_dict", "XPos", "xpos_zeta",
    "METHODS", "extend_context", "make_scaling", "rope_from_hf_config", "rotary_layers",
    "CAPE", "CAPE_BASES", "CoPE", "DeBERTa", "deberta_index", "log_bucket_position", "FIRE", "ForgettingGate",
    "fox_bias", "fox_log_gates", "KERPLE",
    "KERPLE_VARIANTS", "kerple_bias", "ShawRelative", "T5Bias", "t5_bucket", "t5_relative_buckets", "t5_bias",
    "TransformerXLRelative", "TUPE",
    "SineSPE", "ConvSPE", "PEG1d", "peg1d", "peg1d_term",
    "CausalLM", "SequenceEncoder", "irope_schedule", "local_global_schedule",
    "MRoPE", "apply_mrope", "MRopePositions", "mrope_position_ids", "mrope_next_positions",
    "NoPETemperature", "attention_temperature", "hf_layer_encodings", "hf_layer_kinds",
    "SplineTransformer", "evaluate_spline", "bspline_basis", "PositionalAutoencoder", "SmoothCurves",
]
