"""Relative biases of the sequence issue (T5, Shaw, Transformer-XL, KERPLE, FIRE, CAPE, CoPE):
known values, invariances, gradients, the fast path at inference, KV cache, bad input.
Kernel-path equivalence with the float64 reference is in tests/test_kernel_paths.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import posenc
from posenc.common import kernels
from posenc.common.kernels import chunking, dense_blocks
from posenc.common.attention import attend
from posenc.common.pairwise import PairwiseBias
from posenc.seq.cape import CAPE
from posenc.seq.cope import CoPE
from posenc.seq.fire import FIRE
from posenc.seq.kerple import KERPLE, kerple_bias
from posenc.seq.shaw import ShawRelative
from posenc.seq.t5 import T5Bias, t5_bucket
from posenc.seq.transformer_xl import TransformerXLRelative

from . import reference as ref

NAMES = ["t5", "shaw", "transformer_xl", "kerple", "fire", "cape", "cope"]
DIMS = posenc.ModelDims(dim=32, num_heads=4, max_len=64)


# ---- T5 buckets -------------------------------------------------------------------------------

# Worked by hand from the definition (32 buckets, max_distance 128).
# Bidirectional: 16 per sign, 8 exact; 8 + floor(ln(n/8) / ln(16) * 8), capped at 15; r > 0 adds 16.
# Causal: 32 buckets on n = max(-r, 0), 16 exact; 16 + floor(ln(n/16) / ln(8) * 16), capped at 31.
T5_BIDIRECTIONAL = {0: 0, -1: 1, -7: 7, -8: 8, -11: 8, -12: 9, -20: 10, -60: 13, -127: 15, -128: 15, -1000: 15,
                    1: 17, 7: 23, 8: 24, 20: 26, 127: 31, 128: 31, 5000: 31}
T5_CAUSAL = {0: 0, 1: 0, 500: 0, -1: 1, -15: 15, -16: 16, -20: 17, -23: 18, -32: 21, -64: 26, -127: 31, -128: 31,
             -10_000: 31}


@pytest.mark.parametrize("bidirectional,table", [(True, T5_BIDIRECTIONAL), (False, T5_CAUSAL)])
def test_t5_buckets_at_chosen_offsets(bidirectional, table):
    r = torch.tensor(list(table))
    got = t5_bucket(r, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    assert got.tolist() == list(table.values())


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (6, 7)])
def test_t5_buckets_match_the_independent_definition(bidirectional, num_buckets, max_distance):
    r = torch.arange(-300, 301)
    got = t5_bucket(r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    want = [ref.t5_bucket(int(x), bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
            for x in r]
    assert got.tolist() == want
    assert got.min() >= 0 and got.max() < num_buckets


def test_t5_bias_depends_only_on_offset():
    enc = T5Bias(4, bidirectional=True)
    q = torch.zeros(1, 4, 6, 8)
    base = torch.arange(6)[None]
    dense = [enc.score_bias(q, q, base + s, base + s).dense(1, 4, torch.arange(6), torch.arange(6))
             for s in (0, 7, 1000)]
    for d in dense[1:]:
        torch.testing.assert_close(d, dense[0])


def test_t5_shared_across_layers_accumulates_one_gradient_per_layer():
    """One instance in every layer (T5's sharing) gets the sum of what separate copies would get."""
    torch.manual_seed(0)
    shared = T5Bias(4, bidirectional=True)
    with torch.no_grad():
        shared.table.normal_(0, 0.5)
    model = posenc.TransformerEncoder(32, 3, 4, encoding=shared)
    copies = [copy.deepcopy(shared) for _ in range(3)]
    separate = posenc.TransformerEncoder(32, 3, 4, encoding=copies)
    separate.load_state_dict(model.state_dict(), strict=False)
    for blk_a, blk_b in zip(model.blocks, separate.blocks):
        blk_b.load_state_dict(blk_a.state_dict())
    x = torch.randn(2, 10, 32)
    model(x).square().sum().backward()
    separate(x).square().sum().backward()
    per_layer = [c.table.grad for c in copies]
    assert all(g is not None and g.abs().sum() > 0 for g in per_layer)
    torch.testing.assert_close(shared.table.grad, sum(per_layer), rtol=1e-5, atol=1e-7)
    assert sum(p is shared.table for p in model.parameters()) == 1  # registered once


# ---- KERPLE -----------------------------------------------------------------------------------

def test_kerple_formula_values():
    d = torch.tensor([0.0, 1.0, 3.0, 10.0])
    torch.testing.assert_close(kerple_bias(d, torch.tensor(2.0), torch.tensor(0.5), "log"),
                               torch.tensor([0.0, -2 * math.log(1.5), -2 * math.log(2.5), -2 * math.log(6.0)]))
    torch.testing.assert_close(kerple_bias(d, torch.tensor(0.5), torch.tensor(1.5), "power"),
                               torch.tensor([0.0, -0.5, -0.5 * 3 ** 1.5, -0.5 * 10 ** 1.5]))


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_module_bias_and_constraints(variant):
    torch.manual_seed(0)
    enc = KERPLE(4, variant=variant)
    assert (enc.r1 > 0).all() and (enc.r2 > 0).all()
    if variant == "power":
        assert (enc.r2 <= 2).all()
    with torch.no_grad():  # far outside the valid range: the parametrisation keeps it valid
        enc.raw_r1.fill_(-50.0)
        enc.raw_r2.fill_(50.0)
    assert (enc.r1 > 0).all() and (enc.r2 > 0).all() and (variant == "log" or (enc.r2 <= 2).all())
    torch.manual_seed(1)
    enc = KERPLE(4, variant=variant)
    q = torch.zeros(1, 4, 5, 8)
    pos = torch.arange(5)[None]
    dense = enc.score_bias(q, q, pos, pos).dense(1, 4, torch.arange(5), torch.arange(5))
    want = ref.kerple_bias(enc.r1.detach(), enc.r2.detach(), variant, pos, pos)
    torch.testing.assert_close(dense.double(), want, rtol=1e-6, atol=1e-6)
    shifted = enc.score_bias(q, q, pos + 100, pos + 100).dense(1, 4, torch.arange(5), torch.arange(5))
    torch.testing.assert_close(shifted, dense)  # only i - j matters


def test_kerple_causal_by_default_and_symmetric_on_request():
    q = torch.randn(1, 4, 5, 8)
    pos = torch.arange(5)[None]
    with pytest.raises(ValueError, match="KERPLE is defined for causal attention only"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=KERPLE(4))
    attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=KERPLE(4, symmetric=True))


# ---- FIRE -------------------------------------------------------------------------------------

