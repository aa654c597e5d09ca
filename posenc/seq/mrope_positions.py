"""M-RoPE's position ids for a mixed sequence of text, images and videos: a pure function of the
token types and the grids, as Qwen2-VL, Qwen2.5-VL and Qwen3-VL build them (transformers'
``get_rope_index``), without model state.

Per batch row, the tokens form runs of one type (0 text, 1 image, 2 video):

* a text run of ``n`` tokens takes ``p, p+1, ..., p+n-1`` on all three axes, ``p`` the current
  start, which then moves to ``p + n``;
* an image or video block of grid ``(t, h, w)`` (the vision encoder's patch grid; the language
  model sees ``(t, h/m, w/m)`` tokens after merging ``m x m`` patches, ``spatial_merge_size``)
  takes ``(p + floor(i * dt), p + row, p + col)`` for frame ``i``, in raster order (time outermost),
  where ``dt = tokens_per_second * seconds_per_grid`` (Qwen2.5-VL's absolute time) or 1; the next
  start is one past the block's largest index (``text_after="largest"``: Qwen2-VL's and Qwen2.5-VL's
  code, transformers 4) or ``p + max(h, w) / m`` (``"spatial"``: transformers 5's
  ``get_rope_index``); the two agree for an image (``t = 1``, ``dt = 1``) and differ for videos;
* a run of vision tokens holds one block or several back to back, each taking the next grid of
  its kind (grids are read in order across the batch); ``split_video_frames=True`` cuts each video
  into ``t`` one-frame blocks first (Qwen3-VL, whose frames are separated by timestamps).

Padding (``attention_mask``, left or right) is skipped: real tokens are numbered as if it were
not there, padded ones get 0. Packed sequences (``segments``, ids per token as
:meth:`posenc.AttentionMask.packed` takes them) start again at 0 at each new segment.

``rope_deltas [B, 1]`` is the next position minus the number of real tokens of the row (the last
segment's next position, for a packed row): decoding continues at ``tokens seen + delta`` on
every axis (:func:`mrope_next_positions`), as transformers decodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..common.checks import check_bool, check_choice, check_int, check_number

TEXT, IMAGE, VIDEO = 0, 1, 2
TEXT_AFTER = ("largest", "spatial")


class MRopePositions(NamedTuple):
    """``ids`` ``(3, B, L)`` long (time, height, width; transformers' layout) and ``rope_deltas``
    ``[B, 1]`` long. ``positions`` is ``ids`` in posenc's layout, ``[B, L, 3]``."""

    ids: Tensor
    rope_deltas: Tensor

    @property
    def positions(self) -> Tensor:
        return self.ids.permute(1, 2, 0)


def _grids(name: str, grids: Tensor | Sequence[Sequence[int]] | None) -> list[tuple[int, int, int]]:
    if grids is None:
        return []
    rows = grids.tolist() if isinstance(grids, Tensor) else grids
    if not isinstance(rows, (list, tuple)) or not all(
            isinstance(r, (list, tuple)) and len(r) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                  for v in r) for r in rows):
        raise TypeError(f"{name} must be [N, 3] integer grids (t, h, w); got {grids!r}")
    if any(v < 1 for r in rows for v in r):
        raise ValueError(f"{name} must be positive; got {rows}")
    return [tuple(r) for r in rows]  # type: ignore[misc]


def _row_mask(name: str, mask: Tensor | None, shape: tuple[int, int], bool_ok: bool) -> Tensor | None:
    if mask is None:
        return None
    kinds = "bool or integer" if bool_ok else "integer"
    if not isinstance(mask, Tensor) or tuple(mask.shape) != shape or mask.is_floating_point() \
            or (mask.dtype == torch.bool and not bool_ok):
        got = f"{tuple(mask.shape)} {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a {list(shape)} {kinds} tensor like token_types; got {got}")
    return mask


def _runs(values: list[tuple[int, int]]) -> list[tuple[tuple[int, int], int, int]]:
    """``(value, start, end)`` of each run of equal values."""
    runs, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((values[start], start, i))
            start = i
    return runs


