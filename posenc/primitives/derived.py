"""Tensors derived from parameters alone, kept between calls that need no gradient
(:class:`DerivedTensors`: DeBERTa's projected relative embeddings, the by-distance tables; README.md,
"Generation", says when they are rebuilt).

A kept value is a pure function of the parameters, checked against them at every use: bit by bit,
so that an edit no version counter sees (``param.data.copy_(...)``) rebuilds it (bits, not values:
NaN in a parameter must not force a rebuild); inside
:class:`~posenc.common.decoding_state.tracked_edits_only` by torch's version counters instead,
which read no bytes. Calls that track gradients to the sources, and code being
traced by ``torch.compile``, always rebuild (the result must be part of their graph).
"""

from __future__ import annotations

import weakref
from typing import Callable, Generic, TypeVar

import torch
from torch import Tensor

from ..common.decoding_state import tracked_edits_only

T = TypeVar("T")


class DerivedTensors(Generic[T]):
    """One cached ``build()`` result per owner, valid while ``sources`` and ``key`` are unchanged.

    Example::

        self._tables = DerivedTensors()
        ...
        kr = self._tables.get((self.rel, self.proj.weight), lambda: self.proj(self.rel), key=(dtype,))
    """

    def __init__(self) -> None:
        self._sources: tuple[Tensor, ...] | None = None  # copies, compared bit by bit
        self._stamps: tuple[tuple, ...] = ()  # per source: (weak reference, version, storage address)
        self._key: tuple = ()
        self._value: T | None = None

    @staticmethod
    def keeps(sources: tuple[Tensor, ...]) -> bool:
        """Whether a value built from ``sources`` now may be kept: no gradient to them is wanted
        and nothing is being traced."""
        return not (torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(s.requires_grad for s in sources)))

    def get(self, sources: tuple[Tensor, ...], build: Callable[[], T], key: tuple = ()) -> T:
        """``build()``, or the value it gave for sources equal to these (and the same ``key``)."""
        if not isinstance(sources, tuple) or not sources or not all(isinstance(t, Tensor) for t in sources):
            raise TypeError(f"sources must be a non-empty tuple of tensors; got {type(sources).__name__} {sources!r:.80}")
        if not callable(build):
            raise TypeError(f"build must be a callable returning the derived value; got {type(build).__name__}")
        if not isinstance(key, tuple):
            raise TypeError(f"key must be a tuple; got {type(key).__name__} {key!r:.80}")
        if not self.keeps(sources):
            return build()
        if self._sources is not None and key == self._key:
            if tracked_edits_only.active() and _same_stamps(self._stamps, sources):
                return self._value  # type: ignore[return-value]
            if _same(self._sources, sources):
                self._stamps = _stamps(sources)  # (an edit that kept every bit: the versions moved on)
                return self._value  # type: ignore[return-value]
        value = build()
        self._sources, self._key, self._value = tuple(s.detach().clone() for s in sources), key, value
        self._stamps = _stamps(sources)
        return value

    def clear(self) -> None:
        self._sources, self._stamps, self._key, self._value = None, (), (), None

    def __getstate__(self) -> dict:
        return {}  # pickled (torch.save of a whole module) empty: the value is rebuilt on use

    def __setstate__(self, state: dict) -> None:
        self.clear()


def doubling_length(largest: int) -> int:
    """The length of a table by distance kept for cached decoding: a power of two above
    ``largest`` (the farthest distance a call needs), at least 256. A decoding step reaches one
    distance further each time, so such a table is built once per doubling of the context."""
    if isinstance(largest, bool) or not isinstance(largest, int) or largest < 0:
        raise ValueError(f"largest must be a non-negative int (a distance); got {largest!r}")
    return max(256, 1 << largest.bit_length())


def _stamps(sources: tuple[Tensor, ...]) -> tuple[tuple, ...]:
    """Per source ``(weak reference, version, storage address)``; empty when a source is an
    inference tensor (made under ``torch.inference_mode``), which has no version counter: such
    sources are then always compared bit by bit."""
    if any(s.is_inference() for s in sources):
        return ()
    return tuple((weakref.ref(s), s._version, s.data_ptr()) for s in sources)


def _same_stamps(stamps: tuple[tuple, ...], sources: tuple[Tensor, ...]) -> bool:
    """The same tensor objects as when stamped, each at the same version and storage address."""
    return bool(stamps) and len(stamps) == len(sources) and all(
        ref() is s and s._version == version and s.data_ptr() == address
        for (ref, version, address), s in zip(stamps, sources)
    )


def _same(kept: tuple[Tensor, ...], sources: tuple[Tensor, ...]) -> bool:
    return len(kept) == len(sources) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and _same_bits(a, b)
        for a, b in zip(kept, sources)
    )


_SAME_SIZE_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` (one shape, dtype and device) hold the same bits: ``torch.equal`` of their
    elements read as integers of the same size (NaN equals itself, -0.0 differs from 0.0), or of
    their values for a tensor that cannot be read so (conjugate or negative views, complex)."""
    if a.layout != torch.strided or a.is_conj() or b.is_conj() or a.is_neg() or b.is_neg():
        return torch.equal(a, b)
    integer = _SAME_SIZE_INTEGERS.get(a.element_size())
    if integer is None or a.is_complex():
        return torch.equal(a, b)
    return torch.equal(a.view(integer), b.view(integer))
