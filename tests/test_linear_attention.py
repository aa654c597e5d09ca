"""Linear attention (posenc.common.linear_attention): the chunked scans against the explicit
quadratic form with the same features, in float64, under every mask it takes; the feature maps."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.common.linear_attention import (
    EluFeatureMap,
    FavorFeatureMap,
    linear_attention,
    orthogonal_random_features,
)
from posenc.common.masks import AttentionMask

B, H, HKV, D = 2, 4, 2, 8


def explicit(q, k, v, fmap, allowed):
    """``sum_j A_ij v_j / sum_j A_ij`` with ``A = phi(q) phi(k)^T`` masked by ``allowed [B, 1, Tq, Tk]``."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    a = torch.matmul(fmap(q, True), fmap(k, False).transpose(-1, -2))
    if allowed is not None:
        a = a * allowed
    den = a.sum(-1, keepdim=True)
    return torch.where(den > 0, torch.matmul(a, v) / torch.where(den > 0, den, 1.0), 0.0)


def allowed_of(mask, tq, tk):
    if mask is None:
        return None
    idx_q, idx_k = torch.arange(tq), torch.arange(tk)
    return mask.dense(B, idx_q, idx_k, tq, tk)


SEGMENTS = torch.tensor([[0] * 7 + [1] * 9 + [2] * 3 + [5] * 4, [3] * 16 + [4] * 7])  # runs cross the 5-row blocks
PADDING = torch.ones(B, 23, dtype=torch.bool)
PADDING[1, 17:] = False
CASES = {
    "none": (23, 23, None),
    "causal": (23, 23, AttentionMask(causal=True)),
    "causal_cache": (6, 23, AttentionMask(causal=True)),  # decoding after a cached prefix
    "padding": (23, 23, AttentionMask(key_valid=PADDING)),
    "causal_padding": (23, 23, AttentionMask(causal=True, key_valid=PADDING)),
    "packed": (23, 23, AttentionMask.packed(SEGMENTS)),
    "packed_causal": (23, 23, AttentionMask.packed(SEGMENTS, causal=True)),
    "packed_causal_padding": (23, 23, AttentionMask.packed(SEGMENTS, causal=True, key_valid=PADDING)),
}


@pytest.mark.parametrize("fmap_name", ["elu", "favor"])
@pytest.mark.parametrize("case", list(CASES))
def test_chunked_scan_equals_the_explicit_quadratic_form(case, fmap_name):
    tq, tk, mask = CASES[case]
    gen = torch.Generator().manual_seed(1)
    fmap = EluFeatureMap() if fmap_name == "elu" else FavorFeatureMap(D, num_features=12, seed=0).double()
    q = torch.randn(B, H, tq, D, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(B, HKV, tk, D, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(B, HKV, tk, D, dtype=torch.float64, generator=gen, requires_grad=True)
    got = linear_attention(q, k, v, fmap, mask, chunk=5)
    want = explicit(q, k, v, fmap, allowed_of(mask, tq, tk))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    grad = torch.randn(got.shape, dtype=torch.float64, generator=gen)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


def test_the_output_is_causal_and_chunk_size_free():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 30, D, dtype=torch.float64, generator=gen) for _ in range(3))
    fmap, mask = EluFeatureMap(), AttentionMask(causal=True)
    out = linear_attention(q, k, v, fmap, mask, chunk=7)
    torch.testing.assert_close(out, linear_attention(q, k, v, fmap, mask, chunk=64), rtol=1e-12, atol=1e-12)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 20:] += 5.0  # change the future
    v2[:, :, 20:] -= 3.0
    torch.testing.assert_close(linear_attention(q, k2, v2, fmap, mask, chunk=7)[:, :, :20], out[:, :, :20])


def test_rows_that_see_no_key_are_zero():
    q = torch.randn(1, 1, 4, D)
    k, v = torch.randn(1, 1, 4, D), torch.randn(1, 1, 4, D)
    none_valid = AttentionMask(key_valid=torch.zeros(1, 4, dtype=torch.bool))
    assert torch.equal(linear_attention(q, k, v, EluFeatureMap(), none_valid), torch.zeros(1, 1, 4, D))


