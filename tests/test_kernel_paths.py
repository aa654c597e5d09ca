"""Every kernel path agrees with the float64 reference, forward and backward, for each of the
four proving encodings under causal, padding, block-diagonal, sliding-window and non-square
masks, with no NaN on fully masked rows."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

import posenc
from posenc.common import kernels
from posenc.common.attention import attend
from posenc.common.masks import AttentionMask
from posenc.common.pairwise import shared_run_offset, take
from posenc.common.planning import PlanInputs
from posenc.seq.alibi import ALiBi
from posenc.seq.rope import RotaryEncoding
from posenc.timeseries.erpe import ERPE

from . import reference as ref


def _consecutive_causal(case, q_pos, kv_pos) -> bool:
    """The plan's test for Shaw's offset value term: causal alone over one run of positions."""
    return PlanInputs(mask=case.mask(), q_len=case.q_len, kv_len=case.kv_len,
                      run_offset=shared_run_offset(q_pos, kv_pos)).consecutive_causal

# D = 16: compiled FlexAttention (the CUDA run of these tests) refuses head dims under 16
B, H, HKV, D = 3, 4, 2, 16
ALIBI_SLOPES_4 = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]


@dataclasses.dataclass
class Case:
    name: str
    q_len: int
    kv_len: int
    causal: bool = False
    key_valid: torch.Tensor | None = None
    segments: tuple[torch.Tensor, torch.Tensor] | None = None
    window: int | None = None
    q_pos: torch.Tensor | None = None
    kv_pos: torch.Tensor | None = None

    def mask(self) -> posenc.AttentionMask:
        qs, ks = self.segments if self.segments is not None else (None, None)
        return posenc.AttentionMask(
            causal=self.causal, key_valid=self.key_valid, q_segments=qs, kv_segments=ks, window=self.window
        )

    def allowed(self) -> torch.Tensor:
        qs, ks = self.segments if self.segments is not None else (None, None)
        return ref.allowed_matrix(
            B, self.q_len, self.kv_len, causal=self.causal, key_valid=self.key_valid,
            q_segments=qs, kv_segments=ks, window=self.window,
        )

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        kv = torch.arange(self.kv_len)[None] if self.kv_pos is None else self.kv_pos
        q = torch.arange(self.kv_len - self.q_len, self.kv_len)[None] if self.q_pos is None else self.q_pos
        return q, kv


def _qkv(case: Case, gen: torch.Generator, requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
    """float64 ``q [B, H, Tq, D]``, ``k, v [B, HKV, Tk, D]`` for ``case``, drawn from ``gen`` in that order."""
    q = torch.randn(B, H, case.q_len, D, dtype=torch.float64, generator=gen, requires_grad=requires_grad)
    k = torch.randn(B, HKV, case.kv_len, D, dtype=torch.float64, generator=gen, requires_grad=requires_grad)
    v = torch.randn(B, HKV, case.kv_len, D, dtype=torch.float64, generator=gen, requires_grad=requires_grad)
    return q, k, v


def _padding() -> torch.Tensor:
    valid = torch.ones(B, 12, dtype=torch.bool)
    valid[0, 9:] = False
    valid[2] = False  # every key of this sequence is padding: fully masked rows
    return valid


def _packed() -> tuple[torch.Tensor, torch.Tensor]:
    seg = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 12, [0] * 2 + [1] * 10])
    return seg, seg


def _packed_positions() -> torch.Tensor:
    seg = _packed()[0]
    pos = torch.zeros_like(seg)
    for b in range(B):
        for t in range(1, seg.shape[1]):
            pos[b, t] = 0 if seg[b, t] != seg[b, t - 1] else pos[b, t - 1] + 1
    return pos


CASES = [
    Case("causal", 12, 12, causal=True),
    Case("padding", 12, 12, key_valid=_padding()),
    Case("causal_padding", 12, 12, causal=True, key_valid=_padding()),
    Case("packed", 12, 12, causal=True, segments=_packed(), q_pos=_packed_positions(), kv_pos=_packed_positions()),
    Case("window", 12, 12, causal=True, window=4),
    Case("nonsquare_cache", 5, 12, causal=True),
    Case("nonsquare_fully_masked", 8, 5, causal=True, q_pos=torch.arange(-3, 5)[None]),
    Case("cross_padding", 7, 12, key_valid=_padding(), q_pos=torch.arange(7)[None]),
    # query segments shared by the batch, key segments per sequence (each broadcasts on its own)
    Case("segments_broadcast", 5, 12, segments=(torch.tensor([[0, 0, 1, 1, 2]]), _packed()[0]),
         q_pos=torch.arange(5)[None]),
]


def _encoding(kind: str, case: Case):
    torch.manual_seed(1)
    if kind == "none":
        return None
    if kind == "rope_half":
        return RotaryEncoding(D, pairing="half_split")
    if kind == "rope_interleaved":
        return RotaryEncoding(D, pairing="interleaved")
    if kind == "alibi":
        return ALiBi(H, symmetric=not case.causal)
    if kind == "erpe":
        enc = ERPE(H, max_len=16)
        with torch.no_grad():
            enc.weight.normal_(0, 0.3)  # zero-initialised; random values make the test meaningful
        return enc.double()
    raise AssertionError(kind)


def _reference(kind, enc, case, q, k, v):
    q_pos, kv_pos = case.positions()
    score_bias = prob_bias = None
    if kind.startswith("rope"):
        inter = kind == "rope_interleaved"
        q = ref.rope_rotate(q, q_pos, interleaved=inter)
        k = ref.rope_rotate(k, kv_pos, interleaved=inter)
    elif kind == "alibi":
        score_bias = ref.alibi_bias(ALIBI_SLOPES_4, q_pos, kv_pos, symmetric=not case.causal)
    elif kind == "erpe":
        prob_bias = ref.erpe_bias(enc.weight, q_pos, kv_pos, 16)
    return ref.attention(q, k, v, case.allowed(), score_bias=score_bias, prob_bias=prob_bias)


BACKENDS_FOR = {
    "none": ["auto", "sdpa", "dense", "flex", "math"],
    "rope_half": ["auto", "sdpa", "dense", "flex", "math"],
    "rope_interleaved": ["auto", "sdpa", "flex", "math"],
    "alibi": ["auto", "dense", "flex", "math"],
    "erpe": ["auto", "sdpa", "dense", "flex", "math"],
}
PARAMS = [(kind, backend, case) for kind, bs in BACKENDS_FOR.items() for backend in bs for case in CASES]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # Force several query chunks (4 rows each) through the chunked dense path.
    monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", 4 * B * H * 12)
    monkeypatch.setattr("posenc.common.kernels.chunking.MIN_CHUNK_ROWS", 4)
    monkeypatch.setattr("posenc.common.kernels.offset_values._OFFSET_CHUNK_ROWS", 5)


@pytest.mark.parametrize("kind,backend,case", PARAMS, ids=[f"{k}-{b}-{c.name}" for k, b, c in PARAMS])
def test_path_matches_float64_reference(kind, backend, case):
    enc = _encoding(kind, case)
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen, requires_grad=True)
    q_pos, kv_pos = case.positions()
    expected = _reference(kind, enc, case, q, k, v)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    forward_only = backend == "flex"  # FlexAttention has no backward on CPU
    with torch.set_grad_enabled(not forward_only):
        out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend=backend)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected.detach(), rtol=1e-7, atol=1e-9)
    if forward_only:
        return
    params = [q, k, v] + ([enc.weight] if kind == "erpe" else [])
    got = torch.autograd.grad(out, params, grad)
    want = torch.autograd.grad(expected, params, grad)
    for name, g, w in zip(["q", "k", "v", "erpe.weight"], got, want):
        assert not g.isnan().any(), name
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-9, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("choice", ["flash", "explicit"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_backwards_of_a_constant_bias_match_the_float64_reference(case, choice, monkeypatch):
    """The plan names the chunked dense path's backward (POSENC_BIAS_BACKWARD chooses it for a
    constant bias on CPU); both give the reference's gradients."""
    monkeypatch.setenv("POSENC_BIAS_BACKWARD", choice)
    enc = _encoding("alibi", case)
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen, requires_grad=True)
    q_pos, kv_pos = case.positions()
    kwargs = dict(q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend="dense")
    chosen = posenc.plan(q, k, v, **kwargs)
    assert chosen.bias_backward == choice and f"POSENC_BIAS_BACKWARD={choice}" in chosen.reason
    expected = _reference("alibi", enc, case, q, k, v)
    out = attend(q, k, v, **kwargs)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    for name, g, w in zip("qkv", torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-9, msg=lambda m: f"grad {name}: {m}")