def test_fire_normalized_distance_values():
    enc = FIRE(4)  # c = 0.1, L = 512
    got = enc.normalized_distance(torch.tensor([10.0, 600.0, 600.0]), torch.tensor([4.0, 0.0, 600.0]))
    want = torch.tensor([
        math.log(1 + 0.1 * 6) / (math.log(1 + 0.1 * 512) + 1e-6),
        math.log(1 + 0.1 * 600) / (math.log(1 + 0.1 * 600) + 1e-6),
        0.0,
    ])
    torch.testing.assert_close(got, want)
    assert enc.threshold.item() == 512.0 and enc.c.item() == pytest.approx(0.1)


def test_fire_bias_is_the_mlp_of_the_normalized_distance_and_relative_below_threshold():
    torch.manual_seed(0)
    enc = FIRE(4, init_threshold=50.0)
    q = torch.zeros(1, 4, 6, 8)
    pos = torch.arange(6)[None]
    dense = enc.score_bias(q, q, pos, pos).dense(1, 4, torch.arange(6), torch.arange(6))
    m = enc.mlp
    want = ref.fire_bias(enc.c, enc.threshold, m[0].weight, m[0].bias, m[2].weight, m[2].bias, pos, pos)
    torch.testing.assert_close(dense.double(), want.detach(), rtol=1e-5, atol=1e-6)
    # below the threshold the normaliser is constant: the bias depends on i - j only
    moved = enc.score_bias(q, q, pos + 20, pos + 20).dense(1, 4, torch.arange(6), torch.arange(6))
    torch.testing.assert_close(moved, dense)
    # past it, the normaliser grows with i (progressive interpolation): no longer shift-invariant
    far = enc.score_bias(q, q, pos + 500, pos + 500).dense(1, 4, torch.arange(6), torch.arange(6))
    assert not torch.allclose(far, dense)


# ---- every encoding: gradients, fast path, cache, masks -------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_built_by_name_and_every_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    enc = posenc.build(name, dims=DIMS)
    if name == "cope":
        with torch.no_grad():
            enc.pos_emb.normal_()
    mha = posenc.MultiheadAttention(32, 4, encoding=enc)
    x = torch.randn(2, 12, 32)
    out = mha(x, mask=posenc.AttentionMask(causal=True))
    out.square().sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient for {pname}"


@pytest.mark.parametrize("name", NAMES)
def test_kv_cache_decoding_equals_full_forward(name):
    torch.manual_seed(0)
    enc = posenc.build(name, dims=DIMS)
    assert enc.supports_kv_cache
    if name == "cope":
        with torch.no_grad():
            enc.pos_emb.normal_()
    stack = posenc.TransformerEncoder(32, 2, 4, encoding=enc, num_kv_heads=2).eval()
    x = torch.randn(2, 9, 32)
    mask = posenc.AttentionMask(causal=True)
    with torch.no_grad():
        full = stack(x, mask=mask)
        cache = posenc.KVCache(2)
        steps = [stack(x[:, :4], mask=mask, cache=cache)]
        steps += [stack(x[:, t : t + 1], mask=mask, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["kerple", "fire", "t5"])
def test_frozen_or_no_grad_bias_is_a_constant_for_the_fused_kernel(name, monkeypatch):
    """At inference (no grad, or frozen parameters while q/k/v train) the bias carries no learned
    tensors, so the plan's choice for a constant bias holds: asked for the flash kernel's backward
    (the default is the written-out one, see posenc.common.tuning), the explicit one never runs."""
    monkeypatch.setenv("POSENC_BIAS_BACKWARD", "flash")
    torch.manual_seed(0)
    enc = posenc.build(name, dims=DIMS)
    q = torch.randn(2, 4, 9, 8, requires_grad=True)
    pos = torch.arange(9)[None]
    with torch.no_grad():
        assert not enc.score_bias(q, q, pos, pos).requires_grad
    enc.requires_grad_(False)
    assert not enc.score_bias(q, q, pos, pos).requires_grad

    def refuse(*args, **kwargs):
        raise AssertionError("explicit backward used for a constant bias")

    monkeypatch.setattr("posenc.common.kernels.dense.chunk_backward_with_bias_grad", refuse)
    out = attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(causal=True))
    out.sum().backward()
    assert q.grad is not None


@pytest.mark.parametrize("name", ["t5", "kerple", "fire", "transformer_xl", "shaw_keys"])
def test_dense_path_bias_is_evaluated_in_row_chunks(name, monkeypatch):
    """No [B, H, T, T] bias: every evaluation covers a chunk of query rows, forward and backward."""
    torch.manual_seed(0)
    enc = ShawRelative(8, values=False) if name == "shaw_keys" else posenc.build(name, dims=DIMS)
    rows = []
    original = PairwiseBias.dense

    def recording(self, batch, heads, q_idx, kv_idx, dtype=None):
        rows.append(len(q_idx))
        return original(self, batch, heads, q_idx, kv_idx, dtype)

    def recording_offsets(self, values, s, e, kv_end):
        rows.append(e - s)
        return original_block(self, values, s, e, kv_end)

    original_block = dense_blocks.OffsetBias.block
    monkeypatch.setattr(PairwiseBias, "dense", recording)
    monkeypatch.setattr(dense_blocks.OffsetBias, "block", recording_offsets)  # T5 and KERPLE over consecutive positions
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 8 * 4 * 64)  # 8 rows of a bias shared by the batch (and of one per batch: MIN_CHUNK_ROWS)
    monkeypatch.setattr(chunking, "MIN_CHUNK_ROWS", 8)
    q = torch.randn(2, 4, 64, 8, requires_grad=True)
    pos = torch.arange(64)[None]
    out = attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(causal=True))
    out.sum().backward()
    assert rows and max(rows) <= 8


def test_cape_keeps_masked_entries_masked():
    """Values at masked keys never reach the output, however the MLP transforms the scores."""
    torch.manual_seed(0)
    enc = CAPE(32, 4, 64, base="kerple")
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.normal_(0, 3.0)
    q = torch.randn(1, 4, 8, 8)
    v = torch.randn(1, 4, 8, 8)
    valid = torch.ones(1, 8, dtype=torch.bool)
    valid[0, 5:] = False
    mask = posenc.AttentionMask(causal=True, key_valid=valid)
    pos = torch.arange(8)[None]
    out = attend(q, q, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask)
    v2 = v.clone()
    v2[:, :, 5:] += 100.0
    out2 = attend(q, q, v2, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask)
    torch.testing.assert_close(out, out2)
    # and the future (causal) is still invisible: row 2 ignores keys 3..7
    v3 = v.clone()
    v3[:, :, 3:] -= 50.0
    out3 = attend(q, q, v3, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask)
    torch.testing.assert_close(out[:, :, :3], out3[:, :, :3])


@pytest.mark.parametrize("base", ["alibi", "kerple", "fire"])
def test_cape_bases_are_built_through_the_registry(base):
    enc = CAPE(32, 4, 64, base=base)
    assert type(enc.base) is posenc.common.registry.get(base).cls
    assert enc.causal_only
    assert not CAPE(32, 4, 64, base="alibi", base_options={"symmetric": True}).causal_only


