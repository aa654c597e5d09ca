"""MultiheadAttention, the encoder stack, the KV cache, backend choice and bad input."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import posenc
from posenc.common import kernels
from posenc.common.attention import attend
from posenc.common.planning import PlanInputs, decide
from posenc.seq.alibi import ALiBi
from posenc.seq.rope import RotaryEncoding
from posenc.seq.sinusoidal import SinusoidalEncoding
from posenc.timeseries.erpe import ERPE

from . import reference as ref

CPU = torch.device("cpu")


def _encodings(dim=32, heads=4, max_len=64):
    return {
        "none": None,
        "rope": RotaryEncoding(dim // heads),
        "rope_interleaved": RotaryEncoding(dim // heads, pairing="interleaved"),
        "alibi": ALiBi(heads),
        "erpe": ERPE(heads, max_len),
    }


# ---- the kernel plan ------------------------------------------------------------------------

PLAN_SIZES = dict(batch=2, heads=4, q_len=64, kv_len=64)
NEEDS = posenc.common.AttentionNeeds


def _plan(needs=NEEDS(), backend="auto", device=CPU, mask=None, **kw):
    args = dict(PLAN_SIZES, needs_grad=True)
    args.update(kw)
    return decide(PlanInputs(needs, mask=mask, device=device, backend=backend, **args))


def test_auto_picks_the_fastest_allowed_path():
    cuda = torch.device("cuda")
    assert _plan().path == "sdpa"
    assert _plan(NEEDS(qk=True)).path == "sdpa"
    assert _plan(NEEDS(score_bias=True)).path == "dense"
    assert _plan(NEEDS(score_bias=True), device=cuda).path == "flex"
    assert _plan(NEEDS(score_bias=True, value_term=True)).path == "math"
    assert _plan(NEEDS(score_bias=True, score_transform=True)).path == "math"
    assert _plan(NEEDS(prob_bias=True)).label == "sdpa+prob_bias"
    shaw = NEEDS(score_bias=True, value_term=True, offset_values=True)
    causal = posenc.AttentionMask(causal=True)
    assert _plan(shaw, mask=causal, run_offset=0).label == "dense+offset_values"  # one run, queries last
    assert _plan(shaw, mask=causal, run_offset=None).path == "math"  # positions not one run
    assert _plan(shaw, mask=causal, run_offset=3).path == "math"  # the queries not the run's last
    packed = posenc.AttentionMask.packed(torch.zeros(2, 64, dtype=torch.long))
    assert _plan(mask=packed).path == "sdpa"
    assert _plan(mask=packed, device=cuda).path == "flex"
    assert _plan(mask=posenc.AttentionMask(causal=True), device=cuda).path == "sdpa"


def test_the_plan_names_the_math_backward_and_why():
    """One place decides the chunked math path's backward: the encoding's own only on CPU, with
    no score bias beside the transform, not traced; an after-softmax term takes autograd."""
    own = NEEDS(score_bias=False, score_transform=True, tiled_transform=True, own_transform_backward=True)
    plain = NEEDS(score_bias=True, score_transform=True)  # a transform without its own backward (CoPE)
    cases = [
        (own, {}, "encoding", "the encoding's own backward"),
        (own, dict(device=torch.device("cuda")), "explicit", "the encoding's own backward is for CPU"),
        (dataclasses.replace(own, score_bias=True), {}, "explicit", "a score bias beside the transform"),
        (own, dict(traced=True), "autograd", "traced"),
        (plain, {}, "explicit", "written out around the transform's autograd"),
        (NEEDS(score_bias=True, value_term=True), {}, "autograd", "an after-softmax term"),
        (NEEDS(score_bias=True), dict(backend="math"), "explicit", "written out"),
    ]
    for needs, kw, want, why in cases:
        chosen = _plan(needs, **kw)
        assert chosen.path == "math" and chosen.math_backward == want, (needs, kw, chosen)
        assert f"backward {want}: {why}" in chosen.reason
    step = _plan(own, needs_grad=False, q_len=1)  # a decoding step: one pass, no backward
    assert step.form == "one_pass" and step.math_backward is None
    quiet = _plan(own, needs_grad=False)  # no gradient: the kernel is named, the reason says no backward
    assert quiet.math_backward == "encoding" and "backward" not in quiet.reason
    assert _plan(NEEDS(score_bias=True)).math_backward is None  # the dense path has its own
    from posenc.seq.cape import CAPE
    from posenc.seq.cope import CoPE

    assert CAPE(64, 4, 16).attention_needs().own_transform_backward
    assert not CoPE(4, 8).attention_needs().own_transform_backward


def test_the_plan_names_the_tiled_transform():
    """The encoding's tiled transform is the plan's choice: on CPU with the rows in chunks, not
    traced, and its chunks are twice as tall; CUDA and tracing take the plain transform in the
    default chunks, a decoding step the encoding's decoding hook."""
    tiled = NEEDS(score_transform=True, tiled_transform=True)
    on = _plan(tiled, batch=2, q_len=1024, kv_len=1024)
    assert on.tiled_transform and "the encoding's transform in its own tiles (CPU)" in on.reason
    assert on.chunk_rows == kernels.math_chunk_rows(2, 4, 1024, 1024)
    for kw in (dict(device=torch.device("cuda")), dict(traced=True)):
        off = _plan(tiled, batch=2, q_len=1024, kv_len=1024, **kw)
        assert off.path == "math" and not off.tiled_transform and "tiles" not in off.reason, kw
        assert off.chunk_rows == kernels.chunk_rows(2, 4, 1024, 1024)
    step = _plan(tiled, needs_grad=False, q_len=1)
    assert step.decode and step.form == "one_pass" and not step.tiled_transform
    assert _plan(tiled, needs_grad=False).tiled_transform  # no gradient, but rows in chunks
    assert not _plan(NEEDS(score_transform=True)).tiled_transform
    from posenc.seq.cape import CAPE
    from posenc.seq.cope import CoPE

    assert CAPE(64, 4, 16).attention_needs().tiled_transform
    assert not CoPE(4, 8).attention_needs().tiled_transform