def test_the_plan_says_which_backward_and_why(monkeypatch, tmp_path):
    monkeypatch.delenv("POSENC_BIAS_BACKWARD", raising=False)
    monkeypatch.setenv("POSENC_TUNE_FILE", str(tmp_path / "tune.json"))  # none yet
    from posenc.common.tuning import DEFAULT_CONSTANT_BIAS_BACKWARD, machine_key

    case = CASES[0]
    q, k, v = _qkv(case, torch.Generator().manual_seed(0), requires_grad=True)
    q_pos, kv_pos = case.positions()
    kwargs = dict(q_pos=q_pos, kv_pos=kv_pos, mask=case.mask())
    constant = posenc.plan(q, k, v, encoding=ALiBi(H), **kwargs)
    assert constant.bias_backward == DEFAULT_CONSTANT_BIAS_BACKWARD and "the default for a constant bias" in constant.reason
    learned = posenc.plan(q, k, v, encoding=posenc.build("t5", num_heads=H), **kwargs)
    assert learned.bias_backward == "explicit" and "the bias needs its gradient" in learned.reason
    with torch.no_grad():
        assert posenc.plan(q, k, v, encoding=ALiBi(H), **kwargs).bias_backward is None  # no backward
    # a measurement of this machine by posenc tune decides; another machine's does not
    other = "flash" if DEFAULT_CONSTANT_BIAS_BACKWARD == "explicit" else "explicit"
    (tmp_path / "tune.json").write_text(json.dumps({"machines": {"another CPU": {"constant_bias_backward": other}}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a file without this machine is a valid file: no warning
        assert posenc.plan(q, k, v, encoding=ALiBi(H), **kwargs).bias_backward == DEFAULT_CONSTANT_BIAS_BACKWARD
    (tmp_path / "tune.json").write_text(json.dumps({"machines": {machine_key(): {"constant_bias_backward": other}}}))
    tuned = posenc.plan(q, k, v, encoding=ALiBi(H), **kwargs)
    assert tuned.bias_backward == other and "measured on this machine by posenc tune" in tuned.reason
    (tmp_path / "tune.json").write_text("{not json")
    with pytest.warns(UserWarning, match="not a posenc tune file; ignored"):
        assert posenc.plan(q, k, v, encoding=ALiBi(H), **kwargs).bias_backward == DEFAULT_CONSTANT_BIAS_BACKWARD
    monkeypatch.setenv("POSENC_BIAS_BACKWARD", "fast")
    with pytest.raises(ValueError, match="POSENC_BIAS_BACKWARD must be one of flash, explicit .*got 'fast'"):
        posenc.plan(q, k, v, encoding=ALiBi(H), **kwargs)


FLOAT32_PARAMS = [
    (kind, backend)
    for kind in ["none", "rope_half", "alibi", "erpe"]
    for backend in ["auto", "sdpa", "dense", "math"]
    if (kind, backend) != ("alibi", "sdpa")  # rejected by design (test_attention_api)
]


@pytest.mark.parametrize("kind,backend", FLOAT32_PARAMS)
def test_float32_paths_close_to_reference(kind, backend):
    """The float32 kernels (the fused CPU flash kernel) agree with float64 to float32 accuracy."""
    case = CASES[2]  # causal + padding with a fully masked sequence
    enc = _encoding(kind, case)
    if enc is not None:
        enc = enc.float()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 12, D, generator=gen, requires_grad=True)
    k = torch.randn(B, HKV, 12, D, generator=gen, requires_grad=True)
    v = torch.randn(B, HKV, 12, D, generator=gen, requires_grad=True)
    q_pos, kv_pos = case.positions()
    out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend=backend)
    expected = _reference(kind, enc, case, q, k, v)
    torch.testing.assert_close(out.double(), expected.detach(), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


class LearnedRelative(posenc.PositionEncoding):
    """A learned scalar per (head, clipped offset): the shape of T5/KERPLE-style learned biases."""

    hooks = frozenset({posenc.Hook.SCORE_BIAS})

    def __init__(self, table, by_offset=False):
        super().__init__()
        self.table, self.offsets = table, by_offset

    def score_bias(self, q, k, q_pos, kv_pos):
        table = self.table

        def fn(b, h, qi, ki):
            off = take(q_pos, b, qi) - take(kv_pos, b, ki)
            if table.shape[0] == 1:  # one table for every head: a [B, 1, rows, keys] block
                return table[0][off.clamp(-11, 11) + 11]
            return table[h, off.clamp(-11, 11) + 11]

        def by_offset(offsets):  # kv - q -> [H, R]
            return table[:, (-offsets).clamp(-11, 11) + 11]

        return posenc.PairwiseBias(fn, per_batch=max(q_pos.shape[0], kv_pos.shape[0]) > 1, learned=(table,),
                                   by_offset=by_offset if self.offsets else None)


# (chunk budget, backward group budget) for a bias shared by the batch (B=3, H=4, 12 keys):
# 3 chunks of 4 rows, one head at a time / heads in pairs; one chunk of 12 rows, the batch in
# groups of 2 and 1; one chunk, the whole batch at once
SHARED_BUDGETS = [(H * 4 * 12, 1), (H * 4 * 12, 2 * 4 * 12), (B * H * 4 * 12, 2 * H * 12 * 12), (2 * H * 12 * 12, 1 << 19)]
LEARNED_PATHS = [("math", None), ("dense", None), *(("dense", budget) for budget in SHARED_BUDGETS)]


@pytest.mark.parametrize("table_heads", [H, 1])
@pytest.mark.parametrize("by_offset", [False, True], ids=["fn", "by_offset"])
@pytest.mark.parametrize("backend,budget", LEARNED_PATHS, ids=[f"{b}-{n}" for b, n in LEARNED_PATHS])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_learned_bias_gradients_match_reference(case, backend, budget, by_offset, table_heads, monkeypatch):
    """A bias that needs a gradient: the chunked explicit backward gives q, k, v and table
    gradients, whether the bias is evaluated per block or cut from its diagonals, per head or one
    for every head, for every way of chunking the rows and grouping the batch and heads."""
    if budget is not None:
        monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", budget[0])
        monkeypatch.setattr("posenc.common.kernels.dense_blocks.BACKWARD_GROUP_ELEMENTS", budget[1])
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(table_heads, 23, dtype=torch.float64, generator=gen, requires_grad=True)
    q, k, v = _qkv(case, gen, requires_grad=True)
    q_pos, kv_pos = case.positions()
    enc = LearnedRelative(table, by_offset=by_offset)
    out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend=backend)
    offsets = (q_pos[:, :, None] - kv_pos[:, None, :]).clamp(-11, 11) + 11  # [B|1, Tq, Tk]
    expected = ref.attention(q, k, v, case.allowed(), score_bias=table[:, offsets].permute(1, 0, 2, 3))
    torch.testing.assert_close(out, expected, rtol=1e-7, atol=1e-9)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad(out, [q, k, v, table], grad)
    want = torch.autograd.grad(expected, [q, k, v, table], grad)
    for name, g, w in zip(["q", "k", "v", "table"], got, want):
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-9, msg=lambda m: f"grad {name}: {m}")
    assert got[3].abs().sum() > 0


