"""TUPE and DeBERTa against float64 references written from the papers' formulas: forward and
backward on every kernel path that applies (dense, math; flex forward-only on CPU), gradients to
every parameter, KV cache, log buckets, bad input."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.common.planning import flex_available
from posenc.common.kv_cache import KVCache
from posenc.common.registry import ModelDims
from posenc.seq.deberta import DeBERTa, deberta_index
from posenc.seq.tupe import TUPE
from tests import reference as ref

B, H, T, D = 2, 2, 11, 8
C = H * D


def qkv(seed=0, heads_kv=H):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, heads_kv, T, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, heads_kv, T, D, generator=g, dtype=torch.float64)
    return q, k, v


def softmax_attention(scores, v, allowed):
    if allowed is not None:
        scores = scores.masked_fill(~allowed[:, None], -math.inf)
    return torch.softmax(scores, dim=-1) @ v


# ---- TUPE ------------------------------------------------------------------------------------


def tupe_reference(enc: TUPE, q, k, v, q_pos, kv_pos, allowed):
    """``(q.k)/sqrt(2d) + (p_i Uq).(p_j Uk)/sqrt(2d)`` with explicit loops over heads."""
    P = enc.table.double()
    Uq, Uk = enc.pos_q.weight.double(), enc.pos_k.weight.double()  # [H*d, C]
    d = enc.head_dim
    scores = q @ k.transpose(-1, -2) / math.sqrt(2 * d)
    pos_terms = []
    for h in range(enc.num_heads):
        pq = P[q_pos] @ Uq[h * d : (h + 1) * d].T  # [Bp, Tq, d]
        pk = P[kv_pos] @ Uk[h * d : (h + 1) * d].T
        term = pq @ pk.transpose(-1, -2) / math.sqrt(2 * d)
        if enc.untie_cls:
            term = term.clone()
            cls_q, cls_k = q_pos == 0, kv_pos == 0
            for b in range(term.shape[0]):
                for i in range(term.shape[1]):
                    for j in range(term.shape[2]):
                        if cls_q[b if cls_q.shape[0] > 1 else 0, i]:
                            term[b, i, j] = enc.cls_to_others[h].double()
                        elif cls_k[b if cls_k.shape[0] > 1 else 0, j]:
                            term[b, i, j] = enc.others_to_cls[h].double()
        pos_terms.append(term)
    return softmax_attention(scores + torch.stack(pos_terms, dim=1), v, allowed)


def params_of(enc):
    return [p for _, p in sorted(enc.named_parameters())]


def _tupe_for_reference(untie: bool) -> TUPE:
    """A float64 TUPE (seeded), with [CLS] resets of distinct values per head when ``untie``."""
    torch.manual_seed(0)
    enc = TUPE(C, H, max_len=32, untie_cls=untie).double()
    if untie:
        with torch.no_grad():
            enc.cls_to_others.copy_(torch.tensor([0.5, -1.0]))
            enc.others_to_cls.copy_(torch.tensor([2.0, 0.25]))
    return enc


@pytest.mark.parametrize("backend", ["auto", "dense", "math"])
@pytest.mark.parametrize("causal,untie", [(True, False), (False, True)])
def test_tupe_forward_backward_against_reference(backend, causal, untie):
    enc = _tupe_for_reference(untie)
    q, k, v = (t.requires_grad_() for t in qkv())
    pos = torch.stack([torch.arange(T), torch.arange(T) + 3])  # per-row positions
    mask = posenc.AttentionMask(causal=causal)
    allowed = ref.allowed_matrix(B, T, T, causal=causal) if causal else None
    out = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend=backend)
    expected = tupe_reference(enc, q, k, v, pos, pos, allowed)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    go = torch.randn_like(out)
    inputs = [q, k, v] + params_of(enc)
    got = torch.autograd.grad(out, inputs, go)
    want = torch.autograd.grad(expected, inputs, go)
    for name, g, w in zip(["q", "k", "v"] + [n for n, _ in sorted(enc.named_parameters())], got, want):
        assert g is not None, name
        # cls_to_others shifts the [CLS] row's every score alike, which the softmax ignores: its
        # gradient is zero up to rounding (~1e-16), on every path and in the reference
        assert name == "cls_to_others" or g.abs().sum() > 0, name
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-9, msg=name)


@pytest.mark.parametrize("untie", [False, True])
def test_tupe_few_rows_without_gradients_take_the_whole_term_at_once(untie, monkeypatch):
    """A few query rows without gradients (a cached decoding step) take the position term as one
    dense block (one matmul): the reference's values, [CLS] resets included, with per-row
    positions and a query at position 0."""
    from posenc.common import kernels

    enc = _tupe_for_reference(untie)
    dense_tables = []
    original = kernels.dense_path

    def recording(q, k, v, mask, bias, *args, **kwargs):
        dense_tables.append(bias.table is not None)
        return original(q, k, v, mask, bias, *args, **kwargs)

    monkeypatch.setattr(kernels, "dense_path", recording)
    q, k, v = qkv()
    q = q[:, :, :3]
    q_pos = torch.tensor([[0, 4, 5], [7, 8, 9]])
    kv_pos = torch.stack([torch.arange(T), torch.arange(T) + 3])
    with torch.no_grad():
        out = posenc.attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc)
        expected = tupe_reference(enc, q, k, v, q_pos, kv_pos, None)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert dense_tables == [True]


@pytest.mark.skipif(not flex_available(), reason="needs FlexAttention")
def test_tupe_and_deberta_flex_forward_on_cpu():
    torch.manual_seed(0)
    q, k, v = (t.float() for t in qkv())
    pos = torch.arange(T)[None]
    mask = posenc.AttentionMask(causal=True)
    for enc in (TUPE(C, H, max_len=16), DeBERTa(C, H, span=4)):
        with torch.no_grad():
            flex = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend="flex")
            dense = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend="dense")
        torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-5)


def test_tupe_position_term_is_shared_by_layers_and_cached_decoding_matches():
    torch.manual_seed(0)
    enc = posenc.build("tupe", dims=ModelDims(C, H, 32))
    stack = posenc.TransformerEncoder(C, 3, H, encoding=enc).double().eval()
    assert all(b.attn.encoding is enc for b in stack.blocks)  # one table and one (Uq, Uk) for all layers
    x = torch.randn(2, 10, C, dtype=torch.float64)
    mask = posenc.AttentionMask(causal=True)
    full = stack(x, mask=mask)
    cache = KVCache(3)
    steps = [stack(x[:, :4], mask=mask, cache=cache)] + [stack(x[:, t : t + 1], mask=mask, cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


def test_tupe_rows_of_a_run_of_positions_are_a_view_of_the_table():
    """One run of consecutive positions inside the table reads its rows as a view (a KV cache's
    keys at every decoding step), any other positions by index; the same rows either way, and a
    run that leaves the table is refused by name."""
    enc = TUPE(C, H, max_len=12)
    run = enc._positions(torch.arange(3, 10)[None])
    assert run.data_ptr() == enc.table[3].data_ptr() and torch.equal(run[0], enc.table[3:10])
    shuffled = torch.tensor([[9, 3, 4, 8]])
    assert torch.equal(enc._positions(shuffled)[0], enc.table[shuffled[0]])
    batch = torch.arange(3, 10).repeat(2, 1)  # two rows of the same run: by index
    assert torch.equal(enc._positions(batch), enc.table[3:10].expand(2, -1, -1))
    with pytest.raises(ValueError, match=r"position 12 is outside TUPE's table \(max_len=12"):
        enc._positions(torch.arange(8, 13)[None])


def test_tupe_bad_input():
    enc = TUPE(C, H, max_len=8)
    q, k, v = (t.float() for t in qkv())
    with pytest.raises(ValueError, match=r"position 10 is outside TUPE's table \(max_len=8"):
        posenc.attend(q, k, v, q_pos=torch.arange(T), kv_pos=torch.arange(T), encoding=enc)
    with pytest.raises(ValueError, match=r"dim \(15\) must be divisible by num_heads \(2\)"):
        TUPE(15, 2, 8)
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        TUPE(16, 2, 0)


# ---- DeBERTa ---------------------------------------------------------------------------------


log_bucket_ref, delta_ref = ref.log_bucket_ref, ref.delta_ref


def test_deberta_buckets_known_values():
    # linear: clip(i - j + k, 0, 2k - 1)
    rel = torch.tensor([-10, -4, -3, 0, 3, 4, 10])
    assert deberta_index(rel, 4).tolist() == [0, 0, 1, 4, 7, 7, 7]
    # log buckets, k = 8 (mid 4), M = 32: exact up to 4, then log-spaced, 31 -> 7, clipped at 15
    assert deberta_index(torch.tensor([3, 4, 5, 31, 100, -5, -31]), 8, True, 32).tolist() == [11, 12, 13, 15, 15, 3, 1]
    r = torch.arange(-300, 301)
    for span, m in ((8, 32), (256, 512), (16, 100)):
        got = deberta_index(r, span, True, m).tolist()
        assert got == [delta_ref(int(x), span, True, m) for x in r], (span, m)


def deberta_reference(enc: DeBERTa, q, k, v, q_pos, kv_pos, allowed):
    scores = ref.deberta_scores(q, k, enc.rel, enc.pos_q.weight, enc.pos_k.weight, enc.span, enc.log_buckets,
                                enc.max_position, q_pos, kv_pos)
    return softmax_attention(scores, v, allowed)


@pytest.mark.parametrize("backend", ["auto", "dense", "math"])
@pytest.mark.parametrize("causal,log_buckets,heads_kv", [(True, False, H), (False, True, H), (True, True, 1)])
def test_deberta_forward_backward_against_reference(backend, causal, log_buckets, heads_kv):
    torch.manual_seed(0)
    enc = DeBERTa(C, H, span=4 if not log_buckets else 6, log_buckets=log_buckets, max_position=9).double()
    q, k, v = (t.requires_grad_() for t in qkv(1, heads_kv))
    pos = torch.stack([torch.arange(T), torch.arange(T) * 2])  # per-row positions; row 1 reaches distance 20
    mask = posenc.AttentionMask(causal=causal)
    allowed = ref.allowed_matrix(B, T, T, causal=causal) if causal else None
    out = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend=backend)
    expected = deberta_reference(enc, q, k, v, pos, pos, allowed)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    go = torch.randn_like(out)
    inputs = [q, k, v] + params_of(enc)
    got = torch.autograd.grad(out, inputs, go)
    want = torch.autograd.grad(expected, inputs, go)
    for name, g, w in zip(["q", "k", "v"] + [n for n, _ in sorted(enc.named_parameters())], got, want):
        assert g is not None and g.abs().sum() > 0, name
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-9, msg=name)


@pytest.mark.parametrize("backend", ["dense", "math"])
@pytest.mark.parametrize("log_buckets", [False, True])
@pytest.mark.parametrize("causal,q_len,offset,heads_kv",
                         [(True, 300, 0, H), (False, 300, 7, H), (True, 60, 0, 1), (True, 68, 0, H), (True, 5, 0, H),
                          (False, 3, -150, 1)])
def test_deberta_over_consecutive_positions_matches_reference_across_key_blocks(
    monkeypatch, backend, log_buckets, causal, q_len, offset, heads_kv,
):
    """Positions shared by the batch, in chunks of about 64 rows over 300 keys (span 8, clamped
    buckets on both sides); five rows without gradients would be a decoding step, here with
    gradients they are a chunk; the last four rows of 68 a short chunk; three rows in the middle
    without a mask reach keys clipped before and after the span."""

    monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", 4 * 64 * 300)  # blocks of about 64 rows
    kv_len = 300
    enc = DeBERTa(C, H, span=8, log_buckets=log_buckets, max_position=64).double()
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, q_len, D, dtype=torch.float64, generator=gen, requires_grad=True)
    k, v = (torch.randn(B, heads_kv, kv_len, D, dtype=torch.float64, generator=gen, requires_grad=True)
            for _ in range(2))
    kv_pos = torch.arange(kv_len).unsqueeze(0)
    q_pos = (kv_len - q_len + torch.arange(q_len) + offset).unsqueeze(0)
    mask = posenc.AttentionMask(causal=True) if causal else None
    allowed = None
    if causal:
        allowed = (kv_pos.unsqueeze(-2) <= q_pos.unsqueeze(-1) - offset).expand(B, q_len, kv_len)
    out = posenc.attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=mask, backend=backend)
    expected = deberta_reference(enc, q, k, v, q_pos.expand(B, -1), kv_pos.expand(B, -1), allowed)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    go = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    inputs = [q, k, v] + params_of(enc)
    for name, g, w in zip(["q", "k", "v", "pos_k", "pos_q", "rel"], torch.autograd.grad(out, inputs, go),
                          torch.autograd.grad(expected, inputs, go)):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-9, msg=name)


def test_deberta_cached_decoding_matches_full_forward():
    torch.manual_seed(0)
    enc = posenc.build("deberta", dims=ModelDims(C, H, 64), span=4)
    stack = posenc.TransformerEncoder(C, 2, H, encoding=enc).double().eval()
    x = torch.randn(2, 10, C, dtype=torch.float64)
    mask = posenc.AttentionMask(causal=True)
    full = stack(x, mask=mask)
    cache = KVCache(2)
    steps = [stack(x[:, :3], mask=mask, cache=cache)] + [stack(x[:, t : t + 1], mask=mask, cache=cache) for t in range(3, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


def test_deberta_decoding_steps_without_gradients_fold_the_far_keys_into_the_query_product(monkeypatch):
    """Without gradients a decoding row's p2c is k.Qr[0] for every key (a key-linear bias the
    kernel folds into the query) plus k.(Qr[m] - Qr[0]), zero beyond the span: still the full
    forward, at 1e-10 in float64."""
    from posenc.common.kernels import dense

    folds = []
    real = dense.key_linear_forward

    def spy(*args, **kwargs):
        folds.append(args[3].stop)
        return real(*args, **kwargs)

    monkeypatch.setattr(dense, "key_linear_forward", spy)
    torch.manual_seed(0)
    enc = posenc.build("deberta", dims=ModelDims(C, H, 64), span=4)
    stack = posenc.TransformerEncoder(C, 2, H, encoding=enc).double().eval()
    x = torch.randn(2, 12, C, dtype=torch.float64)
    mask = posenc.AttentionMask(causal=True)
    with torch.no_grad():
        full = stack(x, mask=mask)
        cache = KVCache(2)
        steps = [stack(x[:, :3], mask=mask, cache=cache)]
        steps += [stack(x[:, t : t + 1], mask=mask, cache=cache) for t in range(3, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    # two layers per step; the linear term reaches all t + 1 keys
    assert folds == [t + 1 for t in range(3, 12) for _ in range(2)]


def _decode_with_crops(stack, x, prefill, crops):
    """Outputs of ``x [B, T, C]`` decoded through a KV cache: a prefill of ``prefill`` tokens,
    then one token a step; ``crops`` lists ``(t, back)`` in the order they happen: when the next
    step is ``t``, the cache first goes back ``back`` tokens (and those are decoded again).
    Returns the outputs and the cache."""
    mask = posenc.AttentionMask(causal=True)
    cache = KVCache(len(stack.blocks))
    out = torch.empty(*x.shape[:2], stack.blocks[0].attn.dim, dtype=x.dtype)
    out[:, :prefill] = stack(x[:, :prefill], mask=mask, cache=cache)
    t, crops = prefill, list(crops)
    while t < x.shape[1]:
        if crops and crops[0][0] == t:
            t -= crops.pop(0)[1]
            cache.crop(t)
        out[:, t: t + 1] = stack(x[:, t: t + 1], mask=mask, cache=cache)
        t += 1
    return out, cache


@pytest.mark.parametrize(("span", "length", "prefill", "crops"), [
    (4, 30, 1, []),
    (5, 60, 7, [(30, 30), (50, 2)]),  # back to before the first decoded key
    (16, 120, 40, [(60, 8), (70, 17), (90, 33), (100, 40)]),
    (32, 130, 100, [(115, 1), (120, 9)]),  # a prefill longer than the span
])
def test_deberta_decoding_through_crops_matches_the_full_forward(span, length, prefill, crops):
    """Decoding steps (the decoding hook: one row's far keys folded into the query product) through
    crops of the KV cache: still the full forward at 1e-10 in float64; the cache keeps keys, values
    and positions only, so a crop needs nothing of the encoding's."""
    torch.manual_seed(0)
    enc = posenc.build("deberta", dims=ModelDims(C, H, 64), span=span)
    stack = posenc.TransformerEncoder(C, 2, H, encoding=enc).double().eval()
    x = torch.randn(2, length, C, dtype=torch.float64)
    with torch.no_grad():
        full = stack(x, mask=posenc.AttentionMask(causal=True))
        out, _ = _decode_with_crops(stack, x, prefill, crops)
    torch.testing.assert_close(out, full, rtol=1e-10, atol=1e-10)


def test_deberta_decoding_follows_new_parameters():
    """A step after the parameters changed (Qr, and so the kept Qr - Qr[0]) equals the full
    forward under the new parameters."""
    torch.manual_seed(0)
    enc = posenc.build("deberta", dims=ModelDims(C, H, 64), span=16)
    stack = posenc.TransformerEncoder(C, 1, H, encoding=enc).double().eval()
    x = torch.randn(2, 51, C, dtype=torch.float64)
    with torch.no_grad():
        _, cache = _decode_with_crops(stack, x[:, :50], 40, [])
        enc.pos_q.weight.mul_(1.5)
        want = stack(x, mask=posenc.AttentionMask(causal=True))[:, -1:]
        got = stack(x[:, 50:51], mask=posenc.AttentionMask(causal=True), cache=cache)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reach", ["all", "some"])
def test_key_linear_forward_equals_its_definition(dtype, reach):
    """``softmax(s q.k + rest + [j < stop] w.k) V`` and its log-sum-exp: through SDPA's kernel with
    the query moved by ``w / s`` where the term reaches every key in float32 or float64, and
    explicitly otherwise (some keys, half precision, a mask)."""
    from posenc.common.kernels.dense_blocks import key_linear_forward
    from posenc.common.pairwise import KeyLinearPart

    torch.manual_seed(0)
    b, h, r, tk, d = 2, 3, 2, 11, 8
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64) for n in (r, tk, tk))
    rest = torch.randn(b, h, r, tk, dtype=torch.float64)
    w = torch.randn(1, h, r, d, dtype=torch.float64)
    stop = tk if reach == "all" else 7
    scale = d ** -0.5
    linear = torch.matmul(w, k.transpose(-1, -2)) * (torch.arange(tk) < stop)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale + rest + linear
    allowed = torch.arange(tk)[None, None, None, :] <= torch.tensor([[[[8], [10]]]])  # [1, 1, R, Tk]
    for mask in (None, allowed):
        masked = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
        want = torch.matmul(torch.softmax(masked, dim=-1), v)
        part = KeyLinearPart(rest.to(dtype), w.to(dtype), stop)
        out, lse = key_linear_forward(q.to(dtype), k.to(dtype), v.to(dtype), part, mask, scale, True)
        tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 6e-2}[dtype]
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
        torch.testing.assert_close(lse.double(), torch.logsumexp(masked, dim=-1), rtol=tol, atol=tol)