def test_the_math_kernel_refuses_a_backward_its_terms_cannot_take():
    q = torch.randn(1, 2, 4, 8)
    terms = kernels.EncodingTerms(value_term=lambda probs, rows, keys: probs.new_zeros(1, 2, 4, 8))
    for backward in ("explicit", "encoding"):
        with pytest.raises(ValueError, match=f"backward='{backward}' cannot serve an after-softmax term") as info:
            kernels.math_path(q, q, q, None, terms, 1.0, backward=backward)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="backward must be 'encoding', 'explicit', 'autograd' or None; got 'fast'"):
        kernels.math_path(q, q, q, None, kernels.NO_TERMS, 1.0, backward="fast")
    with pytest.raises(ValueError, match="backward='encoding' needs the encoding's transform_softmax_backward"):
        kernels.math_path(q, q, q, None, kernels.NO_TERMS, 1.0, backward="encoding")
    torch.testing.assert_close(kernels.math_path(q, q, q, None, kernels.NO_TERMS, 1.0, backward="explicit"),
                               kernels.math_path(q, q, q, None, kernels.NO_TERMS, 1.0, backward="autograd"))


def test_chunked_paths_report_their_chunk_rows():
    # a bias shared by the batch chunks by heads x keys only; a per-sequence one by batch too
    shared = _plan(NEEDS(score_bias=True), q_len=4096, kv_len=4096)
    per_batch = _plan(NEEDS(score_bias=True), q_len=4096, kv_len=4096, bias_per_batch=True)
    assert shared.chunk_rows == kernels.chunk_rows(1, 4, 4096, 4096)
    assert per_batch.chunk_rows == kernels.chunk_rows(2, 4, 4096, 4096) < shared.chunk_rows
    # the math path chunks by batch x heads x keys: its transform sees every sequence
    math = _plan(NEEDS(score_transform=True), batch=2, q_len=1024, kv_len=1024)
    dense = _plan(NEEDS(score_bias=True), batch=2, q_len=1024, kv_len=1024, bias_per_batch=True)
    assert math.chunk_rows == kernels.chunk_rows(2, 4, 1024, 1024) == dense.chunk_rows == 128
    # a transform that tiles its own work (CAPE) gets twice the budget
    tiled = _plan(NEEDS(score_transform=True, tiled_transform=True), batch=2, q_len=1024, kv_len=1024)
    assert tiled.chunk_rows == kernels.math_chunk_rows(2, 4, 1024, 1024) == 256
    # ... but not down to fewer than four chunks where the default gives more (a worker would idle)
    assert kernels.math_chunk_rows(8, 4, 256, 256) == kernels.chunk_rows(8, 4, 256, 256) == 128
    assert kernels.math_chunk_rows(1, 4, 2048, 2048) == 256 and kernels.chunk_rows(1, 4, 2048, 2048) == 128
    assert _plan().chunk_rows is None
    assert "chunk" in str(shared) and shared.reason in str(shared)


