"""FoX, the Forgetting Transformer's forget-gate bias, against a float64 reference written from the
paper's formula (``D_ij = sum_{l = j+1 .. i} log f_l``): every kernel path the plan names (forward and
backward, flex forward on the CPU), padded and packed batches, grouped-query heads, cached decoding
equal to the full forward, ALiBi when the gates are constant, the functional form, the torch
drop-in and the Hugging Face swap."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import posenc
import posenc.functional as PF
from posenc.common.attention import attend
from posenc.seq.alibi import ALiBi
from posenc.seq.fox import ForgettingGate

from . import reference as ref

B, H, HKV, D = 3, 4, 2, 16


@dataclasses.dataclass
class Case:
    name: str
    q_len: int
    kv_len: int
    key_valid: torch.Tensor | None = None
    segments: torch.Tensor | None = None
    window: int | None = None
    q_pos: torch.Tensor | None = None
    kv_pos: torch.Tensor | None = None

    def mask(self) -> posenc.AttentionMask:
        return posenc.AttentionMask(causal=True, key_valid=self.key_valid, q_segments=self.segments,
                                    kv_segments=self.segments, window=self.window)

    def allowed(self) -> torch.Tensor:
        return ref.allowed_matrix(B, self.q_len, self.kv_len, causal=True, key_valid=self.key_valid,
                                  q_segments=self.segments, kv_segments=self.segments, window=self.window)

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        kv = torch.arange(self.kv_len)[None] if self.kv_pos is None else self.kv_pos
        q = torch.arange(self.kv_len - self.q_len, self.kv_len)[None] if self.q_pos is None else self.q_pos
        return q, kv


def _right_and_left_padding() -> torch.Tensor:
    valid = torch.ones(B, 12, dtype=torch.bool)
    valid[0, 9:] = False  # right padding
    valid[1, :3] = False  # left padding (as for generation)
    valid[2] = False  # every key padding: rows that see nothing
    return valid


def _packed() -> tuple[torch.Tensor, torch.Tensor]:
    seg = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 12, [0] * 2 + [1] * 10])
    pos = torch.zeros_like(seg)
    for b in range(B):
        for t in range(1, 12):
            pos[b, t] = 0 if seg[b, t] != seg[b, t - 1] else pos[b, t - 1] + 1
    return seg, pos


SEG, SEG_POS = _packed()
CASES = [
    Case("causal", 12, 12),
    Case("padding", 12, 12, key_valid=_right_and_left_padding()),
    Case("packed", 12, 12, segments=SEG, q_pos=SEG_POS, kv_pos=SEG_POS),
    Case("window", 12, 12, window=4),
    Case("cache_rows", 5, 12),
    Case("more_queries_than_keys", 8, 5, q_pos=torch.arange(-3, 5)[None]),
]


def _fox(seed: int = 1, **options) -> ForgettingGate:
    torch.manual_seed(seed)
    enc = ForgettingGate(H, D, **options).double()
    with torch.no_grad():  # gates far from 1/2 and from each other
        enc.weight.normal_(0, 0.4)
        enc.bias.uniform_(-1.0, 3.0)
    return enc


def _qkv(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    q = torch.randn(B, H, case.q_len, D, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(B, HKV, case.kv_len, D, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(B, HKV, case.kv_len, D, dtype=torch.float64, generator=gen, requires_grad=True)
    return q, k, v


def _reference(enc: ForgettingGate, case: Case, q, k, v) -> torch.Tensor:
    log_f = ref.fox_log_gates(k, enc.weight, enc.bias, case.key_valid)
    bias = ref.fox_bias(log_f, case.q_len)
    return ref.attention(q, k, v, case.allowed(), score_bias=bias)


@pytest.fixture
def small_chunks(monkeypatch):
    # several chunks of 4 query rows through the chunked dense and math paths
    monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", 4 * B * H * 12)
    monkeypatch.setattr("posenc.common.kernels.chunking.MIN_CHUNK_ROWS", 4)


def test_the_reference_is_the_cumulative_form():
    """``sum_{l = j+1 .. i} log f_l = F_i - F_j``: the reference sums and posenc's cumulative sums agree."""
    log_f = -torch.rand(2, 3, 9, dtype=torch.float64)
    cum = log_f.cumsum(-1)
    dense = ref.fox_bias(log_f, 9)
    i, j = torch.tril_indices(9, 9)
    torch.testing.assert_close(dense[:, :, i, j], cum[:, :, i] - cum[:, :, j], rtol=0, atol=1e-12)
    torch.testing.assert_close(PF.fox_bias(log_f)[:, :, i, j], dense[:, :, i, j], rtol=0, atol=1e-12)
    assert torch.isneginf(PF.fox_bias(log_f)[:, :, j, i][:, :, i != j]).all()


