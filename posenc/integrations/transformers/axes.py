"""M-RoPE's three position axes through a swapped Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

transformers hands the ``(t, h, w)`` position ids of these models to their rotary embedding only
(``position_ids [3, B, T]``, once Qwen3-VL's text row, or the one of a packed Qwen2-VL batch, is
split off as row 0 of ``[4, B, T]``); the attention function gets that text row or nothing. After a
swap, :class:`AxisRotary` stands in for the rotary embedding: it returns ``cos = 1``, ``sin = 0`` as
:class:`~.families.NoRotary` does, and leaves the positions it was given on an :class:`AxisPositions`
shared with the model's attention modules, where the attention function reads them
(:func:`query_axes`, :func:`key_axes`).

The cache holds keys before their rotation, so every call needs the cached keys' positions too, and
an image's grid cannot be counted back from the last query. The cache therefore holds the positions
beside its keys and values: a :class:`KeptAxes` on the cache object (:data:`CACHE_ATTR`), the
``[B, tokens, 3]`` positions of every token it holds, by the token's index. They are tensors that
flow through the model's forward like the keys (appended in :meth:`AxisPositions.extend`, stored
back when the forward ends), so a ``torch.compile``'d forward carries them as it carries the keys,
and nothing depends on what the mask function could record (it records nothing inside a compiled
function). They follow the cache's own batch and length operations: once a cache is first seen,
its ``reorder_cache`` (beam search), ``batch_select_indices``, ``batch_repeat_interleave``,
``crop`` and ``reset`` also act on its positions (:func:`_attach`).

Where a layer's key slots sit needs no cache layout: every transformers cache layer returns, for
``total`` tokens so far, either slots holding tokens ``0 ..`` in order (dynamic, quantized and
static layers, a static layer's empty slots after them, which the mask hides) or the last ``kv_len``
tokens (sliding windows); :func:`key_axes` reads the kept positions so. A cache that held tokens
before it was first seen here (filled by another model) has no known positions: the attention
function then counts the keys back from the last query on each axis, which is right for text that
follows text. One forward at a time per model: the positions of a forward are the model's until
the next one begins (transformers' own ``rope_deltas`` are kept on the model likewise).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .families import NoRotary
from .masks import CacheLayout

AXES_ATTR = "_posenc_axes"  # an attention module's AxisPositions (a plain attribute, not a submodule)
CACHE_ATTR = "_posenc_axis_positions"  # a cache's KeptAxes
# The cache operations that change which tokens (rows, lengths) its keys hold.
FOLLOWED = ("reorder_cache", "batch_select_indices", "batch_repeat_interleave", "crop", "reset")


def as_axes(position_ids: Tensor) -> Tensor:
    """``[3 or 1, B, T]`` (t, h, w rows; one row serves all three) -> ``[B, T, 3]``, a view."""
    return position_ids.expand(3, -1, -1).permute(1, 2, 0)


class KeptAxes:
    """The ``(t, h, w)`` positions of every token a cache holds: ``positions [B or 1, tokens, 3]`` by
    the token's index (None: no token yet), or ``known=False`` when the cache holds tokens whose
    positions were never seen. Each method mirrors the cache method of the same name; positions of
    one row (the same for every row of the cache) are left as they are by the row operations."""

    def __init__(self, positions: Tensor | None = None, known: bool = True) -> None:
        self.positions = positions
        self.known = known

    def _rows(self) -> bool:
        return self.positions is not None and self.positions.shape[0] > 1

    def reorder_cache(self, beam_idx: Tensor) -> None:
        if self._rows():
            self.positions = self.positions.index_select(0, beam_idx.to(self.positions.device))

    def batch_select_indices(self, indices: Tensor) -> None:
        if self._rows():
            index = indices.to(self.positions.device) if isinstance(indices, Tensor) else indices
            self.positions = self.positions[index]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._rows():
            self.positions = self.positions.repeat_interleave(repeats, dim=0)

    def crop(self, tokens_to_remove: int) -> None:
        """transformers 5's ``Cache.crop(tokens_to_remove)``: a negative count of tokens to drop from
        the end. Its layers refuse a positive count (the legacy length to keep) before this runs, and
        ``crop(0)`` (a sliding layer trimming its window) drops no token of the sequence."""
        if self.positions is not None and tokens_to_remove < 0:
            self.positions = self.positions[:, :tokens_to_remove]

    def reset(self) -> None:
        self.positions, self.known = None, True


class _Following:
    """A cache's method that also acts on its :class:`KeptAxes`, set on the cache object itself (the
    class and other caches are untouched). Plain state, not a bound closure: ``copy.deepcopy`` of the
    cache gives the copy one that acts on the copy, and the cache still pickles."""

    def __init__(self, cache: Any, name: str) -> None:
        self.cache, self.name = cache, name

    def __call__(self, *args, **kwargs):
        out = getattr(type(self.cache), self.name)(self.cache, *args, **kwargs)  # the class's own (may refuse)
        getattr(getattr(self.cache, CACHE_ATTR), self.name)(*args, **kwargs)
        return out


@torch.compiler.disable  # runs once per cache, eagerly: it reads the cache's length and sets attributes
def _attach(cache: Any, positions: Tensor | None) -> KeptAxes:
    """Give ``cache`` its :class:`KeptAxes`: ``positions`` for a cache made inside this forward, else
    none (known if the cache is empty), and make its :data:`FOLLOWED` methods act on them too."""
    if positions is not None:
        kept = KeptAxes(positions)
    else:
        length = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
        kept = KeptAxes(known=int(length) == 0)
    setattr(cache, CACHE_ATTR, kept)
    for name in FOLLOWED:
        if callable(getattr(type(cache), name, None)):
            setattr(cache, name, _Following(cache, name))
    return kept


def kept_axes(cache: Any) -> KeptAxes:
    """The positions ``cache`` holds (given them on first sight)."""
    kept = getattr(cache, CACHE_ATTR, None)
    return kept if kept is not None else _attach(cache, None)


class AxisPositions:
    """The ``(t, h, w)`` positions of one forward (``current``, ``[B, T, 3]``), the positions its
    cache held when it began (``kept``), and those of every token once this forward's are appended
    (``extended``, ``[B, tokens, 3]``; None when the cached ones are unknown), shared by a model's
    :class:`AxisRotary` and its attention modules."""

    def __init__(self) -> None:
        self.current: Tensor | None = None
        self.kept: KeptAxes | None = None
        self.extended: Tensor | None = None

    def begin(self, cache: Any) -> None:
        self.current, self.extended = None, None
        self.kept = None if cache is None else kept_axes(cache)

    def extend(self, current: Tensor) -> None:
        """This forward's positions (from the rotary, before any layer runs), appended to the kept ones."""
        self.current = current
        if self.kept is not None and not self.kept.known:
            self.extended = None
            return
        past = None if self.kept is None else self.kept.positions
        if past is None:
            self.extended = current
        else:
            batch = max(past.shape[0], current.shape[0])
            self.extended = torch.cat([past.expand(batch, -1, -1), current.to(past.dtype).expand(batch, -1, -1)],
                                      dim=1)

    def finish(self, cache: Any) -> None:
        """After the forward: the cache holds the positions of its tokens (unknown if this forward
        could not place its own). ``current`` stays for a gradient-checkpointed layer run again in
        the backward pass."""
        if cache is not None:
            if self.kept is None:  # a cache made inside the forward: it holds this forward's tokens
                if getattr(cache, CACHE_ATTR, None) is None:
                    _attach(cache, self.extended)
            elif self.extended is None:
                self.kept.known = False
            else:
                self.kept.positions = self.extended
        self.kept, self.extended = None, None