def test_unusable_paths_are_clear_errors():
    with pytest.raises(ValueError, match="backend='sdpa' cannot apply the score bias of ALiBi"):
        _plan(NEEDS(score_bias=True), backend="sdpa", what="ALiBi")
    with pytest.raises(ValueError, match="needs the attention probabilities"):
        _plan(NEEDS(value_term=True), backend="dense")
    with pytest.raises(ValueError, match="transforms the whole score matrix"):
        _plan(NEEDS(score_transform=True), backend="flex", needs_grad=False)
    with pytest.raises(ValueError, match="no backward pass on CPU"):
        _plan(NEEDS(score_bias=True), backend="flex", needs_grad=True)
    with pytest.raises(ValueError, match="no backward pass on CPU"):
        _plan(NEEDS(score_bias=True), backend="flex", needs_grad=False, bias_learned=True)
    with pytest.raises(ValueError, match="backend must be one of auto, sdpa, flex, dense, math; got 'fast'"):
        _plan(backend="fast")
    with pytest.raises(ValueError, match="backend must be one of"):
        posenc.MultiheadAttention(32, 4, backend="fast")
    mha = posenc.MultiheadAttention(32, 4, encoding=ALiBi(4), backend="sdpa")
    with pytest.raises(ValueError, match="cannot apply the score bias of ALiBi"):
        mha(torch.randn(1, 5, 32), mask=posenc.AttentionMask(causal=True))
    with pytest.raises(ValueError, match="cannot apply the score bias of ALiBi"):
        mha.plan(torch.randn(1, 5, 32), mask=posenc.AttentionMask(causal=True))


def test_plan_of_a_call_matches_what_the_call_runs(monkeypatch):
    """posenc.plan / attn.plan say what attend then does: each path's kernel is the one called."""
    ran = []
    for name in ("sdpa_path", "dense_path", "math_path", "flex_path"):
        original = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _f=original, _n=name, **k: ran.append(_n) or _f(*a, **k))
    causal = posenc.AttentionMask(causal=True)
    x = torch.randn(2, 6, 32, requires_grad=True)
    for enc in (None, RotaryEncoding(8), ALiBi(4), ERPE(4, 16), posenc.build("cope", dims=posenc.ModelDims(32, 4, 16))):
        mha = posenc.MultiheadAttention(32, 4, encoding=enc)
        expected = mha.plan(x, mask=causal)
        ran.clear()
        mha(x, mask=causal)
        assert ran == [expected.path + "_path"], (enc, expected)
    q = torch.randn(1, 4, 5, 8)
    assert posenc.plan(q, q, encoding=ALiBi(4), mask=causal).path == "dense"
    assert posenc.plan(q, q, encoding=ALiBi(4), mask=causal, backend="math").reason.startswith("asked for")
    with torch.no_grad():
        assert posenc.plan(q, q, encoding=ALiBi(4), mask=causal, backend="flex").path == "flex"


def test_plan_does_not_grow_a_kv_cache():
    mha = posenc.MultiheadAttention(32, 4, encoding=RotaryEncoding(8))
    cache = posenc.KVCache(1)
    with torch.no_grad():
        mha(torch.randn(1, 3, 32), mask=posenc.AttentionMask(causal=True), cache=cache[0])
        plan = mha.plan(torch.randn(1, 1, 32), mask=posenc.AttentionMask(causal=True), cache=cache[0])
    assert plan.path == "sdpa" and cache.length == 3


