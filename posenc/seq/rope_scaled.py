"""The registered RoPE context extensions: one :class:`~.rope.RotaryEncoding` subclass per scaling.

``rope_linear`` (:class:`LinearRoPE`), ``rope_ntk`` (:class:`NTKRoPE`), ``rope_dynamic_ntk``
(:class:`DynamicNTKRoPE`), ``rope_yarn`` (:class:`YaRNRoPE`), ``rope_llama3``
(:class:`Llama3RoPE`) and ``rope_longrope`` (:class:`LongRoPE`): each builds its typed config
from :mod:`.rope_scaling` (where the formulas are) and is a plain :class:`~.rope.RotaryEncoding`
holding it, so ``posenc.build("rope_yarn", dims=..., factor=4.0)`` and
``RotaryEncoding(head_dim, scaling=YaRNScaling(...))`` compute the same thing.

The scalings that read the training length take ``max_len`` and ``original_max_len`` (``L0``):
``L0`` defaults to ``max_len // factor``, so that a model built for ``max_len`` (what
``posenc.build`` passes from ``ModelDims``) is the extended one.

Shapes, as for :class:`~.rope.RotaryEncoding`: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``,
positions ``[B or 1, T]``; hook q/k transform; kernel SDPA.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

from ..common.checks import check_int, check_number
from ..common.registry import register
from ..common.rotary import Pairing
from .rope import RotaryEncoding, check_rotary_dims
from .rope_scaling import (
    ROPE_SCALING_ENTRIES,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    LongRoPESelect,
    NTKScaling,
    YaRNScaling,
    longrope_default_factors,
)


def _original_max_len(max_len: int | None, original_max_len: int | None, factor: float, name: str) -> int:
    """``original_max_len``, or ``max_len // factor`` when it is not given (``factor`` checked first,
    before it divides anything)."""
    check_number("factor", factor, minimum=1.0)
    if max_len is not None:
        check_int("max_len", max_len, minimum=1)
    if original_max_len is not None:
        return check_int("original_max_len", original_max_len, minimum=1)
    if max_len is None:
        raise ValueError(f"{name}: give original_max_len, or max_len (then original_max_len = max_len // factor)")
    out = int(max_len // factor)
    if out < 1:
        raise ValueError(f"{name}: max_len // factor = {max_len} // {factor} is 0; give original_max_len")
    return out


def _registered(scaling: str):
    """``register`` with the name, paper and summary of ``scaling``'s row of the table."""
    entry = ROPE_SCALING_ENTRIES[scaling]
    return register(entry.encoding, modality="seq", paper=entry.paper, summary=entry.summary)


@_registered("linear")
class LinearRoPE(RotaryEncoding):
    """RoPE with positions interpolated, ``theta / factor`` (Chen et al. 2023,
    https://arxiv.org/abs/2306.15595; :func:`~.rope_scaling.linear_scaling`).

    Args:
        head_dim: per-head width ``D``.
        factor: the context scale ``s >= 1``.
        base: as for :class:`~.rope.RotaryEncoding`.
        rotary_dim: see ``base``.
        pairing: see ``base``.
    """

    scaling_name: ClassVar[str] = "linear"

    def __init__(
        self,
        head_dim: int,
        factor: float = 4.0,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=LinearScaling(factor))


@_registered("ntk")
class NTKRoPE(RotaryEncoding):
    """RoPE with the NTK-aware base, ``base * factor^(r/(r-2))`` (bloc97 2023,
    https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/; :func:`~.rope_scaling.ntk_scaling`).

    Args:
        head_dim: per-head width ``D``.
        factor: the context scale ``s >= 1``.
        base: as for :class:`~.rope.RotaryEncoding` (the rotary width must be >= 4).
        rotary_dim: see ``base``.
        pairing: see ``base``.
    """

    scaling_name: ClassVar[str] = "ntk"

    def __init__(
        self,
        head_dim: int,
        factor: float = 4.0,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=NTKScaling(factor))


@_registered("dynamic_ntk")
class DynamicNTKRoPE(RotaryEncoding):
    """RoPE with an NTK-aware base grown from the current length ``T`` beyond ``L0``:
    ``base * (s*T/L0 - (s-1))^(r/(r-2))`` (emozilla 2023,
    https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/; :func:`~.rope_scaling.dynamic_ntk_scaling`).

    ``T = max(q_pos, kv_pos) + 1`` per batch row, read from each call's positions; the encoding
    refuses a KV cache (see :mod:`.rope`).

    Args:
        head_dim: per-head width ``D``.
        max_len: the extended length; ``original_max_len`` defaults to ``max_len // factor``.
        factor: the context scale ``s >= 1``.
        original_max_len: ``L0``, the length the model was trained at.
        base: as for :class:`~.rope.RotaryEncoding`.
        rotary_dim: see ``base``.
        pairing: see ``base``.
    """

    scaling_name: ClassVar[str] = "dynamic_ntk"

    def __init__(
        self,
        head_dim: int,
        max_len: int | None = None,
        factor: float = 4.0,
        original_max_len: int | None = None,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_dynamic_ntk")
        check_rotary_dims(head_dim, rotary_dim)
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=DynamicNTKScaling(l0, factor))