def mrope_position_ids(
    token_types: Tensor,
    *,
    image_grids: Tensor | Sequence[Sequence[int]] | None = None,
    video_grids: Tensor | Sequence[Sequence[int]] | None = None,
    spatial_merge_size: int = 1,
    tokens_per_second: float | None = None,
    seconds_per_grid: Tensor | Sequence[float] | None = None,
    split_video_frames: bool = False,
    attention_mask: Tensor | None = None,
    segments: Tensor | None = None,
    text_after: str = "largest",
) -> MRopePositions:
    """M-RoPE ids ``(3, B, L)`` and ``rope_deltas [B, 1]`` of a mixed sequence (module docstring).

    Args:
        token_types: ``[B, L]`` integers, 0 text, 1 image, 2 video (transformers' ``mm_token_type_ids``).
        image_grids, video_grids: ``[N, 3]`` ``(t, h, w)`` per image / video, in order of appearance
            across the batch (``image_grid_thw``, ``video_grid_thw``).
        spatial_merge_size: ``m``, patches merged per side before the language model (2 in Qwen2-VL).
        tokens_per_second: Qwen2.5-VL's time scale; with it a video's frames are ``tokens_per_second
            * seconds_per_grid`` apart (None: 1 apart, Qwen2-VL and Qwen3-VL).
        seconds_per_grid: per video, seconds between frames of the grid (``second_per_grid_ts``;
            None: 1 each).
        split_video_frames: each video frame its own block (Qwen3-VL).
        attention_mask: ``[B, L]`` bool or 0/1, True for real tokens (None: all real).
        segments: ``[B, L]`` integer segment ids of packed sequences (None: one per row).
        text_after: "largest" or "spatial", where text resumes after a vision block.
    """
    if not isinstance(token_types, Tensor) or token_types.dim() != 2 or token_types.is_floating_point() \
            or token_types.dtype == torch.bool:
        raise TypeError(f"token_types must be a [batch, length] integer tensor (0 text, 1 image, 2 video); got "
                        f"{tuple(token_types.shape) if isinstance(token_types, Tensor) else type(token_types).__name__}")
    bad = sorted(set(token_types.unique().tolist()) - {TEXT, IMAGE, VIDEO})
    if bad:
        raise ValueError(f"token_types must hold 0 (text), 1 (image) or 2 (video); got {bad}")
    check_int("spatial_merge_size", spatial_merge_size, minimum=1)
    check_bool("split_video_frames", split_video_frames)
    check_choice("text_after", text_after, TEXT_AFTER)
    if tokens_per_second is not None:
        check_number("tokens_per_second", tokens_per_second, minimum=0.0, strict=True)
    shape = tuple(token_types.shape)
    mask = _row_mask("attention_mask", attention_mask, shape, bool_ok=True)
    segs = _row_mask("segments", segments, shape, bool_ok=False)
    images, videos = _grids("image_grids", image_grids), _grids("video_grids", video_grids)
    seconds = _seconds(seconds_per_grid, len(videos))
    blocks = {IMAGE: [(g, 1) for g in images], VIDEO: []}
    for i, (t, h, w) in enumerate(videos):
        dt = 1 if tokens_per_second is None else tokens_per_second * (1 if seconds is None else seconds[i])
        blocks[VIDEO] += [((1, h, w), dt)] * t if split_video_frames else [((t, h, w), dt)]
    for kind, name in ((IMAGE, "image_grids"), (VIDEO, "video_grids")):
        for (t, h, w), _ in blocks[kind]:
            if h % spatial_merge_size or w % spatial_merge_size:
                raise ValueError(f"{name}: grid {(t, h, w)} has h or w not divisible by spatial_merge_size="
                                 f"{spatial_merge_size}")
    used = {IMAGE: 0, VIDEO: 0}
    ids = torch.zeros(3, *shape, dtype=torch.long)
    deltas = torch.zeros(shape[0], 1, dtype=torch.long)
    for b in range(shape[0]):
        real = torch.ones(shape[1], dtype=torch.bool) if mask is None else mask[b].bool().cpu()
        types = token_types[b].cpu()[real].tolist()
        seg = [0] * len(types) if segs is None else segs[b].cpu()[real].tolist()
        row, next_start = _row_ids(b, list(zip(seg, types)), blocks, used, spatial_merge_size, text_after)
        ids[:, b, real] = row
        deltas[b, 0] = next_start - len(types)
    for kind, name in ((IMAGE, "image"), (VIDEO, "video")):
        if used[kind] != len(blocks[kind]):
            raise ValueError(f"{len(blocks[kind])} {name} blocks were given but the token types hold {used[kind]}")
    return MRopePositions(ids.to(token_types.device), deltas.to(token_types.device))