def test_deberta_bad_input():
    enc = DeBERTa(C, H, span=4)
    q, k, v = (t.float() for t in qkv())
    with pytest.raises(ValueError, match="integer positions"):
        posenc.attend(q, k, v, q_pos=torch.arange(T) * 0.5, kv_pos=torch.arange(T) * 0.5, encoding=enc)
    with pytest.raises(ValueError, match="span must be a positive int.*0"):
        DeBERTa(C, H, span=0)
    with pytest.raises(ValueError, match=r"max_position must be an integer > span/2 \+ 1 = 5, got 4"):
        DeBERTa(C, H, span=8, log_buckets=True, max_position=4)
    with pytest.raises(ValueError, match="log buckets need span >= 4"):
        DeBERTa(C, H, span=2, log_buckets=True)


def test_tupe_and_deberta_build_with_defaults_and_train_in_a_stack():
    for name in ("tupe", "deberta"):
        enc = posenc.build(name, dims=ModelDims(32, 4, 64))
        stack = posenc.TransformerEncoder(32, 2, 4, encoding=enc)
        stack(torch.randn(2, 12, 32), mask=posenc.AttentionMask(causal=True)).square().sum().backward()
        for pname, p in enc.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (name, pname)


@pytest.mark.parametrize("name", ["deberta", "transformer_xl"])
@pytest.mark.parametrize("positions", ["run", "general"])
def test_dense_blocks_at_any_indices_read_the_pairs_asked_for(name, positions):
    """A block that is not one run of rows over keys 0 .. n-1 (keys from 3, keys out of order,
    rows out of order) gives the entries of those pairs: the readers that take a block as
    slices check the run first (the dense path only asks for runs; other callers may not)."""
    torch.manual_seed(0)
    enc = posenc.build(name, dims=ModelDims(C, H, 64), **({"span": 4} if name == "deberta" else {})).double().eval()
    tq, tk = 3, 12
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, H, tq, D, dtype=torch.float64, generator=g)
    k = torch.randn(1, H, tk, D, dtype=torch.float64, generator=g)
    kv_pos = torch.arange(tk)[None] if positions == "run" else torch.tensor([[0, 1, 2, 4, 5, 6, 8, 9, 10, 11, 13, 14]])
    q_pos = kv_pos[:, -tq:]
    with torch.no_grad():
        q_t, k_t = enc.transform_qk(q, k, q_pos, kv_pos)
        bias = enc.score_bias(q_t, k_t, q_pos, kv_pos)
        full = bias.dense(1, H, torch.arange(tq), torch.arange(tk))  # one run: the reference
        for rows, keys in (([0, 1, 2], [3, 4, 5, 6]), ([0], [5, 2, 9]), ([2, 0], list(range(tk))), ([1], [0, 1, 3])):
            got = bias.dense(1, H, torch.tensor(rows), torch.tensor(keys))
            torch.testing.assert_close(got, full[:, :, rows][:, :, :, keys], rtol=1e-12, atol=1e-12, msg=str((rows, keys)))