def test_cope_positions_count_gates_and_clamp():
    """With q.k huge the gates are 1: p_ij counts the visible keys j..i, clamped at npos_max - 1."""
    enc = CoPE(2, max_len=8, npos_max=4).double()
    with torch.no_grad():
        enc.pos_emb.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]))
    q = torch.tensor([[[[1.0, 0.0]] * 6]], dtype=torch.float64)
    scores = torch.full((1, 1, 6, 6), 50.0, dtype=torch.float64)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    pos = torch.arange(6)[None]
    out = enc.transform_scores(scores, q, q, pos, pos, allowed)
    # q.e(p) = p (first coordinate), scaled by 1/sqrt(2); p_ij = min(i - j + 1, 3) on the visible pairs
    want = torch.tensor([[min(i - j + 1, 3) if j <= i else 0 for j in range(6)] for i in range(6)],
                        dtype=torch.float64) / math.sqrt(2)
    torch.testing.assert_close((out - scores)[0, 0], want, atol=1e-9, rtol=0)


@pytest.mark.parametrize("npos_max", [4, 64])
@pytest.mark.parametrize("gain", [-40.0, 0.0, 2.0, 40.0])
def test_cope_transform_and_gradients_match_reference_whatever_the_gates(gain, npos_max):
    """Gates near 0 (the positional table is cut to a few rows), mixed, mostly open, and 1 (every
    position an integer, the small table's clamp reached): the transform and its gradients to the
    scores, q and the table equal the float64 reference, rows no position reaches included (zero)."""
    gen = torch.Generator().manual_seed(3)
    t, d = 20, 8
    enc = CoPE(d, max_len=t, npos_max=npos_max).double()
    with torch.no_grad():
        enc.pos_emb.copy_(torch.randn(npos_max, d, dtype=torch.float64, generator=gen))
    q = torch.randn(2, 3, t, d, dtype=torch.float64, generator=gen, requires_grad=True)
    scores = (gain + torch.randn(2, 3, t, t, dtype=torch.float64, generator=gen)).requires_grad_()
    allowed = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
    pos = torch.arange(t)[None]
    out = enc.transform_scores(scores, q, q, pos, pos, allowed)
    want = ref.cope_scores(scores, q, enc.pos_emb, allowed[:, 0], npos_max)
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad(out, (scores, q, enc.pos_emb), grad)
    expected = torch.autograd.grad(want, (scores, q, enc.pos_emb), grad)
    for name, g, w in zip(("scores", "q", "pos_emb"), got, expected):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=lambda m, name=name: f"grad {name}: {m}")


def test_cope_table_is_cut_to_the_rows_a_position_reaches():
    """p is at most its row's total of gates: the table keeps floor(max total) + 3 rows (one of margin
    for rounding), never more than the keys + 1 or npos_max."""
    from posenc.seq.cope import _reachable_rows

    totals = torch.tensor([[0.2], [4.7]])
    assert _reachable_rows(totals, npos_max=100, keys=50) == 7
    assert _reachable_rows(totals, npos_max=6, keys=50) == 6
    assert _reachable_rows(totals, npos_max=100, keys=5) == 6
    assert _reachable_rows(torch.zeros(0, 1), npos_max=100, keys=0) == 1


def test_cope_nan_scores_give_nan_where_they_reach_not_an_error():
    """A NaN in one query row of one head (a diverged model): that head's row and the later rows
    that see it as a key are NaN; the rows before it and the other head are finite."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 6, 8)
    q[0, 0, 3, 0] = float("nan")
    pos = torch.arange(6)[None]
    v = torch.randn(1, 2, 6, 8)
    out = attend(q, q, v, q_pos=pos, kv_pos=pos, encoding=CoPE(8, 16), mask=posenc.AttentionMask(causal=True))
    assert out[0, 1].isfinite().all() and out[0, 0, :3].isfinite().all()
    assert out[0, 0, 3:].isnan().all(-1).all()


@pytest.mark.parametrize("tile_pairs", [8192, 7])
@pytest.mark.parametrize("base", ["alibi", "kerple"])
def test_cape_transform_and_gradients_match_reference_with_per_sequence_positions(base, tile_pairs, monkeypatch):
    """f in the head-major layout: the transform and the gradients to the scores, the MLP and a
    learned base (KERPLE) equal the float64 reference, in both forms (batched products, and the
    tiled form over tiles of pairs with its backward written out: one tile, and 81 pairs in tiles
    of 7) with a static bias shared by the batch; with one per sequence (positions that differ
    between the sequences) the tiled form declines (None) and the batched one serves it."""
    import posenc.seq.cape_tiles as cape_tiles

    monkeypatch.setattr(cape_tiles, "TILE_PAIRS", tile_pairs)
    gen = torch.Generator().manual_seed(5)
    h, t = 4, 9
    enc = CAPE(16, h, 16, base=base, hidden=6).double()
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64, generator=gen))
    scores = torch.randn(2, h, t, t, dtype=torch.float64, generator=gen, requires_grad=True)
    grad = torch.randn(scores.shape, dtype=torch.float64, generator=gen)
    shared = torch.arange(t)[None]
    per_sequence = torch.stack((torch.arange(t), torch.arange(t) + 3))
    assert enc.transform_scores_tiled(scores, scores, scores, per_sequence, per_sequence, None) is None
    for pos, form in ((shared, "tiled"), (shared, "batched"), (per_sequence, "batched")):
        transform = enc.transform_scores_tiled if form == "tiled" else enc.transform_scores
        out = transform(scores, scores, scores, pos, pos, None)
        if base == "alibi":
            static = ref.alibi_bias([2.0 ** -(2 * i) for i in range(1, h + 1)], pos, pos)
        else:
            static = ref.kerple_bias(enc.base.r1, enc.base.r2, enc.base.variant, pos, pos)
        m = enc.mlp
        want = ref.cape_scores(scores, static, m[0].weight, m[0].bias, m[2].weight, m[2].bias)
        torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)
        params = [scores, *enc.parameters()]
        for name, g, w in zip(["scores", *(n for n, _ in enc.named_parameters())],
                              torch.autograd.grad(out, params, grad), torch.autograd.grad(want, params, grad)):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=lambda m, name=name: f"{form} grad {name}: {m}")


def test_cape_with_bfloat16_weights_on_float32_scores():
    """An MLP kept in bfloat16 runs in its dtype and returns the scores' dtype, close to the float32 MLP."""
    torch.manual_seed(0)
    enc = CAPE(16, 4, 16)
    scores = torch.randn(2, 4, 7, 7)
    pos = torch.arange(7)[None]
    want = enc.transform_scores(scores, scores, scores, pos, pos, None)
    torch.testing.assert_close(enc.transform_scores_tiled(scores, scores, scores, pos, pos, None), want)
    enc = enc.to(torch.bfloat16)
    assert enc.transform_scores_tiled(scores, scores, scores, pos, pos, None) is None  # another dtype: declined
    out = enc.transform_scores(scores, scores, scores, pos, pos, None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=0.05, atol=0.05)


