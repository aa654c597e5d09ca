"""Reference sequence models built on the shared encoder stack."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.encoding import PositionEncoding
from ..common.kv_cache import KVCache
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, build


class CausalLM(nn.Module):
    """Decoder-only language model: token embedding, pre-norm causal blocks, tied output head.

    Token embeddings are multiplied by ``sqrt(dim)`` as in Vaswani et al.: input encodings of
    unit amplitude (sinusoidal) would otherwise drown the small initial embeddings.

    Args:
        vocab_size, dim, depth, num_heads: sizes.
        encoding: a registered name (built for these sizes), an encoding instance, or None (NoPE).
        max_len: the longest sequence the encoding is built for (learned tables, eRPE).
        dropout: residual and MLP dropout.

    Shapes: ``tokens [B, T]`` (long) -> logits ``[B, T, vocab_size]``.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        *,
        encoding: str | PositionEncoding | None = None,
        max_len: int = 1024,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        if isinstance(encoding, str):
            encoding = build(encoding, dims=ModelDims(dim=dim, num_heads=num_heads, max_len=max_len))
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed_scale = math.sqrt(dim)
        self.embed = nn.Embedding(vocab_size, dim)
        self.encoder = TransformerEncoder(dim, depth, num_heads, encoding=encoding, dropout=dropout)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: Tensor, *, positions: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a [batch, length] long tensor; got {tuple(tokens.shape)} {tokens.dtype}")
        x = self.embed(tokens) * self.embed_scale
        h = self.encoder(x, positions=positions, mask=AttentionMask(causal=True), cache=cache)
        return self.head(h)
