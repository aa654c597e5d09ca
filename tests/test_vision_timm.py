"""posenc encodings inside timm: registered models, and swapping the encoding of a stock timm ViT."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models.vision_transformer import VisionTransformer

import posenc.vision.timm_models as tm
from posenc.vision import SinCos2D
from posenc.vision.grid import grid_positions
from posenc.vision.timm_models import PosencAttention, PosencBlock, PosencVisionTransformer, replace_position_encoding


def _stock(**over) -> VisionTransformer:
    args = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    args.update(over)
    return VisionTransformer(**args)


def test_every_registered_model_is_created_by_timm_and_runs_at_two_sizes():
    names = tm.timm_model_names()
    expected = {f"posenc_vit_{s}_{e}" for s in ("tiny", "small") for e in
                ("peg", "sincos2d", "learned2d", "axial", "rope2d_axial", "rope2d_mixed", "relbias2d")}
    assert set(names) == expected
    assert set(timm.list_models("posenc_vit_*")) == expected
    torch.manual_seed(0)
    for name in names:
        model = timm.create_model(name, num_classes=5, img_size=32, patch_size=8, depth=2, in_chans=1).eval()
        assert isinstance(model, PosencVisionTransformer) and isinstance(model, VisionTransformer)
        assert model.posenc_name == name.split("_", 3)[3]
        with torch.no_grad():
            assert model(torch.randn(2, 1, 32, 32)).shape == (2, 5)
            assert model(torch.randn(1, 1, 48, 64)).shape == (1, 5)  # dynamic_img_size by default
        assert model.pretrained_cfg["architecture"] == name
    tiny = timm.create_model("posenc_vit_tiny_peg", num_classes=3)
    assert tiny.embed_dim == 192 and len(tiny.blocks) == 12 and tiny.patch_embed.patch_size == (16, 16)
    assert list(tiny.posenc_conditional) == ["0"]
    small = timm.create_model("posenc_vit_small_rope2d_mixed", num_classes=3, depth=2)
    assert small.embed_dim == 384 and small.blocks[0].attn.attn.num_heads == 6
    # one set of learned frequencies per block (RoPE-Mixed), not shared
    assert small.blocks[0].attn.attn.encoding is not small.blocks[1].attn.attn.encoding
    peg5 = timm.create_model("posenc_vit_tiny_peg", depth=4, peg_blocks=(0, 1, 2), encoding_options={"kernel_size": 5})
    assert sorted(peg5.posenc_conditional) == ["0", "1", "2"] and peg5.posenc_conditional["1"].kernel_size == 5


def test_pretrained_is_refused_and_importing_registers_without_clashes():
    with pytest.raises(ValueError, match="posenc_vit_tiny_sincos2d has no pretrained weights"):
        timm.create_model("posenc_vit_tiny_sincos2d", pretrained=True)
    assert tm.posenc_vit_tiny_peg is timm.models.model_entrypoint("posenc_vit_tiny_peg")
    # In a fresh interpreter (a reload here would replace the classes the other tests use):
    # importing the module registers the models; importing again or reloading it neither warns
    # (timm warns "Overwriting ..." on a duplicate name) nor replaces the entry points.
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "import importlib, timm\n"
        "import posenc.vision.timm_models as tm\n"
        "print(timm.is_model('posenc_vit_tiny_peg'), timm.is_model('posenc_vit_small_axial'))\n"
        "import posenc.vision.timm_models\n"
        "entry = timm.models.model_entrypoint('posenc_vit_tiny_peg')\n"
        "importlib.reload(tm)\n"
        "print(tm.register_timm_models(), timm.models.model_entrypoint('posenc_vit_tiny_peg') is entry)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "[]", "True"]


def test_sincos2d_swap_equals_timm_with_its_own_sincos_table_and_the_posenc_computation():
    torch.manual_seed(0)
    stock = _stock(no_embed_class=True).eval()
    with torch.no_grad():
        stock.pos_embed.copy_(build_sincos2d_pos_embed([4, 4], 32).unsqueeze(0))
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        expected = stock(images)
    swapped = replace_position_encoding(stock, "sincos2d").eval()
    assert swapped is stock and swapped.pos_embed is None
    with torch.no_grad():
        got = swapped(images)
        # the same computation spelled out with posenc pieces
        x = swapped.patch_embed(images)
        x = torch.cat((swapped.cls_token.expand(3, -1, -1), x), dim=1)
        x = SinCos2D(32, num_prefix_tokens=1).encode_input(x, grid_positions(4, 4, num_prefix_tokens=1))
        manual = swapped.head(swapped.norm(swapped.blocks(x))[:, 0])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, manual, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_learned2d_swap_keeps_the_function_of_the_stock_model_at_every_size(no_embed_class):
    torch.manual_seed(0)
    stock = _stock(no_embed_class=no_embed_class, dynamic_img_size=True, reg_tokens=2).eval()
    with torch.no_grad():
        stock.pos_embed.normal_(std=0.5)  # a learned table far from zero
    small, large = torch.randn(2, 3, 16, 16), torch.randn(2, 3, 24, 32)
    with torch.no_grad():
        before_small, before_large = stock(small), stock(large)  # timm resamples pos_embed bicubically
    swapped = replace_position_encoding(stock, "learned2d").eval()
    with torch.no_grad():
        after_small, after_large = swapped(small), swapped(large)
    torch.testing.assert_close(after_small, before_small, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after_large, before_large, atol=1e-5, rtol=1e-5)
    fresh = replace_position_encoding(_stock(), "learned2d", keep_weights=False)
    assert fresh.posenc_encoding.table.std() < 0.05  # its own initialisation


def test_swapped_attention_carries_the_timm_weights():
    torch.manual_seed(0)
    for qkv_bias in (True, False):
        stock = _stock(qkv_bias=qkv_bias).eval()
        attn = stock.blocks[0].attn
        posenc_attn = PosencAttention.from_timm(attn, None).eval()
        x = torch.randn(2, 17, 32)
        positions = grid_positions(4, 4, num_prefix_tokens=1)
        with torch.no_grad():
            torch.testing.assert_close(posenc_attn(x, positions), attn(x), atol=1e-6, rtol=1e-5)
        assert (posenc_attn.attn.q_proj.bias is None) == (not qkv_bias)
    # with RoPE the converted blocks differ from timm's only through the rotation: without it they
    # compute timm's model whose pos_embed has lost its patch part (the class part went into cls_token)
    stock = _stock().eval()
    no_patch_pe = copy.deepcopy(stock)
    with torch.no_grad():
        no_patch_pe.pos_embed[:, 1:] = 0
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        before, expected_plain = stock(x), no_patch_pe(x)
    swapped = replace_position_encoding(stock, "rope2d_axial").eval()
    assert all(isinstance(b, PosencBlock) for b in swapped.blocks)
    with torch.no_grad():
        after = swapped(x)
        for b in swapped.blocks:
            b.attn.attn.encoding = None
        plain = swapped(x)
    assert not torch.allclose(after, before, atol=1e-4)
    torch.testing.assert_close(plain, expected_plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoding", ["sincos2d", "learned2d", "axial", "peg", "rope2d_axial", "rope2d_mixed", "relbias2d", "rope"])
def test_a_stock_timm_vit_with_its_encoding_swapped_trains(encoding):
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, num_classes=4,
                              depth=2, embed_dim=32, num_heads=2)
    replace_position_encoding(model, encoding)
    images, labels = torch.randn(16, 3, 16, 16), torch.arange(16) % 4
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.75 * losses[0], losses
    position_params = [p for n, p in model.named_parameters() if "posenc" in n or "encoding" in n]
    if encoding not in ("sincos2d", "rope2d_axial", "rope"):  # those have no parameters
        assert position_params and all(p.grad is not None for p in position_params)


def test_reswap_and_prefix_tokens():
    torch.manual_seed(0)
    model = _stock(reg_tokens=2, dynamic_img_size=True)
    replace_position_encoding(model, "relbias2d")
    assert model.blocks[0].attn.attn.encoding.num_prefix_tokens == 3
    replace_position_encoding(model, "sincos2d")  # the blocks stay posenc blocks, without an encoding
    assert all(b.attn.attn.encoding is None for b in model.blocks)
    assert model.posenc_encoding.num_prefix_tokens == 3
    assert model(torch.randn(1, 3, 20, 12)).shape == (1, 5)
    replace_position_encoding(model, None)
    assert model.posenc_encoding is None and model(torch.randn(1, 3, 16, 16)).shape == (1, 5)


def test_bad_swaps_are_clear_errors_and_leave_the_model_unchanged():
    model = _stock()
    with pytest.raises(TypeError, match="model must be a timm VisionTransformer; got Linear"):
        replace_position_encoding(torch.nn.Linear(2, 2), "peg")
    with pytest.raises(KeyError, match="unknown encoding 'rope4d'"):
        replace_position_encoding(model, "rope4d")
    with pytest.raises(ValueError, match="'rope3d' is a 3D \\(video\\) encoding"):
        replace_position_encoding(model, "rope3d")
    with pytest.raises(ValueError, match="peg_blocks must name blocks in 0..1; got \\[5\\]"):
        replace_position_encoding(model, "peg", peg_blocks=(5,))
    with pytest.raises(TypeError, match="unknown argument\\(s\\) colour"):
        replace_position_encoding(model, "sincos2d", colour="red")
    with pytest.raises(ValueError, match="alibi is defined for causal attention only.*symmetric=True"):
        replace_position_encoding(model, "alibi")
    with pytest.raises(ValueError, match="built for num_prefix_tokens=0; the model has 1 prefix tokens"):
        replace_position_encoding(model, SinCos2D(32))
    assert type(model) is VisionTransformer and model.pos_embed is not None  # untouched by the failures
    with pytest.raises(ValueError, match="patch_drop_rate > 0 is not supported"):
        replace_position_encoding(_stock(patch_drop_rate=0.1), "sincos2d")
    with pytest.raises(ValueError, match="uses qk_norm"):
        replace_position_encoding(_stock(qk_norm=True), "rope2d_axial")
    fixed = replace_position_encoding(_stock(), "peg")
    with pytest.raises(AssertionError):  # timm's strict PatchEmbed: other sizes need dynamic_img_size=True
        fixed(torch.randn(1, 3, 24, 24))
    with pytest.raises(NotImplementedError, match="forward_intermediates is not available with the peg encoding"):
        fixed.forward_intermediates(torch.randn(1, 3, 16, 16))
