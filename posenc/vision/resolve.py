"""Resolving a ViT's position encoding: a registry name with options, an encoding instance or
None becomes the encoding(s) a ViT runs, with its prefix tokens kept out.

One definition for both ViTs of posenc: the reference :class:`~posenc.vision.vit.ViT` and timm's
``VisionTransformer`` converted by :func:`~posenc.vision.timm_models.replace_position_encoding`.

Rules (the same for a name and an instance where both apply):

* a vision encoding (registry modality "vision") gets ``num_prefix_tokens`` and the training
  ``grid_size`` when its constructor takes them; its positions are grid coordinates
  (``position_kind`` "2d" for a ``(rows, cols)`` grid, "3d" for ``(t, rows, cols)``);
* a sequence encoding (modality "seq") is built for ``max_len`` = the number of patches and
  wrapped in :class:`~posenc.vision.prefix.PatchTokensOnly`; its positions are ``0 .. N-1`` in
  raster order (``position_kind`` "1d"). SPE keeps prefix tokens apart itself and is built with
  ``num_prefix_tokens``, one instance per block (its random codes are drawn per layer);
* ``peg`` (or a :class:`~posenc.vision.peg.PEG` instance) goes after each block of ``peg_blocks``
  (CPVT), as a ``conditional`` module, and nowhere else;
* a class with ``per_layer = True`` (RoPE-Mixed, 2D relative bias) gets one instance per block;
  any other encoding is one instance shared by every block;
* an encoding defined for causal attention only is refused: a ViT attends in both directions;
* a vision encoding's grid rank (``grid_ndim``: 2 for images, 3 for the space-time encodings)
  must be the model's: 2D encodings are not applied per frame of a video (every frame would get
  the same positions), 3D ones need a video model.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..common.encoding import Hook, PositionEncoding, attention_part
from ..common.registry import ModelDims, available, build, get
from ..primitives.spe import StochasticPositionalEncoding
from .peg import PEG
from .prefix import PatchTokensOnly

__all__ = ["ViTEncoding", "resolve_vit_encoding", "modality_of", "grid_ndim"]


def modality_of(encoding: PositionEncoding) -> str | None:
    """The registry modality of an encoding instance's class (None for an unregistered class)."""
    for info in available():
        if info.cls is type(encoding):
            return info.modality
    return None


@dataclass
class ViTEncoding:
    """A resolved ViT encoding.

    Attributes:
        encoding: one instance shared by every block, a list of ``depth`` instances (one per
            block), or None; what :class:`~posenc.common.block.TransformerEncoder` takes.
        conditional: ``{block index: module}`` added after that block (PEG).
        position_kind: "1d" (raster order ``[1, T]``) or "2d"/"3d" (grid coordinates ``[1, T, n]``).
        name: the registry name, the instance's class name, or None.
        depth: the number of blocks it was resolved for.
    """

    encoding: PositionEncoding | list[PositionEncoding] | None
    conditional: dict[int, PositionEncoding] = field(default_factory=dict)
    position_kind: str = "2d"
    name: str | None = None
    depth: int = 1

    @property
    def per_block(self) -> list[PositionEncoding | None]:
        """The encoding of each block (``depth`` entries; the same instance when shared)."""
        if isinstance(self.encoding, list):
            return list(self.encoding)
        return [self.encoding] * self.depth

    @property
    def input_encoding(self) -> PositionEncoding | None:
        """The encoding applied once to the tokens before the first block, or None."""
        first = self.per_block[0] if self.depth else None
        return first if first is not None and Hook.INPUT in first.hooks else None

    @property
    def attention_per_block(self) -> list[PositionEncoding | None]:
        """What each block's attention sees: the encoding when it has attention hooks, else None."""
        return [attention_part(e) for e in self.per_block]


def _peg_blocks(peg_blocks: Sequence[int], depth: int) -> list[int]:
    try:
        blocks = sorted(set(int(i) for i in peg_blocks))
    except (TypeError, ValueError):
        raise TypeError(f"peg_blocks must be a sequence of block indices; got {peg_blocks!r}") from None
    if not blocks or any(not 0 <= i < depth for i in blocks):
        raise ValueError(f"peg_blocks must name blocks in 0..{depth - 1}; got {list(peg_blocks)}")
    return blocks


def grid_ndim(cls: type) -> int:
    """2 for image encodings, 3 for the video ones (the class attribute ``grid_ndim``)."""
    return int(getattr(cls, "grid_ndim", 2))


def _check_grid_rank(cls: type, name: str, grid: tuple[int, ...]) -> None:
    """A 2D encoding on a video grid, or a 3D one on an image grid, is a ValueError."""
    ndim = grid_ndim(cls)
    if len(grid) == 3 and ndim != 3:
        video = ", ".join(i.name for i in available("vision") if grid_ndim(i.cls) == 3)
        raise ValueError(
            f"encoding {name!r} is a 2D (image) encoding; a video model (grid {grid}) takes a 3D one ({video}), a seq "
            "encoding over the flattened (t, row, col) order, or None (2D encodings are not applied per frame: every "
            "frame would get the same positions)"
        )
    if len(grid) == 2 and ndim != 2:
        raise ValueError(
            f"encoding {name!r} is a 3D (video) encoding of (t, row, col) positions; build the ViT with num_frames "
            "(and tubelet_size) for videos [batch, channels, frames, height, width]; timm's ViT takes images"
        )