def _seconds(seconds: Tensor | Sequence[float] | None, count: int) -> list | None:
    if seconds is None:
        return None
    values = seconds if isinstance(seconds, Tensor) else torch.tensor(seconds, dtype=torch.float32)
    if values.dim() != 1 or values.numel() != count or not values.is_floating_point():
        raise ValueError(f"seconds_per_grid must hold one number per video ({count}); got {seconds!r}")
    if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
        raise ValueError(f"seconds_per_grid must be finite and >= 0; got {values.tolist()}")
    return list(values)  # 0-d tensors: the interval keeps their dtype, as transformers computes it


def _row_ids(b: int, tokens: list[tuple[int, int]], blocks: dict, used: dict, m: int,
             text_after: str) -> tuple[Tensor, int]:
    """One row's ``(3, n)`` ids (its real tokens) and the next position of its last segment."""
    parts, start, segment = [], 0, None
    for (seg, kind), lo, hi in _runs(tokens):
        if seg != segment:
            segment, start = seg, 0
        if kind == TEXT:
            parts.append(torch.arange(start, start + hi - lo).expand(3, -1))
            start += hi - lo
            continue
        left = hi - lo
        while left > 0:
            if used[kind] >= len(blocks[kind]):
                what = "image" if kind == IMAGE else "video"
                raise ValueError(f"row {b}: the {what} tokens at {lo}..{hi - 1} (real-token indices) need more {what} "
                                 f"grids than the {len(blocks[kind])} given")
            (t, h, w), dt = blocks[kind][used[kind]]
            used[kind] += 1
            h, w = h // m, w // m
            block = _vision_ids(t, h, w, dt, start)
            if block.shape[1] > left:
                raise ValueError(f"row {b}: a grid {(t, h * m, w * m)} gives {block.shape[1]} tokens but its run at "
                                 f"{lo}..{hi - 1} has {left} left")
            parts.append(block)
            left -= block.shape[1]
            start = int(block.max()) + 1 if text_after == "largest" else start + max(h, w)
    row = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
    last = row[:, [i for i, (s, _) in enumerate(tokens) if s == segment]] if tokens else row
    return row, (int(last.max()) + 1 if last.numel() else 0)


def _vision_ids(t: int, h: int, w: int, dt, start: int) -> Tensor:
    """``(3, t*h*w)``: frame times ``floor(i * dt)`` (transformers truncates the product), rows,
    columns, each plus ``start``, raster order with time outermost."""
    times = (torch.arange(t) * dt).long() + start
    rows, cols = torch.arange(h) + start, torch.arange(w) + start
    grid = torch.meshgrid(times, rows, cols, indexing="ij")
    return torch.stack(grid).reshape(3, -1)


def mrope_next_positions(rope_deltas: Tensor, tokens_seen: Tensor | int, steps: int = 1) -> Tensor:
    """The positions ``[B, steps, 3]`` of the next ``steps`` tokens of each row after
    ``tokens_seen`` real tokens (an int, or ``[B]``): ``tokens_seen + i + delta`` on every axis,
    the form a :class:`~posenc.KVCache` filled with ``[B, T, 3]`` positions takes next."""
    check_int("steps", steps, minimum=1)
    if not isinstance(rope_deltas, Tensor) or rope_deltas.dim() != 2 or rope_deltas.shape[1] != 1:
        raise ValueError(f"rope_deltas must be [batch, 1]; got {rope_deltas!r}")
    seen = torch.as_tensor(tokens_seen, device=rope_deltas.device).reshape(-1, 1)
    pos = seen + torch.arange(steps, device=rope_deltas.device) + rope_deltas  # [B, steps]
    return pos.unsqueeze(-1).expand(-1, -1, 3)


__all__ = ["TEXT", "IMAGE", "VIDEO", "TEXT_AFTER", "MRopePositions", "mrope_position_ids", "mrope_next_positions"]
