"""The reference ViT: every registered vision encoding and some sequence ones, at the training
size and at 1.5x / 2x, bad input, and gradients to every encoding parameter."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.common.encoding import PositionEncoding
from posenc.vision import PEG, Learned2D, PatchTokensOnly, Rope2DMixed, SinCos2D, ViT

# Image encodings; the 3D (video) ones are tested in test_vision_video.py.
VISION = [info.name for info in posenc.available("vision") if getattr(info.cls, "grid_ndim", 2) == 2]
SEQ = [("sinusoidal", {}), ("rope", {}), ("alibi", {"symmetric": True})]
SMALL = dict(img_size=16, patch_size=4, in_chans=3, num_classes=5, dim=32, depth=2, num_heads=2)


def _kind(name: str | None) -> dict:
    """Linear attention for the encodings defined on it only (SPE), softmax for the others."""
    return {"feature_map": "elu"} if name is not None and posenc.common.registry.get(name).cls.linear_only else {}


def test_every_registered_vision_encoding_is_covered():
    assert set(VISION) >= {"peg", "sincos2d", "learned2d", "axial", "rope2d_axial", "rope2d_mixed", "relbias2d"}


def _encoding_modules(model: ViT) -> list[PositionEncoding]:
    return [m for m in model.modules() if isinstance(m, PositionEncoding)]


@pytest.mark.parametrize("name,options", [(n, {}) for n in VISION] + SEQ)
def test_vit_runs_at_the_training_size_and_larger(name, options):
    torch.manual_seed(0)
    model = ViT(**SMALL, encoding=name, encoding_options=options, num_register_tokens=1, **_kind(name))
    assert model.num_prefix_tokens == 2
    for size in [(16, 16), (24, 24), (32, 32), (24, 16)]:
        images = torch.randn(2, 3, *size)
        rows, cols = model.grid_size(size)
        assert model.forward_features(images).shape == (2, 2 + rows * cols, 32)
        assert model(images).shape == (2, 5)


@pytest.mark.parametrize("name", [n for n in VISION] + ["rope"])
def test_gradients_reach_every_encoding_parameter(name):
    torch.manual_seed(1)
    model = ViT(**SMALL, encoding=name, pool="avg", **_kind(name))
    model(torch.randn(2, 3, 24, 16)).pow(2).sum().backward()  # a grid other than the training one
    params = [(n, p) for enc in _encoding_modules(model) for n, p in enc.named_parameters()]
    for n, p in params:
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient for {n}"
    if name in ("learned2d", "axial", "relbias2d", "peg", "rope2d_mixed"):
        assert params, f"{name} should have learned parameters"


def test_encodings_are_built_for_the_model():
    m = ViT(**SMALL, encoding="learned2d", num_register_tokens=2)
    enc = m.encoder.encoding
    assert isinstance(enc, Learned2D) and enc.grid_size == (4, 4) and enc.num_prefix_tokens == 3
    mae = ViT(**SMALL, encoding="sincos2d", encoding_options={"layout": "mae"}, pool="avg")
    assert mae.encoder.encoding.layout == "mae" and mae.encoder.encoding.num_prefix_tokens == 0
    peg = ViT(**SMALL, encoding="peg", peg_blocks=(0, 1), encoding_options={"kernel_size": 5})
    assert peg.encoder.encoding is None
    assert sorted(peg.encoder.conditional) == ["0", "1"]
    assert all(isinstance(p, PEG) and p.kernel_size == 5 and p.num_prefix_tokens == 1 for p in peg.encoder.conditional.values())
    mixed = ViT(**SMALL, encoding="rope2d_mixed")  # RoPE-ViT learns the frequencies per block
    encs = [b.attn.encoding for b in mixed.encoder.blocks]
    assert all(isinstance(e, Rope2DMixed) for e in encs) and encs[0] is not encs[1]
    rel = ViT(**SMALL, encoding="relbias2d")  # as Swin/BEiT: one table per block
    tables = [b.attn.encoding.table for b in rel.encoder.blocks]
    assert tables[0] is not tables[1] and tables[0].shape == (2, 7 * 7)
    seq = ViT(**SMALL, encoding="rope")
    assert isinstance(seq.encoder.encoding, PatchTokensOnly) and seq.positions(2, 3).tolist() == [[0, 0, 1, 2, 3, 4, 5]]
    none = ViT(**SMALL, encoding=None)
    assert none(torch.randn(1, 3, 16, 16)).shape == (1, 5)
    inst = ViT(**SMALL, encoding=SinCos2D(32, num_prefix_tokens=1))
    assert inst(torch.randn(1, 3, 20, 12)).shape == (1, 5)


def test_prefix_tokens_are_kept_out_of_input_encodings():
    torch.manual_seed(2)
    m = ViT(**SMALL, encoding="learned2d", num_register_tokens=1)
    x = torch.randn(1, 2 + 16, 32)
    out = m.encoder.encoding.encode_input(x, m.positions(4, 4))
    assert torch.equal(out[:, :2], x[:, :2])


def test_bad_images_give_clear_errors():
    m = ViT(**SMALL, encoding="sincos2d")
    with pytest.raises(ValueError, match="patch_size=4"):
        m(torch.randn(1, 3, 18, 16))
    with pytest.raises(ValueError, match="patch_size=4"):
        m(torch.randn(1, 3, 16, 2))
    with pytest.raises(ValueError, match="in_chans=3"):
        m(torch.randn(1, 1, 16, 16))
    with pytest.raises(ValueError, match=r"\[batch, channels, height, width\]"):
        m(torch.randn(3, 16, 16))
    with pytest.raises(ValueError, match="patch_size"):
        m.grid_size((15, 16))


def test_bad_construction_and_grids_give_clear_errors():
    with pytest.raises(ValueError, match="divisible by patch_size"):
        ViT(**{**SMALL, "img_size": 18})
    with pytest.raises(ValueError, match="pool"):
        ViT(**SMALL, pool="max")
    with pytest.raises(ValueError, match="timeseries"):
        ViT(**SMALL, encoding="erpe")
    with pytest.raises(ValueError, match="causal attention only"):
        ViT(**SMALL, encoding="alibi")
    with pytest.raises(KeyError, match="unknown encoding"):
        ViT(**SMALL, encoding="no_such_encoding")
    with pytest.raises(TypeError, match="unknown argument"):
        ViT(**SMALL, encoding="sincos2d", encoding_options={"layot": "mae"})
    with pytest.raises(ValueError, match="peg_blocks"):
        ViT(**SMALL, encoding="peg", peg_blocks=(5,))
    with pytest.raises(ValueError, match="num_prefix_tokens=0"):
        ViT(**SMALL, encoding=SinCos2D(32))  # the class token needs num_prefix_tokens=1
    # Encodings that cannot follow a new grid refuse clearly.
    strict = ViT(**SMALL, encoding="learned2d", encoding_options={"new_grid": "refuse"})
    assert strict(torch.randn(1, 3, 16, 16)).shape == (1, 5)
    with pytest.raises(ValueError, match="refuse"):
        strict(torch.randn(1, 3, 24, 24))
    # A grid that does not match the token count.
    m = ViT(**SMALL, encoding="learned2d")
    tokens = torch.randn(1, 1 + 16, 32)
    with pytest.raises(ValueError, match=r"positions must have shape \[17\]"):
        m.encoder(tokens, positions=m.positions(3, 4))
    with pytest.raises(ValueError, match="token count"):
        m.encoder.encoding.encode_input(tokens, m.positions(3, 4))


@pytest.mark.parametrize("name", VISION + ["rope"])
def test_a_tiny_vit_learns(name):
    """A few steps on a fixed batch reduce the loss, with every encoding (average pooling)."""
    torch.manual_seed(3)
    m = ViT(**SMALL, encoding=name, pool="avg", **_kind(name))
    images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(m(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
