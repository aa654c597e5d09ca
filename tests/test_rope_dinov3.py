"""DINOv3's RoPE (``rope2d_dinov3``) against the reference code installed here: transformers'
``DINOv3ViTRopePositionEmbedding`` (with its ``apply_rotary_pos_emb``) and timm's
``RotaryEmbeddingDinoV3``, on tiny configs built in code. Both compute in float32; posenc in float64,
so the tables agree to float32 rounding of angles up to 2 pi * 1.

``_TABLE`` collects the max abs difference of each case; ``test_print_the_difference_table`` prints it
(``pytest -s``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.common.attention import attend
from posenc.vision import ViT, grid_positions
from posenc.vision.rope_dinov3 import (
    Rope2DDinoV3,
    apply_dinov3_rope,
    dinov3_augment_coords,
    dinov3_patch_coords,
    dinov3_rope_angles,
)

transformers = pytest.importorskip("transformers")
dinov3 = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")
timm_sincos = pytest.importorskip("timm.layers.pos_embed_sincos")

TOL = 2e-6  # float32 rounding of angles up to 2 pi
_TABLE: dict[str, float] = {}


def _record(case: str, ours: torch.Tensor, theirs: torch.Tensor, tol: float = TOL) -> None:
    diff = (ours.double() - theirs.double()).abs().max().item()
    _TABLE[case] = diff
    assert diff <= tol, f"{case}: max abs difference {diff:.3g} > {tol:.1g}"


def _hf_rope(rows: int, cols: int, head_dim: int = 16, heads: int = 2, patch: int = 4, **aug):
    config = transformers.DINOv3ViTConfig(hidden_size=head_dim * heads, num_attention_heads=heads, patch_size=patch,
                                          image_size=patch * max(rows, cols), rope_theta=100.0, **aug)
    # evaluation mode: a module in training mode draws DINOv3's coordinate augmentation (rescale 2 by default)
    return dinov3.DINOv3ViTRopePositionEmbedding(config).eval(), torch.zeros(1, 3, rows * patch, cols * patch)


@pytest.mark.parametrize("rows, cols", [(4, 4), (3, 5), (7, 2)])
def test_cos_sin_tables_equal_transformers(rows, cols):
    module, pixels = _hf_rope(rows, cols)
    cos, sin = module(pixels)  # [N, D], half-split layout
    angles = dinov3_rope_angles(dinov3_patch_coords(rows, cols), 16)  # [N, D/2]
    _record(f"transformers cos/sin {rows}x{cols}", torch.cat((angles.cos(), angles.sin()), -1),
            torch.cat((cos[:, :8], sin[:, :8]), -1))
    torch.testing.assert_close(cos[:, :8], cos[:, 8:])  # both halves of a pair turn together


@pytest.mark.parametrize("rows, cols, prefix", [(4, 4, 1), (3, 5, 5), (6, 2, 0)])
def test_rotated_q_k_and_attention_equal_transformers(rows, cols, prefix):
    torch.manual_seed(0)
    module, pixels = _hf_rope(rows, cols)
    cos, sin = module(pixels.double())
    n = prefix + rows * cols
    q, k, v = (torch.randn(2, 2, n, 16, dtype=torch.float64) for _ in range(3))
    hf_q, hf_k = dinov3.apply_rotary_pos_emb(q, k, cos, sin)
    enc = posenc.build("rope2d_dinov3", head_dim=16, num_prefix_tokens=prefix)
    pos = grid_positions(rows, cols, num_prefix_tokens=prefix)
    ours_q, ours_k = enc.transform_qk(q, k, pos, pos)
    _record(f"transformers q/k {rows}x{cols}+{prefix}", torch.cat((ours_q, ours_k)), torch.cat((hf_q, hf_k)))
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc)
    _record(f"transformers attention {rows}x{cols}+{prefix}", out, F.scaled_dot_product_attention(hf_q, hf_k, v))
    # the functional form is the same rotation
    fq, fk = apply_dinov3_rope(q, k, dinov3_patch_coords(rows, cols), num_prefix_tokens=prefix)
    torch.testing.assert_close(torch.cat((fq, fk)), torch.cat((ours_q, ours_k)), rtol=0, atol=1e-12)


def test_training_augmentation_draws_what_transformers_draws():
    torch.manual_seed(0)
    aug = {"pos_embed_shift": 0.1, "pos_embed_jitter": 1.5, "pos_embed_rescale": 2.0}
    module, pixels = _hf_rope(4, 5, **aug)
    q, k = (torch.randn(1, 2, 20, 16, dtype=torch.float64) for _ in range(2))
    enc = Rope2DDinoV3(16, shift=0.1, jitter=1.5, rescale=2.0)
    pos = grid_positions(4, 5)
    for seed in (1, 2):
        torch.manual_seed(seed)
        cos, sin = module.train()(pixels.double())
        hf = torch.cat(dinov3.apply_rotary_pos_emb(q, k, cos, sin))
        torch.manual_seed(seed)
        ours = torch.cat(enc.train().transform_qk(q, k, pos, pos))
        _record(f"transformers augmented q/k seed {seed}", ours, hf, tol=2e-5)
    # evaluation mode draws nothing
    state = torch.get_rng_state()
    enc.eval().transform_qk(q, k, pos, pos)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("normalize", ["separate", "min", "max"])
@pytest.mark.parametrize("pairing", ["half_split", "interleaved"])
def test_rotated_q_k_equal_timm(normalize, pairing):
    torch.manual_seed(0)
    rows, cols = 3, 6
    rope = timm_sincos.RotaryEmbeddingDinoV3(16, temperature=100.0, normalize_coords=normalize,
                                            rotate_half=pairing == "half_split")
    embed = rope.get_embed([rows, cols]).double()  # [N, 2D]: sin, cos
    q = torch.randn(2, 2, rows * cols, 16, dtype=torch.float64)
    theirs = timm_sincos.apply_rot_embed_cat(q, embed, half=pairing == "half_split")
    enc = posenc.build("rope2d_dinov3", head_dim=16, normalize=normalize, pairing=pairing)
    pos = grid_positions(rows, cols)
    ours, _ = enc.transform_qk(q, q, pos, pos)
    _record(f"timm q {normalize} {pairing}", ours, theirs)


def test_timm_training_augmentation_draws_the_same():
    rows, cols = 5, 3
    rope = timm_sincos.RotaryEmbeddingDinoV3(16, temperature=100.0, shift_coords=0.2, jitter_coords=1.3,
                                            rescale_coords=1.7).train()
    q = torch.randn(1, 2, rows * cols, 16, dtype=torch.float64)
    torch.manual_seed(3)
    theirs = timm_sincos.apply_rot_embed_cat(q, rope.get_embed([rows, cols]).double(), half=True)
    enc = Rope2DDinoV3(16, shift=0.2, jitter=1.3, rescale=1.7).train()
    torch.manual_seed(3)
    ours, _ = enc.transform_qk(q, q, grid_positions(rows, cols), grid_positions(rows, cols))
    _record("timm augmented q", ours, theirs, tol=2e-5)


def test_known_values_and_the_normalised_box():
    # a 2 x 4 grid: rows at -0.5, 0.5; columns at -0.75, -0.25, 0.25, 0.75 ("separate")
    coords = dinov3_patch_coords(2, 4)
    assert coords[:4, 0].tolist() == [-0.5] * 4 and coords[:4, 1].tolist() == [-0.75, -0.25, 0.25, 0.75]
    assert dinov3_patch_coords(2, 4, normalize="max")[:, 0].tolist() == [-0.75] * 4 + [-0.25] * 4
    assert dinov3_patch_coords(2, 4, normalize="min")[:4, 1].tolist() == [-0.5, 0.5, 1.5, 2.5]
    angles = dinov3_rope_angles(coords, 8)  # theta = (1, 100^-0.5)
    torch.testing.assert_close(angles[1], torch.tensor([2 * math.pi * -0.5, 2 * math.pi * -0.05,
                                                        2 * math.pi * -0.25, 2 * math.pi * -0.025], dtype=torch.float64))
    # a larger image spans the same box: the corner patches sit at the same place
    small, large = dinov3_patch_coords(4, 4), dinov3_patch_coords(8, 8)
    assert small.abs().max() == 0.75 and large.abs().max() == 0.875


def test_grid_and_normalized_coordinates_agree_and_float_positions_work():
    torch.manual_seed(0)
    q, k = (torch.randn(2, 2, 12, 16, dtype=torch.float64) for _ in range(2))
    grid = posenc.build("rope2d_dinov3", head_dim=16)
    normalized = posenc.build("rope2d_dinov3", head_dim=16, coordinates="normalized")
    pos = grid_positions(3, 4)
    expected = grid.transform_qk(q, k, pos, pos)
    coords = dinov3_patch_coords(3, 4).unsqueeze(0)
    got = normalized.transform_qk(q, k, coords, coords)
    torch.testing.assert_close(torch.cat(got), torch.cat(expected), rtol=0, atol=1e-12)
    # scores depend on the coordinate offset only, for any real coordinates
    shifted = normalized.transform_qk(q, k, coords + 0.3, coords + 0.3)
    torch.testing.assert_close(shifted[0] @ shifted[1].transpose(-1, -2), got[0] @ got[1].transpose(-1, -2))
    # with a KV cache the grid would change under cached keys: refused in grid mode, allowed normalised
    assert not grid.supports_kv_cache and normalized.supports_kv_cache
    moved = dinov3_augment_coords(coords, shift=0.5, generator=torch.Generator().manual_seed(0))
    assert (moved - coords).std(dim=1).max() < 1e-12  # one shift for every patch


def test_vit_runs_with_it_at_two_sizes_and_keeps_the_prefix_unrotated():
    torch.manual_seed(0)
    model = ViT(img_size=16, patch_size=4, in_chans=3, num_classes=5, dim=32, depth=2, num_heads=2,
                encoding="rope2d_dinov3", num_register_tokens=1)
    for size in (16, 32):
        assert model(torch.randn(2, 3, size, size)).shape == (2, 5)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"head_dim": 18}, ValueError, "multiple of 4"),
    ({"head_dim": 16, "normalize": "mean"}, ValueError, "normalize"),
    ({"head_dim": 16, "coordinates": "pixels"}, ValueError, "coordinates"),
    ({"head_dim": 16, "jitter": 0.5}, ValueError, "jitter must be a number >= 1"),
    ({"head_dim": 16, "shift": -1.0}, ValueError, "shift must be a number >= 0"),
    ({"head_dim": 16, "rescale": True}, TypeError, "rescale must be a number; got True"),
])
def test_bad_arguments_are_one_clear_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        Rope2DDinoV3(**kwargs)


def test_negative_grid_positions_are_refused():
    enc = Rope2DDinoV3(16)
    q = torch.randn(1, 2, 4, 16)
    pos = torch.tensor([[[0, 0], [0, 1], [-1, 0], [1, 1]]])
    with pytest.raises(ValueError, match="positions >= 0; got a minimum of"):
        enc.transform_qk(q, q, pos, pos)


def test_print_the_difference_table():
    if not _TABLE:
        pytest.skip("run with the other tests of this file")
    width = max(map(len, _TABLE))
    print("\n" + "\n".join(f"{case:<{width}}  {diff:.2e}" for case, diff in _TABLE.items()))
