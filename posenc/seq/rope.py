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

The functional form: :func:`rope_frequencies`, :func:`rope_cos_sin` and :func:`apply_rope`
(re-exported by :mod:`posenc.functional`); :class:`RotaryEncoding` is a thin module over them.
A context extension is ``RotaryEncoding(head_dim, scaling=YaRNScaling(...))``; the registered
names (``rope_linear``, ``rope_yarn``, ...) are the classes of :mod:`.rope_scaled`, which imports
this module (never the reverse).

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

import torch
from torch import Tensor

from ..common.checks import check_dtype, check_int, check_positions, check_sequence_positions, check_tensor
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.derived import DerivedTensors, doubling_length
from ..primitives.rotary import PAIRINGS, Pairing, apply_rotary_qk, check_pairing, rotary_cos_sin
from .rope_scaling import RopeScaling, default_inv_freq


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


def check_scaling(scaling: RopeScaling | None, *, static: str | None = None) -> None:
    """``scaling`` is None or a :class:`RopeScaling`; with ``static`` (the caller's name, e.g.
    "M-RoPE"), a length-dependent scaling is refused too."""
    if scaling is not None and not isinstance(scaling, RopeScaling):
        raise TypeError(f"scaling must be a RopeScaling config (e.g. LinearScaling(4.0)) or None; got {scaling!r}")
    if static is not None and scaling is not None and scaling.dynamic:
        raise ValueError(f"{static} takes a static scaling; {scaling.name} depends on the length")


def check_rope_arguments(
    head_dim: int, rotary_dim: int | None, pairing: Pairing, scaling: RopeScaling | None, *, static: str | None = None
) -> int:
    """The checks every rotary encoding makes of its constructor arguments (:func:`check_rotary_dims`,
    the pairing, :func:`check_scaling`); returns the rotary dim."""
    rotary_dim = check_rotary_dims(head_dim, rotary_dim)
    check_pairing(pairing)
    check_scaling(scaling, static=static)
    return rotary_dim


def current_length(q_pos: Tensor, kv_pos: Tensor) -> Tensor:
    """``max(q_pos, kv_pos) + 1`` per batch row, float64 ``[B]`` (a scalar for 1D positions): the
    length the length-dependent scalings see (q and k must share it, or scores would stop depending
    on ``i - j`` alone)."""
    q_max = q_pos.to(torch.float64).amax(dim=-1)
    kv_max = kv_pos.to(torch.float64).amax(dim=-1) if kv_pos.shape[-1] > 0 else q_max
    return torch.maximum(q_max, kv_max) + 1


def rope_frequencies(
    rotary_dim: int, base: float = 10000.0, scaling: RopeScaling | None = None, length: Tensor | float | None = None
) -> tuple[Tensor, float]:
    """RoPE's inverse frequencies (float64 ``[r/2]``, or ``[B, r/2]`` for a ``[B]`` length) and
    attention factor, for ``scaling`` (None: plain RoPE, ``base^(-2k/r)``). ``length``, the current
    length, is read by the length-dependent scalings only (dynamic NTK, LongRoPE by length; None
    gives their original-length frequencies and long factors respectively)."""
    check_scaling(scaling)
    if scaling is None:
        return default_inv_freq(rotary_dim, base), 1.0
    return scaling.compute(rotary_dim, base, length)