def _padded_causal_inputs(gen: torch.Generator):
    """``q, k, v [2, 4, 12, 8]`` float64 needing gradients, positions, a causal mask whose batch
    row 1 hides its first five keys (so its first five queries see none), and an upstream
    gradient: the inputs of the written-out backward tests."""
    q, k, v = (torch.randn(2, 4, 12, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    key_valid = torch.ones(2, 12, dtype=torch.bool)
    key_valid[1, :5] = False
    mask = posenc.AttentionMask(causal=True, key_valid=key_valid)
    return q, k, v, torch.arange(12)[None], mask, torch.randn(2, 4, 12, 8, dtype=torch.float64, generator=gen)


def test_cape_runs_the_form_of_its_transform_the_plan_names(monkeypatch):
    """Through the core, CAPE's transform is the form the plan names: the tiled one for a training
    call on CPU (and any call with its rows in chunks), the decoding hook for a decoding step (one
    row or a few, no gradient), each with the output of the plain transform."""
    from posenc.common.attention import prepare
    from posenc.common.call import AttentionCall

    torch.manual_seed(0)
    enc = CAPE(16, 4, 16, hidden=6)
    calls = []
    for name in ("transform_scores", "transform_scores_tiled", "decode_transform_scores"):
        method = getattr(enc, name)
        monkeypatch.setattr(enc, name, lambda *a, _m=method, _n=name, **kw: calls.append(_n) or _m(*a, **kw))
    q, k, v = (torch.randn(2, 4, 12, 8, requires_grad=True) for _ in range(3))
    pos, causal = torch.arange(12)[None], posenc.AttentionMask(causal=True)

    def run(rows):
        calls.clear()
        call = AttentionCall.checked(q[:, :, -rows:], k, v, q_pos=pos[:, -rows:], kv_pos=pos, encoding=enc, mask=causal)
        ready = prepare(call)
        out = kernels.math_path(ready.call.q, ready.call.k, ready.call.v, ready.call.mask, ready.terms,
                                ready.call.scale, ready.plan.chunk_rows, form=ready.plan.form,
                                backward=ready.plan.math_backward)
        return ready.plan, out, list(calls)

    plan, trained, seen = run(12)
    assert plan.tiled_transform and seen and set(seen) == {"transform_scores_tiled"}, (plan, seen)
    with torch.no_grad():
        # one row reads the kept table; three that see one another (speculative) take the plain transform
        for rows, want in ((1, ["decode_transform_scores"]), (3, ["decode_transform_scores", "transform_scores"])):
            plan, out, seen = run(rows)
            assert plan.decode and seen == want, (plan, seen)
            torch.testing.assert_close(out, trained[:, :, -rows:].detach(), rtol=1e-5, atol=1e-6)
        calls.clear()
        monkeypatch.setattr(enc, "transform_scores_tiled", lambda *a, **kw: calls.append("declined"))
        plan, out, seen = run(12)  # an input the tiled form declines: the plain transform serves it
        assert plan.tiled_transform and seen[:2] == ["declined", "transform_scores"], seen
        torch.testing.assert_close(out, trained.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("base", ["alibi", "kerple"])
@pytest.mark.parametrize("tile_pairs", [8192, 20])
def test_cape_fused_backward_is_taken_and_equals_autograd_through_the_transform(base, tile_pairs, monkeypatch):
    """A training call on CPU: the plan names CAPE's own backward (one pass over tiles of rows:
    transform, softmax and gradients from one hidden layer), and it gives the gradients of the
    two other backwards of the math path, the explicit one (autograd through transform_scores)
    and plain autograd per chunk, to q, k, v, the MLP and a learned base, with a padded batch
    row, rows that see no key, and tiles of one row (20 pairs over 12 keys) or of many."""
    import posenc.seq.cape as cape_module
    import posenc.seq.cape_tiles as cape_tiles
    from posenc.common.attention import prepare
    from posenc.common.call import AttentionCall

    monkeypatch.setattr(cape_tiles, "TILE_PAIRS", tile_pairs)
    gen = torch.Generator().manual_seed(3)
    enc = CAPE(16, 4, 16, base=base, hidden=6).double()
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64, generator=gen))
    q, k, v, pos, mask, grad = _padded_causal_inputs(gen)
    params = [q, k, v, *enc.parameters()]

    def gradients(backward):
        ready = prepare(AttentionCall.checked(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend="math"))
        assert ready.plan.math_backward == "encoding", ready.plan
        c = ready.call
        out = kernels.math_path(c.q, c.k, c.v, c.mask, ready.terms, c.scale, ready.plan.chunk_rows, backward=backward)
        return out, torch.autograd.grad(out, params, grad)

    calls = []
    fused = cape_module.fused_softmax_backward
    monkeypatch.setattr(cape_module, "fused_softmax_backward", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    out, got = gradients("encoding")
    assert calls, "the fused backward did not run"
    torch.testing.assert_close(attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask), out, rtol=0, atol=0)
    names = ["q", "k", "v", *(n for n, _ in enc.named_parameters())]
    for other in ("explicit", "autograd"):
        calls.clear()
        want_out, want = gradients(other)
        assert not calls, f"{other}: the fused backward ran"
        torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
        for name, g, w in zip(names, got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12,
                                       msg=lambda m, name=name: f"{other}, grad {name}: {m}")
    assert got[0][1, :, :5].abs().max() == 0  # rows that see no key: no gradient


def test_cape_fused_backward_rejects_bad_input_in_one_line():
    enc = CAPE(16, 4, 16)
    scores, pos = torch.randn(2, 4, 5, 5), torch.arange(5)[None]
    ok_mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    cases = ((scores.tolist(), scores, None, TypeError, "scores must be a tensor; got list"),
             (scores.long(), scores, None, TypeError, "scores must be a floating-point tensor"),
             (scores[0], scores, None, ValueError, r"scores must have 4 dimensions; got shape \(4, 5, 5\)"),
             (scores, scores[:, :, :4], None, ValueError, r"must both be \[B, 4 heads, queries, keys\]"),
             (scores[:, :3], scores[:, :3], None, ValueError, "4 heads"),
             (scores, scores, ok_mask.float(), ValueError, "allowed must be a bool mask"),
             (scores, scores, ok_mask[..., :4], ValueError, r"allowed must be a bool mask \[B or 1, 1, 5, 5\]"),
             (scores, scores, ok_mask.expand(3, 1, 5, 5), ValueError, "allowed must be a bool mask"),
             (scores, scores, ok_mask.expand(1, 4, 5, 5), ValueError, r"allowed must be a bool mask \[B or 1, 1, 5, 5\]"))
    for s, centered, allowed, error, match in cases:
        with pytest.raises(error, match=match) as info:
            enc.transform_softmax_backward(s, centered, scores, scores, pos, pos, allowed)
        assert "\n" not in str(info.value)
    probs, d_scores, _ = enc.transform_softmax_backward(scores, scores, scores, scores, pos, pos, ok_mask)
    assert probs.shape == d_scores.shape == scores.shape


def test_transformer_xl_position_term_uses_q_not_q_plus_u():
    """Terms (a)-(d) separately: changing u moves only u.k_j, changing v only v.W_R R."""
    torch.manual_seed(0)
    enc = TransformerXLRelative(16, 2, 8).double()
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    pos = torch.arange(5)[None]

    def scores(e):
        qt, kt = e.transform_qk(q, k, pos, pos)
        content = qt @ kt.transpose(-1, -2) / math.sqrt(8)
        return content + e.score_bias(qt, kt, pos, pos).dense(1, 2, torch.arange(5), torch.arange(5))

    want = ref.transformer_xl_scores(q, k, enc.u, enc.v, enc.r_proj.weight, 16, pos, pos)
    torch.testing.assert_close(scores(enc), want.detach())


# ---- bad input ----------------------------------------------------------------------------------

def test_bad_input_is_named():
    q = torch.randn(1, 4, 5, 8)
    pos = torch.arange(5)[None]
    fpos = pos.float()
    causal = posenc.AttentionMask(causal=True)
    with pytest.raises(ValueError, match="num_buckets must be"):
        T5Bias(4, num_buckets=7, bidirectional=True)
    with pytest.raises(ValueError, match="max_distance must be"):
        t5_bucket(torch.arange(3), bidirectional=False, num_buckets=32, max_distance=10)
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        t5_bucket(torch.arange(3.0), bidirectional=False)
    for enc in (T5Bias(4), ShawRelative(8), TransformerXLRelative(16, 4, 8)):
        with pytest.raises(ValueError, match="integer positions"):
            attend(q, q, q, q_pos=fpos, kv_pos=fpos, encoding=enc, mask=causal)
    with pytest.raises(ValueError, match="max_relative must be a positive int"):
        ShawRelative(8, max_relative=0)
    with pytest.raises(ValueError, match="variant must be one of"):
        KERPLE(4, variant="gauss")
    with pytest.raises(ValueError, match="base must be one of"):
        CAPE(32, 4, 64, base="t5")
    with pytest.raises(ValueError, match="npos_max must be"):
        CoPE(8, max_len=8, npos_max=1)
    with pytest.raises(ValueError, match="FIRE is defined for causal attention only"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=FIRE(4))
    with pytest.raises(ValueError, match="CoPE is defined for causal attention only"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=CoPE(8, 8))
    for enc in (CAPE(32, 4, 64), CoPE(8, 8)):
        with pytest.raises(ValueError, match="transforms the whole score matrix; use 'math' or 'auto'"):
            attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc, mask=causal, backend="dense")
    with pytest.raises(ValueError, match="needs the attention probabilities"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=ShawRelative(8), mask=causal, backend="flex")
    with pytest.raises(ValueError, match="built for head_dim=16"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=ShawRelative(16), mask=causal)