def test_value_term_encodings_take_the_math_path():
    calls = []

    class ValueSide(posenc.PositionEncoding):
        hooks = frozenset({posenc.Hook.POST_SOFTMAX})
        needs_probs = True

        def value_term(self, probs, q_pos, kv_pos):
            calls.append(probs.shape)
            return torch.zeros(probs.shape[:-1] + (8,), dtype=probs.dtype)

    q = torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)[None]
    assert posenc.plan(q, q, encoding=ValueSide()).path == "math"
    out = attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=ValueSide())
    assert calls == [torch.Size([1, 2, 5, 5])]
    expected = ref.attention(q, q, q, None)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs the attention probabilities"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=ValueSide(), backend="sdpa")


def test_causal_only_encoding_refuses_bidirectional_attention():
    q = torch.randn(1, 4, 5, 8)
    pos = torch.arange(5)[None]
    with pytest.raises(ValueError, match="ALiBi is defined for causal attention only"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=ALiBi(4))
    attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=ALiBi(4, symmetric=True))  # fine


# ---- module behaviour -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["none", "rope", "rope_interleaved", "alibi", "erpe"])
def test_kv_cache_decoding_equals_full_forward(name):
    torch.manual_seed(0)
    enc = _encodings()[name]
    if name == "erpe":
        with torch.no_grad():
            enc.weight.normal_(0, 0.3)
    stack = posenc.TransformerEncoder(32, 2, 4, encoding=enc, num_kv_heads=2).eval()
    x = torch.randn(2, 9, 32)
    mask = posenc.AttentionMask(causal=True)
    with torch.no_grad():
        full = stack(x, mask=mask)
        cache = posenc.KVCache(2)
        prefix = stack(x[:, :4], mask=mask, cache=cache)
        steps = [prefix] + [stack(x[:, t : t + 1], mask=mask, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 9


def test_cache_refused_by_encodings_that_do_not_support_it():
    class NoCache(RotaryEncoding):
        supports_kv_cache = False

    mha = posenc.MultiheadAttention(32, 4, encoding=NoCache(8))
    with pytest.raises(ValueError, match="NoCache does not support a KV cache"):
        mha(torch.randn(1, 3, 32), cache=posenc.common.LayerKVCache())


def test_grouped_query_attention_matches_repeated_heads():
    torch.manual_seed(0)
    mha = posenc.MultiheadAttention(32, 4, num_kv_heads=2, encoding=ALiBi(4))
    x = torch.randn(2, 7, 32)
    out = mha(x, mask=posenc.AttentionMask(causal=True))
    q = mha.q_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)
    k = mha.k_proj(x).unflatten(-1, (2, 8)).transpose(1, 2)
    v = mha.v_proj(x).unflatten(-1, (2, 8)).transpose(1, 2)
    pos = torch.arange(7)[None]
    allowed = ref.allowed_matrix(2, 7, 7, causal=True)
    slopes = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    o = ref.attention(q, k, v, allowed, score_bias=ref.alibi_bias(slopes, pos, pos))
    expected = mha.out_proj(o.float().transpose(1, 2).flatten(2))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_cross_attention_with_different_lengths_and_widths():
    torch.manual_seed(0)
    mha = posenc.MultiheadAttention(32, 4, kv_dim=12, encoding=RotaryEncoding(8))
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 11, 12)
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, 6:] = False
    out = mha(x, ctx, mask=posenc.AttentionMask(key_valid=valid))
    assert out.shape == (2, 5, 32)
    # Padding keys do not influence the output.
    ctx2 = ctx.clone()
    ctx2[1, 6:] = 100.0
    out2 = mha(x, ctx2, mask=posenc.AttentionMask(key_valid=valid))
    torch.testing.assert_close(out, out2)