def _check_prefix(encoding: PositionEncoding, num_prefix_tokens: int) -> None:
    built_for = getattr(encoding, "num_prefix_tokens", None)
    if built_for is not None and built_for != num_prefix_tokens:
        raise ValueError(
            f"the {type(encoding).__name__} instance was built for num_prefix_tokens={built_for}; "
            f"the model has {num_prefix_tokens} prefix tokens (class token + registers)"
        )


def resolve_vit_encoding(
    encoding: str | PositionEncoding | None,
    *,
    dim: int,
    num_heads: int,
    depth: int,
    grid_size: Sequence[int],
    num_prefix_tokens: int,
    options: dict[str, Any] | None = None,
    peg_blocks: Sequence[int] = (0,),
) -> ViTEncoding:
    """The encoding(s) of a ViT of width ``dim``, ``num_heads`` heads and ``depth`` blocks whose
    training patch grid is ``grid_size`` and whose first ``num_prefix_tokens`` tokens are class or
    register tokens (see the module docstring for the rules).

    Args:
        encoding: a registered vision or sequence encoding name, a :class:`PositionEncoding`
            instance, or None.
        options: constructor options of a registry name (e.g. ``{"layout": "mae"}``).
        peg_blocks: the blocks after which a PEG goes (``"peg"`` or a PEG instance, which goes
            after exactly one block).

    Raises KeyError for an unknown name, TypeError for an unknown option or a wrong type, and
    ValueError for an encoding a ViT cannot use (another modality, causal-only, wrong prefix count).
    """
    options = dict(options or {})
    grid = tuple(int(g) for g in grid_size)
    grid_kind = f"{len(grid)}d"
    if encoding is not None and not isinstance(encoding, (str, PositionEncoding)):
        raise TypeError(f"encoding must be a registered name, a PositionEncoding or None; got {type(encoding).__name__}")
    if options and not isinstance(encoding, str):
        raise ValueError(
            f"encoding options {sorted(options)} apply to a registry name, not to "
            f"{'None' if encoding is None else 'an encoding instance'}"
        )
    p = num_prefix_tokens
    if encoding is None:
        return ViTEncoding(None, {}, grid_kind, None, depth)
    name = encoding if isinstance(encoding, str) else type(encoding).__name__
    dims = ModelDims(dim=dim, num_heads=num_heads, max_len=math.prod(grid))

    if isinstance(encoding, PEG) or (isinstance(encoding, str) and get(encoding).cls is PEG):
        _check_grid_rank(PEG, name, grid)
        blocks = _peg_blocks(peg_blocks, depth)
        if isinstance(encoding, PEG):
            if len(blocks) != 1:
                raise ValueError("a PEG instance goes after one block; pass the name 'peg' for several")
            _check_prefix(encoding, p)
            return ViTEncoding(None, {blocks[0]: encoding}, grid_kind, name, depth)
        return ViTEncoding(None, {i: build(encoding, dims=dims, num_prefix_tokens=p, **options) for i in blocks},
                           grid_kind, name, depth)

    resolved: PositionEncoding | list[PositionEncoding]
    if isinstance(encoding, str):
        info = get(encoding)
        if info.modality == "seq":
            kind = "1d"
            if issubclass(info.cls, StochasticPositionalEncoding):  # keeps prefix tokens apart itself
                resolved = [build(encoding, dims=dims, num_prefix_tokens=p, **options) for _ in range(depth)]
            else:
                resolved = PatchTokensOnly(build(encoding, dims=dims, **options), p)
        elif info.modality == "vision":
            _check_grid_rank(info.cls, encoding, grid)
            kind = grid_kind
            params = inspect.signature(info.cls.__init__).parameters
            extra: dict[str, Any] = {}
            if "num_prefix_tokens" in params:
                extra["num_prefix_tokens"] = p
            if "grid_size" in params:
                extra["grid_size"] = grid
            extra.update(options)
            if info.cls.per_layer:  # e.g. RoPE-Mixed learns its frequencies per block
                resolved = [build(encoding, dims=dims, **extra) for _ in range(depth)]
            else:
                resolved = build(encoding, dims=dims, **extra)
        else:
            raise ValueError(
                f"encoding {encoding!r} belongs to the {info.modality!r} modality; a ViT takes vision or seq encodings"
            )
    else:
        if modality_of(encoding) == "seq" and isinstance(encoding, StochasticPositionalEncoding):
            _check_prefix(encoding, p)
            resolved, kind = encoding, "1d"
        elif modality_of(encoding) == "seq":
            resolved, kind = PatchTokensOnly(encoding, p), "1d"
        else:
            if modality_of(encoding) == "vision" or hasattr(type(encoding), "grid_ndim"):  # not a user's own class
                _check_grid_rank(type(encoding), name, grid)
            _check_prefix(encoding, p)
            resolved, kind = encoding, grid_kind

    instances = resolved if isinstance(resolved, list) else [resolved]
    if instances and instances[0].causal_only:
        raise ValueError(
            f"{name} is defined for causal attention only; a ViT attends in both directions "
            "(ALiBi: the option symmetric=True)"
        )
    if isinstance(resolved, list) and any(Hook.INPUT in e.hooks for e in resolved):
        raise ValueError(f"{name}: an encoding with an input hook acts once, before the first block; "
                         "it cannot be built once per block")
    return ViTEncoding(resolved, {}, kind, name, depth)