def test_flex_compiled_cpu_forward_matches_reference():
    """FlexAttention compiled on CPU (as on CUDA) gives the reference forward for ALiBi + packed mask."""
    pytest.importorskip("torch._inductor")
    case = CASES[3]
    enc = ALiBi(H)
    q = torch.randn(B, H, 12, D)
    k = torch.randn(B, H, 12, D)
    v = torch.randn(B, H, 12, D)
    q_pos, kv_pos = case.positions()
    bias = enc.score_bias(q, k, q_pos, kv_pos)
    mask = case.mask()
    block_mask = mask.block_mask(B, 12, 12, q.device)
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    out = compiled(q, k, v, score_mod=lambda s, b, h, qi, ki: s + bias(b, h, qi, ki), block_mask=block_mask)
    expected = ref.attention(q, k, v, case.allowed(), score_bias=ref.alibi_bias(ALIBI_SLOPES_4, q_pos, kv_pos))
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "dense", "flex", "math"])
def test_sinusoidal_input_hook_on_every_path_matches_reference(backend):
    """The input-hook encoding through a block's attention on each path equals the float64 reference."""
    torch.manual_seed(0)
    stack = posenc.TransformerEncoder(16, 1, 2, encoding=posenc.build("sinusoidal", dim=16), backend=backend).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 6:] = False
    mask = posenc.AttentionMask(causal=True, key_valid=valid)
    with torch.set_grad_enabled(backend != "flex"):
        out = stack(x, mask=mask)
    block = stack.blocks[0]
    h = x + ref.sinusoid(torch.arange(9)[None], 16)
    a = block.attn
    hn = block.norm1(h)
    heads = lambda t: t.unflatten(-1, (2, 8)).transpose(1, 2)  # noqa: E731
    o = ref.attention(heads(a.q_proj(hn)), heads(a.k_proj(hn)), heads(a.v_proj(hn)),
                      ref.allowed_matrix(2, 9, 9, causal=True, key_valid=valid))
    h = h + a.out_proj(o.transpose(1, 2).flatten(2))
    h = h + block.mlp(block.norm2(h))
    torch.testing.assert_close(out, stack.norm(h), rtol=1e-9, atol=1e-9)


