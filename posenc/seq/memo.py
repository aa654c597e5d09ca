"""Kept results of functions of plain values (integers, a dtype, a device): no parameter involved.

Every layer asks at every call (a cached decoding step included) for the same parameter-free
tables, such as T5's bucket of each offset up to ``max_distance``. They depend on a few integers
alone, so unlike :class:`~posenc.primitives.derived.DerivedTensors` (tables derived from parameters,
checked against them at each use) nothing can make a kept one wrong.
:class:`ValueMemo` keeps the last few, least recently used dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch
from torch import Tensor


class ValueMemo:
    """``build(*key)`` kept per ``key`` (a tuple of hashable plain values), at most ``size`` of them.

    The values are shared between callers: read them (index, slice, product), never write into
    them. They are built outside inference mode, so a table first asked for under
    ``torch.inference_mode()`` still serves calls that record gradients; code being traced by
    ``torch.compile`` gets ``build(*key)`` itself (a constant of its graph)."""

    def __init__(self, build: Callable[..., Tensor], size: int = 8) -> None:
        if not callable(build):
            raise TypeError(f"build must be a callable of the key's values; got {type(build).__name__}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int; got {size!r}")
        self._build, self._size = build, size
        self._kept: OrderedDict[tuple, Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, *key: Hashable) -> Tensor:
        if torch.compiler.is_compiling():
            return self._build(*key)
        with self._lock:
            value = self._kept.get(key)
            if value is not None:
                self._kept.move_to_end(key)
                return value
        with torch.inference_mode(False):
            value = self._build(*key)
        with self._lock:
            self._kept[key] = value
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