def test_shaw_value_term_takes_the_fused_path_for_causal_consecutive_positions(monkeypatch):
    """Causal self-attention: no probability matrix (the math path is never called); padding or
    packed positions fall back to the math path, with the same result as the reference."""
    torch.manual_seed(0)
    enc = ShawRelative(8, max_relative=3)
    calls = []
    original = kernels.math_path

    def recording(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "math_path", recording)
    q = torch.randn(2, 4, 20, 8, requires_grad=True)
    pos = torch.arange(20)[None]
    out = attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(causal=True))
    out.sum().backward()
    assert calls == [] and enc.value_table.grad.abs().sum() > 0
    want = ref.shaw_attention(q, q, q, ref.allowed_matrix(2, 20, 20, causal=True), enc.key_table, enc.value_table,
                              3, pos, pos)
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-4, atol=1e-5)
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[1, 15:] = False
    attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(causal=True, key_valid=valid))
    assert calls == [1]


def test_shaw_decoding_steps_take_their_bias_whole_and_their_value_term_from_the_last_keys(monkeypatch):
    """A cached decoding step without gradients builds its key term as one dense row (no per-block
    gathers through the positions) and its value term from its last K keys alone, once it sees
    K keys; a step of three rows too, and a few rows at any positions: each equals the full
    forward (or the reference) at 1e-10 in float64."""
    torch.manual_seed(0)
    enc = ShawRelative(8, max_relative=3)
    stack = posenc.TransformerEncoder(32, 2, 4, encoding=enc).double().eval()
    with torch.no_grad():
        enc.key_table.mul_(3.0)  # position terms that move the result well past the tolerance
        enc.value_table.mul_(3.0)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    mask = posenc.AttentionMask(causal=True)
    dense_rows = []
    original = kernels.dense_path

    def recording(q, k, v, mask, bias, *args, **kwargs):
        dense_rows.append((q.shape[2], bias.table is not None))
        return original(q, k, v, mask, bias, *args, **kwargs)

    monkeypatch.setattr(kernels, "dense_path", recording)
    with torch.no_grad():
        full = stack(x, mask=mask)
        cache = posenc.KVCache(2)
        steps = [stack(x[:, :2], mask=mask, cache=cache)]  # two keys: fewer than K, the chunked term
        steps += [stack(x[:, t: t + 1], mask=mask, cache=cache) for t in range(2, 9)]
        steps.append(stack(x[:, 9:], mask=mask, cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    # the full forward's twelve rows by blocks; every cached call (two layers each) its bias whole
    assert dense_rows == [(12, False)] * 2 + [(2, True)] * 2 + [(1, True)] * 14 + [(3, True)] * 2
    # any positions: a few rows at per-row, non-consecutive positions (the math path, for the values)
    q, k, v = (torch.randn(2, 4, n, 8, dtype=torch.float64) for n in (3, 9, 9))
    q_pos, kv_pos = torch.tensor([[2, 5, 7], [1, 1, 8]]), torch.stack([torch.arange(9) * 2, torch.arange(9)])
    with torch.no_grad():
        got = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc)
    want = ref.shaw_attention(q, k, v, None, enc.key_table, enc.value_table, 3, q_pos, kv_pos)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    without_shaw = posenc.TransformerEncoder(32, 2, 4).double().eval()
    without_shaw.load_state_dict(stack.state_dict(), strict=False)
    assert not torch.allclose(without_shaw(x, mask=mask), full, atol=1e-3)


@pytest.mark.parametrize("hook", ["score_bias", "decode_score_bias"], ids=["piecewise", "direct"])
def test_fire_inference_lookup_equals_the_mlp(hook):
    """Both forms used at inference, the piecewise-linear lookup (score_bias without gradients)
    and the MLP evaluated directly (the decoding hook), are the same function as the MLP."""
    torch.manual_seed(0)
    enc = FIRE(4, init_threshold=20.0).double()
    with torch.no_grad():
        enc.mlp[0].weight[3] = 0.0  # a unit with no breakpoint (constant relu(b))
    q = torch.zeros(1, 4, 40, 8)
    pos = torch.arange(40)[None] * 3
    idx = torch.arange(40)
    training = enc.score_bias(q, q, pos, pos)
    assert training.requires_grad
    with torch.no_grad():
        lookup = getattr(enc, hook)(q, q, pos, pos)
        assert not lookup.requires_grad
        torch.testing.assert_close(lookup.dense(1, 4, idx, idx), training.dense(1, 4, idx, idx).detach(),
                                   rtol=1e-12, atol=1e-12)
    m = enc.mlp
    want = ref.fire_bias(enc.c, enc.threshold, m[0].weight, m[0].bias, m[2].weight, m[2].bias, pos, pos)
    torch.testing.assert_close(training.dense(1, 4, idx, idx).detach(), want.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("query", [0, 7, 29, 30, 55])  # below, at and past the threshold of 30
def test_fire_one_query_by_offset_equals_the_mlp(query):
    """A decoding step's bias (one query, no gradients) read by offset, as the kernel cuts it, is
    the MLP of the normalised distance at every key, and the dense evaluation's row."""
    from posenc.common.kernels.dense_blocks import OffsetBias

    torch.manual_seed(1)
    enc = FIRE(3, init_threshold=30.0).double()
    q_pos, kv_pos = torch.tensor([[query]]), torch.arange(query + 1)[None]
    q = torch.zeros(1, 3, 1, 8, dtype=torch.float64)
    with torch.no_grad():
        bias = enc.decode_score_bias(q, q, q_pos, kv_pos)
        assert bias.by_offset is not None
        offsets = OffsetBias(bias, -query, 1, query + 1, True, q.device)
        row = offsets.block(offsets.values(torch.float64), 0, 1, query + 1)  # [1, H, 1, keys]
        dense = bias.dense(1, 3, torch.tensor([0]), torch.arange(query + 1))
    m = enc.mlp
    want = ref.fire_bias(enc.c, enc.threshold, m[0].weight, m[0].bias, m[2].weight, m[2].bias, q_pos, kv_pos)
    torch.testing.assert_close(row, want.detach().reshape(row.shape), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(row, dense, rtol=0, atol=0)
    with torch.enable_grad():  # with gradients to its parameters: per element, learned, no by_offset
        assert enc.score_bias(q, q, q_pos, kv_pos).by_offset is None


def test_fire_decoding_keeps_its_distance_table_until_c_changes(monkeypatch):
    """A decoding step reads psi(|i - j|) from a table built once per doubling of the context (at
    least 256 entries), not a logarithm per key at every step; an edit of c (even through .data)
    rebuilds it, and the bias then follows the new c."""
    from posenc.common.kernels.dense_blocks import OffsetBias

    enc = FIRE(2, init_threshold=30.0)
    builds = []
    get = enc._psi_table.get

    def counted_get(sources, build, key=()):
        return get(sources, lambda: builds.append(key[0]) or build(), key=key)

    monkeypatch.setattr(enc._psi_table, "get", counted_get)

    def step_row(query: int) -> torch.Tensor:
        q_pos, kv_pos = torch.tensor([[query]]), torch.arange(query + 1)[None]
        q = torch.zeros(1, 2, 1, 8)
        with torch.no_grad():
            bias = enc.decode_score_bias(q, q, q_pos, kv_pos)
            offsets = OffsetBias(bias, -query, 1, query + 1, True, q.device)
            row = offsets.block(offsets.values(torch.float32), 0, 1, query + 1)  # [1, H, 1, keys]
            return row, bias.dense(1, 2, torch.tensor([0]), torch.arange(query + 1))

    for query in (100, 101, 255, 256, 300):
        row, dense = step_row(query)
        torch.testing.assert_close(row, dense, rtol=0, atol=0)
    assert builds == [256, 512]  # one table per doubling of the context
    builds.clear()
    before, _ = step_row(300)
    enc.c.data.mul_(2.0)
    after, dense = step_row(300)
    assert builds == [512]
    torch.testing.assert_close(after, dense, rtol=0, atol=0)
    assert not torch.equal(before, after)


def test_fire_training_gradients_equal_the_mlp_reference():
    """The CPU chunks evaluate the MLP in its piecewise-linear form with a written-out backward;
    the gradients of c, the threshold and the MLP are those of the MLP itself (float64)."""
    torch.manual_seed(1)
    enc = FIRE(4, init_threshold=20.0).double()
    with torch.no_grad():
        enc.c.fill_(0.3)
    q = torch.zeros(2, 4, 30, 8, dtype=torch.float64)
    pos = torch.arange(30)[None] * 2 + torch.tensor([[0], [5]])  # per batch row: the per_batch layout
    idx = torch.arange(30)
    upstream = torch.randn(2, 4, 30, 30, dtype=torch.float64)
    params = [enc.c, enc.l_mult, *enc.mlp.parameters()]
    got_value = enc.score_bias(q, q, pos, pos).dense(2, 4, idx, idx)
    got = torch.autograd.grad(got_value, params, upstream)
    m = enc.mlp
    want_value = ref.fire_bias(enc.c, enc.threshold, m[0].weight, m[0].bias, m[2].weight, m[2].bias, pos, pos)
    want = torch.autograd.grad(want_value, params, upstream)
    torch.testing.assert_close(got_value, want_value, rtol=1e-12, atol=1e-12)
    for name, g, w in zip(["c", "l_mult", "w1", "b1", "w2", "b2"], got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=lambda text, n=name: f"{n}: {text}")
    # element-wise calls (FlexAttention's scalar indices) keep the MLP itself: the same function
    b, h = torch.tensor(1), torch.tensor(2)
    element = enc.score_bias(q, q, pos, pos)(b, h, torch.tensor(17), torch.tensor(4))
    torch.testing.assert_close(element, want_value[1, 2, 17, 4], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["self", "cache"])
def test_fire_training_over_runs_of_positions_equals_the_mlp_reference(layout):
    """Positions that are runs shared by the batch (the usual training call): blocks (rows from
    the middle, keys cut short), element-wise calls and gradients of c, the threshold and the MLP
    are those of the MLP itself (float64), with queries below and above the threshold."""
    torch.manual_seed(3)
    enc = FIRE(4, init_threshold=20.0).double()
    with torch.no_grad():
        enc.c.fill_(0.3)
        for p in enc.mlp.parameters():
            p.normal_()
    tq, tk = (12, 40) if layout == "cache" else (40, 40)
    kv_pos = torch.arange(tk)[None] + 3
    q_pos = kv_pos[:, tk - tq:]
    q = torch.zeros(1, 4, tq, 8, dtype=torch.float64)
    bias = enc.score_bias(q, q, q_pos, kv_pos)
    m = enc.mlp
    want_value = ref.fire_bias(enc.c, enc.threshold, m[0].weight, m[0].bias, m[2].weight, m[2].bias, q_pos, kv_pos)
    assert want_value[0, 0].amax() - want_value[0, 0].amin() > 0.5  # the MLP's slopes differ across the pairs
    params = [enc.c, enc.l_mult, *enc.mlp.parameters()]
    idx = torch.arange(tk)
    for rows, keys in ((slice(0, tq), slice(0, tk)), (slice(5, 11), slice(0, 23))):
        upstream = torch.randn(1, 4, rows.stop - rows.start, keys.stop, dtype=torch.float64)
        got_value = enc.score_bias(q, q, q_pos, kv_pos).dense(1, 4, idx[rows], idx[keys])
        torch.testing.assert_close(got_value, want_value[:, :, rows, keys], rtol=1e-12, atol=1e-12)
        with torch.no_grad():  # the forward pass's chunks: the same block without its gradients
            plain = enc.score_bias(q, q, q_pos, kv_pos).dense(1, 4, idx[rows], idx[keys])
        torch.testing.assert_close(plain, want_value[:, :, rows, keys].detach(), rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(got_value, params, upstream)
        want = torch.autograd.grad(want_value[:, :, rows, keys], params, upstream, retain_graph=True)
        for name, g, w in zip(["c", "l_mult", "w1", "b1", "w2", "b2"], got, want):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=lambda text, n=name: f"{n}: {text}")
            if name == "l_mult" and layout == "self":
                assert g.abs() > 1e-6  # queries below the threshold: their norm depends on it
    b, h = torch.tensor(0), torch.tensor(2)
    element = bias(b, h, torch.tensor(9), torch.tensor(30))  # scalar indices: the lookup per element
    torch.testing.assert_close(element, want_value[0, 2, 9, 30], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, layout", [
    *((name, layout) for name in ("alibi", "t5", "kerple", "kerple_power") for layout in ("self", "cache")),
    ("t5_bidirectional", "bidirectional"),  # the causal-only encodings have no bidirectional case
])
def test_offset_blocks_equal_the_per_element_bias(name, layout):
    """Over consecutive positions a bias of the offset alone is cut from its diagonals
    (``_OffsetBias``); outputs and every gradient (q, k, v, the encoding's parameters) equal the
    per-element blocks of the general path, in float64, with a causal mask (square and KV-cache
    shaped) and without one."""
    torch.manual_seed(0)
    if name == "t5_bidirectional":
        enc = posenc.build("t5", dims=DIMS, bidirectional=True)
    elif name == "kerple_power":
        enc = posenc.build("kerple", dims=DIMS, variant="power")
    else:
        enc = posenc.build(name, dims=DIMS)
    enc = enc.double()
    tq, tk = (24, 40) if layout == "cache" else (40, 40)
    q = torch.randn(2, 4, tq, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, tk, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 4, tk, 8, dtype=torch.float64, requires_grad=True)
    kv_pos = torch.arange(tk)[None] + 5
    q_pos = kv_pos[:, tk - tq:]
    mask = None if layout == "bidirectional" else posenc.AttentionMask(causal=True)
    start = posenc.plan(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=mask).offset_start
    assert start == -(tk - tq)  # kv_pos[0] - q_pos[0]
    params = [p for p in enc.parameters() if p.requires_grad]
    results = []
    for offset_start in (start, None):
        bias = enc.score_bias(q, k, q_pos, kv_pos)
        out = kernels.dense_path(q, k, v, mask, bias, 8 ** -0.5, chunk=7, offset_start=offset_start)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum(),
                                    [q, k, v, *params], allow_unused=True)
        results.append((out, grads))
    (out_a, grads_a), (out_b, grads_b) = results
    torch.testing.assert_close(out_a, out_b, rtol=1e-12, atol=1e-12)
    for ga, gb in zip(grads_a, grads_b):
        assert (ga is None) == (gb is None)
        if ga is not None:
            torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)
    if name in ("t5", "kerple", "t5_bidirectional", "kerple_power"):
        assert params and any(g is not None and g.abs().sum() > 0 for g in grads_a[3:])