def _mask_on(case: Case, device: torch.device) -> posenc.AttentionMask:
    mask = case.mask()
    return posenc.AttentionMask(
        causal=mask.causal, window=mask.window,
        key_valid=None if mask.key_valid is None else mask.key_valid.to(device),
        q_segments=None if mask.q_segments is None else mask.q_segments.to(device),
        kv_segments=None if mask.kv_segments is None else mask.kv_segments.to(device),
    )


# Collected only where CUDA exists (scripts/gpu_checks.sh runs them on the device machine).
CUDA_PARAMS = PARAMS if torch.cuda.is_available() else []


@pytest.mark.parametrize("kind,backend,case", CUDA_PARAMS, ids=[f"cuda-{k}-{b}-{c.name}" for k, b, c in CUDA_PARAMS])
def test_cuda_path_matches_float64_reference(kind, backend, case):
    """On CUDA every path, flex included, agrees with the float64 reference forward and backward."""
    dev = torch.device("cuda")
    enc = _encoding(kind, case)
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen)
    q_pos, kv_pos = case.positions()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = _reference(kind, enc, case, *leaves)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    want = torch.autograd.grad(expected, leaves, grad)
    enc_dev = None if enc is None else enc.float().to(dev)
    qc, kc, vc = (t.float().to(dev).requires_grad_() for t in (q, k, v))
    mask = _mask_on(case, dev)
    out = attend(qc, kc, vc, q_pos=q_pos.to(dev), kv_pos=kv_pos.to(dev), encoding=enc_dev, mask=mask, backend=backend)
    torch.testing.assert_close(out.double().cpu(), expected.detach(), rtol=2e-3, atol=2e-3)
    got = torch.autograd.grad(out, [qc, kc, vc], grad.float().to(dev))
    for name, g, w in zip("qkv", got, want):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double().cpu(), w, rtol=5e-3, atol=5e-3, msg=lambda m: f"grad {name}: {m}")


