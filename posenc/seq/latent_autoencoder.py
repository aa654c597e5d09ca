"""A bottleneck sequence autoencoder whose order comes from a position encoding: the baseline
that :class:`~posenc.seq.spline.SplineTransformer` is compared with (the paper compares with ALiBi).

It has the spline model's skeleton and sizes, and differs only in how the decoder knows where
each output element goes:

- encoder: the input tokens (positions ``0 .. L-1``) and ``K`` learned latent tokens; the
  outputs at the latent tokens, through a linear layer, are the ``K`` latent codes (``[B, K, D]``,
  the same bottleneck as the spline model's control points);
- decoder: the ``K`` codes and ``N`` output queries (one learned vector, the same for every
  query) attend to each other; the outputs at the queries are the sequence.

The encoding gives the queries their positions: an input encoding (sinusoidal, learned) is added
to the input tokens and to the queries, never to the latent tokens or codes; an attention
encoding (ALiBi's bias, RoPE) sees every token at its position, the ``K`` latent tokens/codes at
evenly spread positions ``lo + (hi - lo) * (k + 1/2) / K`` over the span ``[lo, hi]`` of the
sequence's positions (so code ``k`` sits in the middle of the ``k``-th ``K``-th of the sequence).
Attention is bidirectional: causal-only encodings are refused (ALiBi is built symmetric,
``-m |i - j|``).

Output positions default to ``0 .. N-1``; pass float positions (e.g. ``i (L - 1) / (N - 1)``)
to read the same span at a finer step.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.encoding import Hook, attention_part
from ..common.registry import ModelDims, build, get


def spread_positions(positions: Tensor, count: int) -> Tensor:
    """``[B or 1, count]`` positions spread evenly over the span of ``positions [B or 1, T]``:
    ``lo + (hi - lo) * (k + 1/2) / count``."""
    lo = positions.amin(dim=1, keepdim=True).to(torch.float32)
    hi = positions.amax(dim=1, keepdim=True).to(torch.float32)
    frac = (torch.arange(count, dtype=torch.float32, device=positions.device) + 0.5) / count
    return lo + (hi - lo) * frac


class PositionalAutoencoder(nn.Module):
    """Args:
        in_dim: features per element.
        dim: width.
        depth: encoder blocks (``decoder_depth`` defaults to it).
        num_heads: attention heads.
        num_latents: ``K``, the bottleneck tokens.
        encoding: a registered sequence encoding name (``"alibi"``, ``"sinusoidal"``, ``"rope"``,
            ...) or None (then the decoder cannot tell its queries apart).
        encoding_options: constructor arguments of the encoding (ALiBi gets ``symmetric=True``
            unless given).
        max_len: for encodings with a table of positions.
        mlp_ratio: of the blocks, like ``dropout`` and ``backend``.

    Shapes: ``x [B, L, in_dim]`` -> ``encode`` -> ``[B, K, D]`` -> ``decode(., N)`` -> ``[B, N, in_dim]``.
    """

    def __init__(
        self,
        in_dim: int,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        *,
        num_latents: int = 8,
        encoding: str | None = "alibi",
        encoding_options: Mapping[str, object] | None = None,
        decoder_depth: int | None = None,
        max_len: int = 4096,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        for name, v in (("in_dim", in_dim), ("dim", dim), ("depth", depth), ("num_heads", num_heads),
                        ("num_latents", num_latents), ("max_len", max_len)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        decoder_depth = depth if decoder_depth is None else decoder_depth
        if not isinstance(decoder_depth, int) or decoder_depth < 1:
            raise ValueError(f"decoder_depth must be a positive int; got {decoder_depth!r}")
        self.in_dim, self.dim, self.num_latents, self.encoding_name = in_dim, dim, num_latents, encoding
        enc = None
        if encoding is not None:
            try:
                info = get(encoding)
            except KeyError as exc:
                raise ValueError(f"encoding: {exc.args[0]}") from None
            options = dict(encoding_options or {})
            if encoding == "alibi":
                options.setdefault("symmetric", True)
            enc = build(encoding, dims=ModelDims(dim=dim, num_heads=num_heads, max_len=max_len), **options)
            if enc.causal_only:
                raise ValueError(
                    f"encoding {info.name!r} is defined for causal attention only; this autoencoder attends both ways"
                )
        self.encoding = enc
        self.in_proj = nn.Linear(in_dim, dim)
        self.latent_tokens = nn.Parameter(torch.randn(num_latents, dim) * 0.02)
        self.query = nn.Parameter(torch.randn(dim) * 0.02)
        attn = attention_part(enc)
        self.encoder = TransformerEncoder(dim, depth, num_heads, encoding=attn, mlp_ratio=mlp_ratio, dropout=dropout,
                                          backend=backend)
        self.to_latent = nn.Linear(dim, dim)
        self.decoder = TransformerEncoder(dim, decoder_depth, num_heads, encoding=attn, mlp_ratio=mlp_ratio,
                                          dropout=dropout, backend=backend)
        self.out_proj = nn.Linear(dim, in_dim)

    def _positions(self, positions: Tensor | None, length: int, name: str, device) -> Tensor:
        if positions is None:
            return torch.arange(length, device=device).unsqueeze(0)
        if positions.dim() == 1:
            positions = positions.unsqueeze(0)
        if positions.dim() != 2 or positions.shape[1] != length:
            raise ValueError(f"{name} must be [{length}] or [batch or 1, {length}]; got {tuple(positions.shape)}")
        return positions.to(device)

    def _run(self, stack: TransformerEncoder, seq: Tensor, seq_pos: Tensor, latents: Tensor, first: bool) -> Tensor:
        """Run ``stack`` over the sequence tokens and the latents (latents first or last)."""
        enc = self.encoding
        if enc is not None and Hook.INPUT in enc.hooks:
            seq = enc.encode_input(seq, seq_pos)
        lat_pos = spread_positions(seq_pos, latents.shape[1])
        parts = (latents, seq) if first else (seq, latents)
        pos = (lat_pos, seq_pos.to(torch.float32)) if first else (seq_pos.to(torch.float32), lat_pos)
        rows = max(p.shape[0] for p in pos)  # 1 when every position is shared by the batch: one bias table
        pos = torch.cat([p.expand(rows, -1) for p in pos], dim=1)
        return stack(torch.cat(parts, dim=1), positions=pos)

    def encode(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Latent codes ``[B, K, D]`` of ``x [B, L, in_dim]`` (input positions default ``0 .. L-1``)."""
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.in_dim or x.shape[1] < 1:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be [batch, length >= 1, in_dim={self.in_dim}]; got {shape}")
        b, length, _ = x.shape
        pos = self._positions(positions, length, "positions", x.device)
        h = self._run(self.encoder, self.in_proj(x), pos, self.latent_tokens.expand(b, -1, -1), first=False)
        return self.to_latent(h[:, length:])

    def decode(self, latents: Tensor, length: int, positions: Tensor | None = None) -> Tensor:
        """``[B, length, in_dim]`` from ``latents [B, K, D]``; output positions default ``0 .. length-1``."""
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"length must be an int >= 1 (the number of output points); got {length!r}")
        if latents.dim() != 3 or tuple(latents.shape[1:]) != (self.num_latents, self.dim):
            raise ValueError(f"latents must be [batch, {self.num_latents}, {self.dim}]; got {tuple(latents.shape)}")
        b = latents.shape[0]
        pos = self._positions(positions, length, "positions", latents.device)
        queries = self.query.expand(b, length, -1)
        h = self._run(self.decoder, queries, pos, latents, first=True)
        return self.out_proj(h[:, self.num_latents:])

    def forward(
        self, x: Tensor, out_length: int | None = None, *, positions: Tensor | None = None,
        out_positions: Tensor | None = None,
    ) -> Tensor:
        """Reconstruct ``x [B, L, in_dim]`` at ``out_length`` points (default ``L``) at
        ``out_positions`` (default ``0 .. out_length-1``)."""
        if out_length is not None and (not isinstance(out_length, int) or isinstance(out_length, bool) or out_length < 1):
            raise ValueError(f"out_length must be an int >= 1 (the number of output points); got {out_length!r}")
        latents = self.encode(x, positions)
        return self.decode(latents, x.shape[1] if out_length is None else out_length, out_positions)


__all__ = ["PositionalAutoencoder", "spread_positions"]
