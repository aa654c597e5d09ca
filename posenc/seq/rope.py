"""Rotary position embedding, RoPE (Su et al. 2021, https://arxiv.org/abs/2104.09864), and its
context extensions (linear, NTK-aware, dynamic NTK, YaRN, Llama 3, LongRoPE).

``theta_k = base^(-2k/r)`` for ``k < r/2``; each pair of query and key features is rotated by
``p * theta_k``, so ``q_i . k_j`` depends on positions only through ``i - j``. A context
extension changes the frequencies (see :mod:`.rope_scaling`) and may multiply ``cos`` and ``sin``
by an attention factor ``a`` (q and k each scaled by ``a``, the scores by ``a^2``, as in Hugging
Face). Hook: q/k transform. Kernel: SDPA (flash) -- nothing touches the scores.

Pairing conventions (both are used by real checkpoints): ``pairing="half_split"`` pairs
``(k, k + r/2)`` as GPT-NeoX and Hugging Face Llama do; ``pairing="interleaved"`` pairs
``(2k, 2k+1)`` as GPT-J, rotary-embedding-torch and torchtune do. ``rotary_dim = r < head_dim``
rotates only the first ``r`` features (partial rotary).

Static scalings compute their frequencies once, at construction (a float64 buffer). Length-
dependent ones (dynamic NTK; LongRoPE switching short/long) take the current length of each batch
row from the positions passed in, ``T = max(q_pos, kv_pos) + 1``, never from module state
(Hugging Face's dynamic update keeps the frequencies of the longest length seen so far between
calls, so its result depends on call history; here each call depends on its positions only). With a
KV cache such an encoding would rotate each cached key with the frequencies of the length at the
time it was cached, while a full forward uses those of the final length (Hugging Face does this
silently); these encodings set ``supports_kv_cache = False`` instead, so a model refuses a cache
and the sequence must be run whole.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import Tensor

from ..common.checks import check_choice, check_int, check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..common.rotary import apply_rotary
from .rope_scaling import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    LongRoPESelect,
    NTKScaling,
    RopeScaling,
    YaRNScaling,
    default_inv_freq,
    ntk_long_factors,
)

PAIRINGS = ("half_split", "interleaved")
Pairing = Literal["half_split", "interleaved"]


def rope_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """``base^(-2k/r)`` for ``k = 0 .. r/2 - 1`` (float64)."""
    return default_inv_freq(rotary_dim, base)


def check_rotary_dims(head_dim: int, rotary_dim: int | None) -> int:
    """The rotary dim (``head_dim`` when None) after checking both: ``head_dim`` a positive int,
    ``rotary_dim`` an even int in ``[2, head_dim]`` (a ``head_dim`` that is odd with no
    ``rotary_dim`` is reported as ``head_dim``, the argument the caller gave)."""
    check_int("head_dim", head_dim, minimum=1)
    if rotary_dim is None:
        if head_dim % 2:
            raise ValueError(
                f"head_dim must be even when rotary_dim is not given (features are rotated in pairs); got {head_dim}"
            )
        return head_dim
    check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim ({rotary_dim}) must not exceed head_dim ({head_dim})")
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    return rotary_dim


def current_length(q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """``max(q_pos, kv_pos) + 1`` per batch row, float64 ``[B]``: the length the length-dependent
    scalings see (q and k must share it, or scores would stop depending on ``i - j`` alone)."""
    q_max = q_pos.to(torch.float64).amax(dim=-1)
    kv_max = kv_pos.to(torch.float64).amax(dim=-1) if kv_pos.shape[-1] > 0 else q_max
    return torch.maximum(q_max, kv_max) + 1


@register(
    "rope",
    modality="seq",
    paper="Su et al. 2021, RoFormer, https://arxiv.org/abs/2104.09864",
    summary="rotary q/k transform; half-split or interleaved pairs, partial rotary",
)
class RotaryEncoding(PositionEncoding):
    """Args:
        head_dim: per-head width ``D``.
        base: frequency base (10000).
        rotary_dim: features rotated, even, ``<= head_dim``; default all.
        pairing: "half_split" (GPT-NeoX, HF Llama) or "interleaved" (GPT-J, torchtune).
        scaling: a context extension from :mod:`.rope_scaling` (``LinearScaling(4.0)``, ...);
            None for plain RoPE.

    Shapes: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``, positions ``[B or 1, T]`` (integer or float).
    """

    hooks = frozenset({Hook.QK})

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
        scaling: RopeScaling | None = None,
    ) -> None:
        super().__init__()
        rotary_dim = check_rotary_dims(head_dim, rotary_dim)
        check_choice("pairing", pairing, PAIRINGS)
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling config (e.g. LinearScaling(4.0)) or None; got {scaling!r}")
        self.head_dim, self.rotary_dim, self.base, self.pairing = head_dim, rotary_dim, base, pairing
        self.scaling = None
        self.register_buffer("inv_freq", default_inv_freq(2, 10000.0), persistent=False)
        self.set_scaling(scaling)  # validates every parameter

    def set_scaling(self, scaling: RopeScaling | None) -> None:
        """Switch to ``scaling`` (None: plain RoPE) in place, e.g. to extend a trained model's
        context (:func:`posenc.seq.extend_context`). The frequencies are recomputed; the KV-cache
        rule follows the scaling (a length-dependent one refuses a cache)."""
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling config (e.g. LinearScaling(4.0)) or None; got {scaling!r}")
        previous = self.scaling
        self.scaling = scaling
        try:
            inv_freq, attention_factor = self._frequencies()
        except ValueError:
            self.scaling = previous  # a refused scaling leaves the encoding as it was
            raise
        self.attention_factor = attention_factor
        if scaling is not None and scaling.dynamic:
            self.supports_kv_cache = False  # see the module docstring
        else:
            self.__dict__.pop("supports_kv_cache", None)  # back to the class's rule
        self.inv_freq = inv_freq.to(self.inv_freq.device)

    def frequencies(self, length: int | None = None) -> tuple[Tensor, float]:
        """The inverse frequencies (float64 ``[r/2]``) and attention factor this encoding uses for a
        sequence of ``length`` tokens (its largest position + 1). ``length`` is needed only by the
        length-dependent scalings (dynamic NTK, LongRoPE switching by length), and refused as
        missing there."""
        if self.scaling is not None and self.scaling.dynamic:
            if length is None:
                raise ValueError(f"{self.scaling.name} scaling depends on the length: pass length=")
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ValueError(f"length must be a positive int, got {length!r}")
            return self._frequencies(float(length))
        return self._frequencies()

    def _frequencies(self, seq_len: Tensor | None = None) -> tuple[Tensor, float]:
        if self.scaling is None:
            return rope_inv_freq(self.rotary_dim, self.base), 1.0
        return self.scaling.compute(self.rotary_dim, self.base, seq_len)

    def _inv_freq(self, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """Float64 ``[r/2]``, or ``[B, r/2]`` for a length-dependent scaling."""
        if self.scaling is not None and self.scaling.dynamic:
            return self._frequencies(current_length(q_pos, kv_pos))[0].to(q_pos.device)
        if self.inv_freq.dtype != torch.float64:  # the module was cast (.half(), .float()): recompute exactly
            return self._frequencies()[0].to(q_pos.device)
        return self.inv_freq

    def _tables(self, positions: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
        """``cos, sin [B, 1, T, r/2]`` (float64), times the attention factor."""
        if positions.dim() != 2:
            raise ValueError(f"positions must be [batch or 1, tokens]; got {tuple(positions.shape)}")
        # Float64 angles: in float32 the angle of position 100,000 is off by about 0.01 rad.
        angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq.unsqueeze(-2)  # [B, T, r/2]
        angles = angles.unsqueeze(1)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        interleaved = self.pairing == "interleaved"
        inv_freq = self._inv_freq(q_pos, kv_pos)
        cos, sin = self._tables(q_pos, inv_freq)
        q = apply_rotary(q, cos, sin, interleaved=interleaved)
        if k.shape[2] > 0:
            if kv_pos is not q_pos:
                cos, sin = self._tables(kv_pos, inv_freq)
            k = apply_rotary(k, cos, sin, interleaved=interleaved)
        return q, k


def _original_max_len(max_len: int | None, original_max_len: int | None, factor: float, name: str) -> int:
    """``original_max_len``, or ``max_len // factor`` when it is not given."""
    check_number("factor", factor, minimum=1.0)  # before it divides anything
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