def test_float_positions_and_packed_sequences_are_explicit():
    """Packed sequences with positions restarting per document equal separate runs."""
    torch.manual_seed(0)
    mha = posenc.MultiheadAttention(32, 4, encoding=RotaryEncoding(8))
    a, b = torch.randn(1, 4, 32), torch.randn(1, 6, 32)
    packed = torch.cat([a, b], dim=1)
    seg = torch.tensor([[0] * 4 + [1] * 6])
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])
    out = mha(packed, q_pos=pos, mask=posenc.AttentionMask.packed(seg, causal=True))
    causal = posenc.AttentionMask(causal=True)
    torch.testing.assert_close(out, torch.cat([mha(a, mask=causal), mha(b, mask=causal)], dim=1), rtol=1e-5, atol=1e-6)
    # float positions are accepted and shift-invariant for RoPE
    fpos = torch.linspace(0, 3.5, 10)[None]
    o1 = mha(packed, q_pos=fpos)
    o2 = mha(packed, q_pos=fpos + 7.25)
    torch.testing.assert_close(o1, o2, rtol=1e-4, atol=1e-5)


def test_encoder_applies_input_hook_conditional_modules_and_shares_encoding():
    torch.manual_seed(0)

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, x, positions, *, mask=None, cache=None):
            self.seen.append((x.shape, positions.shape, mask, cache))
            return torch.zeros_like(x)

    rec = Recorder()
    sin = SinusoidalEncoding(32)
    stack = posenc.TransformerEncoder(32, 3, 4, encoding=sin, conditional={0: rec})
    assert all(b.attn.encoding is None for b in stack.blocks)  # input-only encodings stay out of attention
    x = torch.randn(2, 5, 32)
    stack(x)
    assert rec.seen == [(torch.Size([2, 5, 32]), torch.Size([1, 5]), None, None)]
    mask, cache = posenc.AttentionMask(causal=True), posenc.KVCache(3)
    stack(x, mask=mask, cache=cache)  # the conditional slot gets the mask and the token rows of its place
    assert rec.seen[-1][2] is mask and rec.seen[-1][3] is cache.rows(0)

    alibi = ALiBi(4)
    stack = posenc.TransformerEncoder(32, 3, 4, encoding=alibi)
    assert all(b.attn.encoding is alibi for b in stack.blocks)
    erpes = [ERPE(4, 16) for _ in range(3)]
    stack = posenc.TransformerEncoder(32, 3, 4, encoding=erpes)
    assert [b.attn.encoding for b in stack.blocks] == erpes
    with pytest.raises(ValueError, match="got 2 per-layer encodings for depth 3"):
        posenc.TransformerEncoder(32, 3, 4, encoding=erpes[:2])
    with pytest.raises(ValueError, match="block index 5 is outside 0..2"):
        posenc.TransformerEncoder(32, 3, 4, conditional={5: rec})


# ---- bad input ------------------------------------------------------------------------------