def test_offset_blocks_only_for_consecutive_shared_positions():
    enc = posenc.build("t5", dims=DIMS)
    q = torch.randn(1, 4, 8, 8)
    pos = torch.arange(8)[None]
    causal = posenc.AttentionMask(causal=True)

    def start(encoding, positions, mask):
        return posenc.plan(q, q, q, q_pos=positions, kv_pos=positions, encoding=encoding, mask=mask).offset_start

    assert start(enc, pos, causal) == 0
    gappy = torch.tensor([[0, 1, 2, 4, 5, 6, 7, 8]])
    assert start(enc, gappy, causal) is None
    padded = posenc.AttentionMask(causal=True, key_valid=torch.ones(1, 8, dtype=torch.bool))
    assert start(enc, pos, padded) is None
    fire = posenc.build("fire", dims=DIMS)  # normalised by the query position: not an offset alone
    assert start(fire, pos, causal) is None


@pytest.mark.parametrize("flat_units", ["none", "some", "all"])
def test_fire_piecewise_linear_form_is_the_mlp_on_the_whole_line(flat_units):
    """Units with w1 = 0 (constant relu(b1)) have no breakpoint (inf, never reached): the form is
    the MLP everywhere, also past the last breakpoint and with every unit flat."""
    torch.manual_seed(0)
    enc = FIRE(4).double()
    with torch.no_grad():
        if flat_units == "all":
            enc.mlp[0].weight.zero_()
        elif flat_units == "some":
            enc.mlp[0].weight[::3] = 0.0
    x = torch.linspace(-2, 3, 1001, dtype=torch.float64)
    breaks, slope, offset = enc.piecewise_linear()
    assert breaks.shape == (32,) and slope.shape == offset.shape == (33, 4)
    seg = torch.searchsorted(breaks, x, right=True)
    torch.testing.assert_close(slope[seg] * x[:, None] + offset[seg], enc.mlp(x[:, None]), rtol=1e-12, atol=1e-12)