@register(
    "rope_linear",
    modality="seq",
    paper="Chen et al. 2023, Extending Context Window via Positional Interpolation, https://arxiv.org/abs/2306.15595",
    summary="RoPE with positions interpolated: theta / factor",
)
class LinearRoPE(RotaryEncoding):
    """RoPE with linear position interpolation, ``theta_k / factor`` (default factor 4).

    Args: ``head_dim``, ``factor`` (>= 1), and ``base``, ``rotary_dim``, ``pairing`` as for
    :class:`RotaryEncoding`. Kernel: SDPA.
    """

    def __init__(
        self, head_dim: int, factor: float = 4.0, base: float = 10000.0, rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=LinearScaling(factor))


@register(
    "rope_ntk",
    modality="seq",
    paper="bloc97 2023, NTK-Aware Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/",
    summary="RoPE with the NTK-aware base: base * factor^(r/(r-2))",
)
class NTKRoPE(RotaryEncoding):
    """RoPE with the NTK-aware base ``base * factor^(r/(r-2))`` (default factor 4). Kernel: SDPA."""

    def __init__(
        self, head_dim: int, factor: float = 4.0, base: float = 10000.0, rotary_dim: int | None = None,
        pairing: Pairing = "half_split",
    ) -> None:
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=NTKScaling(factor))