def test_bad_shapes_are_clear_errors():
    mha = posenc.MultiheadAttention(32, 4)
    with pytest.raises(ValueError, match=r"x must be \[batch, tokens, dim=32\]; got \(5, 32\)"):
        mha(torch.randn(5, 32))
    with pytest.raises(ValueError, match=r"x must be \[batch, tokens, dim=32\]; got \(1, 5, 16\)"):
        mha(torch.randn(1, 5, 16))
    with pytest.raises(ValueError, match="num_heads \\(4\\) must be a positive multiple of num_kv_heads \\(3\\)"):
        posenc.MultiheadAttention(32, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="dim \\(30\\) must be divisible by num_heads \\(4\\)"):
        posenc.MultiheadAttention(30, 4)
    with pytest.raises(ValueError, match=r"mask.key_valid must have shape \[batch=2 or 1, keys=5\], got \(2, 4\)"):
        mha(torch.randn(2, 5, 32), mask=posenc.AttentionMask(key_valid=torch.ones(2, 4, dtype=torch.bool)))
    with pytest.raises(ValueError, match="key_valid must be a bool tensor"):
        posenc.AttentionMask(key_valid=torch.ones(2, 4))
    with pytest.raises(ValueError, match="q_segments and kv_segments must be given together"):
        posenc.AttentionMask(q_segments=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="window must be a positive int"):
        posenc.AttentionMask(window=0)
    with pytest.raises(ValueError, match=r"q_pos must have shape \[5\], \[batch=2 or 1, 5\]"):
        mha(torch.randn(2, 5, 32), q_pos=torch.arange(4))
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(ValueError, match=r"kv_pos must have shape \[5\], \[batch=1 or 1, 5\]"):
        attend(q, q, q, q_pos=torch.arange(5), kv_pos=torch.arange(6)[None])
    with pytest.raises(ValueError, match=r"q, k, v must be \[B, H, T, D\]"):
        attend(q[0], q, q, q_pos=torch.arange(5)[None], kv_pos=torch.arange(5)[None])
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of key/value heads \(3\)"):
        k = torch.randn(1, 3, 5, 8)
        attend(q, k, k, q_pos=torch.arange(5)[None], kv_pos=torch.arange(5)[None])
    with pytest.raises(ValueError, match="this ALiBi was built for num_heads=8"):
        attend(q, q, q, q_pos=torch.arange(5)[None], kv_pos=torch.arange(5)[None], encoding=ALiBi(8),
               mask=posenc.AttentionMask(causal=True))
    with pytest.raises(ValueError, match="this encoding was built for head_dim=16"):
        attend(q, q, q, q_pos=torch.arange(5)[None], kv_pos=torch.arange(5)[None], encoding=RotaryEncoding(16))
    with pytest.raises(ValueError, match=r"eRPE was built for max_len=4 \(offsets up to 3\); these positions are 4 apart"):
        attend(q, q, q, q_pos=torch.arange(5)[None], kv_pos=torch.arange(5)[None], encoding=ERPE(4, 4))
    with pytest.raises(ValueError, match="eRPE needs integer positions"):
        attend(q, q, q, q_pos=torch.arange(5.0)[None], kv_pos=torch.arange(5.0)[None], encoding=ERPE(4, 8))


def test_all_paths_give_zero_rows_and_finite_grads_when_everything_is_masked():
    torch.manual_seed(0)
    for name, enc in _encodings().items():
        backends = {"none": ["sdpa", "dense", "math"], "rope": ["sdpa", "math"], "rope_interleaved": ["sdpa"],
                    "alibi": ["dense", "math"], "erpe": ["sdpa", "math"]}[name]
        for backend in backends:
            mha = posenc.MultiheadAttention(32, 4, encoding=enc, backend=backend)
            x = torch.randn(2, 6, 32, requires_grad=True)
            valid = torch.zeros(2, 6, dtype=torch.bool)
            valid[0] = True
            out = mha(x, mask=posenc.AttentionMask(causal=True, key_valid=valid))
            out.sum().backward()
            assert torch.isfinite(out).all() and torch.isfinite(x.grad).all(), (name, backend)
            # the fully masked sequence's attention output is zero, so only out_proj's bias remains
            torch.testing.assert_close(out[1], mha.out_proj.bias.expand(6, 32))


def test_empty_sequences_give_empty_or_zero_outputs_on_every_path():
    q = torch.randn(1, 4, 5, 8, requires_grad=True)
    empty = torch.randn(1, 4, 0, 8)
    for enc, backends in [(None, ["sdpa", "dense", "math"]), (ALiBi(4, symmetric=True), ["dense", "math"]),
                          (ERPE(4, 8), ["sdpa", "math"])]:
        for backend in backends:
            out = attend(q, empty, empty, q_pos=torch.arange(5), kv_pos=torch.arange(0), encoding=enc, backend=backend)
            assert out.shape == (1, 4, 5, 8) and not out.any()
            out = attend(empty, q, q, q_pos=torch.arange(0), kv_pos=torch.arange(5), encoding=enc, backend=backend)
            assert out.shape == (1, 4, 0, 8)
    mha = posenc.MultiheadAttention(16, 2, encoding=ALiBi(2, symmetric=True))
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(mha(x, torch.randn(2, 0, 16)), mha.out_proj.bias.expand(2, 3, 16))


def test_refused_call_leaves_the_cache_untouched():
    mha = posenc.MultiheadAttention(16, 2, encoding=ALiBi(2))
    cache = posenc.common.LayerKVCache()
    with pytest.raises(ValueError, match="ALiBi is defined for causal attention only"):
        mha(torch.randn(1, 4, 16), cache=cache)
    assert cache.length == 0


