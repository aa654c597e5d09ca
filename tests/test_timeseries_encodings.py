"""tAPE and eRPE (scalar and vector) against their formulas and a float64 reference written here,
through the core's kernel paths."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.common.attention import attend
from posenc.timeseries import ERPE, TAPE, ERPEVector
from posenc.timeseries.convtran import build_encodings

# ---- tAPE ------------------------------------------------------------------------------------


def _tape_by_loops(positions: list[int], d: int, length: int) -> torch.Tensor:
    rows = []
    for p in positions:
        row = []
        for k in range(d // 2):
            angle = p * 10000.0 ** (-2.0 * k / d) * d / length
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("d,length", [(16, 100), (8, 29), (64, 7)])
def test_tape_equals_its_formula(d, length):
    enc = TAPE(d, length)
    positions = list(range(length))
    x = torch.randn(2, length, d, dtype=torch.float64)
    out = enc.encode_input(x, torch.tensor([positions]))
    torch.testing.assert_close(out - x, _tape_by_loops(positions, d, length).expand(2, -1, -1), rtol=0, atol=1e-12)


def test_tape_uses_the_built_length_not_the_call_length():
    enc = TAPE(16, 100)
    short = enc.encode_input(torch.zeros(1, 10, 16), torch.arange(10)[None])
    torch.testing.assert_close(short[0].double(), _tape_by_loops(list(range(10)), 16, 100), rtol=0, atol=1e-6)
    # the scaling is what distinguishes it from the Vaswani sinusoid
    plain = posenc.build("sinusoidal", dim=16).encode_input(torch.zeros(1, 10, 16), torch.arange(10)[None])
    assert not torch.allclose(short, plain)
    assert posenc.build("tape", dims=posenc.ModelDims(dim=16, num_heads=8, max_len=100)).max_len == 100


def test_tape_rejects_bad_arguments():
    with pytest.raises(ValueError, match="dim must be a positive even number, got 15"):
        TAPE(15, 10)
    with pytest.raises(ValueError, match="max_len must be a positive int.*0"):
        TAPE(16, 0)
    with pytest.raises(ValueError, match="x has 8 features; this tAPE was built for dim=16"):
        TAPE(16, 10).encode_input(torch.zeros(1, 4, 8), torch.arange(4)[None])


# ---- eRPE: where the bias lands ----------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 4, 8, 16])
@pytest.mark.parametrize("length", [3, 7, 10])
def test_erpe_bias_lands_at_i_j_through_attention(heads, length):
    """With V the identity (value j = unit vector j), ``out - out_without_bias = B`` row by row, so the
    bias the core adds after the softmax is read off at every (head, i, j)."""
    max_len = 10
    enc = ERPE(heads, max_len).double()
    with torch.no_grad():
        enc.weight.copy_(torch.arange(heads)[:, None] * 100.0 + torch.arange(2 * max_len - 1)[None])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, length, length, dtype=torch.float64, generator=gen)
    k = torch.randn(2, heads, length, length, dtype=torch.float64, generator=gen)
    v = torch.eye(length, dtype=torch.float64).expand(2, heads, length, length)
    pos = torch.arange(length)[None]
    for backend in ("auto", "math"):
        got = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, backend=backend)
        got = got - attend(q, k, v, q_pos=pos, kv_pos=pos, backend=backend)
        want = torch.tensor([[[100.0 * h + (i - j + max_len - 1) for j in range(length)] for i in range(length)]
                             for h in range(heads)], dtype=torch.float64)
        torch.testing.assert_close(got, want.expand(2, -1, -1, -1), rtol=0, atol=1e-9)


def test_erpe_bias_is_dropped_on_padded_keys():
    heads, length = 4, 6
    enc = ERPE(heads, 8).double()
    with torch.no_grad():
        enc.weight.fill_(1.0)
    q = k = torch.zeros(2, heads, length, length, dtype=torch.float64)
    v = torch.eye(length, dtype=torch.float64).expand(2, heads, length, length)
    valid = torch.tensor([[True] * length, [True] * 4 + [False] * 2])
    out = attend(q, k, v, q_pos=torch.arange(length)[None], kv_pos=torch.arange(length)[None], encoding=enc,
                 mask=posenc.AttentionMask(key_valid=valid))
    torch.testing.assert_close(out[1, :, :, 4:], torch.zeros(heads, length, 2, dtype=torch.float64))
    torch.testing.assert_close(out[1, :, :, :4], torch.full((heads, length, 4), 0.25 + 1.0, dtype=torch.float64))


# ---- float64 references, forward and backward ------------------------------------------------


def _allowed(valid: torch.Tensor | None, b: int, t: int) -> torch.Tensor:
    return torch.ones(b, t, t, dtype=torch.bool) if valid is None else valid[:, None, :].expand(b, t, t)


def _reference(q, k, v, valid, *, scale, score_bias=None, prob_bias=None):
    b, h, t, _ = q.shape
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if score_bias is not None:
        s = s + score_bias
    allowed = _allowed(valid, b, t)[:, None]
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), -1)
    if prob_bias is not None:
        p = p + prob_bias * allowed
    return p @ v


def _scalar_bias_loops(weight, length, max_len):
    h = weight.shape[0]
    rows = [[weight[:, i - j + max_len - 1] for j in range(length)] for i in range(length)]
    return torch.stack([torch.stack(r, -1) for r in rows], -2).view(1, h, length, length)


def _vector_bias_loops(q, weight, length, max_len, scale):
    # B[b, h, i, j] = q[b, h, i] . r[h or 0, i - j + L - 1] * scale
    b, h = q.shape[:2]
    out = torch.zeros(b, h, length, length, dtype=torch.float64)
    out = out + 0 * q.sum()  # keep the graph to q
    entries = []
    for i in range(length):
        row = []
        for j in range(length):
            r = weight[:, i - j + max_len - 1]  # [H or 1, D]
            row.append((q[:, :, i] * r[None]).sum(-1) * scale)  # [B, H]
        entries.append(torch.stack(row, -1))
    return torch.stack(entries, -2)


MASKS = {"none": None, "padding": torch.tensor([[True] * 9, [True] * 5 + [False] * 4, [True] * 9])}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("backend", ["auto", "sdpa", "dense", "math"])
@pytest.mark.parametrize("heads", [1, 3, 8])
def test_scalar_erpe_matches_float64_reference(mask, backend, heads):
    b, t, d, max_len = 3, 9, 4, 12
    enc = ERPE(heads, max_len).double()
    gen = torch.Generator().manual_seed(heads)
    with torch.no_grad():
        enc.weight.copy_(torch.randn(enc.weight.shape, generator=gen, dtype=torch.float64) * 0.3)
    q, k, v = (torch.randn(b, heads, t, d, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    valid = MASKS[mask]
    pos = torch.arange(t)[None]
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, backend=backend, scale=0.4,
                 mask=None if valid is None else posenc.AttentionMask(key_valid=valid))
    want = _reference(q, k, v, valid, scale=0.4, prob_bias=_scalar_bias_loops(enc.weight, t, max_len))
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    params = [q, k, v, enc.weight]
    for name, g, w in zip("q k v weight".split(), torch.autograd.grad(out, params, grad), torch.autograd.grad(want, params, grad)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("backend", ["auto", "dense", "math"])
@pytest.mark.parametrize("per_head", [False, True])
def test_vector_erpe_matches_float64_reference(mask, backend, per_head):
    b, heads, t, d, max_len = 3, 4, 9, 4, 12
    enc = ERPEVector(heads, d, max_len, per_head=per_head, scale=0.3).double()
    assert enc.weight.shape == (heads if per_head else 1, 2 * max_len - 1, d)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(b, heads, t, d, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    valid = MASKS[mask]
    pos = torch.arange(t)[None]
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, backend=backend, scale=0.4,
                 mask=None if valid is None else posenc.AttentionMask(key_valid=valid))
    want = _reference(q, k, v, valid, scale=0.4, score_bias=_vector_bias_loops(q, enc.weight, t, max_len, 0.3))
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    params = [q, k, v, enc.weight]
    for name, g, w in zip("q k v weight".split(), torch.autograd.grad(out, params, grad), torch.autograd.grad(want, params, grad)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=lambda m: f"grad {name}: {m}")


def test_vector_erpe_checks_its_inputs():
    enc = ERPEVector(2, 4, 5)
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match=r"built for max_len=5 \(offsets up to 4\); these positions are 5 apart"):
        attend(q, q, q, q_pos=torch.arange(6)[None], kv_pos=torch.arange(6)[None], encoding=enc)
    with pytest.raises(ValueError, match="built for num_heads=2; the attention has 3"):
        attend(torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4),
               q_pos=torch.arange(4)[None], kv_pos=torch.arange(4)[None], encoding=enc)


def test_registry_lists_the_timeseries_encodings():
    infos = {i.name: i for i in posenc.available("timeseries")}
    assert {"tape", "erpe", "erpe_vector"} <= set(infos)
    assert infos["tape"].hooks == ("input",) and infos["erpe_vector"].hooks == ("score_bias",)
    assert "2305.16642" in infos["tape"].paper


# ---- the model's encoding spec --------------------------------------------------------------


def test_encoding_specs_fill_the_input_and_attention_slots():
    inp, att = build_encodings("tape+erpe", dim=16, num_heads=8, max_len=20)
    assert isinstance(inp, TAPE) and isinstance(att, ERPE) and att.weight.shape == (8, 39)
    inp, att = build_encodings("erpe", dim=16, num_heads=8, max_len=20)
    assert inp is None and isinstance(att, ERPE)
    inp, att = build_encodings("sinusoidal", dim=16, num_heads=8, max_len=20)
    assert att is None and type(inp).__name__ == "SinusoidalEncoding"
    assert build_encodings("none", dim=16, num_heads=8, max_len=20) == (None, None)
    with pytest.raises(ValueError, match="'tape' and 'sinusoidal' both act on the input"):
        build_encodings("tape+sinusoidal", dim=16, num_heads=8, max_len=20)
    with pytest.raises(ValueError, match="unknown encoding 'tAPE'"):
        build_encodings("tAPE+erpe", dim=16, num_heads=8, max_len=20)
    with pytest.raises(ValueError, match="each '\\+'-separated part must be a registered encoding name"):
        build_encodings("tape+", dim=16, num_heads=8, max_len=20)