@pytest.mark.parametrize("backend,path", [("auto", "sdpa"), ("sdpa", "sdpa"), ("dense", "dense"), ("math", "math"),
                                          ("flex", "flex")])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_path_matches_the_float64_reference(case, backend, path, small_chunks):
    """Forward, and backward to q, k, v, the gate weights and biases (flex: forward; CPU flex has no backward)."""
    enc = _fox()
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen)
    q_pos, kv_pos = case.positions()
    forward_only = path == "flex"
    with torch.set_grad_enabled(not forward_only):
        plan = posenc.plan(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend=backend)
        assert plan.path == path and plan.key_column == (path == "sdpa"), plan
        out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend=backend)
    expected = _reference(enc, case, q, k, v)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected.detach(), rtol=1e-9, atol=1e-10)
    if forward_only:
        return
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    params = [q, k, v, enc.weight, enc.bias]
    got = torch.autograd.grad(out, params, grad)
    want = torch.autograd.grad(expected, params, grad)
    for name, g, w in zip(["q", "k", "v", "weight", "bias"], got, want):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10, msg=lambda m: f"grad {name}: {m}")
    assert got[3].abs().sum() > 0 and got[4].abs().sum() > 0


def test_a_packed_sequence_is_its_segments_attended_alone():
    """A packed row gives each segment what the segment gives as a sequence of its own: the gates
    of another segment never enter its sums."""
    enc = _fox()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 12, 64, dtype=torch.float64, generator=gen)
    torch.manual_seed(2)
    stack = posenc.TransformerEncoder(64, 2, H, num_kv_heads=HKV, encoding=[enc, _fox(3)]).double().eval()
    seg, pos = SEG[:1], SEG_POS[:1]
    with torch.no_grad():
        packed = stack(x, positions=pos, mask=posenc.AttentionMask.packed(seg, causal=True))
        alone = [stack(x[:, a:b], mask=posenc.AttentionMask(causal=True)) for a, b in ((0, 5), (5, 9), (9, 12))]
    torch.testing.assert_close(packed, torch.cat(alone, dim=1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3])
def test_cached_decoding_equals_the_full_forward(chunk):
    """The gates of cached tokens come back from the cached keys: a prompt, then ``chunk`` tokens at
    a time through a KV cache, gives the full forward; each step is a decoding step of the plan."""
    torch.manual_seed(0)
    stack = posenc.TransformerEncoder(64, 2, H, num_kv_heads=HKV, encoding=[_fox(1), _fox(2)]).double().eval()
    x = torch.randn(2, 13, 64, dtype=torch.float64)
    causal = posenc.AttentionMask(causal=True)
    with torch.no_grad():
        full = stack(x, mask=causal)
        cache = posenc.KVCache(2)
        pieces = [stack(x[:, :4], mask=causal, cache=cache)]
        for t in range(4, 13, chunk):
            pieces.append(stack(x[:, t: t + chunk], mask=causal, cache=cache))
        q = torch.randn(2, H, chunk, 8, dtype=torch.float64)
        kv = torch.randn(2, HKV, 9, 8, dtype=torch.float64)
        assert posenc.plan(q, kv, kv, encoding=ForgettingGate(H, 8), mask=causal).decode
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-12)


def test_a_causal_lm_generates_with_the_cache_as_without():
    torch.manual_seed(0)
    model = posenc.seq.CausalLM(40, 32, 2, H, encoding="fox", max_len=64).eval()
    assert len(model.encodings) == 2  # one gate per layer
    for gate in model.encodings:
        with torch.no_grad():
            gate.weight.normal_(0, 0.3)
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model.generate(prompt, 8, greedy=True), model.generate(prompt, 8, greedy=True, use_cache=False))


