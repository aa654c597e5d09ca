"""KV cache for incremental decoding. It is an explicit argument, never module state."""

from __future__ import annotations

import torch
from torch import Tensor


class LayerKVCache:
    """Keys, values and key positions seen so far by one attention layer.

    Keys are stored after the encoding's q/k transform, so each is transformed once, at its own
    position; positions are kept for score biases over the whole history.

    ``conditional``: what the conditional module after this layer (the ``conditional`` slot of
    :class:`~posenc.common.block.TransformerEncoder`) keeps of the past, or None before its first
    call; for a causal 1D PEG its last ``kernel_size - 1`` inputs ``[B, k - 1, C]``.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.pos: Tensor | None = None
        self.conditional: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def next_positions(self, length: int, device=None) -> Tensor:
        """Default positions of ``length`` new tokens: they continue after the last cached position
        (``0 .. length-1`` for an empty cache). ``[B or 1, length]``."""
        if self.pos is None:
            return torch.arange(length, device=device).unsqueeze(0)
        if self.pos.dim() != 2:
            raise ValueError(
                f"the cache holds coordinate positions {tuple(self.pos.shape)}; pass the new positions explicitly"
            )
        return self.pos[:, -1:] + 1 + torch.arange(length, device=self.pos.device, dtype=self.pos.dtype)

    def peek(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The history with ``k, v [B, Hkv, T, D]`` at ``pos [B or 1, T(, C)]`` appended, leaving
        the cache as it is."""
        if self.k is None:
            return k, v, pos
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
            raise ValueError(f"cached keys are {tuple(self.k.shape)}; new keys {tuple(k.shape)} do not match")
        old = self.pos
        if pos.shape[0] != old.shape[0]:
            b = max(pos.shape[0], old.shape[0])
            pos, old = pos.expand(b, *pos.shape[1:]), old.expand(b, *old.shape[1:])
        return torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2), torch.cat((old, pos), dim=1)

    def append(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Append ``k, v [B, Hkv, T, D]`` at ``pos [B or 1, T(, C)]``; return the whole history."""
        self.k, self.v, self.pos = self.peek(k, v, pos)
        return self.k, self.v, self.pos


class KVCache:
    """One :class:`LayerKVCache` per layer of a stack."""

    def __init__(self, num_layers: int) -> None:
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive, got {num_layers}")
        self.layers = [LayerKVCache() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def next_positions(self, length: int, device=None) -> Tensor:
        """See :meth:`LayerKVCache.next_positions` (every layer holds the same positions)."""
        return self.layers[0].next_positions(length, device)

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)
