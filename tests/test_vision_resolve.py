"""One encoding resolution for both ViTs (posenc.vision.resolve): names, options and instances
become the same encodings in the reference ViT and in a timm ViT converted by
replace_position_encoding."""

from __future__ import annotations

import pytest
import torch

from posenc import build
from posenc.common.encoding import Hook
from posenc.common.registry import ModelDims
from posenc.vision import PEG, SinCos2D, ViT
from posenc.vision.prefix import PatchTokensOnly
from posenc.vision.resolve import resolve_vit_encoding

DIMS = dict(dim=32, num_heads=2, depth=3, grid_size=(4, 4), num_prefix_tokens=1)


def test_names_resolve_by_the_documented_rules():
    assert resolve_vit_encoding(None, **DIMS).encoding is None
    sincos = resolve_vit_encoding("sincos2d", **DIMS)
    assert isinstance(sincos.encoding, SinCos2D) and sincos.position_kind == "2d"
    assert sincos.encoding.num_prefix_tokens == 1 and sincos.input_encoding is sincos.encoding
    assert sincos.attention_per_block == [None, None, None]  # an input encoding never enters the blocks
    mixed = resolve_vit_encoding("rope2d_mixed", **DIMS)  # per_layer: one instance per block
    assert isinstance(mixed.encoding, list) and len({id(e) for e in mixed.encoding}) == 3
    learned = resolve_vit_encoding("learned2d", **DIMS)
    assert tuple(learned.encoding.table.shape[:2]) == (4, 4)  # built at the training grid
    rope = resolve_vit_encoding("rope", **DIMS)  # a sequence encoding over the raster order
    assert isinstance(rope.encoding, PatchTokensOnly) and rope.position_kind == "1d"
    spe = resolve_vit_encoding("sine_spe", **DIMS)  # keeps the prefix apart itself, one per block
    assert isinstance(spe.encoding, list) and spe.encoding[0].num_prefix_tokens == 1 and spe.position_kind == "1d"
    peg = resolve_vit_encoding("peg", **DIMS, peg_blocks=(0, 2), options={"kernel_size": 5})
    assert peg.encoding is None and sorted(peg.conditional) == [0, 2] and peg.conditional[2].kernel_size == 5


def test_instances_and_bad_input():
    peg = PEG(32, num_prefix_tokens=1)
    assert resolve_vit_encoding(peg, **DIMS, peg_blocks=(1,)).conditional == {1: peg}
    with pytest.raises(ValueError, match="a PEG instance goes after one block"):
        resolve_vit_encoding(peg, **DIMS, peg_blocks=(0, 1))
    rope = build("rope", dims=ModelDims(32, 2, 16))
    wrapped = resolve_vit_encoding(rope, **DIMS)
    assert isinstance(wrapped.encoding, PatchTokensOnly) and wrapped.encoding.inner is rope
    with pytest.raises(ValueError, match="built for num_prefix_tokens=0; the model has 1 prefix tokens"):
        resolve_vit_encoding(SinCos2D(32), **DIMS)
    with pytest.raises(ValueError, match="alibi is defined for causal attention only.*symmetric=True"):
        resolve_vit_encoding("alibi", **DIMS)
    assert resolve_vit_encoding("alibi", **DIMS, options={"symmetric": True}).position_kind == "1d"
    with pytest.raises(ValueError, match="apply to a registry name, not to an encoding instance"):
        resolve_vit_encoding(SinCos2D(32, num_prefix_tokens=1), **DIMS, options={"layout": "mae"})
    with pytest.raises(ValueError, match="peg_blocks must name blocks in 0..2; got \\[3\\]"):
        resolve_vit_encoding("peg", **DIMS, peg_blocks=(3,))
    with pytest.raises(ValueError, match="belongs to the 'graph' modality"):
        resolve_vit_encoding("lap", **DIMS)
    with pytest.raises(TypeError, match="encoding must be a registered name"):
        resolve_vit_encoding(3, **DIMS)


@pytest.mark.parametrize("encoding", ["sincos2d", "learned2d", "peg", "rope2d_mixed", "relbias2d", "rope"])
def test_the_reference_vit_and_a_timm_vit_resolve_alike(encoding):
    timm_models = pytest.importorskip("posenc.vision.timm_models")
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    ours = ViT(img_size=16, patch_size=4, num_classes=5, dim=32, depth=3, num_heads=2, encoding=encoding)
    stock = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, num_classes=5,
                              embed_dim=32, depth=3, num_heads=2)
    theirs = timm_models.replace_position_encoding(stock, encoding)
    assert ours.position_kind == theirs.posenc_position_kind and ours.encoding_name == theirs.posenc_name
    # the same encoding classes before the first block, in each block and after blocks
    first = ours.encoder.encoding
    ours_input = first if first is not None and Hook.INPUT in first.hooks else None
    assert type(ours_input) is type(theirs.posenc_encoding)
    ours_blocks = [type(b.attn.encoding) for b in ours.encoder.blocks]
    theirs_blocks = [type(b.attn.attn.encoding) if hasattr(b.attn, "attn") else type(None) for b in theirs.blocks]
    assert ours_blocks == theirs_blocks
    assert sorted(ours.encoder.conditional) == sorted(theirs.posenc_conditional)
    images = torch.randn(2, 3, 16, 16)
    assert ours(images).shape == theirs(images).shape == (2, 5)