def test_constant_gates_are_alibi():
    """``init_std=0`` and ``gate_init="alibi"``: every gate is ``sigmoid(b_h)`` with ``-log f = m_h``,
    and the bias is ALiBi's ``-m_h (i - j)``."""
    enc = ForgettingGate(H, D, init_std=0.0, gate_init="alibi").double()
    torch.testing.assert_close(F.softplus(-enc.bias), posenc.seq.alibi_slopes(H).double(), rtol=1e-6, atol=0)
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(CASES[0], gen)
    pos = torch.arange(12)[None]
    mask = posenc.AttentionMask(causal=True)
    with torch.no_grad():
        got = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask)
        want = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=ALiBi(H), mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # ALiBi's slopes are float32
    assert torch.equal(ForgettingGate(H, D).bias, torch.zeros(H))  # the authors' start: f = 1/2


def test_the_functional_form_is_the_module_and_serves_sdpa():
    enc = _fox()
    gen = torch.Generator().manual_seed(4)
    q, k, v = (t.detach() for t in _qkv(CASES[0], gen))
    log_f = PF.fox_log_gates(k, enc.weight, enc.bias)
    torch.testing.assert_close(log_f, ref.fox_log_gates(k, enc.weight, enc.bias), rtol=0, atol=1e-12)
    torch.testing.assert_close(log_f, enc.log_gates(k), rtol=0, atol=0)
    bias = PF.fox_bias(log_f)
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=bias)
    pos = torch.arange(12)[None]
    with torch.no_grad():
        want = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(causal=True))
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    tail = PF.fox_bias(log_f, q_len=3)
    torch.testing.assert_close(tail, bias[:, :, -3:])


def test_float32_training_step_is_close_to_float64():
    """The float32 module (cumulative sums in float32) against the float64 reference."""
    enc = _fox()
    gen = torch.Generator().manual_seed(6)
    q, k, v = _qkv(CASES[0], gen)
    expected = _reference(enc, CASES[0], q, k, v)
    enc32 = enc.float()
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    pos = torch.arange(12)[None]
    out = attend(q32, k32, v32, q_pos=pos, kv_pos=pos, encoding=enc32, mask=posenc.AttentionMask(causal=True))
    torch.testing.assert_close(out.double(), expected.detach(), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q32, k32, v32, enc32.weight, enc32.bias))


def test_the_plan_carries_the_gates_as_a_key_column_where_it_can():
    """``F_i - F_j`` is ``-F_j`` plus a constant per row: off CUDA, in float32 or float64 and outside
    a decoding step, SDPA takes ``-F_j`` as one more key column; bfloat16 (whose column would round
    the sums) and a decoding step take the dense path; backend='sdpa' asks for the column."""
    enc = _fox().float()
    gen = torch.Generator().manual_seed(8)
    q, k, v = (t.detach().float().requires_grad_() for t in _qkv(CASES[0], gen))
    pos, causal = torch.arange(12)[None], posenc.AttentionMask(causal=True)
    p = posenc.plan(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=causal)
    assert p.label == "sdpa+key_column" and p.key_column
    half = enc.to(torch.bfloat16)
    qh, kh, vh = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    assert posenc.plan(qh, kh, vh, q_pos=pos, kv_pos=pos, encoding=half, mask=causal).path == "dense"
    with pytest.raises(ValueError, match="backend='sdpa' cannot apply the score bias of .*bfloat16 would round"):
        posenc.plan(qh, kh, vh, q_pos=pos, kv_pos=pos, encoding=half, mask=causal, backend="sdpa")
    with torch.no_grad():
        step = posenc.plan(q[:, :, -1:], k, v, q_pos=pos[:, -1:], kv_pos=pos, encoding=enc.float(), mask=causal)
    assert step.label == "dense+decode", step
    with pytest.raises(ValueError, match="not a term of the key alone"):
        posenc.plan(q, k, v, q_pos=pos, kv_pos=pos, encoding=ALiBi(H), mask=causal, backend="sdpa")