@register(
    "rope_dynamic_ntk",
    modality="seq",
    paper="emozilla 2023, Dynamically Scaled RoPE, https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/",
    summary="RoPE with an NTK-aware base grown from the current length beyond original_max_len",
)
class DynamicNTKRoPE(RotaryEncoding):
    """RoPE whose base follows the current length ``T`` (max position + 1 of each batch row):
    ``base * (factor*T/L0 - (factor-1))^(r/(r-2))`` for ``T > L0``, ``base`` below.

    Args: ``head_dim``; ``max_len`` and ``original_max_len`` (``L0``, default
    ``max_len // factor``); ``factor`` (default 4); ``base``, ``rotary_dim``, ``pairing``.
    ``supports_kv_cache`` is False (the frequencies change as the sequence grows; see the module
    docstring). Kernel: SDPA.
    """

    def __init__(
        self, head_dim: int, max_len: int | None = None, factor: float = 4.0, original_max_len: int | None = None,
        base: float = 10000.0, rotary_dim: int | None = None, pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_dynamic_ntk")
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=DynamicNTKScaling(l0, factor))


@register(
    "rope_yarn",
    modality="seq",
    paper="Peng et al. 2023, YaRN, https://arxiv.org/abs/2309.00071",
    summary="RoPE with YaRN's ramp between interpolated and original frequencies, and 0.1 ln(s) + 1 attention factor",
)
class YaRNRoPE(RotaryEncoding):
    """YaRN (see :func:`.rope_scaling.yarn_scaling`).

    Args: ``head_dim``; ``max_len`` and ``original_max_len`` (``L0``, default ``max_len // factor``);
    ``factor`` (4); ``beta_fast`` (32) > ``beta_slow`` (1); ``attention_factor`` (default
    ``0.1 ln s + 1``); ``mscale``, ``mscale_all_dim`` (DeepSeek's knobs, both or neither);
    ``truncate`` (floor/ceil the correction range, HF's default); ``base``, ``rotary_dim``,
    ``pairing``. Kernel: SDPA.
    """

    def __init__(
        self, head_dim: int, max_len: int | None = None, factor: float = 4.0, original_max_len: int | None = None,
        beta_fast: float = 32.0, beta_slow: float = 1.0, attention_factor: float | None = None,
        mscale: float | None = None, mscale_all_dim: float | None = None, truncate: bool = True,
        base: float = 10000.0, rotary_dim: int | None = None, pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_yarn")
        scaling = YaRNScaling(
            l0, factor, beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim, truncate
        )
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=scaling)


