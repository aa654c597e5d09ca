"""MultiheadAttention, the encoder stack, the KV cache, backend choice and bad input."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.common.attention import attend, choose_backend
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


# ---- backend choice -------------------------------------------------------------------------

def test_auto_picks_the_fastest_allowed_path():
    kw = dict(needs_grad=True)
    assert choose_backend("auto", device=CPU, has_score_bias=False, needs_probs=False, **kw) == "sdpa"
    assert choose_backend("auto", device=CPU, has_score_bias=True, needs_probs=False, **kw) == "dense"
    assert choose_backend("auto", device=torch.device("cuda"), has_score_bias=True, needs_probs=False, **kw) == "flex"
    assert choose_backend("auto", device=CPU, has_score_bias=True, needs_probs=True, **kw) == "math"


def test_unusable_paths_are_clear_errors():
    with pytest.raises(ValueError, match="backend='sdpa' cannot apply the score bias of ALiBi"):
        choose_backend("sdpa", device=CPU, has_score_bias=True, needs_probs=False, needs_grad=False, what="ALiBi")
    with pytest.raises(ValueError, match="needs the attention probabilities"):
        choose_backend("dense", device=CPU, has_score_bias=False, needs_probs=True, needs_grad=False)
    with pytest.raises(ValueError, match="no backward pass on CPU"):
        choose_backend("flex", device=CPU, has_score_bias=True, needs_probs=False, needs_grad=True)
    with pytest.raises(ValueError, match="backend must be one of auto, sdpa, flex, dense, math; got 'fast'"):
        choose_backend("fast", device=CPU, has_score_bias=False, needs_probs=False, needs_grad=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        posenc.MultiheadAttention(32, 4, backend="fast")
    mha = posenc.MultiheadAttention(32, 4, encoding=ALiBi(4), backend="sdpa")
    with pytest.raises(ValueError, match="cannot apply the score bias of ALiBi"):
        mha(torch.randn(1, 5, 32), mask=posenc.AttentionMask(causal=True))


def test_value_term_encodings_take_the_math_path(monkeypatch):
    calls = []

    class ValueSide(posenc.PositionEncoding):
        hooks = frozenset({posenc.Hook.POST_SOFTMAX})
        needs_probs = True

        def value_term(self, probs, q_pos, kv_pos):
            calls.append(probs.shape)
            return torch.zeros(probs.shape[:-1] + (8,), dtype=probs.dtype)

    q = torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)[None]
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

        def forward(self, x, positions):
            self.seen.append((x.shape, positions.shape))
            return torch.zeros_like(x)

    rec = Recorder()
    sin = SinusoidalEncoding(32)
    stack = posenc.TransformerEncoder(32, 3, 4, encoding=sin, conditional={0: rec})
    assert all(b.attn.encoding is None for b in stack.blocks)  # input-only encodings stay out of attention
    x = torch.randn(2, 5, 32)
    stack(x)
    assert rec.seen == [(torch.Size([2, 5, 32]), torch.Size([1, 5]))]

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
