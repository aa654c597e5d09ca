"""Learned absolute positions (error past the table, interpolation when asked, gradients) and NoPE."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.common.encoding import attention_part
from posenc.common.registry import ModelDims
from posenc.common.registry import get as get_info
from posenc.seq.learned import LearnedEncoding, lerp_rows
from posenc.seq.nope import NoPE


def test_learned_adds_table_rows():
    enc = LearnedEncoding(4, 10)
    x = torch.randn(2, 3, 4)
    pos = torch.tensor([[0, 5, 9], [1, 1, 2]])
    torch.testing.assert_close(enc.encode_input(x, pos), x + enc.table.detach()[pos])
    assert enc.supports_kv_cache


def test_learned_error_past_the_table_names_position_and_max_len():
    enc = posenc.build("learned", dims=ModelDims(8, 2, 16))
    x = torch.randn(1, 17, 8)
    with pytest.raises(ValueError, match=r"position 16 is past the learned table \(max_len=16, positions 0..15\)"):
        enc.encode_input(x, torch.arange(17)[None])
    with pytest.raises(ValueError, match=r"position 15.5 is past the learned table \(max_len=16"):
        enc.encode_input(x[:, :1], torch.tensor([[15.5]]))
    with pytest.raises(ValueError, match="positions must be >= 0"):
        enc.encode_input(x[:, :1], torch.tensor([[-1]]))
    with pytest.raises(ValueError, match="beyond must be one of"):
        LearnedEncoding(8, 16, beyond="wrap")
    with pytest.raises(ValueError, match="max_len must be a positive int.*0"):
        LearnedEncoding(8, 0)


def test_learned_float_positions_interpolate_between_rows():
    enc = LearnedEncoding(3, 8)
    t = enc.table.detach()
    out = enc.embeddings(torch.tensor([[2.0, 2.5, 6.25, 7.0]]))
    torch.testing.assert_close(out[0], torch.stack([t[2], (t[2] + t[3]) / 2, 0.75 * t[6] + 0.25 * t[7], t[7]]))


def test_learned_interpolation_to_the_same_length_is_the_identity():
    exact, stretch = LearnedEncoding(6, 12), LearnedEncoding(6, 12, beyond="interpolate")
    stretch.load_state_dict(exact.state_dict())
    pos = torch.arange(12)[None]
    torch.testing.assert_close(stretch.embeddings(pos), exact.embeddings(pos))
    torch.testing.assert_close(stretch.embeddings(pos)[0], exact.table.detach())
    assert not stretch.supports_kv_cache


def test_learned_interpolation_stretches_the_table_per_row():
    enc = LearnedEncoding(5, 9, beyond="interpolate")  # rows 0..8
    t = enc.table.detach()
    pos = torch.stack([torch.arange(17), torch.arange(17).clamp(max=8)])  # row 0 reaches 16 = 2 * 8; row 1 fits
    out = enc.embeddings(pos)
    torch.testing.assert_close(out[0, 0::2], t)  # position 2p reads row p
    torch.testing.assert_close(out[0, 1::2], (t[:-1] + t[1:]) / 2)  # odd positions: the midpoint
    torch.testing.assert_close(out[1], t[pos[1]])  # a row that fits is read unchanged


def test_learned_gradients_reach_the_table():
    torch.manual_seed(0)
    for beyond, length in (("error", 10), ("interpolate", 20)):
        enc = posenc.build("learned", dims=ModelDims(16, 2, 12), beyond=beyond)
        stack = posenc.TransformerEncoder(16, 1, 2, encoding=enc)
        stack(torch.randn(2, length, 16), mask=posenc.AttentionMask(causal=True)).square().sum().backward()
        g = enc.table.grad
        used = min(length, 12)
        assert g is not None and bool((g[:used].abs().sum(-1) > 0).all()), beyond  # every row used gets a gradient
        assert bool((g[used:] == 0).all())
    # float positions: the interpolation is differentiable in the table
    pos = torch.tensor([[0.0, 1.5, 3.25, 7.0]], dtype=torch.float64)
    table = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: lerp_rows(t, pos), (table,))


def test_nope_takes_the_plain_sdpa_path_and_equals_no_encoding():
    enc = posenc.build("nope", dims=ModelDims(16, 2, 32))
    assert isinstance(enc, NoPE) and attention_part(enc) is None
    torch.manual_seed(0)
    with_nope = posenc.TransformerEncoder(16, 2, 2, encoding=enc)
    plain = posenc.TransformerEncoder(16, 2, 2)
    plain.load_state_dict(with_nope.state_dict())
    assert all(b.attn.encoding is None for b in with_nope.blocks)
    x = torch.randn(2, 9, 16)
    mask = posenc.AttentionMask(causal=True)
    torch.testing.assert_close(with_nope(x, mask=mask), plain(x, mask=mask))
    # with no position signal the output is equivariant to permutations without a causal mask
    perm = torch.randperm(9)
    torch.testing.assert_close(with_nope(x[:, perm]), with_nope(x)[:, perm], rtol=1e-5, atol=1e-5)
    assert get_info("nope").paper and not get_info("nope").causal_only