def test_dense_bias_blocks_are_views_for_runs_and_gathers_otherwise():
    """A dense bias read at one run of rows and keys (the dense path's blocks) is a view of the
    table, no copy; any other indices (reversed, with a gap, repeated) read the right entries."""
    from posenc.common.pairwise import dense_bias

    table = torch.randn(2, 3, 5, 7, requires_grad=True)
    bias = dense_bias(table)

    def block(rows, keys):
        return bias.dense(2, 3, torch.tensor(rows), torch.tensor(keys))

    run = block([1, 2, 3], [0, 1, 2, 3, 4, 5, 6])
    assert run.data_ptr() == table[:, :, 1:].data_ptr() and torch.equal(run, table[:, :, 1:4])
    assert torch.equal(block([4], [2, 3]), table[:, :, 4:5, 2:4])
    for rows, keys in (([3, 2, 1], [0, 1]), ([0, 2], [6, 5, 4]), ([1, 1], [0, 2, 3]), ([0, 1, 3], [0, 1, 2, 3]),
                       ([0, 2, 1, 3], [4, 6, 5])):
        torch.testing.assert_close(block(rows, keys), table[:, :, rows][:, :, :, keys], rtol=0, atol=0)
    block([0, 1], [2, 3]).sum().backward()
    expected = torch.zeros_like(table)
    expected[:, :, 0:2, 2:4] = 1
    assert torch.equal(table.grad, expected)