def test_bf16_inputs_keep_a_float32_bias():
    """Queries far from their keys: ALiBi's biases are large and differ by small amounts, which a
    bf16 bias (spacing 4 near 750) would erase; the dense path keeps them in float32."""
    torch.manual_seed(0)
    q = torch.randn(1, 4, 8, 16)
    kv = torch.randn(1, 4, 64, 16)
    q_pos, kv_pos = torch.arange(3000, 3008)[None], torch.arange(64)[None]
    slopes = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    expected = ref.attention(q, kv, kv, None, score_bias=ref.alibi_bias(slopes, q_pos, kv_pos, symmetric=True))
    qb, kvb = q.bfloat16(), kv.bfloat16()
    out = attend(qb, kvb, kvb, q_pos=q_pos, kv_pos=kv_pos, encoding=ALiBi(4, symmetric=True), backend="dense")
    input_error = (kvb.double() - kv.double()).abs().max().item()
    assert (out.double() - expected).abs().max().item() < 3 * input_error


# ---- relative biases of the sequence issue: every applicable path vs the float64 reference ----------

from posenc.seq.cape import CAPE  # noqa: E402
from posenc.seq.cope import CoPE  # noqa: E402
from posenc.seq.fire import FIRE  # noqa: E402
from posenc.seq.kerple import KERPLE  # noqa: E402
from posenc.seq.shaw import ShawRelative  # noqa: E402
from posenc.seq.t5 import T5Bias  # noqa: E402
from posenc.seq.deberta import DeBERTa  # noqa: E402
from posenc.seq.transformer_xl import TransformerXLRelative  # noqa: E402
from posenc.timeseries.erpe_vector import ERPEVector  # noqa: E402

TXL_DIM = 16


def _relative_encoding(kind: str, case: Case):
    torch.manual_seed(1)
    if kind == "t5":
        enc = T5Bias(H, num_buckets=8, max_distance=6, bidirectional=not case.causal)
        with torch.no_grad():
            enc.table.normal_(0, 0.5)
    elif kind.startswith("shaw"):
        enc = ShawRelative(D, max_relative=3, values=kind == "shaw")
    elif kind == "transformer_xl":
        enc = TransformerXLRelative(TXL_DIM, H, D)
        with torch.no_grad():
            enc.u.normal_(0, 0.5)
            enc.v.normal_(0, 0.5)
    elif kind.startswith("kerple"):
        enc = KERPLE(H, variant=kind.split("_")[1], symmetric=not case.causal)
    elif kind == "fire":
        enc = FIRE(H, mlp_width=6, init_threshold=4.0)  # a threshold inside the test lengths
    elif kind == "cape":
        enc = CAPE(16, H, 16, base="alibi", hidden=5, base_options={"symmetric": not case.causal})
    elif kind == "cape_kerple":  # a learned base: its gradient goes through the static bias
        enc = CAPE(16, H, 16, base="kerple", hidden=5, base_options={"symmetric": not case.causal})
    elif kind == "cape_fire":
        enc = CAPE(16, H, 16, base="fire", hidden=5, base_options={"mlp_width": 6, "init_threshold": 4.0})
    elif kind.startswith("cope"):
        # small table: the clamp is exercised; wide: a table longer than any chunk's keys (rows
        # past them are never read and get no gradient)
        enc = CoPE(D, max_len=12, npos_max=40 if kind == "cope_wide" else 5)
        with torch.no_grad():
            enc.pos_emb.normal_(0, 1.0)
    elif kind.startswith("deberta"):
        enc = DeBERTa(16, H, D, span=3 if kind == "deberta" else 4, log_buckets=kind == "deberta_log", max_position=9)
        with torch.no_grad():
            enc.rel.normal_(0, 0.5)
    elif kind == "erpe_vector":
        enc = ERPEVector(H, D, max_len=16, per_head=True, scale=0.4)
    elif kind == "erpe":
        enc = ERPE(H, max_len=16)
        with torch.no_grad():
            enc.weight.normal_(0, 0.3)
    else:
        raise AssertionError(kind)
    return enc.double()


