"""KV cache for incremental decoding, an explicit argument, never module state: per layer keys,
values and key positions (:class:`LayerKVCache`), and the token rows a conditional module between
blocks reads (:class:`TokenRows`), cropped with the keys (docs/architecture.md, "The way of a KV
cache")."""

from __future__ import annotations

import itertools
from bisect import bisect_right

import torch
from torch import Tensor

from .checks import check_int

_CACHES = itertools.count(1)  # a number per LayerKVCache ever made: marks of another cache match nothing


class LayerKVCache:
    """Keys (after the encoding's q/k transform: each transformed once, at its own position),
    values and key positions seen so far by one attention layer.

    The history lives in buffers whose capacity doubles when full, so a decoding step writes its
    one new key in place instead of copying the whole cache; ``k``, ``v`` and ``pos`` are views of
    the filled part. ``capacity``: the entries per sequence the first buffers hold (at least the
    first append's), for a caller that knows how long the sequence will get (``generate``): the
    buffers then never grow, nor hold the up to twice what they use that doubling leaves. While a
    gradient flows through the keys, appending concatenates instead, as autograd needs.
    :meth:`crop` drops the newest entries (as HF's ``DynamicCache.crop``).
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = None if capacity is None else check_int("capacity", capacity, minimum=1)
        self._k: Tensor | None = None  # [B, Hkv, capacity, D]
        self._v: Tensor | None = None  # [B, Hkv, capacity, Dv]
        self._pos: Tensor | None = None  # [B or 1, capacity(, C)]
        self._length = 0
        # every append still held, oldest first: its stamp (counting the appends of this cache's life)
        # and the length after it; crop cuts this history as it cuts the keys (see mark())
        self._id, self._appends = next(_CACHES), 0
        self._stamps: list[int] = []
        self._ends: list[int] = []

    @property
    def length(self) -> int:
        return self._length

    @property
    def k(self) -> Tensor | None:
        """The cached keys ``[B, Hkv, length, D]`` (a view), or None when empty."""
        return None if self._k is None else self._k[:, :, : self._length]

    @property
    def v(self) -> Tensor | None:
        return None if self._v is None else self._v[:, :, : self._length]

    @property
    def pos(self) -> Tensor | None:
        """The cached key positions ``[B or 1, length(, C)]`` (a view), or None when empty."""
        return None if self._pos is None else self._pos[:, : self._length]

    def mark(self) -> tuple[int, int, int]:
        """Which entries the cache holds now, for :meth:`unchanged_prefix` to compare with later."""
        return self._id, self._stamps[-1] if self._stamps else 0, self._length

    def unchanged_prefix(self, mark: tuple[int, int, int] | None) -> int:
        """How many of the oldest entries are the very ones held when ``mark`` was taken (by
        :meth:`mark` of this cache; 0 for None or another cache's mark): appends leave them as they
        were, a crop below them does not. A :class:`~posenc.common.decoding_state.LayerDecodingState`
        reads it to know which of its values still belong to the cached keys."""
        if mark is None:
            return 0
        if not (isinstance(mark, tuple) and len(mark) == 3 and all(type(m) is int for m in mark)):
            raise TypeError(f"mark must be what LayerKVCache.mark() returned (three ints) or None; got {mark!r:.80}")
        if mark[0] != self._id:
            return 0
        # the appends made by the mark's time that are still held (stamps grow with time); the
        # newest of them may have been cut by a crop, and later appends are not the mark's
        held = bisect_right(self._stamps, mark[1])
        return min(self._ends[held - 1], mark[2]) if held else 0

    def next_positions(self, length: int, device=None) -> Tensor:
        """Default positions of ``length`` new tokens: they continue after the last cached position
        (``0 .. length-1`` for an empty cache). ``[B or 1, length]``."""
        pos = self.pos
        if pos is None:
            return torch.arange(length, device=device).unsqueeze(0)
        if pos.dim() != 2:
            raise ValueError(
                f"the cache holds coordinate positions {tuple(pos.shape)}; pass the new positions explicitly"
            )
        return pos[:, -1:] + 1 + torch.arange(length, device=pos.device, dtype=pos.dtype)

    def _check_new(self, k: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        """The cached positions and ``pos`` with one batch size."""
        if k.shape[:2] != self._k.shape[:2] or k.shape[3] != self._k.shape[3]:
            raise ValueError(f"new keys {tuple(k.shape)} must match the cached keys {tuple(self.k.shape)} in batch, "
                             "key heads and head_dim (a cache of another batch or model?)")
        old = self.pos
        if pos.shape[0] != old.shape[0]:
            b = max(pos.shape[0], old.shape[0])
            pos, old = pos.expand(b, *pos.shape[1:]), old.expand(b, *old.shape[1:])
        return old, pos

    def peek(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The history with ``k, v [B, Hkv, T, D]`` at ``pos [B or 1, T(, C)]`` appended, leaving
        the cache as it is."""
        if self._k is None:
            return k, v, pos
        old, pos = self._check_new(k, pos)
        return torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2), torch.cat((old, pos), dim=1)

    def append(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Append ``k, v [B, Hkv, T, D]`` at ``pos [B or 1, T(, C)]``; return the whole history."""
        grad = torch.is_grad_enabled() and (k.requires_grad or v.requires_grad
                                            or (self._k is not None and self._k.requires_grad))
        if self._k is None or grad:
            # the first entries (copied: later steps write into the buffer) or a history autograd follows
            k_all, v_all, pos_all = self.peek(k, v, pos)
            self._length = k_all.shape[2]
            if grad:
                self._k, self._v, self._pos = k_all, v_all, pos_all
            elif self.capacity is not None and self.capacity > self._length:
                self._k, self._v, self._pos = k_all, v_all, pos_all
                self._grow(self.capacity, pos_all)  # copies them into buffers of that capacity
            else:
                self._k, self._v, self._pos = k_all.clone(), v_all.clone(), pos_all.clone()
            self._record_append()
            return self.k, self.v, self.pos
        old, pos = self._check_new(k, pos)
        n, t = self._length, k.shape[2]
        if n + t > self._k.shape[2] or old.shape[0] != self._pos.shape[0]:
            self._grow(max(2 * self._k.shape[2], n + t), old)
        self._k[:, :, n: n + t] = k
        self._v[:, :, n: n + t] = v
        self._pos[:, n: n + t] = pos
        self._length = n + t
        self._record_append()
        return self.k, self.v, self.pos

    def _record_append(self) -> None:
        self._appends += 1
        self._stamps.append(self._appends)
        self._ends.append(self._length)

    def _grow(self, capacity: int, old_pos: Tensor) -> None:
        """New buffers of ``capacity`` entries holding the history (positions at ``old_pos``'s batch)."""
        n = self._length

        def grown(buf: Tensor, filled: Tensor, axis: int) -> Tensor:
            shape = list(filled.shape)
            shape[axis] = capacity
            out = buf.new_empty(shape)
            out.narrow(axis, 0, n).copy_(filled)
            return out

        self._k = grown(self._k, self.k, 2)
        self._v = grown(self._v, self.v, 2)
        self._pos = grown(self._pos, old_pos, 1)

    def crop(self, length: int) -> None:
        """Keep the oldest ``length`` entries (``0 <= length <= self.length``)."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self._length:
            raise ValueError(f"length must be an int in [0, {self._length}] (the cached entries); got {length!r}")
        self._length = length
        while self._ends and self._ends[-1] > length:  # the appends cut (wholly, or the newest in part)
            if len(self._ends) > 1 and self._ends[-2] >= length:
                self._stamps.pop()
                self._ends.pop()
            else:
                self._ends[-1] = length
        if length == 0:
            self._k = self._v = self._pos = None
            self._stamps.clear()
            self._ends.clear()


class TokenRows:
    """The rows ``[B, length, C]`` of the token stream at one place of a stack (the input of a
    conditional module after a block), one per cached token, cropped with the keys; ``capacity``
    as :class:`LayerKVCache`'s."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = None if capacity is None else check_int("capacity", capacity, minimum=1)
        self._rows: Tensor | None = None  # [B, capacity, C]
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def last(self, count: int, like: Tensor) -> Tensor:
        """The newest ``count`` rows ``[B, count, C]``, zeros before the first token (``like``
        gives batch, width, dtype and device)."""
        have = min(count, self._length)
        old = like.new_zeros(like.shape[0], have, like.shape[2]) if self._rows is None else (
            self._rows[:, self._length - have: self._length].to(like.dtype))
        if old.shape[0] != like.shape[0] or old.shape[2] != like.shape[2]:
            raise ValueError(f"the cache holds rows [batch={old.shape[0]}, dim={old.shape[2]}]; these are "
                             f"{tuple(like.shape)} (a cache of another model or batch?)")
        return torch.cat((like.new_zeros(like.shape[0], count - have, like.shape[2]), old), dim=1)

    def append(self, x: Tensor) -> None:
        """Append ``x [B, T, C]``, the rows of the ``T`` new tokens (concatenated, not written into
        a buffer, while a gradient flows through them, as :meth:`LayerKVCache.append` does)."""
        n, t = self._length, x.shape[1]
        if torch.is_grad_enabled() and (x.requires_grad or (self._rows is not None and self._rows.requires_grad)):
            self._rows = x if self._rows is None or n == 0 else torch.cat((self._rows[:, :n], x), dim=1)
            self._length = n + t
            return
        if self._rows is None or n + t > self._rows.shape[1]:
            first = self.capacity if self._rows is None and self.capacity is not None else 16
            grown = x.new_empty(x.shape[0], max(2 * n, n + t, first), x.shape[2])
            if n:
                grown[:, :n] = self._rows[:, :n]
            self._rows = grown
        self._rows[:, n: n + t] = x
        self._length = n + t

    def crop(self, length: int) -> None:
        """Keep the oldest ``length`` rows (:meth:`KVCache.crop` checks ``length``)."""
        self._length = min(self._length, length)
        if self._length == 0:
            self._rows = None  # a new prefill may have another batch


class KVCache:
    """One :class:`LayerKVCache` per layer of a stack, and the :class:`TokenRows` that the
    conditional modules between blocks read (:meth:`rows`); ``capacity``: the entries per sequence
    each reserves at its first append (see :class:`LayerKVCache`), None to grow by doubling."""

    def __init__(self, num_layers: int, capacity: int | None = None) -> None:
        num_layers = check_int("num_layers", num_layers, minimum=1)  # True was one layer, "2" a TypeError of <=
        self.layers = [LayerKVCache(capacity) for _ in range(num_layers)]
        self.capacity = self.layers[0].capacity  # checked there
        self._rows: dict[int, TokenRows] = {}

    def rows(self, place: int) -> TokenRows:
        """The token rows kept after block ``place`` (made on first use)."""
        return self._rows.setdefault(place, TokenRows(self.capacity))

    @property
    def length(self) -> int:
        return self.layers[0].length

    def next_positions(self, length: int, device=None) -> Tensor:
        """See :meth:`LayerKVCache.next_positions` (every layer holds the same positions)."""
        return self.layers[0].next_positions(length, device)

    def crop(self, length: int) -> None:
        """See :meth:`LayerKVCache.crop`: every layer keeps its oldest ``length`` entries."""
        for layer in self.layers:
            layer.crop(length)
        for rows in self._rows.values():
            rows.crop(length)

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)
