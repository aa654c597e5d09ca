"""Attention masks: causal, key padding, block-diagonal (packed sequences, batches of graphs),
sliding window.

One mask is one boolean function ``allowed(b, h, q_idx, kv_idx)``; it becomes a dense boolean
mask for SDPA and the math path, or a FlexAttention ``BlockMask`` on CUDA. Build one mask object
per forward pass and hand it to every layer: the block mask is then computed once. Causal masks
are aligned bottom-right, the KV-cache convention (new queries come after the cached keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from .checks import check_bool, check_int
from .pairwise import take

MaskFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
MAX_PACKED_RUNS = 4096  # more runs than this: one masked call beats that many small ones


def _check_2d(name: str, t: Tensor, batch: int, length: int, what: str) -> None:
    if t.dim() != 2 or t.shape[0] not in (1, batch) or t.shape[1] != length:
        raise ValueError(
            f"{name} must have shape [batch={batch} or 1, {what}={length}], got {tuple(t.shape)}"
        )


@dataclass(eq=False)
class AttentionMask:
    """Which keys each query may attend to.

    Args:
        causal: query ``i`` sees keys ``j <= i + (Tk - Tq)`` (bottom-right aligned).
        key_valid: ``[B, Tk]`` bool, True for real keys and False for padding.
        q_segments: ``[B, Tq]`` integer segment (document, graph) id of each query.
        kv_segments: ``[B, Tk]`` segment id of each key; a query sees only keys of its own
            segment (block-diagonal attention). Give both or neither; ``AttentionMask.packed``
            fills both from one tensor for self-attention.
        window: sliding window: key ``j`` is visible from query ``i`` when
            ``|i + (Tk - Tq) - j| < window`` (with ``causal``, only the past side remains).
    """

    causal: bool = False
    key_valid: Tensor | None = None
    q_segments: Tensor | None = None
    kv_segments: Tensor | None = None
    window: int | None = None
    _block_masks: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)
        for name in ("key_valid", "q_segments", "kv_segments"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{name} must be a tensor or None; got {type(value).__name__}")
        if (self.q_segments is None) != (self.kv_segments is None):
            raise ValueError("q_segments and kv_segments must be given together (or use AttentionMask.packed)")
        if self.key_valid is not None and self.key_valid.dtype != torch.bool:
            raise ValueError(f"key_valid must be a bool tensor (True = real token), got dtype {self.key_valid.dtype}")
        for name in ("q_segments", "kv_segments"):
            seg = getattr(self, name)
            if seg is not None and (seg.dtype.is_floating_point or seg.dtype.is_complex or seg.dtype == torch.bool):
                raise ValueError(f"{name} must be an integer tensor of segment ids, got dtype {seg.dtype}")
        if self.window is not None:
            check_int("window", self.window, minimum=1)

    def __repr__(self) -> str:
        """Only what is set, tensors as their shapes: ``AttentionMask(causal=True, key_valid=[2, 64])``."""
        parts = [] if not self.causal else ["causal=True"]
        for name in ("key_valid", "q_segments", "kv_segments"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}=[{', '.join(map(str, value.shape))}]")
        if self.window is not None:
            parts.append(f"window={self.window}")
        return f"AttentionMask({', '.join(parts)})"

    @classmethod
    def packed(cls, segments: Tensor, *, causal: bool = False, key_valid: Tensor | None = None) -> "AttentionMask":
        """Block-diagonal self-attention mask for packed sequences: ``segments`` is ``[B, T]``."""
        return cls(causal=causal, key_valid=key_valid, q_segments=segments, kv_segments=segments)

    @property
    def is_empty(self) -> bool:
        return not self.causal and self.key_valid is None and self.q_segments is None and self.window is None

    @property
    def per_batch(self) -> bool:
        return self.key_valid is not None or self.q_segments is not None

    @property
    def only_key_padding(self) -> bool:
        """True when only ``key_valid`` is set: a ``[B, 1, 1, Tk]`` mask then suffices."""
        return self.key_valid is not None and not self.causal and self.q_segments is None and self.window is None

    @property
    def plain(self) -> bool:
        """True when the mask is at most the causal rule: no padding, segments or window, so it
        depends on the query and key indices alone."""
        return self.key_valid is None and self.q_segments is None and self.window is None

    @property
    def causal_alone(self) -> bool:
        """True when the mask is the causal rule and nothing else (bottom-right aligned)."""
        return self.causal and self.plain

    def hides_nothing(self, q_len: int) -> bool:
        """True when every query sees every key: no mask at all, or a causal mask alone over one
        query row (bottom-right aligned: the last position sees the whole prefix, as in each
        step of cached decoding)."""
        return self.is_empty or (self.causal_alone and q_len == 1)

    def only_causal(self, q_len: int, kv_len: int) -> bool:
        """True when the mask is exactly SDPA's ``is_causal=True`` (top-left aligned, square)."""
        return self.causal_alone and q_len == kv_len

    def zero_padding(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        """``tensors`` (``[B, H, Tk, ...]``: keys, values, their features) with the padded keys
        (``key_valid`` False) set to zero, so that whatever a padded slot holds (NaN, inf, stale
        data) never reaches a real row: a masked score is ``-inf`` only after ``q.k`` is computed,
        and ``0 * NaN`` in ``P V`` is NaN. The gradient at padded slots is zero. Unchanged
        without ``key_valid``."""
        if self.key_valid is None:
            return tensors
        keep = self.key_valid[:, None, :, None]  # [B or 1, 1, Tk, 1]
        return tuple(torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device)) for t in tensors)

    def validate(self, batch: int, q_len: int, kv_len: int) -> None:
        if self.key_valid is not None:
            _check_2d("mask.key_valid", self.key_valid, batch, kv_len, "keys")
        if self.q_segments is not None:
            _check_2d("mask.q_segments", self.q_segments, batch, q_len, "queries")
            _check_2d("mask.kv_segments", self.kv_segments, batch, kv_len, "keys")

    def fn(self, q_len: int, kv_len: int) -> MaskFn:
        """``allowed(b, h, q_idx, kv_idx) -> bool tensor``, usable densely and as a flex ``mask_mod``."""
        offset = kv_len - q_len
        causal, window = self.causal, self.window
        key_valid, q_seg, kv_seg = self.key_valid, self.q_segments, self.kv_segments

        def allowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            ok = torch.ones_like(q_idx, dtype=torch.bool) & torch.ones_like(kv_idx, dtype=torch.bool)
            if causal:
                ok = ok & (kv_idx <= q_idx + offset)
            if window is not None:
                dist = q_idx + offset - kv_idx
                ok = ok & (dist < window) & (dist > -window)
            if key_valid is not None:
                ok = ok & take(key_valid, b, kv_idx)
            if q_seg is not None:
                ok = ok & (take(q_seg, b, q_idx) == take(kv_seg, b, kv_idx))
            return ok

        return allowed

    def dense(self, batch: int, q_idx: Tensor, kv_idx: Tensor, q_len: int, kv_len: int) -> Tensor | None:
        """Boolean ``[B or 1, 1, len(q_idx), len(kv_idx)]`` (True = attend), or None if nothing is masked."""
        if self.is_empty:
            return None
        device = q_idx.device
        b = torch.arange(batch if self.per_batch else 1, device=device).view(-1, 1, 1, 1)
        h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
        return self.fn(q_len, kv_len)(b, h, q_idx.view(1, 1, -1, 1), kv_idx.view(1, 1, 1, -1))

    def smallest_dense(self, batch: int, q_len: int, kv_len: int, device) -> Tensor:
        """The whole mask as the smallest boolean tensor SDPA broadcasts: ``[B, 1, 1, Tk]`` for
        key padding alone (no ``T x T`` tensor), else ``[B or 1, 1, Tq, Tk]``."""
        if self.only_key_padding:
            return self.key_valid[:, None, None, :]
        return self.dense(batch, torch.arange(q_len, device=device), torch.arange(kv_len, device=device), q_len, kv_len)

    def allowed(self, batch: int, q_idx: Tensor, kv_idx: Tensor, q_len: int, kv_len: int) -> Tensor | None:
        """:meth:`dense` at these indices, or None where every query sees every key
        (:meth:`hides_nothing`: no mask tensor, no masked softmax)."""
        if self.hides_nothing(q_len):
            return None
        return self.dense(batch, q_idx, kv_idx, q_len, kv_len)

    def packed_runs(self, batch: int, q_len: int, kv_len: int) -> list[tuple[int, int]] | None:
        """``[(start, stop), ...]``: the runs of one packed batch row whose segments are contiguous
        (a PyG batch: each graph's nodes together), when the mask is those segments alone over the
        same queries and keys; None otherwise. Each run then attends only to itself, so the
        ``T x T`` mask and the work on pairs across runs are never made. Reads the segments (a
        host sync), so never while ``torch.compile`` traces."""
        if (self.q_segments is None or self.kv_segments is not self.q_segments or self.causal or self.window is not None
                or self.key_valid is not None or batch != 1 or q_len != kv_len or q_len == 0
                or torch.compiler.is_compiling()):
            return None
        ids, counts = torch.unique_consecutive(self.q_segments[0], return_counts=True)
        if ids.numel() > MAX_PACKED_RUNS or (ids.numel() > 1 and torch.unique(ids).numel() != ids.numel()):
            return None  # too many runs, or a segment id in two places: not contiguous runs
        stops = torch.cumsum(counts, 0).tolist()
        return list(zip([0, *stops[:-1]], stops))

    def block_mask(self, batch: int, q_len: int, kv_len: int, device: torch.device):
        """FlexAttention ``BlockMask`` (computed once per mask object, length and device)."""
        from torch.nn.attention.flex_attention import create_block_mask

        key = (batch, q_len, kv_len, str(device))
        if key not in self._block_masks:
            if len(self._block_masks) >= 4:  # one mask reused across decoding steps: keep the latest few
                self._block_masks.pop(next(iter(self._block_masks)))
            fn = self.fn(q_len, kv_len)
            # Compiled on CUDA so that no dense [Tq, Tk] mask is ever materialised.
            self._block_masks[key] = create_block_mask(
                fn, batch if self.per_batch else None, None, q_len, kv_len, device=device,
                _compile=torch.device(device).type == "cuda",
            )
        return self._block_masks[key]


def allowed_of(mask: AttentionMask | None, batch: int, q_idx: Tensor, kv_idx: Tensor, q_len: int,
               kv_len: int) -> Tensor | None:
    """:meth:`AttentionMask.allowed` of ``mask``, or None without a mask."""
    return None if mask is None else mask.allowed(batch, q_idx, kv_idx, q_len, kv_len)


def causal_of(mask: AttentionMask | None) -> bool:
    """Whether ``mask`` has the causal rule (a chunk of rows then stops at its last visible key)."""
    return mask is not None and mask.causal


def per_batch_of(mask: AttentionMask | None) -> bool:
    """Whether ``mask`` differs between the sequences of the batch."""
    return mask is not None and mask.per_batch
