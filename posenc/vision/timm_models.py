"""posenc position encodings inside timm's ``VisionTransformer``.

Two entry points:

:func:`replace_position_encoding`
    swaps the position encoding of an existing timm ``VisionTransformer`` for a posenc one, in
    place, and returns the model, which stays a ``VisionTransformer`` (its class becomes the
    subclass :class:`PosencVisionTransformer`), so timm's tools keep working on it.
timm's registry
    importing this module registers ``posenc_vit_{tiny,small}_{encoding}`` with timm's
    ``register_model``, each with a (weightless) pretrained config in this module's
    ``default_cfgs`` (timm's ``generate_default_cfgs``), so ``timm.create_model("posenc_vit_tiny_peg",
    num_classes=10)`` works, and so do ``features_only=True`` and ``timm.get_pretrained_cfg``:
    timm's DeiT-tiny (patch 16, width 192, 12 blocks, 3 heads) or DeiT-small (width 384, 6
    heads) at 224 pixels, built by timm's ``build_model_with_cfg`` and given the encoding by
    :func:`replace_position_encoding`. They take timm's usual keyword arguments (``num_classes``,
    ``img_size``, ``patch_size``, ``in_chans``, ``global_pool``, ``depth``, ``features_only``,
    ``out_indices``, ...) and default to ``dynamic_img_size=True``, so they run at any image size
    divisible by the patch. There are no pretrained weights: ``pretrained=True`` is a ValueError.

Where each kind of encoding goes (the seam is timm's ``_pos_embed`` and the block loop of
``forward_features``/``forward_intermediates``, all overridden by :class:`PosencVisionTransformer`;
the rules that turn a name or an instance into encodings are
:func:`~posenc.vision.resolve.resolve_vit_encoding`, shared with :class:`~posenc.vision.ViT`):

* input encodings (sincos2d, learned2d, axial, a 1D encoding over the raster order): timm's
  ``pos_embed`` is removed and the encoding is applied to the tokens after the prefix tokens are
  attached, with ``num_prefix_tokens`` set so that class and register tokens get none. If timm's
  ``pos_embed`` had entries for the prefix tokens (``no_embed_class=False``), they are constants
  and are folded into ``cls_token``/``reg_token``, so the prefix tokens stay what they were.
  ``learned2d`` starts from timm's learned patch embedding when the grids agree
  (``keep_weights=True``): the swapped model then computes exactly what the original did.
* attention encodings (2D RoPE, 2D relative bias, 1D attention encodings): every ``Block``
  becomes a :class:`PosencBlock` that keeps its norms, MLP, layer scales and drop paths, with its
  ``Attention`` replaced by a posenc :class:`~posenc.common.multihead.MultiheadAttention` holding
  the same q/k/v/output weights (split from timm's fused ``qkv``).
* PEG: one PEG after each block of ``peg_blocks`` (default ``(0,)``, as CPVT).

Positions are explicit: every forward derives the patch grid from the tensor that the patch
embedding returns (``[B, H, W, C]`` with ``dynamic_img_size``, otherwise the fixed
``patch_embed.grid_size``), builds the positions of that grid and passes them to the encoding,
the blocks and the PEGs. Nothing is stored on a module between calls.

timm's tools: ``forward_intermediates`` (and so ``features_only=True``, timm's getter feature
wrapper), ``prune_intermediate_layers``, ``set_grad_checkpointing`` and FX tracing work with every
encoding. For FX, the steps that depend on tensor sizes or values (the patch grid and its
positions, the encodings, the posenc attention, the PEG) are called through the functions
:func:`patch_tokens`, :func:`apply_input_encoding`, :func:`apply_attention` and
:func:`conditional_term`, which ``torch.fx.wrap`` keeps opaque: ``torch.fx.symbolic_trace``, timm's
FX feature extraction and torchvision's ``create_feature_extractor`` record each as one call.
TorchScript is not supported: ``torch.jit.script`` raises a NotImplementedError saying so (use
``torch.compile``, ``torch.export`` or FX).

Not supported (a clear error at swap time): ``patch_drop_rate > 0`` (dropped tokens would need
their positions gathered), attention with ``qk_norm``, ``scale_attn_norm``, gating or attention
dropout when an attention encoding is swapped in, blocks other than timm's ``Block``; and
``attn_mask``/``is_causal`` on a model whose blocks were replaced.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch
import torch.fx
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint
from timm.models.vision_transformer import Attention, Block, VisionTransformer
from torch import Tensor, nn

from ..common.multihead import MultiheadAttention
from ..common.encoding import PositionEncoding
from ..common.registry import get
from .grid import grid_positions, raster_positions
from .resolve import ViTEncoding, resolve_vit_encoding

__all__ = [
    "PosencVisionTransformer", "PosencBlock", "PosencAttention", "replace_position_encoding",
    "TIMM_ENCODINGS", "TIMM_SIZES", "timm_model_names", "patch_tokens", "apply_input_encoding",
    "apply_attention", "conditional_term", "refuse_attention_mask",
]

_NO_TORCHSCRIPT = (
    "{} does not support TorchScript (posenc encodings follow the patch grid of each call with Python-level "
    "shape logic); use torch.compile, torch.export or FX (torch.fx.symbolic_trace, timm's features_only)"
)


# ----------------------------------------------------------------------------------------------
# The steps FX keeps opaque (torch.fx.wrap: each is one call in a traced graph)


def patch_tokens(
    patches: Tensor, fixed_grid: tuple[int, int], num_prefix_tokens: int, position_kind: str
) -> tuple[Tensor, Tensor]:
    """The patch embedding's output as tokens, and the positions of all tokens (prefix first).

    Args:
        patches: ``[B, H, W, C]`` (``dynamic_img_size``) or ``[B, N, C]`` at ``fixed_grid``.
        fixed_grid: ``patch_embed.grid_size``, the grid of a ``[B, N, C]`` output.
        num_prefix_tokens: class and register tokens that come before the patches.
        position_kind: "2d" (``(row, col)``) or "1d" (raster order).

    Returns:
        ``(tokens [B, H*W, C], positions [1, P + H*W, 2] or [1, P + H*W])``.
    """
    if patches.dim() == 4:
        rows, cols = int(patches.shape[1]), int(patches.shape[2])
    else:
        rows, cols = fixed_grid
        if patches.shape[1] != rows * cols:
            raise ValueError(
                f"the patch embedding returned {patches.shape[1]} tokens, not the {rows}x{cols} grid of "
                f"patch_embed.grid_size; build the model with dynamic_img_size=True for other image sizes"
            )
    tokens = patches.reshape(patches.shape[0], rows * cols, patches.shape[-1])
    if position_kind == "1d":
        positions = raster_positions(rows * cols, num_prefix_tokens=num_prefix_tokens, device=patches.device)
    else:
        positions = grid_positions(rows, cols, num_prefix_tokens=num_prefix_tokens, device=patches.device)
    return tokens, positions


def apply_input_encoding(encoding: PositionEncoding, x: Tensor, positions: Tensor) -> Tensor:
    """``encoding.encode_input(x, positions)``: tokens ``[B, T, C]`` with the input encoding."""
    return encoding.encode_input(x, positions)


def apply_attention(attn: nn.Module, x: Tensor, positions: Tensor) -> Tensor:
    """``attn(x, positions)`` for a :class:`PosencAttention`: ``[B, T, C]`` -> ``[B, T, C]``."""
    return attn(x, positions)


def conditional_term(module: nn.Module, x: Tensor, positions: Tensor) -> Tensor:
    """``module(x, positions)``: the term a conditional encoder (PEG) adds after a block, ``[B, T, C]``."""
    return module(x, positions)


def refuse_attention_mask(attn_mask: Tensor | None, is_causal: bool) -> None:
    """ValueError when a mask is given to a model whose blocks have the posenc attention (a
    function, so that a traced graph keeps the check instead of branching on a traced argument)."""
    if attn_mask is not None or is_causal:
        raise ValueError("attn_mask and is_causal are not supported by the posenc attention blocks")


for _fn in (patch_tokens, refuse_attention_mask, apply_input_encoding, apply_attention, conditional_term):
    torch.fx.wrap(_fn.__name__)


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

    def __prepare_scriptable__(self):
        raise NotImplementedError(_NO_TORCHSCRIPT.format("the posenc attention of a timm ViT"))


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
        x = x + self.drop_path1(self.ls1(apply_attention(self.attn, self.norm1(x), positions)))
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

    def token_positions(self, rows: int, cols: int, device=None) -> Tensor:
        """Positions of all tokens (prefix first) for a ``rows x cols`` grid: ``[1, T, 2]`` or ``[1, T]``."""
        if self.posenc_position_kind == "1d":
            return raster_positions(rows * cols, num_prefix_tokens=self.num_prefix_tokens, device=device)
        return grid_positions(rows, cols, num_prefix_tokens=self.num_prefix_tokens, device=device)

    def _embed_with_positions(self, patches: Tensor) -> tuple[Tensor, Tensor]:
        """Patch embedding output -> (tokens with prefix and input encoding ``[B, T, C]``, positions)."""
        x, positions = patch_tokens(
            patches, tuple(self.patch_embed.grid_size), self.num_prefix_tokens, self.posenc_position_kind
        )
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if prefix:
            x = torch.cat((*prefix, x), dim=1)
        if self.posenc_encoding is not None:
            x = apply_input_encoding(self.posenc_encoding, x, positions)
        return self.pos_drop(x), positions

    def _pos_embed(self, x: Tensor) -> Tensor:
        return self._embed_with_positions(x)[0]

    def _block(self, i: int, block: nn.Module, x: Tensor, positions: Tensor, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        """Block ``i`` and the conditional encoder after it (if any)."""
        if isinstance(block, PosencBlock):  # takes no mask: forward_features refused one (_refuse_attention_mask)
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, positions)
            else:
                x = block(x, positions)
        elif attn_mask is not None or is_causal:
            x = block(x, attn_mask=attn_mask, is_causal=is_causal)
        elif self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint(block, x)
        else:
            x = block(x)
        if str(i) in self.posenc_conditional:
            x = x + conditional_term(self.posenc_conditional[str(i)], x, positions)
        return x

    def _check_mask(self, attn_mask: Tensor | None, is_causal: bool) -> None:
        if any(isinstance(b, PosencBlock) for b in self.blocks):
            refuse_attention_mask(attn_mask, is_causal)

    def forward_features(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        self._check_mask(attn_mask, is_causal)
        x, positions = self._embed_with_positions(self.patch_embed(x))
        x = self.norm_pre(self.patch_drop(x))
        for i, block in enumerate(self.blocks):
            x = self._block(i, block, x, positions, attn_mask, is_causal)
        return self.norm(x)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        # Defined here (not inherited) so that FX's tracing of this module sees the wrapped functions.
        return self.forward_head(self.forward_features(x, attn_mask=attn_mask, is_causal=is_causal))

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ):
        """timm's ``VisionTransformer.forward_intermediates`` (same arguments and outputs) with the
        positions of the patch grid passed to every block and PEG. The arguments not listed here
        are timm's.

        Args:
            x: images ``[B, C, H, W]``.
            indices: the last ``n`` blocks (int), all (None) or these block indices.
            output_fmt: "NCHW" (``[B, C, rows, cols]`` intermediates) or "NLC" (``[B, rows*cols, C]``).

        Returns:
            ``(final features [B, T, C], intermediates)``, the intermediates alone, or a dict with
            ``image_intermediates`` (and ``image_features``, ``image_intermediates_prefix``).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC'; got {output_fmt!r}")
        self._check_mask(attn_mask, is_causal)
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        batch = x.shape[0]
        patches = self.patch_embed(x)
        x, positions = self._embed_with_positions(patches)
        x = self.norm_pre(self.patch_drop(x))
        if patches.dim() == 4:
            rows, cols = int(patches.shape[1]), int(patches.shape[2])
        else:
            rows, cols = self.patch_embed.grid_size
        intermediates = []
        blocks = self.blocks if not stop_early else self.blocks[: max_index + 1]
        for i, block in enumerate(blocks):
            x = self._block(i, block, x, positions, attn_mask, is_causal)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        p = self.num_prefix_tokens
        prefix_tokens = [y[:, :p] for y in intermediates] if p else None
        intermediates = [y[:, p:] for y in intermediates]
        if output_fmt == "NCHW":
            intermediates = [y.reshape(batch, rows, cols, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if output_dict:
            out: dict[str, Any] = {"image_intermediates": intermediates}
            if prefix_tokens is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                out["image_features"] = self.norm(x)
            return out
        if return_prefix_tokens and prefix_tokens is not None:
            intermediates = list(zip(intermediates, prefix_tokens))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """timm's pruning (blocks after the last index, optionally the norm and head) that also
        drops the PEGs after removed blocks."""
        take_indices = super().prune_intermediate_layers(indices, prune_norm=prune_norm, prune_head=prune_head)
        kept = len(self.blocks)
        for key in [k for k in self.posenc_conditional if int(k) >= kept]:
            del self.posenc_conditional[key]
        return take_indices

    def __prepare_scriptable__(self):
        raise NotImplementedError(_NO_TORCHSCRIPT.format(f"{type(self).__name__} ({self.posenc_name})"))


# ----------------------------------------------------------------------------------------------
# Swapping


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
            block when its class sets ``per_layer`` (:func:`~posenc.vision.resolve.resolve_vit_encoding`).
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

    # Resolve the new encoding(s) before touching the model, so a bad option leaves it unchanged.
    resolved: ViTEncoding = resolve_vit_encoding(
        encoding, dim=model.embed_dim, num_heads=_num_heads(model), depth=len(model.blocks),
        grid_size=tuple(model.patch_embed.grid_size), num_prefix_tokens=model.num_prefix_tokens,
        options=options, peg_blocks=peg_blocks,
    )
    per_block = resolved.attention_per_block
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
    first = resolved.input_encoding
    if (
        keep_weights and patch_pos_embed is not None and first is not None
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
    model.posenc_encoding = first
    model.posenc_conditional = nn.ModuleDict({str(i): m for i, m in sorted(resolved.conditional.items())})
    # A graph traced by FX holds the encodings directly (not the model): torch.jit.script of it
    # meets PositionEncoding.__prepare_scriptable__, the clear refusal.
    model.posenc_position_kind = resolved.position_kind
    model.posenc_name = resolved.name or "none"
    return model


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


def _cfg(**overrides: Any) -> dict[str, Any]:
    """A weightless pretrained config: timm's data settings for a DeiT at 224 pixels, no url/hub id."""
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.9,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225), "first_conv": "patch_embed.proj", "classifier": "head",
        "license": "apache-2.0", **overrides,
    }


#: timm reads a module's ``default_cfgs`` when ``register_model`` registers an entry point of it
#: (as in timm's own model files); filled by :func:`register_timm_models`.
default_cfgs: dict[str, Any] = {}


def _create(name: str, size: str, encoding: str, pretrained: bool, kwargs: dict[str, Any]) -> nn.Module:
    if pretrained:
        raise ValueError(f"{name} has no pretrained weights (posenc ships none); use pretrained=False")
    peg_blocks = kwargs.pop("peg_blocks", (0,))
    options = {**TIMM_ENCODINGS[encoding], **dict(kwargs.pop("encoding_options", None) or {})}
    out_indices = kwargs.pop("out_indices", 3)  # timm's ViT default: the last 3 blocks as features

    def make(**model_args: Any) -> PosencVisionTransformer:
        model = VisionTransformer(**model_args)
        return replace_position_encoding(model, encoding, peg_blocks=peg_blocks, **options)

    args = {**TIMM_SIZES[size], "dynamic_img_size": True, "pos_embed": "none", **kwargs}
    return build_model_with_cfg(
        make, name, pretrained=False, feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **args
    )


def _entrypoint(name: str, size: str, encoding: str):
    def create(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        return _create(name, size, encoding, pretrained, kwargs)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = (
        f"timm DeiT-{size} ({TIMM_SIZES[size]['embed_dim']} wide) with posenc's {encoding!r} encoding; no pretrained weights. "
        "Keyword arguments go to timm's VisionTransformer (defaults: dynamic_img_size=True) and timm's builder "
        "(features_only, out_indices, ...), plus peg_blocks and encoding_options (constructor options of the encoding)."
    )
    return create


def register_timm_models() -> list[str]:
    """Register :func:`timm_model_names` with timm, each with its pretrained config (idempotent:
    names this module registered before are left alone; a name another module owns is not
    overwritten, with a warning)."""
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
        default_cfgs.update(generate_default_cfgs({name: _cfg()}))
        fn = _entrypoint(name, size, encoding)
        globals()[name] = fn  # a module attribute, as timm's own entry points are (register_model lists it in __all__)
        register_model(fn)
        done.append(name)
    return done


register_timm_models()
