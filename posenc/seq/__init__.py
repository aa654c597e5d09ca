"""Sequence encodings: absolute, rotary, relative, NoPE."""

from .alibi import ALiBi, alibi_slopes
from .rope import RotaryEncoding, rope_inv_freq
from .sinusoidal import SinusoidalEncoding

__all__ = ["ALiBi", "alibi_slopes", "RotaryEncoding", "rope_inv_freq", "SinusoidalEncoding"]
