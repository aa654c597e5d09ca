"""Tensors derived from parameters alone, kept between calls that need no gradient.

Some encodings rebuild a table from their parameters at every call although it depends on
nothing else: DeBERTa projects its ``2k`` relative embeddings through two ``C x C`` matrices per
layer, which in a cached decoding step costs far more than the attention itself.
:class:`DerivedTensors` keeps such a result while its sources hold the same values. It is not
per-call state: the value is a pure function of the parameters, and it is checked against them
at every use, value by value (``torch.equal``), so an edit of any kind -- an optimizer step, a
``load_state_dict``, ``param.data.copy_(...)``, which no version counter sees -- rebuilds it.
Calls that track gradients to the sources, and code being traced by ``torch.compile``, always
rebuild (the result must be part of their graph).
"""

from __future__ import annotations

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


def _same(kept: tuple[Tensor, ...], sources: tuple[Tensor, ...]) -> bool:
    return len(kept) == len(sources) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
        for a, b in zip(kept, sources)
    )