def test_masks_without_a_linear_form_are_clear_errors():
    q = torch.randn(1, 1, 6, D)
    with pytest.raises(ValueError, match="sliding window"):
        linear_attention(q, q, q, EluFeatureMap(), AttentionMask(causal=True, window=2))
    split = AttentionMask.packed(torch.tensor([[0, 0, 1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="contiguous run"):
        linear_attention(q, q, q, EluFeatureMap(), split)
    cross = AttentionMask(q_segments=torch.zeros(1, 6, dtype=torch.long), kv_segments=torch.ones(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="packed sequences as self-attention"):
        linear_attention(q, q, q, EluFeatureMap(), cross)


def test_orthogonal_random_features_are_orthogonal_blocks_of_gaussian_norm():
    w = orthogonal_random_features(20, 8, torch.Generator().manual_seed(0)).double()
    for block in (w[:8], w[8:16]):
        unit = block / block.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ unit.t(), torch.eye(8, dtype=torch.float64), atol=1e-6, rtol=0)
    assert w.shape == (20, 8)
    # the norms are chi(8)-distributed: mean sqrt(2) Gamma(4.5) / Gamma(4) ~ 2.74
    many = orthogonal_random_features(4000, 8, torch.Generator().manual_seed(1)).double().norm(dim=1)
    assert abs(many.mean().item() - math.sqrt(2) * math.gamma(4.5) / math.gamma(4)) < 0.05


def test_favor_features_estimate_the_softmax_kernel_and_redraw_on_demand():
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(6, D, generator=gen) * 0.3, torch.randn(6, D, generator=gen) * 0.3
    fmap = FavorFeatureMap(D, num_features=20000, seed=0, eps=0.0).double()
    qd, kd = q.double(), k.double()
    est = fmap(qd, False) @ fmap(kd, False).t()  # no query rescaling: the raw kernel estimate
    exact = torch.exp(qd @ kd.t() / math.sqrt(D))
    assert ((est - exact).abs() / exact).max() < 0.05
    assert bool((fmap(qd, True) > 0).all())
    before = fmap.projection.clone()
    fmap.eval()
    fmap(qd, True)
    assert torch.equal(fmap.projection, before)  # nothing redraws behind the caller's back
    fmap.redraw(torch.Generator().manual_seed(9))
    assert not torch.equal(fmap.projection, before)
    with pytest.raises(ValueError, match="head_dim=8"):
        fmap(torch.randn(2, 4, dtype=torch.float64), True)


# --- in the core: the plan, attend, MultiheadAttention -------------------------------------------

import posenc  # noqa: E402


def _mha(encoding=None, feature_map=None):
    torch.manual_seed(0)
    return posenc.MultiheadAttention(32, 4, num_kv_heads=2, encoding=encoding, feature_map=feature_map)


def test_the_plan_names_the_linear_path_and_refuses_what_it_cannot_apply():
    dims = posenc.ModelDims(dim=32, num_heads=4, max_len=64)
    x = torch.randn(2, 20, 32)
    attn = _mha(feature_map=EluFeatureMap())
    causal = attn.plan(x, mask=AttentionMask(causal=True))
    assert causal.path == "linear" and causal.chunk_rows is not None and "elu+1" in causal.reason
    assert attn.plan(x).path == "linear" and attn.plan(x).chunk_rows is None
    for name, hook in (("alibi", "score bias"), ("erpe", "after-softmax bias"), ("cape", "score transform")):
        layer = _mha(posenc.build(name, dims=dims), EluFeatureMap())
        with pytest.raises(ValueError, match=f"never forms the scores, so the {hook}"):
            layer(x, mask=AttentionMask(causal=True))
    with pytest.raises(ValueError, match="softmax kernel"):
        posenc.MultiheadAttention(32, 4, backend="dense", feature_map=EluFeatureMap())(x)
    with pytest.raises(TypeError, match="FeatureMap"):
        posenc.MultiheadAttention(32, 4, feature_map=torch.nn.ReLU())
    split = AttentionMask.packed(torch.tensor([[0] * 5 + [1] * 10 + [0] * 5] * 2))
    with pytest.raises(ValueError, match="contiguous run"):  # the plan refuses what the run would
        attn.plan(x, mask=split)


def test_the_layer_with_rope_equals_the_function_on_rotated_q_and_k():
    dims = posenc.ModelDims(dim=32, num_heads=4, max_len=64)
    rope = posenc.build("rope", dims=dims)
    fmap = FavorFeatureMap(8, num_features=16, seed=0)
    attn = _mha(rope, fmap)
    x = torch.randn(2, 20, 32, requires_grad=True)
    mask = AttentionMask(causal=True)
    out = attn(x, mask=mask)
    pos = torch.arange(20).unsqueeze(0)
    q = attn.q_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)
    k = attn.k_proj(x).unflatten(-1, (2, 8)).transpose(1, 2)
    v = attn.v_proj(x).unflatten(-1, (2, 8)).transpose(1, 2)
    q, k = rope.transform_qk(q, k, pos, pos)
    want = attn.out_proj(linear_attention(q, k, v, fmap, mask).transpose(1, 2).flatten(2))
    torch.testing.assert_close(out, want)
    out.sum().backward()
    assert x.grad is not None and attn.q_proj.weight.grad is not None
    assert "feature_map.projection" in attn.state_dict()  # the draw is saved with the layer


def test_decoding_with_a_kv_cache_matches_the_full_sequence():
    attn = _mha(feature_map=EluFeatureMap()).eval()
    x = torch.randn(1, 12, 32)
    mask = AttentionMask(causal=True)
    full = attn(x, mask=mask)
    cache = posenc.KVCache(1)
    steps = [attn(x[:, :5], mask=mask, cache=cache[0])]
    steps += [attn(x[:, t : t + 1], mask=mask, cache=cache[0]) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)


def test_bad_shapes_are_the_core_s_clear_errors():
    q = torch.randn(1, 3, 4, D)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        linear_attention(q, torch.randn(1, 2, 4, D), torch.randn(1, 2, 4, D), EluFeatureMap())
    with pytest.raises(ValueError, match="k and v must be"):
        linear_attention(q, torch.randn(1, 3, 4, D), torch.randn(1, 3, 5, D), EluFeatureMap())
