"""A reference Vision Transformer that takes any registered vision or sequence encoding.

Dosovitskiy et al. 2021, An Image is Worth 16x16 Words, https://arxiv.org/abs/2010.11929.
Patch embedding (a ``Conv2d`` with stride = patch), an optional class token and register tokens
(Darcet et al. 2024, https://arxiv.org/abs/2309.16588), pre-norm blocks from
:class:`~posenc.common.block.TransformerEncoder`, class-token or global-average pooling, and a
linear head.

Token order: ``[class token?, registers..., patches in raster order]``; the first
``num_prefix_tokens`` tokens are the prefix. Every encoding sees the whole token sequence with
explicit positions and keeps the prefix out by construction:

* vision encodings (registry modality "vision") are built with ``num_prefix_tokens`` and receive
  2D positions ``[1, T, 2]`` = ``(row, col)`` per patch (:func:`~posenc.vision.grid.grid_positions`);
* sequence encodings (modality "seq") are built for ``max_len = N`` patches at the training size
  and wrapped in :class:`~posenc.vision.prefix.PatchTokensOnly`; they receive 1D positions
  ``0 .. N-1`` in raster order;
* ``"peg"`` puts one PEG after each block in ``peg_blocks`` (CPVT) and nothing else;
* an encoding class with ``per_layer = True`` (RoPE-Mixed, 2D relative bias: their papers learn
  one set per block) gets one instance per block; any other is shared by every block.

(These rules are :func:`~posenc.vision.resolve.resolve_vit_encoding`, shared with the timm integration.)

Images of any size divisible by the patch run at inference: each encoding follows the new grid
(sinusoidal, RoPE, PEG), resamples its table (learned 2D, axial, 2D relative bias) or refuses
clearly (e.g. a learned 1D table past its length).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.encoding import PositionEncoding
from .grid import grid_positions, raster_positions, to_pair
from .resolve import resolve_vit_encoding

POOLS = ("cls", "avg")


class ViT(nn.Module):
    """Vision Transformer with a pluggable position encoding.

    Args:
        img_size: training image size ``(H, W)`` or one int; sets the grid that learned tables
            are built for. Inference may use any size divisible by ``patch_size``.
        patch_size: square patch side ``p``.
        in_chans: image channels.
        num_classes: classifier outputs.
        dim, depth, num_heads, mlp_ratio: transformer sizes.
        encoding: a registered vision or sequence encoding name, a :class:`PositionEncoding`
            instance (a vision one must be built with ``num_prefix_tokens`` equal to this model's;
            a registered sequence one is wrapped in :class:`PatchTokensOnly`), or None.
        encoding_options: extra constructor options for a registry name (e.g. ``{"layout": "mae"}``,
            ``{"kernel_size": 5}`` for PEG).
        peg_blocks: the blocks (0-based) after which a PEG is added when ``encoding == "peg"``.
        pool: "cls" (class token) or "avg" (global average of the patch tokens, no class token).
        num_register_tokens: learned register tokens after the class token.
        dropout: residual and MLP dropout.
        backend: attention kernel path (see :func:`posenc.common.attention.attend`).
        feature_map: None for softmax attention; ``"elu"`` or ``"favor"`` for linear attention,
            where encodings on the input or on q and k apply (none, sincos2d, learned2d, axial,
            PEG, 2D RoPE, ``conv_spe2d``, and the 1D ones on raster order); a score bias is a
            ValueError at construction.

    Shapes: ``images [B, in_chans, H, W]`` -> logits ``[B, num_classes]``;
    :meth:`forward_features` -> tokens ``[B, num_prefix_tokens + (H/p)(W/p), dim]``.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        dim: int = 192,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        encoding: str | PositionEncoding | None = "sincos2d",
        encoding_options: dict | None = None,
        peg_blocks: Sequence[int] = (0,),
        pool: str = "cls",
        num_register_tokens: int = 0,
        dropout: float = 0.0,
        backend: str = "auto",
        feature_map: str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size <= 0:
            raise ValueError(f"patch_size must be a positive int; got {patch_size!r}")
        self.img_size = to_pair(img_size, "img_size")
        if self.img_size[0] % patch_size or self.img_size[1] % patch_size:
            raise ValueError(f"img_size {self.img_size} must be divisible by patch_size={patch_size}")
        for name, value in (("in_chans", in_chans), ("num_classes", num_classes), ("dim", dim), ("depth", depth),
                            ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}; got {pool!r}")
        if num_register_tokens < 0:
            raise ValueError(f"num_register_tokens must be >= 0; got {num_register_tokens}")
        if encoding_options is not None and not isinstance(encoding_options, dict):
            raise TypeError(f"encoding_options must be a dict or None; got {type(encoding_options).__name__}")
        self.patch_size, self.in_chans, self.num_classes = patch_size, in_chans, num_classes
        self.dim, self.depth, self.num_heads, self.pool = dim, depth, num_heads, pool
        self.num_register_tokens = num_register_tokens
        self.num_prefix_tokens = (1 if pool == "cls" else 0) + num_register_tokens
        self.train_grid = (self.img_size[0] // patch_size, self.img_size[1] // patch_size)

        self.patch_embed = nn.Conv2d(in_chans, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, dim)) if num_register_tokens else None
        for p in (self.cls_token, self.register_tokens):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02, a=-0.04, b=0.04)

        resolved = resolve_vit_encoding(
            encoding, dim=dim, num_heads=num_heads, depth=depth, grid_size=self.train_grid,
            num_prefix_tokens=self.num_prefix_tokens, options=encoding_options, peg_blocks=peg_blocks,
        )
        self.position_kind, self.encoding_name = resolved.position_kind, resolved.name
        self.encoder = TransformerEncoder(
            dim, depth, num_heads, encoding=resolved.encoding, mlp_ratio=mlp_ratio, dropout=dropout,
            conditional=resolved.conditional or None, backend=backend, feature_map=feature_map,
        )
        self.feature_map = feature_map
        self.head = nn.Linear(dim, num_classes)

    # -- construction -------------------------------------------------------------------------

    # -- forward ------------------------------------------------------------------------------

    def grid_size(self, img_hw: tuple[int, int] | Sequence[int]) -> tuple[int, int]:
        """Patch grid ``(rows, cols)`` of an image of size ``(H, W)``; sizes not divisible by the patch are a ValueError."""
        if len(img_hw) != 2:
            raise ValueError(f"img_hw must be (height, width); got {tuple(img_hw)}")
        h, w = int(img_hw[0]), int(img_hw[1])
        p = self.patch_size
        if h < p or w < p or h % p or w % p:
            raise ValueError(
                f"image size {h}x{w} must be a positive multiple of patch_size={p} in both height and width"
            )
        return h // p, w // p

    def positions(self, rows: int, cols: int, device=None) -> Tensor:
        """The positions the encoder receives for a ``rows x cols`` grid: ``[1, T, 2]`` (2D) or ``[1, T]`` (1D)."""
        if self.position_kind == "1d":
            return raster_positions(rows * cols, num_prefix_tokens=self.num_prefix_tokens, device=device)
        return grid_positions(rows, cols, num_prefix_tokens=self.num_prefix_tokens, device=device)

    def forward_features(self, images: Tensor) -> Tensor:
        """``images [B, C, H, W]`` -> tokens ``[B, num_prefix_tokens + rows * cols, dim]`` (after the final norm)."""
        if not isinstance(images, Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must be [batch, channels, height, width]; got {shape}")
        if images.shape[1] != self.in_chans:
            raise ValueError(f"images have {images.shape[1]} channels; this ViT expects in_chans={self.in_chans}")
        rows, cols = self.grid_size(images.shape[-2:])
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # [B, N, C]
        b = x.shape[0]
        prefix = [t.expand(b, -1, -1) for t in (self.cls_token, self.register_tokens) if t is not None]
        if prefix:
            x = torch.cat((*prefix, x), dim=1)
        return self.encoder(x, positions=self.positions(rows, cols, device=x.device))

    def pool_tokens(self, tokens: Tensor) -> Tensor:
        """``[B, T, dim]`` -> ``[B, dim]``: the class token, or the mean of the patch tokens."""
        if self.pool == "cls":
            return tokens[:, 0]
        return tokens[:, self.num_prefix_tokens:].mean(dim=1)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.pool_tokens(self.forward_features(images)))