def _relative_reference(kind, enc, case, q, k, v):
    q_pos, kv_pos = case.positions()
    allowed = case.allowed()
    if kind == "t5":
        bias = ref.t5_bias(enc.table, q_pos, kv_pos, bidirectional=enc.bidirectional, num_buckets=8, max_distance=6)
        return ref.attention(q, k, v, allowed, score_bias=bias)
    if kind.startswith("shaw"):
        return ref.shaw_attention(q, k, v, allowed, enc.key_table, enc.value_table, 3, q_pos, kv_pos)
    if kind == "transformer_xl":
        scores = ref.transformer_xl_scores(q, k, enc.u, enc.v, enc.r_proj.weight, TXL_DIM, q_pos, kv_pos)
        return ref.attention_from_scores(scores, v, allowed)
    if kind.startswith("kerple"):
        bias = ref.kerple_bias(enc.r1, enc.r2, enc.variant, q_pos, kv_pos)
        return ref.attention(q, k, v, allowed, score_bias=bias)
    if kind == "fire":
        m = enc.mlp
        bias = ref.fire_bias(enc.c, enc.threshold, m[0].weight, m[0].bias, m[2].weight, m[2].bias, q_pos, kv_pos)
        return ref.attention(q, k, v, allowed, score_bias=bias)
    if kind.startswith("cape"):
        if kind == "cape":
            static = ref.alibi_bias(ALIBI_SLOPES_4, q_pos, kv_pos, symmetric=not case.causal)
        elif kind == "cape_kerple":
            static = ref.kerple_bias(enc.base.r1, enc.base.r2, enc.base.variant, q_pos, kv_pos)
        else:
            f = enc.base.mlp
            static = ref.fire_bias(enc.base.c, enc.base.threshold, f[0].weight, f[0].bias, f[2].weight, f[2].bias,
                                   q_pos, kv_pos)
        m = enc.mlp
        scores = ref.cape_scores(ref.content_scores(q, k), static, m[0].weight, m[0].bias, m[2].weight, m[2].bias)
        return ref.attention_from_scores(scores, v, allowed)
    if kind.startswith("cope"):
        scores = ref.cope_scores(ref.content_scores(q, k), q, enc.pos_emb, allowed, enc.npos_max)
        return ref.attention_from_scores(scores, v, allowed)
    if kind.startswith("deberta"):
        scores = ref.deberta_scores(q, k, enc.rel, enc.pos_q.weight, enc.pos_k.weight, enc.span, enc.log_buckets,
                                    enc.max_position, q_pos, kv_pos)
        return ref.attention_from_scores(scores, v, allowed)
    if kind == "erpe_vector":
        bias = ref.vector_erpe_bias(q, enc.weight, q_pos, kv_pos, 16, 0.4)
        return ref.attention(q, k, v, allowed, score_bias=bias)
    if kind == "erpe":
        return ref.attention(q, k, v, allowed, prob_bias=ref.erpe_bias(enc.weight, q_pos, kv_pos, 16))
    raise AssertionError(kind)


RELATIVE_BACKENDS = {
    "t5": ["auto", "dense", "flex", "math"],
    # the value term: fused (dense) for causal attention over consecutive positions, else math
    "shaw": ["auto", "dense", "math"],
    "shaw_keys": ["auto", "dense", "flex", "math"],
    "transformer_xl": ["auto", "dense", "flex", "math"],  # QK + SCORE_BIAS hooks together
    "kerple_log": ["auto", "dense", "flex", "math"],
    "kerple_power": ["auto", "dense", "flex", "math"],
    "fire": ["auto", "dense", "flex", "math"],
    "cape": ["auto", "math"],  # needs the score matrix
    "cape_kerple": ["math"],
    "cape_fire": ["math"],
    "cope": ["auto", "math"],
    "cope_wide": ["auto", "math"],
    "deberta": ["auto", "dense", "flex", "math"],
    "deberta_log": ["auto", "dense", "math"],
    "erpe_vector": ["auto", "dense", "flex", "math"],
    "erpe": ["auto", "dense", "math"],
}
CAUSAL_ONLY_KINDS = {"fire", "cope", "cope_wide", "cape_fire"}
# biases with a reduction per element (PairwiseBias.pointwise False): eager flex on the CPU, dense on CUDA
NOT_POINTWISE_KINDS = {"transformer_xl", "fire", "deberta", "erpe_vector"}
RELATIVE_PARAMS = [
    (kind, backend, case)
    for kind, bs in RELATIVE_BACKENDS.items()
    for backend in bs
    for case in CASES
    if case.causal or kind not in CAUSAL_ONLY_KINDS
]