def rope_cos_sin(
    positions: Tensor,
    dim: int,
    base: float = 10000.0,
    *,
    scaling: RopeScaling | None = None,
    dtype: torch.dtype | None = torch.float32,
) -> tuple[Tensor, Tensor]:
    """The cos/sin cache of RoPE: ``cos(p * theta_k) * a`` and ``sin(p * theta_k) * a``.

    Args:
        positions: ``[..., T]``, integer or float (offsets, packed or per-row positions); finite (NaN
            or inf is a ValueError, read unless ``torch.compile`` traces).
        dim: the rotated width ``r`` (even): the head dim, or less for partial rotary.
        base: frequency base (10000).
        scaling: a context extension (:class:`~.rope_scaling.LinearScaling`, ...); its attention
            factor ``a`` is folded in. A length-dependent one reads the length from the positions:
            ``max(positions[..., :]) + 1`` per leading index.
        dtype: of the result (None: float64, in which the angles are computed).

    Returns:
        ``(cos, sin)``, each ``[..., T, dim/2]``; pair ``k`` of the half-split or interleaved
        layout (see :func:`apply_rope`) is rotated by column ``k``.
    """
    check_positions("positions", positions)  # NaN or inf would be a NaN row of the cache, without a word
    check_int("dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"dim must be even (features are rotated in pairs); got {dim}")
    if dtype is not None:
        check_dtype("dtype", dtype)
    length = current_length(positions, positions) if scaling is not None and scaling.dynamic else None
    inv_freq, factor = rope_frequencies(dim, base, scaling, length)
    cos, sin = rotary_cos_sin(positions, inv_freq.to(positions.device), attention_factor=factor)
    return (cos, sin) if dtype is None else (cos.to(dtype), sin.to(dtype))


def _batch_positions(positions: Tensor, length: int, name: str) -> Tensor:
    check_positions(name, positions)
    batched = positions.unsqueeze(0) if positions.dim() == 1 else positions
    if batched.dim() != 2 or batched.shape[1] != length:
        raise ValueError(f"{name} must be [{length}] or [batch or 1, {length}]; got {tuple(positions.shape)}")
    return batched


def apply_rope(
    q: Tensor,
    k: Tensor,
    positions: Tensor,
    *,
    k_positions: Tensor | None = None,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    pairing: Pairing = "half_split",
    scaling: RopeScaling | None = None,
) -> tuple[Tensor, Tensor]:
    """Rotate queries and keys by RoPE, ``q_i . k_j`` then depends on ``i - j`` only.

    Args:
        q: ``[B, Hq, Tq, D]``; k: ``[B, Hkv, Tk, D]`` (transpose a ``[B, T, H, D]`` layout first).
        positions: the queries' positions, ``[Tq]`` or ``[B or 1, Tq]`` (integer or float; finite, as
            :func:`rope_cos_sin`'s).
        k_positions: the keys' positions, ``[Tk]`` or ``[B or 1, Tk]``; default ``positions``
            (self-attention; a KV cache passes the cached keys' own positions).
        base: frequency base (10000).
        rotary_dim: features rotated, even, ``<= D`` (partial rotary); default ``D``.
        pairing: "half_split" pairs ``(k, k + r/2)`` (GPT-NeoX, Hugging Face Llama) or
            "interleaved" pairs ``(2k, 2k+1)`` (GPT-J, torchtune).
        scaling: a context extension (:mod:`posenc.seq.rope_scaling`); None for plain RoPE.
            A length-dependent one reads the length ``max(positions, k_positions) + 1`` per row.

    Returns:
        ``(q, k)`` rotated, same shapes and dtypes (tables computed in float64).
    """
    check_tensor("q", q, floating=True)
    check_tensor("k", k, floating=True)
    if q.dim() != 4 or k.dim() != 4 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be [batch, heads, tokens, head_dim] with one head_dim; got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    head_dim = q.shape[-1]
    r = head_dim if rotary_dim is None else rotary_dim
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0 or r % 2 or r > head_dim:
        raise ValueError(f"rotary_dim must be a positive even number <= head_dim ({head_dim}); got {rotary_dim!r}")
    check_pairing(pairing)
    q_pos = _batch_positions(positions, q.shape[2], "positions")
    if k_positions is None and k.shape[2] != q.shape[2]:
        raise ValueError(f"k has {k.shape[2]} tokens and q {q.shape[2]}: pass k_positions for the keys")
    kv_pos = q_pos if k_positions is None else _batch_positions(k_positions, k.shape[2], "k_positions")
    length = current_length(q_pos, kv_pos) if scaling is not None and scaling.dynamic else None
    inv_freq, factor = rope_frequencies(r, base, scaling, length)
    return apply_rotary_qk(q, k, q_pos, kv_pos, inv_freq.to(q_pos.device), pairing=pairing, attention_factor=factor)


# Calls of at most this many positions read cos/sin from a kept table (cached decoding), for
# positions below _TABLE_POSITIONS (the table then holds at most 2 x 65536 x r/2 values).
_FEW_POSITIONS = 8
_TABLE_POSITIONS = 1 << 16


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
    The rotation is :func:`apply_rope`'s.
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
        rotary_dim = check_rope_arguments(head_dim, rotary_dim, pairing, scaling)
        self.head_dim, self.rotary_dim, self.base, self.pairing = head_dim, rotary_dim, base, pairing
        self.scaling = None
        self.register_buffer("inv_freq", default_inv_freq(2, 10000.0), persistent=False)
        self._tables: DerivedTensors[tuple[Tensor, Tensor]] = DerivedTensors()  # cos, sin by position
        self.set_scaling(scaling)  # validates every parameter

    def set_scaling(self, scaling: RopeScaling | None) -> None:
        """Switch to ``scaling`` (None: plain RoPE) in place, e.g. to extend a trained model's
        context (:func:`posenc.seq.extend_context`). The frequencies are recomputed; the KV-cache
        rule follows the scaling (a length-dependent one refuses a cache)."""
        check_scaling(scaling)
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

    def _frequencies(self, seq_len: Tensor | float | None = None) -> tuple[Tensor, float]:
        return rope_frequencies(self.rotary_dim, self.base, self.scaling, seq_len)

    def _inv_freq(self, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """Float64 ``[r/2]``, or ``[B, r/2]`` for a length-dependent scaling."""
        if self.scaling is not None and self.scaling.dynamic:
            return self._frequencies(current_length(q_pos, kv_pos))[0].to(q_pos.device)
        if self.inv_freq.dtype != torch.float64:  # the module was cast (.half(), .float()): recompute exactly
            return self._frequencies()[0].to(q_pos.device)
        return self.inv_freq

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head dim {q.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        check_sequence_positions(q_pos, kv_pos)
        inv_freq = self._inv_freq(q_pos, kv_pos)
        return apply_rotary_qk(q, k, q_pos, kv_pos, inv_freq, pairing=self.pairing,
                               attention_factor=self.attention_factor, by_position=self._kept_tables(q_pos, kv_pos, q))

    def _kept_tables(self, q_pos: Tensor, kv_pos: Tensor, q: Tensor) -> tuple[Tensor, Tensor] | None:
        """``cos`` and ``sin`` by position ``[L, r/2]`` in ``q``'s dtype, kept between calls
        (:class:`~posenc.primitives.derived.DerivedTensors`, ``L`` doubling as positions grow), for a
        call of a few integer positions that shares them between queries and keys (a cached
        decoding step): two lookups in place of the angles' six operations per layer. The same
        numbers: the table is the same float64 computation, cast as the rotation casts it. None
        (computed as usual) for longer calls, float or negative positions, positions from 65536 on
        (the table's size stays bounded), positions off the CPU, a length-dependent scaling, and
        traced code."""
        if (kv_pos is not q_pos or q_pos.numel() > _FEW_POSITIONS or q_pos.is_floating_point()
                or q_pos.device.type != "cpu"  # (reading the positions would wait for a GPU stream)
                or torch.compiler.is_compiling() or self.inv_freq.dtype != torch.float64
                or (self.scaling is not None and self.scaling.dynamic)):
            return None
        positions = q_pos.flatten().tolist()
        if not positions or min(positions) < 0 or max(positions) >= _TABLE_POSITIONS:
            return None
        length = doubling_length(max(positions))
        factor, dtype, device = self.attention_factor, q.dtype, q.device

        def build() -> tuple[Tensor, Tensor]:
            cos, sin = rotary_cos_sin(torch.arange(length, device=device), self.inv_freq.to(device),
                                      attention_factor=factor)
            return cos.to(dtype), sin.to(dtype)

        return self._tables.get((self.inv_freq,), build, key=(length, dtype, device, factor))


__all__ = [
    "PAIRINGS", "Pairing", "rope_inv_freq", "check_rotary_dims", "check_rope_arguments", "check_scaling",
    "current_length", "rope_frequencies", "rope_cos_sin", "apply_rope", "RotaryEncoding",
]