def test_cached_positions_continue_after_explicit_positions():
    torch.manual_seed(0)
    stack = posenc.TransformerEncoder(16, 1, 2, encoding=RotaryEncoding(8)).eval()
    x = torch.randn(1, 6, 16)
    causal = posenc.AttentionMask(causal=True)
    pos = torch.arange(1000, 1006)[None]
    with torch.no_grad():
        full = stack(x, positions=pos, mask=causal)
        cache = posenc.KVCache(1)
        stack(x[:, :4], positions=pos[:, :4], mask=causal, cache=cache)
        tail = stack(x[:, 4:], mask=causal, cache=cache)  # positions 1004, 1005 by default
    torch.testing.assert_close(tail, full[:, 4:], rtol=1e-5, atol=1e-5)


def test_head_count_of_per_head_encodings_is_checked():
    q = torch.randn(1, 4, 5, 8)
    pos = torch.arange(5)
    for enc in (ERPE(2, 8), ERPE(8, 8)):
        with pytest.raises(ValueError, match=f"this ERPE was built for num_heads={enc.num_heads}; the attention has 4"):
            attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc)


def test_erpe_range_is_checked_per_sequence():
    q = torch.randn(2, 2, 10, 8)
    pos = torch.arange(10) + torch.tensor([[0], [1000]])  # offsets within each row stay below 10
    out = attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=ERPE(2, 16))
    assert torch.isfinite(out).all()


def test_alibi_distances_are_exact_for_large_integer_positions():
    enc = ALiBi(8, symmetric=True)
    q = torch.zeros(1, 8, 1, 2)
    bias = enc.score_bias(q, q, torch.tensor([[2 ** 24 + 1]]), torch.tensor([[2 ** 24]]))
    dense = bias.dense(1, 8, torch.arange(1), torch.arange(1))
    torch.testing.assert_close(dense[0, :, 0, 0], -alibi_slopes_for_test(8))


def alibi_slopes_for_test(heads):
    return torch.tensor([2.0 ** (-8 * h / heads) for h in range(1, heads + 1)])


def test_more_bad_input_is_named():
    mha = posenc.MultiheadAttention(16, 2, kv_dim=8)
    with pytest.raises(ValueError, match=r"x \(self-attention: kv_dim must equal dim\) must be \[batch=1, keys, kv_dim=8\]"):
        mha(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match=r"context must be \[batch=1, keys, kv_dim=8\]; got \(1, 4, 6\)"):
        mha(torch.randn(1, 3, 16), torch.randn(1, 4, 6))
    with pytest.raises(ValueError, match=r"encoding\[1\] \(SinusoidalEncoding\) has an input hook"):
        posenc.TransformerEncoder(16, 2, 2, encoding=[SinusoidalEncoding(16), SinusoidalEncoding(16)])


# ---- one attention call -----------------------------------------------------------------------


def test_an_attention_call_is_checked_once_and_runs_as_attend():
    from posenc.common import AttentionCall, make_plan, prepare, run

    torch.manual_seed(0)
    q = torch.randn(2, 4, 10, 8, dtype=torch.float64)
    causal = posenc.AttentionMask(causal=True)
    call = AttentionCall.checked(q, q, q, encoding=ALiBi(4), mask=causal)
    assert call.scale == 8 ** -0.5 and call.q_pos.shape == (1, 10) and call.needs.score_bias
    ready = prepare(call)
    assert ready.plan == make_plan(call) and ready.plan.path == "dense"
    want = attend(q, q, q, q_pos=torch.arange(10), kv_pos=torch.arange(10), encoding=ALiBi(4), mask=causal)
    torch.testing.assert_close(run(ready), want)
    text = repr(call)
    assert "q=[2, 4, 10, 8] float64 cpu" in text and "encoding=ALiBi" in text and "AttentionMask(causal=True)" in text
    assert "tensor(" not in text and "dense" in repr(ready)
    with pytest.raises(ValueError, match="backend must be one of"):
        AttentionCall.checked(q, q, q, backend="fast")
    with pytest.raises(ValueError, match="q_pos must have shape"):
        AttentionCall.checked(q, q, q, q_pos=torch.arange(9))
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.scale = 1.0