@pytest.mark.parametrize(
    "kind,backend,case", RELATIVE_PARAMS, ids=[f"{k}-{b}-{c.name}" for k, b, c in RELATIVE_PARAMS]
)
def test_relative_encoding_path_matches_float64_reference(kind, backend, case):
    """Forward, and backward to q, k, v and every learned parameter of the encoding (flex: forward)."""
    enc = _relative_encoding(kind, case)
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen, requires_grad=True)
    q_pos, kv_pos = case.positions()
    expected = _relative_reference(kind, enc, case, q, k, v)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    forward_only = backend == "flex"
    if kind == "shaw" and backend == "dense" and not _consecutive_causal(case, q_pos, kv_pos):
        with pytest.raises(ValueError, match="needs the attention probabilities"):
            attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend=backend)
        return
    with torch.set_grad_enabled(not forward_only):
        out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend=backend)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected.detach(), rtol=1e-7, atol=1e-9)
    if forward_only:
        return
    names = ["q", "k", "v"] + [n for n, _ in enc.named_parameters()]
    params = [q, k, v] + list(enc.parameters())
    got = torch.autograd.grad(out, params, grad, allow_unused=True)
    want = torch.autograd.grad(expected, params, grad, allow_unused=True)
    for name, g, w in zip(names, got, want):
        assert w is not None, f"the reference does not reach {name}"
        assert g is not None, f"no gradient reaches {name}"
        assert not g.isnan().any(), name
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-9, msg=lambda m: f"grad {name}: {m}")


NO_GRAD_PARAMS = [(kind, case) for kind in ("cape", "cope", "cope_wide") for case in CASES
                  if case.causal or kind not in CAUSAL_ONLY_KINDS]


@pytest.mark.parametrize("kind,case", NO_GRAD_PARAMS, ids=[f"{k}-{c.name}" for k, c in NO_GRAD_PARAMS])
def test_score_transform_without_gradients_matches_float64_reference(kind, case):
    """Without gradients a one-chunk call (a decoding step) runs the chunk directly, not through the
    autograd Function: the same forward as the reference, and as the Function's."""
    enc = _relative_encoding(kind, case)
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen)
    q_pos, kv_pos = case.positions()
    expected = _relative_reference(kind, enc, case, q, k, v)
    with torch.no_grad():
        out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(), backend="math")
    torch.testing.assert_close(out, expected, rtol=1e-7, atol=1e-9)
    with_grad = attend(q.requires_grad_(), k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=enc, mask=case.mask(),
                       backend="math")
    torch.testing.assert_close(out, with_grad.detach(), rtol=0, atol=1e-12)


CUDA_RELATIVE_PARAMS = RELATIVE_PARAMS if torch.cuda.is_available() else []


@pytest.mark.parametrize(
    "kind,backend,case", CUDA_RELATIVE_PARAMS, ids=[f"cuda-{k}-{b}-{c.name}" for k, b, c in CUDA_RELATIVE_PARAMS]
)
def test_cuda_relative_encoding_path_matches_float64_reference(kind, backend, case):
    """On CUDA (scripts/gpu_checks.sh): every relative encoding on every path it takes, flex
    forward and backward included, against the float64 reference, gradients to the parameters too."""
    dev = torch.device("cuda")
    enc = _relative_encoding(kind, case)
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(case, gen, requires_grad=True)
    q_pos, kv_pos = case.positions()
    expected = _relative_reference(kind, enc, case, q, k, v)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    params = [q, k, v] + list(enc.parameters())
    want = torch.autograd.grad(expected, params, grad, allow_unused=True)
    enc_dev = enc.float().to(dev)
    qc, kc, vc = (t.detach().float().to(dev).requires_grad_() for t in (q, k, v))
    mask = _mask_on(case, dev)
    if kind == "shaw" and backend == "dense" and not _consecutive_causal(case, q_pos, kv_pos):
        return  # refused on every device; the CPU test checks the message
    if backend == "flex" and kind in NOT_POINTWISE_KINDS:  # compiled flex cannot hold their reductions
        with pytest.raises(ValueError, match="backend='flex' cannot serve this call"):
            attend(qc, kc, vc, q_pos=q_pos.to(dev), kv_pos=kv_pos.to(dev), encoding=enc_dev, mask=mask, backend=backend)
        return
    out = attend(qc, kc, vc, q_pos=q_pos.to(dev), kv_pos=kv_pos.to(dev), encoding=enc_dev, mask=mask, backend=backend)
    torch.testing.assert_close(out.double().cpu(), expected.detach(), rtol=2e-3, atol=2e-3)
    got = torch.autograd.grad(out, [qc, kc, vc] + list(enc_dev.parameters()), grad.float().to(dev), allow_unused=True)
    names = ["q", "k", "v"] + [n for n, _ in enc.named_parameters()]
    for name, g, w in zip(names, got, want):
        assert g is not None and torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double().cpu(), w, rtol=5e-3, atol=5e-3, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("table_heads", [3, 1])
