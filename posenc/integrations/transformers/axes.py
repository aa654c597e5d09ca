"""M-RoPE's three position axes through a swapped Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

transformers hands the ``(t, h, w)`` position ids of these models to their rotary embedding only
(``position_ids [3, B, T]``, once Qwen3-VL's text row, or the one of a packed Qwen2-VL batch, is
split off as row 0 of ``[4, B, T]``); the attention function gets that text row or nothing. After a
swap, :class:`AxisRotary` stands in for the rotary embedding: it returns ``cos = 1``, ``sin = 0`` as
:class:`~.families.NoRotary` does, and leaves the positions it was given on an :class:`AxisPositions`
shared with the model's attention modules, where the attention function reads them
(:func:`query_axes`, :func:`key_axes`).

The cache holds keys before their rotation, so every call needs the cached keys' positions too, and
an image's grid cannot be counted back from the last query. :class:`AxisPositions` therefore keeps
the positions of every token of the sequence so far (``[B, tokens, 3]``, by the token's index), and
the text model's forward hooks carry them on the cache object between calls (:data:`CACHE_ATTR`), so
two generations with two caches never mix, and a cache cut back reads the prefix it kept. A call
whose cached keys' positions are not all known -- a mask that records no cache layout (made inside
``torch.compile``), a cache filled elsewhere -- gets None from :func:`key_axes`, and the attention
function counts the keys back from the last query on each axis, which is right for text that
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
CACHE_ATTR = "_posenc_axis_positions"  # a cache's [B, tokens, 3] positions, kept between calls


def as_axes(position_ids: Tensor) -> Tensor:
    """``[3 or 1, B, T]`` (t, h, w rows; one row serves all three) -> ``[B, T, 3]``, a view."""
    return position_ids.expand(3, -1, -1).permute(1, 2, 0)


class AxisPositions:
    """The ``(t, h, w)`` positions of one forward (``current``, ``[B, T, 3]``) and of every token of
    the sequence so far (``history`` when the forward began, ``extended`` with this forward's tokens
    once an attention call has placed them), shared by a model's :class:`AxisRotary` and its
    attention modules."""

    def __init__(self) -> None:
        self.current: Tensor | None = None
        self.history: Tensor | None = None
        self.extended: Tensor | None = None

    def begin(self, cache: Any) -> None:
        self.current, self.extended = None, None
        self.history = None if cache is None else getattr(cache, CACHE_ATTR, None)

    def finish(self, cache: Any) -> None:
        """After the forward: the cache keeps the positions of its tokens, or none when this forward
        could not place its own (the cache moved on without them). ``current`` stays for a
        gradient-checkpointed layer run again in the backward pass."""
        if cache is not None:
            if self.extended is None:
                if hasattr(cache, CACHE_ATTR):
                    delattr(cache, CACHE_ATTR)
            else:
                setattr(cache, CACHE_ATTR, self.extended)
        self.history, self.extended = None, None


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
        self.axes.current = as_axes(pos if pos.dim() == 3 else pos.unsqueeze(0))
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
    """``[B, Tk, 3]``: the keys' positions, the cached ones from the positions kept for the cache;
    records this call's in ``axes.extended``. None when the cached ones are not all known."""
    q_len = q_axes.shape[1]
    if axes is None or layout is None:
        return q_axes if kv_len == q_len else None
    total = layout.q_offset + q_len
    known = axes.extended
    if known is None or known.shape[1] != total:
        history = axes.history
        if layout.q_offset == 0:
            known = q_axes
        elif history is None or history.shape[1] < layout.q_offset:
            return q_axes if kv_len == q_len else None
        else:
            past = history[:, :layout.q_offset]
            batch = max(past.shape[0], q_axes.shape[0])
            known = torch.cat([past.expand(batch, -1, -1), q_axes.to(past.dtype).expand(batch, -1, -1)], dim=1)
        axes.extended = known
    return known[:, layout.kv_offset:layout.kv_offset + kv_len]


__all__ = ["AXES_ATTR", "CACHE_ATTR", "as_axes", "AxisPositions", "AxisRotary", "begin_forward", "finish_forward",
           "query_axes", "key_axes"]
