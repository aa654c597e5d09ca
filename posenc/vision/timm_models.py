"""posenc position encodings inside timm's ``VisionTransformer``.

Two entry points:

:func:`replace_position_encoding`
    swaps the position encoding of an existing timm ``VisionTransformer`` for a posenc one, in
    place, and returns the model, which stays a ``VisionTransformer`` (its class becomes the
    subclass :class:`PosencVisionTransformer`), so timm's tools keep working on it.
timm's registry
    importing this module registers ``posenc_vit_{tiny,small}_{encoding}`` with timm's
    ``register_model``, so ``timm.create_model("posenc_vit_tiny_peg", num_classes=10)`` works:
    timm's DeiT-tiny (patch 16, width 192, 12 blocks, 3 heads) or DeiT-small (width 384, 6
    heads) at 224 pixels, built by timm and then given the encoding by
    :func:`replace_position_encoding`. They take timm's usual keyword arguments (``num_classes``,
    ``img_size``, ``patch_size``, ``in_chans``, ``global_pool``, ``depth``, ...) and default to
    ``dynamic_img_size=True``, so they run at any image size divisible by the patch. There are no
    pretrained weights: ``pretrained=True`` is a ValueError.

Where each kind of encoding goes (the seam is timm's ``_pos_embed`` and the block loop of
``forward_features``, both overridden by :class:`PosencVisionTransformer`):

* input encodings (sincos2d, learned2d, axial, a 1D encoding over the raster order): timm's
  ``pos_embed`` is removed and the encoding is applied to the tokens after the prefix tokens are
  attached, with ``num_prefix_tokens`` set so that class and register tokens get none. If timm's
  ``pos_embed`` had entries for the prefix tokens (``no_embed_class=False``), they are constants
  and are folded into ``cls_token``/``reg_token``, so the prefix tokens stay what they were.
  ``learned2d`` starts from timm's learned patch embedding when the grids agree
  (``keep_weights=True``): the swapped model then computes exactly what the original did.
* attention encodings (2D RoPE, 2D relative bias, 1D attention encodings): every ``Block``
  becomes a :class:`PosencBlock` that keeps its norms, MLP, layer scales and drop paths, with its
  ``Attention`` replaced by a posenc :class:`~posenc.common.attention.MultiheadAttention` holding
  the same q/k/v/output weights (split from timm's fused ``qkv``).
* PEG: one PEG after each block of ``peg_blocks`` (default ``(0,)``, as CPVT).

Positions are explicit: every forward derives the patch grid from the tensor that the patch
embedding returns (``[B, H, W, C]`` with ``dynamic_img_size``, otherwise the fixed
``patch_embed.grid_size``), builds the positions of that grid and passes them to the encoding,
the blocks and the PEGs. Nothing is stored on a module between calls.

Not supported (a clear error at swap time): ``patch_drop_rate > 0`` (dropped tokens would need
their positions gathered), attention with ``qk_norm``, ``scale_attn_norm``, gating or attention
dropout when an attention encoding is swapped in, blocks other than timm's ``Block``; and
``attn_mask``/``is_causal`` or ``forward_intermediates`` on a model whose blocks were replaced.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Sequence

import torch
from timm.models import register_model
from timm.models.vision_transformer import Attention, Block, VisionTransformer
from torch import Tensor, nn

from ..common.attention import MultiheadAttention
from ..common.encoding import Hook, PositionEncoding, attention_part
from ..common.registry import ModelDims, available, build, get
from .grid import grid_positions, raster_positions
from .peg import PEG
from .prefix import PatchTokensOnly

__all__ = [
    "PosencVisionTransformer", "PosencBlock", "PosencAttention", "replace_position_encoding",
    "TIMM_ENCODINGS", "TIMM_SIZES", "timm_model_names",
]


# ----------------------------------------------------------------------------------------------
# Modules


class PosencAttention(nn.Module):
    """timm's ``Attention`` as a posenc :class:`MultiheadAttention` with a position encoding.

    Built from a timm ``Attention`` (:meth:`from_timm`): the fused ``qkv`` weight ``[3C, C]`` is
    split into the q, k and v projections, ``proj`` becomes the output projection, and a missing
    timm bias stays missing. ``proj_drop`` is kept.

    Shapes: ``x [B, T, C]``, ``positions [1, T, 2]`` (2D) or ``[1, T]`` (1D) -> ``[B, T, C]``.
    """

    def __init__(self, attn: MultiheadAttention, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.attn = attn
        self.proj_drop = nn.Dropout(proj_drop)

    @classmethod
    def from_timm(cls, attn: nn.Module, encoding: PositionEncoding | None, backend: str = "auto") -> "PosencAttention":
        if not isinstance(attn, Attention):
            raise TypeError(f"expected timm's Attention; got {type(attn).__name__} (only timm.layers.Attention is supported)")
        unsupported = [
            name for name, present in (
                ("qk_norm", not isinstance(attn.q_norm, nn.Identity) or not isinstance(attn.k_norm, nn.Identity)),
                ("scale_attn_norm", not isinstance(attn.norm, nn.Identity)),
                ("gated attention", getattr(attn, "gate", None) is not None),
                ("attention dropout", attn.attn_drop.p > 0),
            ) if present
        ]
        if unsupported:
            raise ValueError(
                f"this timm Attention uses {', '.join(unsupported)}, which the posenc attention does not have; "
                "swap in an input encoding (sincos2d, learned2d, axial, peg) or build the model without them"
            )
        dim, heads, head_dim = attn.qkv.in_features, attn.num_heads, attn.head_dim
        has_qkv_bias, has_proj_bias = attn.qkv.bias is not None, attn.proj.bias is not None
        mha = MultiheadAttention(dim, heads, head_dim=head_dim, encoding=encoding, backend=backend, scale=attn.scale,
                                 bias=True)
        mha = mha.to(device=attn.qkv.weight.device, dtype=attn.qkv.weight.dtype)
        if attn.proj.out_features != dim:
            raise ValueError(f"timm Attention with dim_out={attn.proj.out_features} != dim={dim} is not supported")
        with torch.no_grad():
            for i, proj in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
                proj.weight.copy_(attn.qkv.weight[i * heads * head_dim : (i + 1) * heads * head_dim])
                if has_qkv_bias:
                    proj.bias.copy_(attn.qkv.bias[i * heads * head_dim : (i + 1) * heads * head_dim])
                else:
                    proj.bias = None
            mha.out_proj.weight.copy_(attn.proj.weight)
            if has_proj_bias:
                mha.out_proj.bias.copy_(attn.proj.bias)
            else:
                mha.out_proj.bias = None
        return cls(mha, attn.proj_drop.p)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.proj_drop(self.attn(x, q_pos=positions))


class PosencBlock(nn.Module):
    """timm's pre-norm ``Block`` with a :class:`PosencAttention`: the same norms, MLP, layer
    scales and drop paths (the modules themselves, taken over from the timm block).

    ``x + drop_path1(ls1(attn(norm1(x), positions)))``, then ``x + drop_path2(ls2(mlp(norm2(x))))``.
    """

    def __init__(self, block: Block, attn: PosencAttention) -> None:
        super().__init__()
        self.norm1, self.attn, self.ls1, self.drop_path1 = block.norm1, attn, block.ls1, block.drop_path1
        self.norm2, self.mlp, self.ls2, self.drop_path2 = block.norm2, block.mlp, block.ls2, block.drop_path2

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), positions)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PosencVisionTransformer(VisionTransformer):
    """A timm ``VisionTransformer`` whose position encoding is a posenc one.

    Not constructed directly: :func:`replace_position_encoding` converts a ``VisionTransformer``.
    Attributes it adds: ``posenc_encoding`` (the input encoding, or None), ``posenc_conditional``
    (``{block index: PEG}``), ``posenc_position_kind`` ("2d": ``(row, col)`` positions; "1d":
    raster order) and ``posenc_name``.
    """

    posenc_encoding: PositionEncoding | None
    posenc_conditional: nn.ModuleDict
    posenc_position_kind: str
    posenc_name: str

    def patch_grid(self, patches: Tensor) -> tuple[int, int]:
        """The grid ``(rows, cols)`` of the patch embedding's output: ``[B, H, W, C]``
        (``dynamic_img_size``) or ``[B, N, C]`` at the fixed ``patch_embed.grid_size``."""
        if patches.dim() == 4:
            return int(patches.shape[1]), int(patches.shape[2])
        rows, cols = self.patch_embed.grid_size
        if patches.shape[1] != rows * cols:
            raise ValueError(
                f"the patch embedding returned {patches.shape[1]} tokens, not the {rows}x{cols} grid of "
                f"patch_embed.grid_size; build the model with dynamic_img_size=True for other image sizes"
            )
        return rows, cols

    def token_positions(self, rows: int, cols: int, device=None) -> Tensor:
        """Positions of all tokens (prefix first) for a ``rows x cols`` grid: ``[1, T, 2]`` or ``[1, T]``."""
        if self.posenc_position_kind == "1d":
            return raster_positions(rows * cols, num_prefix_tokens=self.num_prefix_tokens, device=device)
        return grid_positions(rows, cols, num_prefix_tokens=self.num_prefix_tokens, device=device)

    def _embed_with_positions(self, patches: Tensor) -> tuple[Tensor, Tensor]:
        """Patch embedding output -> (tokens with prefix and input encoding ``[B, T, C]``, positions)."""
        rows, cols = self.patch_grid(patches)
        x = patches.reshape(patches.shape[0], rows * cols, patches.shape[-1])
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if prefix:
            x = torch.cat((*prefix, x), dim=1)
        positions = self.token_positions(rows, cols, device=x.device)
        if self.posenc_encoding is not None:
            x = self.posenc_encoding.encode_input(x, positions)
        return self.pos_drop(x), positions

    def _pos_embed(self, x: Tensor) -> Tensor:
        return self._embed_with_positions(x)[0]

    def forward_features(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x, positions = self._embed_with_positions(self.patch_embed(x))
        x = self.norm_pre(self.patch_drop(x))
        for i, block in enumerate(self.blocks):
            if isinstance(block, PosencBlock):
                if attn_mask is not None or is_causal:
                    raise ValueError("attn_mask and is_causal are not supported by the posenc attention blocks")
                x = block(x, positions)
            else:
                x = block(x, attn_mask=attn_mask, is_causal=is_causal)
            if str(i) in self.posenc_conditional:
                x = x + self.posenc_conditional[str(i)](x, positions)
        return self.norm(x)

    def forward_intermediates(self, *args: Any, **kwargs: Any):
        if any(isinstance(b, PosencBlock) for b in self.blocks) or len(self.posenc_conditional):
            raise NotImplementedError(
                f"forward_intermediates is not available with the {self.posenc_name} encoding "
                "(its blocks need positions); use forward_features"
            )
        return super().forward_intermediates(*args, **kwargs)


# ----------------------------------------------------------------------------------------------
# Swapping


def _modality(encoding: PositionEncoding) -> str | None:
    for info in available():
        if info.cls is type(encoding):
            return info.modality
    return None


def _build(name: str, model: VisionTransformer, options: dict[str, Any], per_block: bool) -> list[PositionEncoding]:
    """The encodings for ``model``: one, or one per block when the class asks for it (``per_layer``)."""
    info = get(name)
    rows, cols = model.patch_embed.grid_size
    heads = _num_heads(model)
    dims = ModelDims(dim=model.embed_dim, num_heads=heads, max_len=rows * cols)
    if info.modality == "seq":
        return [PatchTokensOnly(build(name, dims=dims, **options), model.num_prefix_tokens)]
    if info.modality != "vision":
        raise ValueError(f"encoding {name!r} belongs to the {info.modality!r} modality; a ViT takes vision or seq encodings")
    if getattr(info.cls, "grid_ndim", 2) != 2:  # sincos3d, axial3d, rope3d: timm's ViT is for images
        raise ValueError(f"encoding {name!r} is a 3D (video) encoding of (t, row, col) positions; timm's ViT takes images")
    params = inspect.signature(info.cls.__init__).parameters
    extra: dict[str, Any] = {}
    if "num_prefix_tokens" in params:
        extra["num_prefix_tokens"] = model.num_prefix_tokens
    if "grid_size" in params:
        extra["grid_size"] = (rows, cols)
    extra.update(options)
    count = len(model.blocks) if per_block and info.cls.per_layer else 1
    return [build(name, dims=dims, **extra) for _ in range(count)]


def _num_heads(model: VisionTransformer) -> int:
    attn = model.blocks[0].attn
    return attn.attn.num_heads if isinstance(attn, PosencAttention) else attn.num_heads


def _fold_prefix_pos_embed(model: VisionTransformer) -> Tensor | None:
    """Move the prefix entries of timm's ``pos_embed`` into the prefix tokens; return the patch part
    ``[1, N, C]`` (or None without a ``pos_embed``)."""
    pos_embed = getattr(model, "pos_embed", None)
    if pos_embed is None:
        return None
    patch_part = pos_embed
    if not model.no_embed_class and model.num_prefix_tokens:
        prefix, patch_part = pos_embed[:, : model.num_prefix_tokens], pos_embed[:, model.num_prefix_tokens :]
        with torch.no_grad():
            start = 0
            for token in (model.cls_token, model.reg_token):
                if token is not None:
                    token.add_(prefix[:, start : start + token.shape[1]])
                    start += token.shape[1]
    return patch_part.detach()


def replace_position_encoding(
    model: VisionTransformer,
    encoding: str | PositionEncoding | None,
    *,
    peg_blocks: Sequence[int] = (0,),
    keep_weights: bool = True,
    backend: str = "auto",
    **options: Any,
) -> PosencVisionTransformer:
    """Give a timm ``VisionTransformer`` a posenc position encoding, in place; returns the model.

    Args:
        model: a timm ``VisionTransformer`` (or one already converted, whose encoding is replaced
            again: blocks converted before keep their posenc attention with the new encoding, or
            none). Its class becomes :class:`PosencVisionTransformer`.
        encoding: a registered vision or sequence encoding name, an encoding instance, or None
            (no position encoding at all). An instance with a ``num_prefix_tokens`` attribute must
            match the model's; a registered sequence encoding instance is wrapped in
            :class:`~posenc.vision.prefix.PatchTokensOnly`. A registry name gets
            ``num_prefix_tokens`` and the training ``grid_size`` from the model, one instance per
            block when its class sets ``per_layer``.
        peg_blocks: for "peg" (or a PEG instance): the blocks after which a PEG is added.
        keep_weights: ``learned2d`` starts from the model's learned ``pos_embed`` when its grid
            matches (then the converted model computes what the original did).
        backend: the attention kernel path of the posenc attention (see :func:`posenc.attend`).
        options: constructor options of a registry name (e.g. ``layout="mae"``, ``kernel_size=5``).

    The model's ``pos_embed`` is removed in every case (its prefix entries are folded into the
    prefix tokens first). Raises TypeError for anything but a timm ``VisionTransformer`` built from
    ``Block``, and ValueError for the unsupported options listed in the module docstring.
    """
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"model must be a timm VisionTransformer; got {type(model).__name__}")
    if type(model) not in (VisionTransformer, PosencVisionTransformer):
        raise TypeError(
            f"model is a {type(model).__name__}, a subclass of VisionTransformer with its own forward; "
            "only timm's VisionTransformer itself can be converted"
        )
    if not isinstance(model.patch_drop, nn.Identity):
        raise ValueError("patch_drop_rate > 0 is not supported: dropped tokens would need their positions gathered")
    if getattr(model, "attn_pool", None) is not None and model.pool_include_prefix:
        raise ValueError("attention pooling over the prefix tokens is not supported")
    name = encoding if isinstance(encoding, str) else "none" if encoding is None else type(encoding).__name__
    if not isinstance(encoding, (str, PositionEncoding)) and encoding is not None:
        raise TypeError(f"encoding must be a registered name, a PositionEncoding or None; got {type(encoding).__name__}")
    if options and not isinstance(encoding, str):
        raise ValueError("encoding options apply to a registry name, not to an encoding instance or None")

    # Build the new encoding(s) before touching the model, so a bad option leaves it unchanged.
    conditional: dict[int, nn.Module] = {}
    if isinstance(encoding, str) and get(encoding).cls is PEG or isinstance(encoding, PEG):
        blocks = sorted(set(int(i) for i in peg_blocks))
        if not blocks or any(not 0 <= i < len(model.blocks) for i in blocks):
            raise ValueError(f"peg_blocks must name blocks in 0..{len(model.blocks) - 1}; got {list(peg_blocks)}")
        if isinstance(encoding, PEG):
            if len(blocks) != 1:
                raise ValueError("a PEG instance goes after one block; pass a name ('peg') for several")
            _check_prefix(encoding, model)
            conditional = {blocks[0]: encoding}
        else:
            conditional = {i: _build("peg", model, dict(options), per_block=False)[0] for i in blocks}
        encodings: list[PositionEncoding | None] = [None]
        kind = "2d"
    elif isinstance(encoding, str):
        encodings = list(_build(encoding, model, dict(options), per_block=True))
        kind = "1d" if get(encoding).modality == "seq" else "2d"
    elif isinstance(encoding, PositionEncoding):
        if _modality(encoding) == "seq":
            encoding = PatchTokensOnly(encoding, model.num_prefix_tokens)
            kind = "1d"
        else:
            _check_prefix(encoding, model)
            kind = "2d"
        encodings = [encoding]
    else:
        encodings, kind = [None], "2d"
    first = encodings[0]
    if first is not None and first.causal_only:
        raise ValueError(f"{name} is defined for causal attention only; a ViT attends in both directions "
                         "(ALiBi: pass symmetric=True)")
    if first is not None and Hook.INPUT in first.hooks and len(encodings) > 1:
        raise ValueError(f"{name}: an encoding with an input hook cannot be built once per block")

    attn_encodings = [attention_part(e) for e in encodings]
    per_block = attn_encodings if len(attn_encodings) == len(model.blocks) else attn_encodings * len(model.blocks)
    new_blocks: list[nn.Module] = []
    for block, enc in zip(model.blocks, per_block):
        if isinstance(block, PosencBlock):  # converted before: only its encoding changes (set below)
            new_blocks.append(block)
        elif enc is None:
            new_blocks.append(block)  # timm's own block: plain attention
        elif type(block) is not Block:
            raise TypeError(f"only timm's Block can take an attention encoding; this model has {type(block).__name__}")
        else:
            new_blocks.append(PosencBlock(block, PosencAttention.from_timm(block.attn, enc, backend)))

    patch_pos_embed = _fold_prefix_pos_embed(model)
    if (
        keep_weights and patch_pos_embed is not None and isinstance(first, nn.Module)
        and type(first).__name__ == "Learned2D" and tuple(first.table.shape[:2]) == tuple(model.patch_embed.grid_size)
    ):
        with torch.no_grad():
            first.table.copy_(patch_pos_embed.reshape(first.table.shape))
    model.pos_embed = None
    for block, enc in zip(new_blocks, per_block):
        if isinstance(block, PosencBlock):
            block.attn.attn.encoding = enc
    model.blocks = nn.Sequential(*new_blocks)
    model.__class__ = PosencVisionTransformer
    model.posenc_encoding = first if first is not None and Hook.INPUT in first.hooks else None
    model.posenc_conditional = nn.ModuleDict({str(i): m for i, m in sorted(conditional.items())})
    model.posenc_position_kind = kind
    model.posenc_name = name
    return model


def _check_prefix(encoding: PositionEncoding, model: VisionTransformer) -> None:
    built_for = encoding.num_prefix_tokens
    if built_for is not None and built_for != model.num_prefix_tokens:
        raise ValueError(
            f"the {type(encoding).__name__} instance was built for num_prefix_tokens={built_for}; "
            f"the model has {model.num_prefix_tokens} prefix tokens (class token + registers)"
        )


# ----------------------------------------------------------------------------------------------
# timm registry

# encoding -> options for the registered models
TIMM_ENCODINGS: dict[str, dict[str, Any]] = {
    "peg": {},
    "sincos2d": {},
    "learned2d": {},
    "axial": {},
    "rope2d_axial": {},
    "rope2d_mixed": {},
    "relbias2d": {},
}
# size -> timm VisionTransformer arguments (DeiT-tiny and DeiT-small at 224 pixels, patch 16)
TIMM_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
}


def timm_model_names() -> list[str]:
    """The timm names this module registers (for the encodings that are registered with posenc)."""
    return [f"posenc_vit_{size}_{enc}" for size in TIMM_SIZES for enc in TIMM_ENCODINGS if _known(enc)]


def _known(name: str) -> bool:
    try:
        get(name)
    except KeyError:
        return False
    return True


def _pretrained_cfg(name: str) -> dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.9,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225), "first_conv": "patch_embed.proj", "classifier": "head",
        "architecture": name, "license": "apache-2.0",
    }


def _entrypoint(name: str, size: str, encoding: str):
    def create(pretrained: bool = False, **kwargs: Any) -> PosencVisionTransformer:
        if pretrained:
            raise ValueError(f"{name} has no pretrained weights (posenc ships none); use pretrained=False")
        for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "pretrained_model_args"):
            kwargs.pop(key, None)
        peg_blocks = kwargs.pop("peg_blocks", (0,))
        encoding_options = dict(kwargs.pop("encoding_options", None) or {})
        args = dict(TIMM_SIZES[size])
        args.update(dynamic_img_size=True, pos_embed="none")
        args.update(kwargs)
        model = VisionTransformer(**args)
        model.pretrained_cfg = model.default_cfg = _pretrained_cfg(name)
        options = {**TIMM_ENCODINGS[encoding], **encoding_options}
        return replace_position_encoding(model, encoding, peg_blocks=peg_blocks, **options)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = (
        f"timm DeiT-{size} ({TIMM_SIZES[size]['embed_dim']} wide) with posenc's {encoding!r} encoding; no pretrained weights. "
        "Keyword arguments go to timm's VisionTransformer (defaults: dynamic_img_size=True), plus peg_blocks and "
        "encoding_options (constructor options of the encoding)."
    )
    return create


def register_timm_models() -> list[str]:
    """Register :func:`timm_model_names` with timm (idempotent: names this module registered
    before are left alone; a name another module owns is not overwritten, with a warning)."""
    from timm.models import is_model, model_entrypoint

    done = []
    for name in timm_model_names():
        size, encoding = name[len("posenc_vit_"):].split("_", 1)
        if is_model(name):
            owner = getattr(model_entrypoint(name), "__module__", None)
            if owner != __name__:
                warnings.warn(f"timm already has a model named {name} (from {owner}); posenc does not overwrite it",
                              stacklevel=2)
            continue
        fn = _entrypoint(name, size, encoding)
        globals()[name] = fn  # a module attribute, as timm's own entry points are (register_model lists it in __all__)
        register_model(fn)
        done.append(name)
    return done


register_timm_models()
