"""posenc.TorchMultiheadAttention: torch.nn.MultiheadAttention's call, with a position encoding.

Without an encoding it computes what torch's layer computes (float64, identical weights, every kind
of mask); with one it is what posenc's own attention computes; it works as the self_attn of
torch's Transformer layers, forward and backward."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import posenc
from posenc import TorchMultiheadAttention
from posenc.common.masks import AttentionMask
from posenc.seq import ALiBi, RotaryEncoding, SinusoidalEncoding, T5Bias

E, H, L = 16, 4, 6


def _pair(batch_first=True, **kw):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=batch_first, **kw).double()
    nn.init.normal_(ref.in_proj_bias, std=0.1) if ref.in_proj_bias is not None else None
    return ref, TorchMultiheadAttention.from_torch(ref)


def _masks(n: int):
    kpm = torch.zeros(n, L, dtype=torch.bool)
    kpm[1, 4:] = True
    causal_float = nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    torch.manual_seed(1)
    return {
        "none": {},
        "key_padding_bool": {"key_padding_mask": kpm},
        "key_padding_float": {"key_padding_mask": torch.randn(n, L, dtype=torch.float64)},
        "attn_mask_bool": {"attn_mask": torch.rand(L, L) < 0.3},  # no row removed whole: the diagonal stays
        "attn_mask_float": {"attn_mask": torch.randn(L, L, dtype=torch.float64)},
        "attn_mask_per_head": {"attn_mask": torch.randn(n * H, L, L, dtype=torch.float64)},
        "causal_hint": {"attn_mask": causal_float, "is_causal": True},
        "causal_and_padding": {"attn_mask": causal_float.isinf(), "key_padding_mask": kpm},
    }


@pytest.mark.parametrize("mask_kind", list(_masks(2)))
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_equals_torch_with_identical_weights_and_no_encoding(mask_kind, need_weights, batch_first):
    ref, mine = _pair(batch_first)
    kwargs = dict(_masks(2)[mask_kind])
    if "attn_mask_bool" == mask_kind:
        kwargs["attn_mask"].fill_diagonal_(False)
    torch.manual_seed(2)
    x = torch.randn(2, L, E, dtype=torch.float64, requires_grad=True)
    inp = x if batch_first else x.transpose(0, 1)
    ref_out, ref_w = ref(inp, inp, inp, need_weights=need_weights, **kwargs)
    out, w = mine(inp, inp, inp, need_weights=need_weights, **kwargs)
    torch.testing.assert_close(out, ref_out)
    if need_weights:
        torch.testing.assert_close(w, ref_w)
    else:
        assert w is None
    g_ref = torch.autograd.grad(ref_out.sum(), [x, ref.in_proj_weight])
    g = torch.autograd.grad(out.sum(), [x, mine.q_proj_weight])
    torch.testing.assert_close(g[0], g_ref[0])
    torch.testing.assert_close(g[1], g_ref[1][:E])


def test_per_head_weights_unbatched_input_and_cross_attention():
    ref, mine = _pair(kdim=10, vdim=12)
    torch.manual_seed(3)
    q, k, v = torch.randn(L, E).double(), torch.randn(9, 10).double(), torch.randn(9, 12).double()
    r_out, r_w = ref(q, k, v, average_attn_weights=False)
    out, w = mine(q, k, v, average_attn_weights=False)
    assert out.shape == (L, E) and w.shape == (H, L, 9)
    torch.testing.assert_close(out, r_out)
    torch.testing.assert_close(w, r_w)
    assert set(mine.state_dict()) == set(ref.state_dict())  # torch's names (separate weights, kdim != E)


def test_torch_state_dicts_load_both_ways():
    torch.manual_seed(4)
    ref = nn.MultiheadAttention(E, H)
    mine = TorchMultiheadAttention(E, H, encoding=T5Bias(H))
    mine.load_state_dict({**ref.state_dict(), **{k: v for k, v in mine.state_dict().items() if k.startswith("encoding")}})
    torch.testing.assert_close(mine.k_proj_weight, ref.in_proj_weight[E:2 * E])
    copy = TorchMultiheadAttention(E, H, encoding=T5Bias(H))
    copy.load_state_dict(mine.state_dict())
    x = torch.randn(L, 2, E)
    torch.testing.assert_close(copy(x, x, x)[0], mine(x, x, x)[0])


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_with_an_encoding_it_is_posenc_attention(encoding):
    torch.manual_seed(5)
    enc = RotaryEncoding(E // H) if encoding == "rope" else ALiBi(H)
    mine = TorchMultiheadAttention(E, H, batch_first=True, encoding=enc).double()
    nn.init.normal_(mine.in_proj_bias, std=0.1)
    core = posenc.MultiheadAttention(E, H, encoding=enc).double()
    with torch.no_grad():
        for name, w, b in zip("qkv", (mine.q_proj_weight, mine.k_proj_weight, mine.v_proj_weight), mine.in_proj_bias.chunk(3)):
            getattr(core, f"{name}_proj").weight.copy_(w)
            getattr(core, f"{name}_proj").bias.copy_(b)
        core.out_proj.load_state_dict(mine.out_proj.state_dict())
    x = torch.randn(2, L, E, dtype=torch.float64)
    want = core(x, mask=AttentionMask(causal=True))
    fast, none = mine(x, x, x, need_weights=False, is_causal=True)
    explicit, weights = mine(x, x, x, is_causal=True, average_attn_weights=False)  # the math path
    assert none is None
    torch.testing.assert_close(fast, want)
    torch.testing.assert_close(explicit, want)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, L, dtype=torch.float64))
    assert float(weights.detach().triu(1).abs().max()) == 0.0  # causal
    if encoding == "alibi":  # the causal mask as a tensor (no hint) is recognised for a causal-only encoding
        mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
        torch.testing.assert_close(mine(x, x, x, attn_mask=mask, need_weights=False)[0], want)


def test_as_self_attn_of_torch_transformer_layers_matches_torch_without_encoding():
    torch.manual_seed(6)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True)
    ours = nn.TransformerEncoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True)
    ours.load_state_dict(layer.state_dict())
    ours.self_attn = TorchMultiheadAttention.from_torch(layer.self_attn)
    x = torch.randn(3, L, E)
    kpm = torch.zeros(3, L, dtype=torch.bool)
    kpm[2, 3:] = True
    torch.testing.assert_close(ours(x, src_key_padding_mask=kpm), layer(x, src_key_padding_mask=kpm))
    layer.eval(), ours.eval()
    with torch.no_grad():  # torch's layer takes its fused inference path here; ours must not
        torch.testing.assert_close(ours(x, src_key_padding_mask=kpm)[kpm.logical_not()],
                                   layer(x, src_key_padding_mask=kpm)[kpm.logical_not()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_inside_torch_transformer_encoder_forward_and_backward(encoding):
    torch.manual_seed(7)
    enc = RotaryEncoding(E // H) if encoding == "rope" else ALiBi(H)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=32, dropout=0.1, batch_first=True)
    layer.self_attn = TorchMultiheadAttention(E, H, dropout=0.1, batch_first=True, encoding=enc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no nested-tensor warning when it is turned off
        stack = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(2, L, E, requires_grad=True)
    causal = nn.Transformer.generate_square_subsequent_mask(L)
    out = stack(x, mask=causal)  # TransformerEncoder detects the causal mask and passes is_causal
    out.sum().backward()
    assert torch.isfinite(out).all() and x.grad is not None and torch.isfinite(x.grad).all()
    for block in stack.layers:
        assert block.self_attn.q_proj_weight.grad.abs().sum() > 0
    stack.eval()
    kpm = torch.zeros(2, L)
    kpm[1, 4:] = float("-inf")  # float, like the causal mask (torch warns about mixed kinds)
    with torch.no_grad():
        with_enc = stack(x, mask=causal, src_key_padding_mask=kpm)
        for block in stack.layers:
            block.self_attn.encoding = None
        without = stack(x, mask=causal, src_key_padding_mask=kpm)
    assert not torch.allclose(with_enc, without)  # the encoding is applied, not skipped by a fused path


def test_attention_dropout_runs_in_training_only():
    torch.manual_seed(8)
    mine = TorchMultiheadAttention(E, H, dropout=0.5, batch_first=True, encoding=RotaryEncoding(E // H))
    x = torch.randn(2, L, E)
    _, w = mine(x, x, x, average_attn_weights=False)
    assert (w == 0).any()  # dropped weights (the rest scaled by 2)
    mine.eval()
    out, w = mine(x, x, x)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, L))
    torch.testing.assert_close(out, mine(x, x, x, need_weights=False)[0])


@pytest.mark.parametrize("call,error,match", [
    (lambda: TorchMultiheadAttention(E, H, add_bias_kv=True), ValueError, "add_bias_kv and add_zero_attn are not supported"),
    (lambda: TorchMultiheadAttention(E, H, encoding=SinusoidalEncoding(E)), ValueError, "acts on the input only"),
    (lambda: TorchMultiheadAttention(E, 5), ValueError, r"embed_dim \(16\) must be divisible by num_heads \(5\)"),
    (lambda: TorchMultiheadAttention(E, H)(*[torch.randn(L, 2, E)] * 2, torch.randn(L + 1, 2, E)), ValueError,
     "key and value must be"),
    (lambda: TorchMultiheadAttention(E, H)(*[torch.randn(L, 2, E)] * 3, attn_mask=torch.zeros(L, L + 1)), ValueError,
     r"attn_mask must be \[L=6, S=6\]"),
    (lambda: TorchMultiheadAttention(E, H)(torch.randn(2, 2, E), *[torch.randn(L, 2, E)] * 2, is_causal=True),
     ValueError, "is_causal needs as many queries as keys"),
    (lambda: TorchMultiheadAttention(E, H, encoding=ALiBi(H))(*[torch.randn(L, 2, E)] * 3), ValueError,
     "ALiBi is defined for causal attention only"),
])
def test_misuse_is_one_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()