@_registered("yarn")
class YaRNRoPE(RotaryEncoding):
    """RoPE with YaRN's ramp between interpolated (``theta / s``) and original frequencies, and
    its attention factor on cos and sin (Peng et al. 2023, https://arxiv.org/abs/2309.00071;
    :func:`~.rope_scaling.yarn_scaling`).

    Args:
        head_dim: per-head width ``D``.
        max_len: the extended length; ``original_max_len`` defaults to ``max_len // factor``.
        factor: the context scale ``s >= 1``.
        original_max_len: ``L0``, the length the model was trained at.
        beta_fast: rotations in ``L0`` that bound the ramp (32 and 1).
        beta_slow: see ``beta_fast``.
        attention_factor: an explicit factor (default ``0.1 ln s + 1``).
        mscale: DeepSeek's knobs, ``m(s, mscale) / m(s, mscale_all_dim)`` when both are given.
        mscale_all_dim: see ``mscale``.
        truncate: round the ramp's ends to whole pairs (Hugging Face's ``truncate``).
        base: as for :class:`~.rope.RotaryEncoding`.
        rotary_dim: see ``base``.
        pairing: see ``base``.
    """

    scaling_name: ClassVar[str] = "yarn"

    def __init__(
        self,
        head_dim: int,
        max_len: int | None = None,
        factor: float = 4.0,
        original_max_len: int | None = None,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        attention_factor: float | None = None,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
        truncate: bool = True,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_yarn")
        check_rotary_dims(head_dim, rotary_dim)
        scaling = YaRNScaling(l0, factor, beta_fast=beta_fast, beta_slow=beta_slow, attention_factor=attention_factor,
                              mscale=mscale, mscale_all_dim=mscale_all_dim, truncate=truncate)
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=scaling)


@_registered("llama3")
class Llama3RoPE(RotaryEncoding):
    """RoPE with Llama 3.1's wavelength-banded scaling: wavelengths below ``L0 / high_freq_factor``
    kept, above ``L0 / low_freq_factor`` divided by ``s``, blended between (Llama Team 2024,
    https://arxiv.org/abs/2407.21783; :func:`~.rope_scaling.llama3_scaling`).

    Args:
        head_dim: per-head width ``D``.
        max_len: the extended length; ``original_max_len`` defaults to ``max_len // factor``.
        factor: the context scale ``s >= 1`` (8 for Llama 3.1).
        original_max_len: ``L0`` (8192 for Llama 3.1).
        low_freq_factor: the band edges (1 and 4).
        high_freq_factor: see ``low_freq_factor``.
        base: as for :class:`~.rope.RotaryEncoding`.
        rotary_dim: see ``base``.
        pairing: see ``base``.
    """

    scaling_name: ClassVar[str] = "llama3"

    def __init__(
        self,
        head_dim: int,
        max_len: int | None = None,
        factor: float = 8.0,
        original_max_len: int | None = None,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_llama3")
        check_rotary_dims(head_dim, rotary_dim)
        scaling = Llama3Scaling(factor, low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                                original_max_len=l0)
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=scaling)


@_registered("longrope")
class LongRoPE(RotaryEncoding):
    """RoPE with LongRoPE's per-pair rescale factors, ``theta_k / f_k``: the short list while the
    current length is at most ``L0``, the long list beyond (Ding et al. 2024,
    https://arxiv.org/abs/2402.13753; :func:`~.rope_scaling.longrope_scaling`).

    With ``select="by_length"`` the list is chosen per batch row from each call's positions and
    the encoding refuses a KV cache (see :mod:`.rope`).

    Args:
        head_dim: per-head width ``D``.
        max_len: the extended length; ``original_max_len`` defaults to ``max_len // factor``.
        factor: the context scale ``s >= 1`` (read by the default attention factor and the
            default long list).
        original_max_len: ``L0``.
        short_factor: ``r/2`` positive factors each; default all ones and the
            NTK-aware factors ``s^(2k/(r-2))`` (:func:`~.rope_scaling.ntk_long_factors`).
        long_factor: see ``short_factor``.
        attention_factor: an explicit factor (default ``sqrt(1 + ln s / ln L0)``).
        select: "by_length", "short" or "long".
        base: as for :class:`~.rope.RotaryEncoding`.
        rotary_dim: see ``base``.
        pairing: see ``base``.
    """

    scaling_name: ClassVar[str] = "longrope"

    def __init__(
        self,
        head_dim: int,
        max_len: int | None = None,
        factor: float = 4.0,
        original_max_len: int | None = None,
        short_factor: Sequence[float] | None = None,
        long_factor: Sequence[float] | None = None,
        attention_factor: float | None = None,
        select: LongRoPESelect = "by_length",
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_longrope")
        r = check_rotary_dims(head_dim, rotary_dim)  # before the width-dependent defaults read it
        short_factor, long_factor = longrope_default_factors(r, factor, short_factor, long_factor)
        scaling = LongRoPEScaling(short_factor, long_factor, l0, factor, attention_factor=attention_factor,
                                  select=select)
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=scaling)


#: Each scaling's registered encoding class, by scaling name.
SCALED_ROPE_CLASSES: dict[str, type[RotaryEncoding]] = {
    "linear": LinearRoPE,
    "ntk": NTKRoPE,
    "dynamic_ntk": DynamicNTKRoPE,
    "yarn": YaRNRoPE,
    "llama3": Llama3RoPE,
    "longrope": LongRoPE,
}

__all__ = ["LinearRoPE", "NTKRoPE", "DynamicNTKRoPE", "YaRNRoPE", "Llama3RoPE", "LongRoPE", "SCALED_ROPE_CLASSES"]