def test_a_key_term_of_the_wrong_shape_is_one_clear_line():
    from posenc.common import kernels

    q, k, v = torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 5, 8), torch.zeros(2, 4, 5, 8)
    for bad in (torch.zeros(2, 4, 4), torch.zeros(3, 4, 5), torch.zeros(2, 4, 5, 1), torch.zeros(2, 4, 5, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"key_term must be a float tensor \[2 or 1, 4 or 1, 5\]"):
            kernels.key_column_path(q, k, v, None, 0.5, bad)
    assert kernels.key_column_path(q, k, v, None, 0.5, torch.zeros(1, 1, 5)).shape == (2, 4, 3, 8)


def test_a_long_float32_sequence_keeps_the_dense_paths_precision():
    """Over 2048 tokens with gates near 0.2 the sums reach about -3300; the key column (centred per
    head) loses about what the dense path loses to float32 rounding, against float64."""
    torch.manual_seed(9)
    enc = ForgettingGate(H, D, init_std=0.0).double()
    with torch.no_grad():
        enc.bias.fill_(-1.4)  # f = sigmoid(-1.4) ~ 0.2
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, h, 2048, D, dtype=torch.float64, generator=gen) for h in (H, HKV, HKV))
    pos, causal = torch.arange(2048)[None], posenc.AttentionMask(causal=True)
    with torch.no_grad():
        want = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=causal, backend="dense")
        errors = {}
        for backend in ("sdpa", "dense"):
            got = attend(q.float(), k.float(), v.float(), q_pos=pos, kv_pos=pos, encoding=enc.float(), mask=causal,
                         backend=backend)
            errors[backend] = (got.double() - want).abs().max().item()
        enc.double()
    assert errors["sdpa"] < 1.4 * errors["dense"], errors  # uncentred: 1.6x


def test_the_torch_drop_in_applies_the_gates():
    torch.manual_seed(0)
    enc = _fox().float()
    layer = posenc.TorchMultiheadAttention(64, H, batch_first=True, encoding=enc)
    x = torch.randn(2, 10, 64)
    out, _ = layer(x, x, x, need_weights=False, is_causal=True,
                   attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(10))
    heads = lambda t: t.view(2, 10, H, 16).transpose(1, 2)  # noqa: E731
    w_q, w_k, w_v = layer.q_proj_weight, layer.k_proj_weight, layer.v_proj_weight
    b_q, b_k, b_v = layer.in_proj_bias.chunk(3)
    q, k, v = heads(x @ w_q.T + b_q), heads(x @ w_k.T + b_k), heads(x @ w_v.T + b_v)
    bias = ref.fox_bias(ref.fox_log_gates(k, enc.weight, enc.bias), 10)
    o = ref.attention(q, k, v, ref.allowed_matrix(2, 10, 10, causal=True), score_bias=bias)
    want = layer.out_proj(o.float().transpose(1, 2).reshape(2, 10, 64))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


def test_a_swapped_hugging_face_model_generates_with_the_cache_as_without():
    transformers = pytest.importorskip("transformers")
    from posenc.integrations import transformers as posenc_hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=0, eos_token_id=39, bos_token_id=1)
    model = posenc_hf.swap_position_encoding(transformers.LlamaForCausalLM(config).double().eval(), "fox")
    gates = [layer.self_attn.position_encoding for layer in model.model.layers]
    assert len({id(g) for g in gates}) == 2 and all(isinstance(g, ForgettingGate) for g in gates)
    for gate in gates:
        with torch.no_grad():
            gate.weight.normal_(0, 0.5)
    ids = torch.randint(2, 39, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    args = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **args), model.generate(ids, use_cache=False, **args))