def test_rows_times_table_equals_the_broadcast_matmul_with_gradients(table_heads):
    from posenc.common.pairwise import rows_times_table

    gen = torch.Generator().manual_seed(3)
    # rows as a chunk of a transposed view, the way the dense blocks read them
    full = torch.randn(2, 7, 3, 5, generator=gen, dtype=torch.float64).transpose(1, 2)  # [B, H, T, d]
    rows = full[:, :, 2:6].detach().requires_grad_()
    table = torch.randn(table_heads, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    out = rows_times_table(rows, table)
    assert out.shape == (2, 3, 4, 4)
    torch.testing.assert_close(out, torch.matmul(rows, table), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(rows_times_table, (rows, table))


@pytest.mark.parametrize("vector_shape", [(2, 3, 5), (3, 5), (5,)])
def test_matvec_equals_the_matrix_times_a_column_with_gradients(vector_shape):
    from posenc.common.pairwise import matvec

    gen = torch.Generator().manual_seed(4)
    matrix = torch.randn(2, 7, 3, 5, generator=gen, dtype=torch.float64).transpose(1, 2)  # [B, H, n, d], a view
    matrix = matrix.detach().requires_grad_()
    vector = torch.randn(*vector_shape, generator=gen, dtype=torch.float64, requires_grad=True)  # broadcast batch axes
    out = matvec(matrix, vector)
    assert out.shape == (2, 3, 7)
    torch.testing.assert_close(out, torch.matmul(matrix, vector.unsqueeze(-1)).squeeze(-1), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(matvec, (matrix, vector))


@pytest.mark.parametrize("sizes", [[5, 5, 5], [3, 7, 1, 4], [6], [2, 3, 2]])
def test_packed_segments_attend_per_run_as_the_dense_mask(sizes):
    """A packed row of contiguous segments (a PyG batch) runs SDPA per run (one batched call when
    every run has one length); values and gradients equal the masked float64 reference. Ids that
    come back after another segment ([0, 0, 1, 1, 0]) are not runs: the dense mask serves them."""
    from posenc.common.kernels import sdpa_path

    torch.manual_seed(0)
    ids = [0, 1, 0] if sizes == [2, 3, 2] else list(range(len(sizes)))
    seg = torch.cat([torch.full((n,), i) for i, n in zip(ids, sizes)])[None]
    t = seg.shape[1]
    q, k, v = (torch.randn(1, 2, t, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = AttentionMask.packed(seg)
    runs = mask.packed_runs(1, t, t)
    if sizes == [2, 3, 2]:
        assert runs is None
    else:
        assert runs == [(a, a + n) for a, n in zip([sum(sizes[:i]) for i in range(len(sizes))], sizes)]
    out = sdpa_path(q, k, v, mask, 0.5)
    allowed = seg[0][:, None] == seg[0][None, :]
    ref = torch.softmax((q @ k.transpose(-1, -2) * 0.5).masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


class RowConstantTransform(posenc.PositionEncoding):
    """A score transform that drops the scores: ``w * q_i[0]`` on every key of row ``i``. Each row's
    softmax is then uniform over its visible keys, whatever ``q``, ``k`` and ``w``."""

    hooks = frozenset({posenc.Hook.SCORE_BIAS})
    needs_scores = True

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.7, dtype=torch.float64))

    def transform_scores(self, scores, q, k, q_pos, kv_pos, allowed):
        return torch.zeros_like(scores) + self.w * q[..., :1]


def test_math_path_takes_a_transform_that_drops_the_scores():
    """The chunked transform backward when the transform's result does not depend on ``q.k``:
    uniform attention over the visible keys (the running mean of v), zero gradient to q, k and w."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, 12, D, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    enc = RowConstantTransform()
    pos = torch.arange(12)[None]
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=AttentionMask(causal=True), backend="math")
    expected = v.cumsum(2) / torch.arange(1, 13, dtype=torch.float64)[:, None]
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    grads = torch.autograd.grad(out, [q, k, v, enc.w], torch.randn(out.shape, dtype=torch.float64, generator=gen))
    for name, g in zip(["q", "k", "w"], [grads[0], grads[1], grads[3]]):
        torch.testing.assert_close(g, torch.zeros_like(g), atol=1e-12, rtol=0, msg=lambda m: f"grad {name}: {m}")
    assert grads[2].abs().sum() > 0


def test_masked_softmax_is_zero_outside_the_mask_and_refuses_what_does_not_fit():
    scores = torch.tensor([[[[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]]]])  # [1, 1, 2, 3]
    allowed = torch.tensor([[[[True, True, False], [False, False, False]]]])
    probs = kernels.masked_softmax(scores, allowed)
    torch.testing.assert_close(probs[0, 0, 0], torch.tensor([1.0, torch.e, 0.0]) / (1 + torch.e))
    assert torch.equal(probs[0, 0, 1], torch.zeros(3))  # a row that sees no key
    with pytest.raises(TypeError, match="scores must be a floating-point tensor; got dtype torch.int64"):
        kernels.masked_softmax(torch.zeros(1, 1, 2, 3, dtype=torch.long), None)
    with pytest.raises(ValueError, match=r"allowed must be None or a bool mask that broadcasts to scores \(1, 1, 2, 3\)"):
        kernels.masked_softmax(scores, allowed.float())
    with pytest.raises(ValueError, match=r"broadcasts to scores .*; got torch.bool \(1, 2, 2, 3\)"):
        kernels.masked_softmax(scores, allowed.expand(1, 2, 2, 3))