def test_a_module_forward_checks_its_positions_once(monkeypatch):
    """MultiheadAttention builds its call from what it checked before projecting: each explicit
    position tensor is checked once per forward, not again inside attend."""
    import posenc.common.call as call_module

    seen = []
    original = call_module.check_positions
    monkeypatch.setattr(call_module, "check_positions", lambda name, pos: seen.append(name) or original(name, pos))
    mha = posenc.MultiheadAttention(32, 4, encoding=RotaryEncoding(8))
    x = torch.randn(2, 6, 32)
    mha(x, q_pos=torch.arange(6), kv_pos=torch.arange(6), mask=posenc.AttentionMask(causal=True))
    assert seen == ["q_pos", "kv_pos"]


def test_masks_and_calls_print_readably():
    valid = torch.ones(2, 7, dtype=torch.bool)
    assert repr(posenc.AttentionMask(causal=True, key_valid=valid, window=3)) == (
        "AttentionMask(causal=True, key_valid=[2, 7], window=3)")
    assert repr(posenc.AttentionMask()) == "AttentionMask()"


def test_a_causal_mask_over_one_query_row_hides_nothing(monkeypatch):
    """A decoding step (one query, causal, bottom-right aligned) sees every key: no mask is built,
    and the result equals attention without a mask; any other mask still counts."""
    assert posenc.AttentionMask(causal=True).hides_nothing(1) and posenc.AttentionMask().hides_nothing(5)
    assert not posenc.AttentionMask(causal=True).hides_nothing(2)
    assert not posenc.AttentionMask(causal=True, window=3).hides_nothing(1)
    assert not posenc.AttentionMask(causal=True, key_valid=torch.ones(1, 6, dtype=torch.bool)).hides_nothing(1)
    q, k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: seen.append((kw.get("attn_mask"), kw.get("is_causal", False))) or real(*a, **kw))
    out = posenc.attend(q, k, v, q_pos=torch.tensor([[5]]), kv_pos=torch.arange(6)[None], mask=posenc.AttentionMask(causal=True),
                        backend="sdpa")
    assert seen == [(None, False)]
    torch.testing.assert_close(out, real(q, k, v))


def test_a_content_bias_holds_the_compacted_q_and_k_the_kernel_reads():
    # DeBERTa's bias keeps q and k for its gradient. On CPU with gradients, prepare() compacts
    # them before the bias is built, so the bias and the dense kernel share one copy of each
    # (had the bias kept the strided views, both would stay alive through the backward).
    import copy

    from posenc.common import AttentionCall, prepare, run
    from posenc.seq.deberta import DeBERTa

    torch.manual_seed(0)
    proj = torch.randn(2, 12, 3, 4, 8, requires_grad=True)  # [B, T, (q, k, v), H, D]
    q, k, v = (proj[:, :, i].transpose(1, 2) for i in range(3))  # strided views, as from one projection
    enc = DeBERTa(32, 4, span=4)
    causal = posenc.AttentionMask(causal=True)
    want = attend(*(t.detach().double() for t in (q, k, v)), q_pos=torch.arange(12), kv_pos=torch.arange(12),
                  encoding=copy.deepcopy(enc).double(), mask=causal)
    seen = {}
    score_bias = enc.score_bias

    def spy(q_in, k_in, q_pos, kv_pos):
        seen["q"], seen["k"] = q_in, k_in
        return score_bias(q_in, k_in, q_pos, kv_pos)

    enc.score_bias = spy
    ready = prepare(AttentionCall.checked(q, k, v, encoding=enc, mask=causal))
    assert ready.call.q.is_contiguous() and ready.call.k.is_contiguous()
    assert seen["q"] is ready.call.q and seen["k"] is ready.call.k
    torch.testing.assert_close(run(ready).double(), want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # nothing is kept for a backward: the views as they are (a KV cache's slice)
        ready = prepare(AttentionCall.checked(q, k, v, encoding=enc, mask=causal))
    assert not ready.call.k.is_contiguous() and seen["k"] is ready.call.k
    torch.testing.assert_close(run(ready).double(), want, rtol=1e-5, atol=1e-5)