def test_bad_input_gets_one_clear_line():
    with pytest.raises(ValueError, match="gate_init must be one of 'zero', 'alibi'; got 'bogus'"):
        ForgettingGate(H, D, gate_init="bogus")
    with pytest.raises(ValueError, match="init_std must be a number >= 0"):
        ForgettingGate(H, D, init_std=-1.0)
    enc = ForgettingGate(H, D)
    q = torch.randn(1, H, 6, 8)
    pos = torch.arange(6)[None]
    with pytest.raises(ValueError, match="fox: keys of width 8; this encoding was built for head_dim=16"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(causal=True))
    q = torch.randn(1, H, 6, D)
    with pytest.raises(ValueError, match="causal"):
        attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc)
    with pytest.raises(ValueError, match="q_len must be"):
        PF.fox_bias(torch.zeros(1, 2, 4), q_len=5)
    with pytest.raises(ValueError, match=r"log_gates must be a float tensor \[batch, heads, keys\]"):
        PF.fox_bias(torch.zeros(2, 4))
    for bad, shown in ((float("nan"), "nan"), (float("-inf"), "-inf"), (0.5, "0.5")):  # a gate log is finite, <= 0
        with pytest.raises(ValueError, match=f"log_gates must be log forget gates, finite and <= 0 .*got {shown}"):
            PF.fox_bias(torch.tensor([[[0.0, bad, -0.1]]]))
    with pytest.raises(ValueError, match="6 gate heads must be a multiple of the 4 key heads"):
        PF.fox_log_gates(torch.zeros(1, 4, 3, 8), torch.zeros(6, 8), torch.zeros(6))
    with pytest.raises(ValueError, match="fox_bias.*would need"):
        PF.fox_bias(torch.zeros(1, 1, 10**7), q_len=10**7)


CUDA_CASES = CASES if torch.cuda.is_available() else []


@pytest.mark.parametrize("backend", ["flex", "dense", "math"])
@pytest.mark.parametrize("case", CUDA_CASES, ids=[f"cuda-{c.name}" for c in CUDA_CASES])
def test_cuda_paths_match_the_float64_reference(case, backend):
    """On CUDA (scripts/gpu_checks.sh): FlexAttention's score_mod over the two cumulative sums,
    forward and backward (the gradients of the captured sums reach the gates), and the other paths."""
    dev = torch.device("cuda")
    enc = _fox()
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen)
    expected = _reference(enc, case, q, k, v)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    params = [q, k, v, enc.weight, enc.bias]
    want = torch.autograd.grad(expected, params, grad)
    gate = enc.float().to(dev)
    qc, kc, vc = (t.detach().float().to(dev).requires_grad_() for t in (q, k, v))
    q_pos, kv_pos = (p.to(dev) for p in case.positions())
    mask = posenc.AttentionMask(causal=True, window=case.window,
                                key_valid=None if case.key_valid is None else case.key_valid.to(dev),
                                q_segments=None if case.segments is None else case.segments.to(dev),
                                kv_segments=None if case.segments is None else case.segments.to(dev))
    assert posenc.plan(qc, kc, vc, q_pos=q_pos, kv_pos=kv_pos, encoding=gate, mask=mask, backend=backend).path == backend
    out = attend(qc, kc, vc, q_pos=q_pos, kv_pos=kv_pos, encoding=gate, mask=mask, backend=backend)
    torch.testing.assert_close(out.double().cpu(), expected.detach(), rtol=2e-3, atol=2e-3)
    got = torch.autograd.grad(out, [qc, kc, vc, gate.weight, gate.bias], grad.float().to(dev))
    for name, g, w in zip(["q", "k", "v", "weight", "bias"], got, want):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double().cpu(), w, rtol=5e-3, atol=5e-3, msg=lambda m: f"grad {name}: {m}")


def test_log_gates_equal_logsigmoid_across_the_range_with_finite_gradients():
    """The gates' log-sigmoid (log sigmoid x, faster than aten's logsigmoid on CPU) equals
    F.logsigmoid to float64 rounding from deep in the tail to saturation, and its gradient is
    finite where sigmoid would underflow."""
    from posenc.seq.fox import _log_sigmoid

    x = torch.linspace(-200.0, 60.0, 26001, dtype=torch.float64, requires_grad=True)
    ours = _log_sigmoid(x)
    (grad,) = torch.autograd.grad(ours.sum(), x)
    ref = torch.nn.functional.logsigmoid(x)
    (ref_grad,) = torch.autograd.grad(ref.sum(), x)
    assert (ours - ref).abs().max().item() < 1e-13
    assert torch.isfinite(grad).all() and (grad - ref_grad).abs().max().item() < 1e-13
    x32 = x.detach().float()
    assert (_log_sigmoid(x32).double() - ref.detach()).abs().max().item() < 1e-5  # float32's own rounding of x