@register(
    "rope_llama3",
    modality="seq",
    paper="Llama Team 2024, The Llama 3 Herd of Models, https://arxiv.org/abs/2407.21783",
    summary="RoPE with Llama 3.1's wavelength-banded frequency scaling",
)
class Llama3RoPE(RotaryEncoding):
    """Llama 3.1 scaling (see :func:`.rope_scaling.llama3_scaling`).

    Args: ``head_dim``; ``max_len`` and ``original_max_len`` (``L0``; Llama 3.1 uses 8192, the
    default here is ``max_len // factor`` so that a model built for ``max_len`` is the extended
    one); ``factor`` (8), ``low_freq_factor`` (1) < ``high_freq_factor`` (4); ``base``,
    ``rotary_dim``, ``pairing``. Kernel: SDPA.
    """

    def __init__(
        self, head_dim: int, max_len: int | None = None, factor: float = 8.0, original_max_len: int | None = None,
        low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
        base: float = 10000.0, rotary_dim: int | None = None, pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_llama3")
        scaling = Llama3Scaling(factor, low_freq_factor, high_freq_factor, l0)
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=scaling)


@register(
    "rope_longrope",
    modality="seq",
    paper="Ding et al. 2024, LongRoPE, https://arxiv.org/abs/2402.13753",
    summary="RoPE with per-pair short/long rescale factors, switched beyond original_max_len",
)
class LongRoPE(RotaryEncoding):
    """LongRoPE (see :func:`.rope_scaling.longrope_scaling`).

    Args: ``head_dim``; ``max_len`` and ``original_max_len`` (``L0``, default ``max_len // factor``);
    ``factor`` (4; the attention factor is ``sqrt(1 + ln factor / ln L0)`` unless
    ``attention_factor`` is given); ``short_factor`` and ``long_factor``: ``rotary_dim/2``
    positive numbers each (searched lists from a checkpoint); by default the short list is all
    ones (plain RoPE inside ``L0``) and the long list ``factor^(2k/(r-2))``, which reproduces the
    NTK-aware base; ``select``: "by_length" (long factors once the current length exceeds ``L0``,
    as Phi-3; ``supports_kv_cache`` is then False), or "short"/"long" to fix one list (a cache is
    then fine); ``base``, ``rotary_dim``, ``pairing``. Kernel: SDPA.
    """

    def __init__(
        self, head_dim: int, max_len: int | None = None, factor: float = 4.0, original_max_len: int | None = None,
        short_factor: Sequence[float] | None = None, long_factor: Sequence[float] | None = None,
        attention_factor: float | None = None, select: LongRoPESelect = "by_length",
        base: float = 10000.0, rotary_dim: int | None = None, pairing: Pairing = "half_split",
    ) -> None:
        l0 = _original_max_len(max_len, original_max_len, factor, "rope_longrope")
        r = check_rotary_dims(head_dim, rotary_dim)
        for list_name, values in (("short_factor", short_factor), ("long_factor", long_factor)):
            if values is not None and (isinstance(values, (str, bytes)) or not isinstance(values, Sequence)):
                raise TypeError(f"{list_name} must be a sequence of rotary_dim/2 numbers or None; got {values!r}")
        if short_factor is None:
            short_factor = (1.0,) * max(r // 2, 0)
        if long_factor is None:
            long_factor = ntk_long_factors(r, factor)
        scaling = LongRoPEScaling(tuple(short_factor), tuple(long_factor), l0, factor, attention_factor, select)
        super().__init__(head_dim, base, rotary_dim, pairing, scaling=scaling)