class AxisRotary(NoRotary):
    """A Qwen-VL rotary embedding after a swap: ``cos = 1``, ``sin = 0`` (:class:`NoRotary`), and the
    positions it is given (``[3 or 1, B, T]``, or ``[B, T]`` for text) left on ``axes``."""

    def __init__(self, head_dim: int, axes: AxisPositions) -> None:
        super().__init__(head_dim)
        self.axes = axes

    def forward(self, x: Tensor, position_ids: Tensor, *rest) -> tuple[Tensor, Tensor]:
        pos = position_ids
        if pos.dim() == 1:
            pos = pos.unsqueeze(0)
        self.axes.extend(as_axes(pos if pos.dim() == 3 else pos.unsqueeze(0)))
        return super().forward(x, position_ids, *rest)


def _cache_of(args: tuple, kwargs: dict) -> Any:
    """The cache a text model's forward was given: by name (``cache``, or the older
    ``past_key_values``), else the fourth positional argument, as the Qwen-VL text models order them."""
    for name in ("cache", "past_key_values"):
        if kwargs.get(name) is not None:
            return kwargs[name]
    return args[3] if len(args) > 3 else None


def begin_forward(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a swapped Qwen-VL text model."""
    module.rotary_emb.axes.begin(_cache_of(args, kwargs))


def finish_forward(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    """Forward hook of a swapped Qwen-VL text model: the output names the cache (one made inside the
    forward included)."""
    cache = getattr(output, "cache", None)
    module.rotary_emb.axes.finish(cache if cache is not None else _cache_of(args, kwargs))


def query_axes(axes: AxisPositions | None, given: Tensor | None, text: Tensor, q_len: int) -> Tensor:
    """``[B or 1, Tq, 3]``: positions passed to the attention function (``given``, ``[B, Tq, 3]``),
    else this forward's from the rotary, else the text positions ``text [B or 1, Tq]`` on all axes."""
    if given is not None:
        return given
    if axes is not None and axes.current is not None and axes.current.shape[1] == q_len:
        return axes.current
    return text.unsqueeze(-1).expand(-1, -1, 3)


def key_axes(axes: AxisPositions | None, q_axes: Tensor, layout: CacheLayout | None, kv_len: int) -> Tensor | None:
    """``[B, Tk, 3]``: the keys' positions, the cached ones from the positions the cache holds (see
    the module docstring for the slots). None when the cached ones are not all known, or when a
    recorded ``layout`` says the cache holds other tokens than those positions."""
    q_len = q_axes.shape[1]
    if kv_len == q_len:
        return q_axes
    known = None if axes is None else axes.extended
    if known is None or known.shape[1] < q_len:
        return None
    total = known.shape[1]
    if layout is not None and layout.q_offset + q_len != total:
        return None
    if q_axes is not axes.current:  # positions passed to the attention function itself
        batch = max(known.shape[0], q_axes.shape[0])
        known = torch.cat([known[:, :total - q_len].expand(batch, -1, -1),
                           q_axes.to(known.dtype).expand(batch, -1, -1)], dim=1)
    if kv_len < total:  # a sliding window: the last kv_len tokens
        return known[:, total - kv_len:]
    if kv_len > total:  # a static layer's empty slots (masked)
        return torch.cat([known, known.new_zeros(known.shape[0], kv_len - total, known.shape[2])], dim=1)
    return known


__all__ = ["AXES_ATTR", "CACHE_ATTR", "FOLLOWED", "as_axes", "KeptAxes", "kept_axes", "AxisPositions", "AxisRotary",
           "begin_forward", "finish_forward", "query_axes", "key_axes"]
