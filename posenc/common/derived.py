"""Tensors derived from parameters alone, kept between calls that need no gradient.

Some encodings rebuild a table from their parameters at every call although it depends on
nothing else: DeBERTa projects its ``2k`` relative embeddings through two ``C x C`` matrices per
layer, which in a cached decoding step costs far more than the attention itself.
:class:`DerivedTensors` keeps such a result while its sources hold the same values. It is not
per-call state: the value is a pure function of the parameters, and it is checked against them
at every use, bit by bit, so an edit of any kind -- an optimizer step, a ``load_state_dict``,
``param.data.copy_(...)``, which no version counter sees -- rebuilds it. (Bits, not values: the
same bits give the same table, and a CPU comparison of bytes is ``memcmp``, four times faster
than ``torch.equal`` here: 12 against 47 us for DeBERTa's ``[512, 256]`` table, compared in
every layer at every decoding step.)
Calls that track gradients to the sources, and code being traced by ``torch.compile``, always
rebuild (the result must be part of their graph).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Callable, Generic, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class DerivedTensors(Generic[T]):
    """One cached ``build()`` result per owner, valid while ``sources`` and ``key`` are unchanged.

    Example::

        self._tables = DerivedTensors()
        ...
        kr = self._tables.get((self.rel, self.proj.weight), lambda: self.proj(self.rel), key=(dtype,))
    """

    def __init__(self) -> None:
        self._sources: tuple[Tensor, ...] | None = None
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
        if self._sources is not None and key == self._key and _same(self._sources, sources):
            return self._value  # type: ignore[return-value]
        value = build()
        self._sources, self._key, self._value = tuple(s.detach().clone() for s in sources), key, value
        return value

    def clear(self) -> None:
        self._sources, self._key, self._value = None, (), None


def doubling_length(largest: int) -> int:
    """The length of a table by distance kept for cached decoding: a power of two above
    ``largest`` (the farthest distance a call needs), at least 256. A decoding step reaches one
    distance further each time, so such a table is built once per doubling of the context."""
    if isinstance(largest, bool) or not isinstance(largest, int) or largest < 0:
        raise ValueError(f"largest must be a non-negative int (a distance); got {largest!r}")
    return max(256, 1 << largest.bit_length())


def _same(kept: tuple[Tensor, ...], sources: tuple[Tensor, ...]) -> bool:
    return len(kept) == len(sources) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and _same_bits(a, b)
        for a, b in zip(kept, sources)
    )


def _load_memcmp():
    """libc's ``memcmp``, or None where it cannot be found (the comparison then stays in torch)."""
    try:
        # the process's own symbols hold libc's on POSIX: no library search (find_library runs
        # ldconfig or a compiler in a subprocess at import)
        libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        fn = libc.memcmp
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), ctypes.c_int
    return fn


_MEMCMP = _load_memcmp()


_SAME_SIZE_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` (one shape, dtype and device) hold the same bits: ``memcmp`` over two
    contiguous CPU tensors, else ``torch.equal`` of their elements read as integers of the same
    size (of their values for a tensor that cannot be read so: conjugate or negative views)."""
    if a.layout != torch.strided or a.is_conj() or b.is_conj() or a.is_neg() or b.is_neg():
        return torch.equal(a, b)
    if _MEMCMP is not None and a.device.type == "cpu" and a.is_contiguous() and b.is_contiguous():
        size = a.numel() * a.element_size()
        return size == 0 or _MEMCMP(a.data_ptr(), b.data_ptr(), size) == 0
    integer = _SAME_SIZE_INTEGERS.get(a.element_size())
    if integer is None or a.is_complex():
        return torch.equal(a, b)
    return torch.equal(a.view(integer), b.view(integer))
