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

Images of any size divisible by the patch run at inference: each encoding follows the new grid
(sinusoidal, RoPE, PEG), resamples its table (learned 2D, axial, 2D relative bias) or refuses
clearly (e.g. a learned 1D table past its length).
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.encoding import PositionEncoding
from ..common.registry import ModelDims, available, build, get
from ..common.spe import StochasticPositionalEncoding
from ..training.pretrained import PretrainedMixin
from .grid import grid_positions, raster_positions, to_pair
from .peg import PEG
from .prefix import PatchTokensOnly

POOLS = ("cls", "avg")


def _modality_of(encoding: PositionEncoding) -> str | None:
    for info in available():
        if info.cls is type(encoding):
            return info.modality
    return None


class ViT(nn.Module, PretrainedMixin):
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

        per_layer, conditional, self.position_kind = self._build_encoding(
            encoding, dict(encoding_options or {}), peg_blocks
        )
        self.encoding_name = encoding if isinstance(encoding, str) else type(encoding).__name__ if encoding else None
        self.encoder = TransformerEncoder(
            dim, depth, num_heads, encoding=per_layer, mlp_ratio=mlp_ratio, dropout=dropout,
            conditional=conditional, backend=backend, feature_map=feature_map,
        )
        self.feature_map = feature_map
        self.head = nn.Linear(dim, num_classes)

    # -- construction -------------------------------------------------------------------------

    def _build_encoding(self, encoding, options: dict, peg_blocks: Sequence[int]):
        """-> (encoding or per-layer list for the encoder, conditional modules, "2d" | "1d")."""
        p = self.num_prefix_tokens
        if encoding is None:
            if options:
                raise ValueError("encoding_options given without an encoding")
            return None, None, "2d"
        if isinstance(encoding, PositionEncoding):
            if options:
                raise ValueError("encoding_options apply to a registry name, not to an encoding instance")
            if _modality_of(encoding) == "seq" and not isinstance(encoding, StochasticPositionalEncoding):
                if encoding.causal_only:
                    raise ValueError(f"{type(encoding).__name__} is causal-only; a ViT attends in both directions")
                return PatchTokensOnly(encoding, p), None, "1d"
            built_for = encoding.num_prefix_tokens
            if built_for is not None and built_for != p:
                raise ValueError(
                    f"the {type(encoding).__name__} instance was built for num_prefix_tokens={built_for}; "
                    f"this ViT has {p} prefix tokens (class token + registers)"
                )
            return encoding, None, "2d"
        if not isinstance(encoding, str):
            raise TypeError(f"encoding must be a name, a PositionEncoding or None; got {type(encoding).__name__}")
        info = get(encoding)
        rows, cols = self.train_grid
        if info.modality == "seq":
            dims = ModelDims(dim=self.dim, num_heads=self.num_heads, max_len=rows * cols)
            if issubclass(info.cls, StochasticPositionalEncoding):  # keeps prefix tokens apart itself
                built = [build(encoding, dims=dims, num_prefix_tokens=p, **options) for _ in range(self.depth)]
                return built, None, "1d"
            built = build(encoding, dims=dims, **options)
            if built.causal_only:
                raise ValueError(
                    f"encoding {encoding!r} (with options {options}) is defined for causal attention only; "
                    "a ViT attends in both directions (ALiBi: encoding_options={'symmetric': True})"
                )
            return PatchTokensOnly(built, p), None, "1d"
        if info.modality != "vision":
            raise ValueError(
                f"encoding {encoding!r} belongs to the {info.modality!r} modality; a ViT takes vision or seq encodings"
            )
        if info.cls is PEG:
            blocks = sorted(set(int(i) for i in peg_blocks))
            if not blocks:
                raise ValueError("peg_blocks must name at least one block for encoding='peg'")
            bad = [i for i in blocks if not 0 <= i < self.depth]
            if bad:
                raise ValueError(f"peg_blocks {bad} are outside 0..{self.depth - 1}")
            conditional = {i: PEG(self.dim, num_prefix_tokens=p, **options) for i in blocks}
            return None, conditional, "2d"
        params = inspect.signature(info.cls.__init__).parameters
        extra = {}
        if "num_prefix_tokens" in params:
            extra["num_prefix_tokens"] = p
        if "grid_size" in params:
            extra["grid_size"] = self.train_grid
        extra.update(options)
        dims = ModelDims(dim=self.dim, num_heads=self.num_heads, max_len=rows * cols)
        if info.cls.per_layer:  # e.g. RoPE-Mixed learns its frequencies per block
            return [build(encoding, dims=dims, **extra) for _ in range(self.depth)], None, "2d"
        return build(encoding, dims=dims, **extra), None, "2d"

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
