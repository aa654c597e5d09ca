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
from timm.models._features import FeatureGetterNet
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
    rope = replace_position_encoding(_stock(), "rope2d_axial")
    with pytest.raises(ValueError, match="attn_mask and is_causal are not supported by the posenc attention blocks"):
        rope(torch.randn(1, 3, 16, 16), is_causal=True)
    with pytest.raises(ValueError, match="attn_mask and is_causal are not supported"):
        rope.forward_intermediates(torch.randn(1, 3, 16, 16), attn_mask=torch.ones(17, 17, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------
# What timm's own tests/test_models.py checks, fast: pretrained config, features_only,
# forward_intermediates, FX tracing (forward and backward), TorchScript refused clearly.

ENCODINGS = ["peg", "sincos2d", "learned2d", "axial", "rope2d_axial", "rope2d_mixed", "relbias2d"]
SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5)


def _small(encoding: str, **over):
    torch.manual_seed(0)
    return timm.create_model(f"posenc_vit_tiny_{encoding}", **{**SMALL, **over})


def _swapped_stock(encoding: str):
    torch.manual_seed(0)
    stock = timm.create_model("vit_tiny_patch16_224", pretrained=False, dynamic_img_size=True, **SMALL)
    return replace_position_encoding(stock, encoding)


def test_every_registered_model_has_a_weightless_pretrained_config():
    names = tm.timm_model_names()
    assert set(timm.list_models("posenc_vit_*", name_matches_cfg=True)) == set(names)  # timm's filter keeps them
    assert timm.list_models("posenc_vit_*", pretrained=True) == []  # no weights are claimed
    for name in names:
        cfg = timm.models.get_pretrained_cfg(name)
        assert cfg is not None and cfg.architecture == name and not cfg.has_weights
        assert timm.models.get_pretrained_cfg_value(name, "input_size") == (3, 224, 224)
        assert tm.default_cfgs[name].cfgs[""].first_conv == "patch_embed.proj"
    model = _small("peg")
    assert model.pretrained_cfg["architecture"] == "posenc_vit_tiny_peg" and model.default_cfg is model.pretrained_cfg
    # the names of the config exist in the model (timm's default-config test)
    keys = model.state_dict().keys()
    assert "patch_embed.proj.weight" in keys and "head.weight" in keys


@pytest.mark.parametrize("make", ["registered", "swapped"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_forward_intermediates_with_every_encoding(encoding, make):
    model = (_small(encoding) if make == "registered" else _swapped_stock(encoding)).eval()
    images = torch.randn(2, 3, 32, 24)  # a 4 x 3 grid, not the training 4 x 4
    with torch.no_grad():
        final, inter = model.forward_intermediates(images)
        features = model.forward_features(images)
        torch.testing.assert_close(final, features)
        assert [t.shape for t in inter] == [(2, 32, 4, 3)] * 3
        # the last intermediate, normalised, is the patch part of forward_features
        last = model.forward_intermediates(images, indices=[2], norm=True, output_fmt="NLC", intermediates_only=True)
        torch.testing.assert_close(last[0], features[:, 1:])
        # a middle block's output equals the model cut after that block (its PEG included)
        first = model.forward_intermediates(images, indices=[0], output_fmt="NLC", stop_early=True,
                                            return_prefix_tokens=True, intermediates_only=True)[0]
        cut = copy.deepcopy(model)
        cut.prune_intermediate_layers([0], prune_norm=True)
        assert len(cut.blocks) == 1 and all(int(k) < 1 for k in cut.posenc_conditional)
        torch.testing.assert_close(torch.cat([first[1], first[0]], 1), cut.forward_features(images))
        model.set_grad_checkpointing()
        torch.testing.assert_close(model.forward_intermediates(images)[0], final)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_features_only_gives_feature_info_and_grid_maps(encoding):
    model = _small(encoding, features_only=True).eval()
    assert type(model).__name__ == "FeatureGetterNet"
    assert model.feature_info.channels() == [32, 32, 32] and model.feature_info.reduction() == [8, 8, 8]
    full = _small(encoding).eval()
    images = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        maps = model(images)
        _, expected = full.forward_intermediates(images)
    assert [m.shape for m in maps] == [(1, 32, 3, 5)] * 3
    for got, want in zip(maps, expected):
        torch.testing.assert_close(got, want)
    one = _small(encoding, features_only=True, out_indices=(1,))
    assert one.feature_info.channels() == [32] and len(one.model.blocks) == 2
    # timm's getter wrapper around a stock ViT whose encoding was swapped
    swapped = _swapped_stock(encoding).eval()
    with torch.no_grad():
        _, expected = swapped.forward_intermediates(images)
        maps = FeatureGetterNet(swapped, out_indices=3)(images)
    for got, want in zip(maps, expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("make", ["registered", "swapped"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_fx_symbolic_trace_runs_the_same_model(encoding, make):
    model = (_small(encoding) if make == "registered" else _swapped_stock(encoding)).eval()
    traced = torch.fx.symbolic_trace(model)
    called = {n.target.__name__ for n in traced.graph.nodes if n.op == "call_function" and hasattr(n.target, "__name__")}
    assert "patch_tokens" in called
    for size in ((32, 32), (24, 40)):  # the traced graph follows the grid of each call
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            assert torch.equal(traced(images), model(images))
    # backward through the traced model reaches every parameter (timm's FX backward test)
    model.train()
    traced = torch.fx.symbolic_trace(model)
    traced(torch.randn(2, 3, 32, 32)).mean().backward()
    assert all(p.grad is not None for p in traced.parameters())


def test_fx_feature_extraction_with_timms_fx_features():
    model = _small("relbias2d", features_only=True, feature_cls="fx").eval()
    assert type(model).__name__ == "FeatureGraphNet"
    with torch.no_grad():
        out = model(torch.randn(1, 3, 32, 24))
    assert [o.shape for o in out] == [(1, 1 + 12, 32)] * 3  # the blocks' token outputs


@pytest.mark.parametrize("encoding", ["sincos2d", "peg", "rope2d_axial"])
def test_torchscript_is_refused_with_a_clear_error(encoding):
    with pytest.raises(NotImplementedError, match="does not support TorchScript.*torch.compile, torch.export or FX"):
        torch.jit.script(_small(encoding))
    # also after FX tracing (timm's FX + TorchScript test), where the graph holds the posenc modules
    with pytest.raises(NotImplementedError, match="does not support TorchScript"):
        torch.jit.script(torch.fx.symbolic_trace(_small(encoding).eval()))
