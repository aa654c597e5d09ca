"""The units ``posenc bench attention`` times: a causal self-attention layer each, ``x [B, T, C]``
-> ``[B, T, C]``: the bare SDPA baseline, posenc's :class:`~posenc.common.multihead.MultiheadAttention`
with an encoding, and the peers' layers (x-transformers, AttentionSmithy), imported only when a
row needs them."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...common.multihead import MultiheadAttention
from ...common.encoding import Hook, PositionEncoding, attention_part
from ...common.linear_attention import make_feature_map
from ...common.masks import AttentionMask

# the encodings the peers' units (x-transformers, AttentionSmithy) are built with, each its own
PEER_ENCODINGS = ("rope", "alibi")


class BareCausalAttention(nn.Module):
    """The baseline: q/k/v/out ``nn.Linear(C, C)`` around SDPA with ``is_causal=True``.

    Shapes: ``x [B, T, C]`` -> ``[B, T, C]``.
    """

    kernel_path = "sdpa"
    path_reason = "F.scaled_dot_product_attention(is_causal=True), no bias"

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        def heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class PosencAttention(nn.Module):
    """:class:`posenc.MultiheadAttention` under a causal mask, with an encoding's input hook applied first.

    Shapes: ``x [B, T, C]`` -> ``[B, T, C]`` (``T <= seq_len``).
    """

    def __init__(self, dim: int, num_heads: int, seq_len: int, encoding: PositionEncoding | None = None,
                 feature_map: str | None = None) -> None:
        super().__init__()
        hooks = encoding.hooks if encoding is not None else frozenset()
        self.input_encoding = encoding if Hook.INPUT in hooks else None
        fmap = None
        if feature_map is not None:
            head_dim = dim // num_heads
            fmap = make_feature_map(feature_map, encoding.qk_width(head_dim) if encoding is not None else head_dim)
        self.attn = MultiheadAttention(dim, num_heads, encoding=attention_part(encoding), feature_map=fmap)
        self.mask = AttentionMask(causal=True)
        self.register_buffer("positions", torch.arange(seq_len).unsqueeze(0), persistent=False)

    def plan(self, x: Tensor) -> Any | None:
        """The attention's plan for ``x`` (``MultiheadAttention.plan``: ``.label``, ``.reason``,
        ``.chunk_rows``), or None where :class:`MultiheadAttention` has no ``plan``."""
        plan = getattr(self.attn, "plan", None)
        return None if plan is None else plan(x, mask=self.mask)

    def forward(self, x: Tensor) -> Tensor:
        if self.input_encoding is not None:
            x = self.input_encoding.encode_input(x, self.positions[:, : x.shape[1]])
        return self.attn(x, mask=self.mask)


class XTransformersAttention(nn.Module):
    """x-transformers' ``Attention`` (causal, flash = SDPA) with its RoPE or ALiBi."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, encoding: str) -> None:
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its import warns about torch.jit.script
            from x_transformers.x_transformers import AlibiPositionalBias, Attention, RotaryEmbedding
        self.attn = Attention(dim=dim, dim_head=head_dim, heads=num_heads, causal=True, flash=True)
        self.rotary = RotaryEmbedding(head_dim) if encoding == "rope" else None
        self.alibi = AlibiPositionalBias(heads=num_heads, total_heads=num_heads) if encoding == "alibi" else None
        if self.rotary is None and self.alibi is None:
            raise ValueError(f"x-transformers rows are {', '.join(PEER_ENCODINGS)}; got {encoding!r}")
        self.kernel_path = "sdpa" if self.rotary is not None else "sdpa+bias"
        self.path_reason = (
            "x-transformers Attention(flash=True): SDPA on rotated q/k" if self.rotary is not None
            else "x-transformers Attention(flash=True): SDPA with the ALiBi bias as an additive mask"
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.rotary is not None:
            return self.attn(x, rotary_pos_emb=self.rotary.forward_from_seq_len(x.shape[1]))
        return self.attn(x, rel_pos=self.alibi)


class AttentionSmithyAttention(nn.Module):
    """AttentionSmithy's ``MultiheadAttention`` (standard causal method) with its RoPE or ALiBi."""

    kernel_path = "math"
    path_reason = "attention-smithy StandardAttentionMethod: scores, mask and softmax as separate torch ops"

    def __init__(self, dim: int, num_heads: int, head_dim: int, encoding: str) -> None:
        super().__init__()
        from attention_smithy.attention import StandardAttentionMethod
        from attention_smithy.components import MultiheadAttention as SmithyMultiheadAttention
        from attention_smithy.numeric_embeddings import (
            ALiBiPositionEmbedding,
            NumericEmbeddingManager,
            RotaryPositionEmbedding,
        )

        if encoding == "rope":
            strategy = RotaryPositionEmbedding(head_dim)
        elif encoding == "alibi":
            strategy = ALiBiPositionEmbedding(num_heads)
        else:
            raise ValueError(f"attention-smithy rows are {', '.join(PEER_ENCODINGS)}; got {encoding!r}")
        self.manager = NumericEmbeddingManager([strategy])
        self.attn = SmithyMultiheadAttention(dim, num_heads, StandardAttentionMethod(is_causal_masking=True))

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.attn(x, x, x, numeric_embedding_manager=self.manager, padding_and_loss_attention_mask=None)
        return out
