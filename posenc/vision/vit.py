"""A reference Vision Transformer for images and videos that takes any registered vision or
sequence encoding.

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

Video (``num_frames`` set): clips ``[B, C, T, H, W]`` are cut into tubelets by a ``Conv3d`` with
kernel = stride = ``(tubelet_size, patch_size, patch_size)`` (ViViT's tubelet embedding,
VideoMAE; ``tubelet_size = 1`` is per-frame patches), giving a ``(T/tubelet, H/p, W/p)`` grid
whose tokens follow in raster order, time outermost. The 3D vision encodings (``grid_ndim = 3``:
``sincos3d``, ``axial3d``, ``rope3d``) receive positions ``[1, N, 3]`` = ``(t, row, col)``
(:func:`~posenc.vision.grid.grid_positions3d`); sequence encodings receive ``0 .. N-1`` over that
raster order. The 2D encodings are refused on video with an error naming the 3D ones: applied
per frame they would give every frame the same positions, which cannot tell the frame order
(for that time-blind baseline, ``rope3d`` with ``axis_pairs=(0, n, n)`` is exactly
``rope2d_axial`` per frame), and PEG's grid scatter needs distinct ``(row, col)`` positions. A
3D encoding on an image ViT is refused the same way. Clips of other lengths and frame sizes
(multiples of the tubelet) run at inference, as images of other sizes do.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.checks import check_number
from ..common.encoding import PositionEncoding
from ..primitives.budget import check_build
from ..training.pretrained import PretrainedMixin
from .grid import grid_positions, grid_positions3d, raster_positions, to_pair
from .resolve import resolve_vit_encoding

POOLS = ("cls", "avg")


class ViT(nn.Module, PretrainedMixin):
    """Vision Transformer with a pluggable position encoding.

    Args:
        img_size: training image size ``(H, W)`` or one int; sets the grid that learned tables
            are built for. Inference may use any size divisible by ``patch_size``.
        patch_size: square patch side ``p``.
        in_chans: image channels.
        num_classes: classifier outputs.
        dim: width.
        depth: blocks.
        num_heads: attention heads.
        mlp_ratio: MLP width as a multiple of ``dim``.
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

        num_frames: None for an image model; the training clip length ``T`` for a video model
            (sets the temporal grid that learned tables are built for).
        tubelet_size: frames per tubelet ``k`` (video only; ``T`` must be a multiple of it).

    Shapes: ``images [B, in_chans, H, W]`` -> logits ``[B, num_classes]``;
    :meth:`forward_features` -> tokens ``[B, num_prefix_tokens + (H/p)(W/p), dim]``. A video
    model takes ``videos [B, in_chans, T, H, W]`` -> tokens ``[B, P + (T/k)(H/p)(W/p), dim]``.
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
        num_frames: int | None = None,
        tubelet_size: int = 1,
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
        check_number("dropout", dropout, minimum=0.0, maximum=1.0)
        check_number("mlp_ratio", mlp_ratio, minimum=0.0, strict=True)
        check_build(f"ViT(dim={dim}, depth={depth}, patch_size={patch_size}, in_chans={in_chans})",
                    parameters=depth * int((4 + 2 * mlp_ratio) * dim * dim) + patch_size * patch_size * in_chans * dim,
                    blocks=depth)
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
        self.num_frames, self.tubelet_size = self._check_video(num_frames, tubelet_size)
        if num_frames is None:
            self.patch_embed = nn.Conv2d(in_chans, dim, patch_size, stride=patch_size)
        else:
            self.train_grid = (num_frames // tubelet_size, *self.train_grid)
            kernel = (tubelet_size, patch_size, patch_size)
            self.patch_embed = nn.Conv3d(in_chans, dim, kernel, stride=kernel)
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

    @staticmethod
    def _check_video(num_frames, tubelet_size) -> tuple[int | None, int]:
        if isinstance(tubelet_size, bool) or not isinstance(tubelet_size, int) or tubelet_size <= 0:
            raise ValueError(f"tubelet_size must be a positive int; got {tubelet_size!r}")
        if num_frames is None:
            if tubelet_size != 1:
                raise ValueError(f"tubelet_size={tubelet_size} is for video: set num_frames (the training clip length) too")
            return None, 1
        if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames <= 0:
            raise ValueError(f"num_frames must be a positive int or None; got {num_frames!r}")
        if num_frames % tubelet_size:
            raise ValueError(f"num_frames={num_frames} must be divisible by tubelet_size={tubelet_size}")
        return num_frames, tubelet_size

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

    def video_grid_size(self, clip_thw: tuple[int, int, int] | Sequence[int]) -> tuple[int, int, int]:
        """Tubelet grid ``(frames / tubelet, rows, cols)`` of a clip of ``(T, H, W)``; a length not
        divisible by the tubelet or a frame size not divisible by the patch is a ValueError."""
        if len(clip_thw) != 3:
            raise ValueError(f"clip_thw must be (frames, height, width); got {tuple(clip_thw)}")
        t, k = int(clip_thw[0]), self.tubelet_size
        if t < k or t % k:
            raise ValueError(f"videos have {t} frames; this ViT needs a positive multiple of tubelet_size={k} frames")
        return (t // k, *self.grid_size(clip_thw[1:]))

    def video_positions(self, frames: int, rows: int, cols: int, device=None) -> Tensor:
        """The positions the encoder receives for a ``frames x rows x cols`` tubelet grid:
        ``[1, T, 3]`` (3D encodings) or ``[1, T]`` (sequence encodings over the raster order)."""
        if self.position_kind == "1d":
            return raster_positions(frames * rows * cols, num_prefix_tokens=self.num_prefix_tokens, device=device)
        return grid_positions3d(frames, rows, cols, num_prefix_tokens=self.num_prefix_tokens, device=device)

    def _forward_video_features(self, videos: Tensor) -> Tensor:
        if not isinstance(videos, Tensor) or videos.dim() != 5:
            shape = tuple(videos.shape) if isinstance(videos, Tensor) else type(videos).__name__
            raise ValueError(
                f"videos must be [batch, channels, frames, height, width] for this video ViT "
                f"(num_frames={self.num_frames}); got {shape}"
            )
        if videos.shape[1] != self.in_chans:
            raise ValueError(f"videos have {videos.shape[1]} channels; this ViT expects in_chans={self.in_chans}")
        grid = self.video_grid_size(videos.shape[-3:])
        x = self.patch_embed(videos).flatten(2).transpose(1, 2)  # [B, N, C], time outermost
        b = x.shape[0]
        prefix = [t.expand(b, -1, -1) for t in (self.cls_token, self.register_tokens) if t is not None]
        if prefix:
            x = torch.cat((*prefix, x), dim=1)
        return self.encoder(x, positions=self.video_positions(*grid, device=x.device))

    def forward_features(self, images: Tensor) -> Tensor:
        """``images [B, C, H, W]`` -> tokens ``[B, num_prefix_tokens + rows * cols, dim]`` (after the final norm);
        a video model: ``videos [B, C, T, H, W]`` -> ``[B, num_prefix_tokens + frames * rows * cols, dim]``."""
        if self.num_frames is not None:
            return self._forward_video_features(images)
        if not isinstance(images, Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            hint = " (videos need a ViT built with num_frames)" if isinstance(images, Tensor) and images.dim() == 5 else ""
            raise ValueError(f"images must be [batch, channels, height, width]; got {shape}{hint}")
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
