"""What an encoding keeps between the decoding steps of a KV cache, beside the cache, never in it:
:class:`DecodingState`, an explicit argument next to the cache (docs/architecture.md, "Add an
encoding with a decoding hook").

The cache holds keys, values and positions. An encoding whose decoding hook would recompute
something from every cached key at each step (FoX's running sum of log forget gates) may keep it
here instead, per layer, and extend it by the new keys only. A kept value is only ever read for the
cached entries that are still the ones it was computed from (:meth:`LayerKVCache.unchanged_prefix`:
a crop, or a state passed with another cache, cuts or drops it), and under the key its owner gives
(for example the versions of the parameters it was computed from); anything else is recomputed,
so a state changes how much is recomputed, and the values only within rounding (a running sum
extended step by step adds in another order than one sum over all keys).
"""

from __future__ import annotations

import contextvars
from typing import Hashable

from torch import Tensor

from .checks import check_int
from .kv_cache import LayerKVCache

_TRACKED_EDITS_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("posenc_tracked_edits_only", default=False)


class tracked_edits_only:  # a context manager named as one: with tracked_edits_only(): ...
    """Within this block, a value kept from parameters
    (:class:`~posenc.primitives.derived.DerivedTensors`) is checked against them by torch's version
    counters, not bit by bit (an edit through ``.data``, which no counter sees, is not caught): for
    code whose result already assumes unchanged parameters, as a step that reads a KV cache does.
    (A class, not a generator: it is entered in every layer of every decoding step.)"""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _TRACKED_EDITS_ONLY.set(True)

    def __exit__(self, *exc) -> None:
        _TRACKED_EDITS_ONLY.reset(self._token)

    @staticmethod
    def active() -> bool:
        """Whether the caller is inside such a block."""
        return _TRACKED_EDITS_ONLY.get()


class LayerDecodingState:
    """One attention layer's kept values. The layer calls :meth:`follow` with its cache after
    appending a step's keys; the encoding's decoding hook then reads :meth:`kept` and writes
    :meth:`keep`."""

    def __init__(self) -> None:
        self._cache: LayerKVCache | None = None
        self._kept: dict[str, tuple[Hashable, Tensor, tuple[int, int, int]]] = {}

    def follow(self, cache: LayerKVCache) -> None:
        """The cache whose keys this step's hook sees (its newest keys already appended)."""
        if not isinstance(cache, LayerKVCache):
            raise TypeError(f"a decoding state follows a posenc LayerKVCache; got {type(cache).__name__}")
        self._cache = cache

    def kept(self, name: str, key: Hashable) -> Tensor | None:
        """The value kept under ``name`` if it was kept with this ``key``, cut along its last axis
        to the oldest cached keys that are unchanged since (``[..., n]``, ``n >= 1``); else None."""
        entry = self._kept.get(name)
        if entry is None or self._cache is None or entry[0] != key:
            return None
        n = self._cache.unchanged_prefix(entry[2])
        return entry[1][..., :n] if n else None

    def keep(self, name: str, key: Hashable, value: Tensor) -> None:
        """Keep ``value`` (its last axis: one entry per key the cache holds now) under ``name``."""
        if not isinstance(name, str) or not isinstance(value, Tensor):
            raise TypeError(f"keep(name, key, value) takes a str name and a tensor value; got {type(name).__name__}, "
                            f"{type(value).__name__}")
        if self._cache is None:
            raise RuntimeError("keep() before follow(): the layer names its cache first")
        if value.shape[-1] != self._cache.length:
            raise ValueError(f"a kept value has one entry per cached key ({self._cache.length}); got "
                             f"{tuple(value.shape)}")
        self._kept[name] = (key, value, self._cache.mark())


class DecodingState:
    """One :class:`LayerDecodingState` per layer of a stack: ``model(tokens, cache=cache,
    decoding_state=state)`` at every step, ``DecodingState(len(cache))``; optional (without one,
    each step recomputes what an encoding would keep)."""

    def __init__(self, num_layers: int) -> None:
        num_layers = check_int("num_layers", num_layers, minimum=1)
        self.layers = [LayerDecodingState() for _ in range(num_layers)]

    def __getitem__(self, i: int) -> LayerDecodingState:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)