def test_run_start_known_values_and_bad_input():
    from posenc.common.pairwise import run_start

    assert run_start(torch.tensor([4, 5, 6])) == 4
    assert run_start(torch.tensor([[7]])) == 7
    assert run_start(torch.arange(3).view(1, 1, 1, 3)) == 0
    for not_a_run in ([], [0, 2, 1, 3], [0, 1, 3], [2, 1, 0], [1, 1]):
        assert run_start(torch.tensor(not_a_run, dtype=torch.long)) is None, not_a_run
    for bad, what in ((torch.tensor([0.0, 1.0]), "torch.float32 tensor"), (torch.tensor([True]), "torch.bool tensor"),
                      ([0, 1], "list")):
        with pytest.raises(TypeError, match=f"idx must be an integer tensor of indices; got {what}"):
            run_start(bad)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_a_decoding_rows_dense_table_is_read_whole(mask_kind, monkeypatch):
    """Without gradients, a call of a few rows hands a dense bias table (a caller's attn_bias,
    DeBERTa's decoding bias) to the kernel as it is, no blocks cut: the output equals float64
    softmax(s q k^T + table + mask) v, and no per-index evaluation runs."""
    from posenc.common.attention import attend
    from posenc.common.masks import AttentionMask
    from posenc.common.pairwise import PairwiseBias

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) for n in (2, 9, 9))
    table = torch.randn(2, 3, 2, 9, generator=gen)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, :3] = False
    mask = {"none": None, "causal": AttentionMask(causal=True), "padding": AttentionMask(key_valid=valid)}[mask_kind]
    hidden = torch.zeros(2, 1, 2, 9, dtype=torch.bool)
    if mask_kind == "causal":
        hidden[:, :, 0, 8] = True  # the first of the two rows (position 7) does not see key 8
    if mask_kind == "padding":
        hidden[1, :, :, :3] = True
    scores = (q.double() @ k.double().transpose(-1, -2)) * 8 ** -0.5 + table.double()
    want = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1) @ v.double()

    def refuse(*args, **kwargs):
        raise AssertionError("the whole table was cut into blocks")

    monkeypatch.setattr(PairwiseBias, "dense", refuse)
    with torch.no_grad():
        got = attend(q, k, v, q_pos=torch.tensor([[7, 8]]), kv_pos=torch.arange(9)[None], mask=mask, attn_bias=table)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_key_linear_bias_known_values_and_bad_input():
    """``rest + k_j . w_r`` for the keys before ``stop``, ``rest`` after them; misuse is one line."""
    from posenc.common.pairwise import key_linear_bias

    gen = torch.Generator().manual_seed(1)
    rest, keys = torch.randn(2, 3, 1, 7, generator=gen), torch.randn(2, 3, 7, 4, generator=gen)
    w = torch.randn(1, 3, 1, 4, generator=gen)
    bias = key_linear_bias(rest, keys, w, 3, name="test")
    want = rest.clone()
    for j in range(3):
        want[:, :, 0, j] += (keys[:, :, j] * w[:, :, 0]).sum(-1)
    torch.testing.assert_close(bias.dense(2, 3, torch.tensor([0]), torch.arange(7)), want)
    assert bias.key_linear.stop == 3 and bias.key_linear.rest is rest and bias.key_linear.weights is w
    torch.testing.assert_close(bias(torch.tensor(1), torch.tensor(2), torch.tensor(0), torch.tensor(1)), want[1, 2, 0, 1])
    for args, match in (((rest, keys, w, 8), r"test: stop must be an int in \[0, 7\] \(keys\); got 8"),
                        ((rest, keys, w, True), "stop must be an int"),
                        ((rest[..., :5], keys, w, 2), "disagree"),
                        ((rest, keys, w[..., :3], 2), "disagree"),
                        ((rest[0], keys, w, 2), "must be 4-D")):
        with pytest.raises(ValueError, match=match):
            key_linear_bias(*args, name="test")
    for args, match in (((rest.tolist(), keys, w, 2), "test: rest must be a tensor; got list"),
                        ((rest, keys.long(), w, 2), "test: keys must be a floating-point tensor; got dtype torch.int64"),
                        ((rest, keys, w.double(), 2), "test: weights and keys must have one dtype")):
        with pytest.raises(TypeError, match=match):
            key_linear_bias(*args, name="test")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_key_linear_kernel_matches_a_float64_reference(mask_kind, dtype):
    """The dense path's fold of a key-linear bias (weights sent through the product with the
    keys beside the query) gives float64 softmax(s q k^T + bias) v and its log-sum-exp, with
    grouped keys (GQA), a batch, a padded batch row seeing no key at all (zeros)."""
    from posenc.common.kernels import dense_path
    from posenc.common.masks import AttentionMask
    from posenc.common.pairwise import key_linear_bias

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(3, 4, 1, 8, generator=gen)
    k, v = torch.randn(3, 2, 9, 8, generator=gen), torch.randn(3, 2, 9, 8, generator=gen)
    rest, w = torch.randn(3, 4, 1, 9, generator=gen), torch.randn(1, 4, 1, 8, generator=gen)
    q, k, v, rest, w = (t.to(dtype) for t in (q, k, v, rest, w))
    k_heads = k.repeat_interleave(2, dim=1)
    bias = key_linear_bias(rest, k_heads, w, 5)
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[1, :4] = False
    valid[2] = False
    mask = {"none": None, "causal": AttentionMask(causal=True), "padding": AttentionMask(key_valid=valid)}[mask_kind]
    full = bias.dense(3, 4, torch.tensor([0]), torch.arange(9)).double()
    scores = (q.double() @ k_heads.double().transpose(-1, -2)) * 8 ** -0.5 + full
    if mask_kind == "padding":
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    want_lse = torch.logsumexp(scores, -1)
    want = torch.nan_to_num(torch.softmax(scores, -1)) @ v.double().repeat_interleave(2, dim=1)
    with torch.no_grad():
        out, lse = dense_path(q, k, v, mask, bias, 8 ** -0.5, return_lse=True, form="one_pass")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), want_lse, rtol=tol, atol=tol)
    assert out.dtype == dtype
