"""posenc inside AttentionSmithy (issue 22): equivalence in float64, conventions (hostile input: test_integration_smithy_hostile.py).

* An AttentionSmithy encoder-decoder built with ``PosencAttentionMethod`` equals the same model
  with its ``StandardAttentionMethod`` (padding masks, causal masking, cross attention), forward
  and gradients, with no encoding and with AttentionSmithy's sinusoidal, rotary and ALiBi.
* Every encoding :func:`strategies` covers, through AttentionSmithy's ``MultiheadAttention`` and
  ``StandardAttentionMethod``, equals posenc's ``MultiheadAttention`` on the same weights
  (forward and gradients, the encoding's parameters included).
* The encodings no strategy can express equal posenc's attention through ``PosencAttentionMethod``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("attention_smithy")

from attention_smithy.attention import StandardAttentionMethod  # noqa: E402
from attention_smithy.components import (  # noqa: E402
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForwardNetwork,
    MultiheadAttention,
)
from attention_smithy.numeric_embeddings import (  # noqa: E402
    ALiBiPositionEmbedding,
    NumericEmbeddingManager,
    RotaryPositionEmbedding,
    SinusoidalPositionEmbedding,
)

import posenc  # noqa: E402
from posenc.common.attention import attend  # noqa: E402
from posenc.common.masks import AttentionMask  # noqa: E402
from posenc.common.registry import available, get  # noqa: E402
from posenc.integrations.attention_smithy import (  # noqa: E402
    PosencAttentionMethod,
    PosencInputStrategy,
    expressible,
    smithy_alibi_slopes,
    strategies,
)

ROOT = Path(__file__).resolve().parents[1]
B, H, D = 2, 2, 16  # head_dim 16: sqrt(D) is exact in AttentionSmithy's float32 scale too
C = H * D
MAX_LEN = 16


def _build(name: str, **options) -> posenc.PositionEncoding:
    params = inspect.signature(get(name).cls.__init__).parameters
    sizes = {"dim": C, "num_heads": H, "head_dim": D, "max_len": MAX_LEN}
    return posenc.build(name, **{k: v for k, v in sizes.items() if k in params}, **options)


# --- an AttentionSmithy encoder-decoder, with either method -----------------------------------


class Seq2Seq(torch.nn.Module):
    """Token embeddings + manager's input term, AttentionSmithy Encoder and Decoder, a head."""

    def __init__(self, manager: NumericEmbeddingManager, vocab: int = 11) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, C)
        self.manager = manager
        ffn = FeedForwardNetwork(C, 2 * C, "gelu", dropout=0.0)  # its default is 0.1
        enc_layer = EncoderLayer(C, MultiheadAttention(C, H, StandardAttentionMethod()), ffn, 0.0)
        dec_layer = DecoderLayer(C, MultiheadAttention(C, H, StandardAttentionMethod(is_causal_masking=True)),
                                 MultiheadAttention(C, H, StandardAttentionMethod()), ffn, 0.0)
        self.encoder, self.decoder = Encoder(enc_layer, 2), Decoder(dec_layer, 2)
        self.head = torch.nn.Linear(C, vocab)

    def _embed(self, tokens):
        x = self.embed(tokens)
        return x + self.manager.create_positional_or_custom_embedding(token_embedding=x)

    def forward(self, src, tgt, src_mask, tgt_mask):
        memory = self.encoder(self._embed(src), src_padding_mask=src_mask, numeric_embedding_manager=self.manager)
        out = self.decoder(self._embed(tgt), memory, tgt_padding_mask=tgt_mask, src_padding_mask=src_mask,
                           numeric_embedding_manager=self.manager)
        return self.head(out)


def _swap_methods(model: torch.nn.Module) -> None:
    """Every StandardAttentionMethod of ``model`` becomes a PosencAttentionMethod (same flags)."""
    for module in model.modules():
        if isinstance(module, MultiheadAttention):
            old = module.attention_method
            module.attention_method = PosencAttentionMethod(is_causal_masking=old.is_causal_masking)


SMITHY_ENCODINGS = {
    "none": lambda: [],
    "sinusoidal": lambda: [SinusoidalPositionEmbedding(C)],
    "rope": lambda: [RotaryPositionEmbedding(D)],
    "alibi": lambda: [ALiBiPositionEmbedding(H)],
}


@pytest.mark.parametrize("name", list(SMITHY_ENCODINGS))
def test_encoder_decoder_with_posenc_method_equals_standard_method_float64(name):
    torch.manual_seed(0)
    model = Seq2Seq(NumericEmbeddingManager(SMITHY_ENCODINGS[name]())).double()
    ours = copy.deepcopy(model)
    _swap_methods(ours)
    assert sum(isinstance(m, PosencAttentionMethod) for m in ours.modules()) == 6
    src, tgt = torch.randint(0, 11, (B, 7)), torch.randint(0, 11, (B, 5))
    src_mask = torch.ones(B, 7, dtype=torch.long)
    src_mask[0, 5:] = 0  # padding at the end of the first source
    tgt_mask = torch.ones(B, 5, dtype=torch.long)
    tgt_mask[1, 4:] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AttentionSmithy's ALiBi warns in cross attention (Tq != Tk)
        ref = model(src, tgt, src_mask, tgt_mask)
        out = ours(src, tgt, src_mask, tgt_mask)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(ref)
    ref.backward(grad)
    out.backward(grad)
    named = dict(ours.named_parameters())
    for pname, p in model.named_parameters():
        torch.testing.assert_close(named[pname].grad, p.grad, rtol=1e-9, atol=1e-10, msg=pname)


def test_the_swap_changes_something_a_wrong_mask_would_show():
    """The equivalence above fails when the padding mask is ignored (the test can fail)."""
    torch.manual_seed(0)
    model = Seq2Seq(NumericEmbeddingManager([])).double()
    src, tgt = torch.randint(0, 11, (B, 7)), torch.randint(0, 11, (B, 5))
    src_mask = torch.ones(B, 7, dtype=torch.long)
    src_mask[0, 3:] = 0
    full = model(src, tgt, None, None)
    assert not torch.allclose(model(src, tgt, src_mask, None), full)


# --- every strategy equals posenc's own attention ----------------------------------------------


def _strategy_encodings() -> list[str]:
    """The 1D encodings with an attention hook that the strategies express."""
    names = []
    for info in available():
        if info.modality in ("seq", "timeseries"):
            enc = _build(info.name)
            if expressible(enc) is None and enc.hooks - {posenc.Hook.INPUT}:
                names.append(info.name)
    return names


STRATEGY_ATTENTION = _strategy_encodings()
NOT_EXPRESSIBLE = ["erpe", "shaw", "transformer_xl", "deberta", "cape", "cope"]


def test_the_strategy_set_is_the_expected_one():
    assert set(STRATEGY_ATTENTION) >= {"alibi", "t5", "kerple", "fire", "tupe", "xpos", "erpe_vector", "rope",
                                        "rope_linear", "rope_ntk", "rope_dynamic_ntk", "rope_yarn", "rope_llama3",
                                        "rope_longrope"}
    assert not set(STRATEGY_ATTENTION) & set(NOT_EXPRESSIBLE)


def _pair(encoding, method_encoding=None, causal=False):
    """An AttentionSmithy MHA and a posenc MHA with the same projection weights (float64)."""
    smithy = MultiheadAttention(C, H, PosencAttentionMethod(method_encoding, is_causal_masking=causal)
                                if method_encoding is not None else StandardAttentionMethod(is_causal_masking=causal))
    ours = posenc.MultiheadAttention(C, H, encoding=encoding)
    with torch.no_grad():
        for mine, theirs in (("q_proj", "query_weights"), ("k_proj", "key_weights"), ("v_proj", "value_weights"),
                             ("out_proj", "out_weights")):
            getattr(ours, mine).weight.copy_(getattr(smithy, theirs).weight)
            getattr(ours, mine).bias.copy_(getattr(smithy, theirs).bias)
    return smithy.double(), ours.double()


def _perturb(module: torch.nn.Module) -> None:
    """Move learned parameters off their initial values (zero-initialised tables would hide errors)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))


def _compare(name, smithy_forward, ours_forward, smithy_params, ours_params, x):
    out_s = smithy_forward(x)
    x2 = x.detach().clone().requires_grad_(True)
    out_o = ours_forward(x2)
    torch.testing.assert_close(out_s, out_o, rtol=1e-9, atol=1e-10, msg=name)
    grad = torch.randn_like(out_s)
    out_s.backward(grad)
    out_o.backward(grad)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-8, atol=1e-9, msg=name)
    for ps, po in zip(smithy_params, ours_params):
        torch.testing.assert_close(ps.grad, po.grad, rtol=1e-8, atol=1e-9, msg=name)


@pytest.mark.parametrize("name", STRATEGY_ATTENTION)
def test_each_strategy_through_standard_method_equals_posenc_attention(name):
    torch.manual_seed(1)
    options = {"bidirectional": True} if name == "t5" else {}
    enc = _build(name, **options).double()
    _perturb(enc)
    causal = enc.causal_only
    manager = NumericEmbeddingManager(strategies(enc))
    ours_enc = copy.deepcopy(enc)
    smithy, ours = _pair(ours_enc, causal=causal)
    x = torch.randn(B, 9, C, dtype=torch.float64, requires_grad=True)
    mask = AttentionMask(causal=True) if causal else None
    _compare(name, lambda t: smithy(t, t, t, manager, padding_and_loss_attention_mask=None)[0],
             lambda t: ours(t, mask=mask), list(enc.parameters()), list(ours_enc.parameters()), x)


@pytest.mark.parametrize("name", STRATEGY_ATTENTION + NOT_EXPRESSIBLE)
def test_posenc_method_holding_the_encoding_equals_posenc_attention(name):
    torch.manual_seed(2)
    enc = _build(name).double()
    _perturb(enc)
    causal = enc.causal_only
    ours_enc = copy.deepcopy(enc)
    smithy, ours = _pair(ours_enc, method_encoding=enc, causal=causal)
    x = torch.randn(B, 9, C, dtype=torch.float64, requires_grad=True)
    padding = torch.ones(B, 9, dtype=torch.long)
    padding[1, 7:] = 0
    mask = AttentionMask(causal=causal, key_valid=padding.bool())
    _compare(name, lambda t: smithy(t, t, t, NumericEmbeddingManager([]), padding_and_loss_attention_mask=padding)[0],
             lambda t: ours(t, mask=mask), list(enc.parameters()), list(ours_enc.parameters()), x)


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "tape"])
def test_input_strategies_add_the_encodings_term(name):
    enc = _build(name).double()
    (strategy,) = strategies(enc)
    assert isinstance(strategy, PosencInputStrategy)
    x = torch.randn(B, 9, C, dtype=torch.float64)
    term = NumericEmbeddingManager([strategy]).create_positional_or_custom_embedding(token_embedding=x)
    torch.testing.assert_close(x + term, enc.encode_input(x, torch.arange(9).unsqueeze(0)), rtol=0, atol=1e-12)


def test_strategies_hold_the_encoding_so_its_parameters_train():
    (strategy,) = strategies("t5", num_heads=H)
    manager = NumericEmbeddingManager([strategy])
    assert any(p is q for p in manager.parameters() for q in strategy.encoding.parameters())
    q = torch.randn(1, H, 4, D)
    manager.create_bias_tensor(attention_score_matrix=torch.zeros(1, H, 4, 4), query=q, key=q).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in strategy.encoding.parameters())


# --- conventions -------------------------------------------------------------------------------


def test_rope_conventions():
    x = torch.randn(2, 3, 6, 16)
    (smithy,) = strategies("rope", options={"head_dim": 16}, convention="attention_smithy")
    (canonical,) = strategies("rope", options={"head_dim": 16})
    assert smithy.encoding.pairing == "interleaved" and canonical.encoding.pairing == "half_split"
    theirs = RotaryPositionEmbedding(16).modify_matrix(x)
    torch.testing.assert_close(smithy.modify_matrix(x), theirs, rtol=1e-5, atol=1e-5)  # theirs: float32 frequencies
    assert not torch.allclose(canonical.modify_matrix(x), theirs, atol=1e-3)


@pytest.mark.parametrize("heads, degree", [(4, 2.0), (3, 4.0), (8, 2.0)])
def test_alibi_smithy_convention_equals_attention_smithy(heads, degree):
    (strategy,) = strategies("alibi", num_heads=heads, convention="attention_smithy", slope_degree=degree)
    q, k = torch.randn(1, heads, 5, 4), torch.randn(1, heads, 5, 4)
    theirs = ALiBiPositionEmbedding(heads, slope_degree=int(degree))(query=q, key=k)
    torch.testing.assert_close(strategy.create_bias_tensor(query=q, key=k)[0], theirs)
    k_cross = torch.randn(1, heads, 7, 4)
    assert torch.equal(strategy(q, k_cross), torch.zeros(1, heads, 5, 7))  # no bias in cross attention, as theirs
    (crossing,) = strategies("alibi", num_heads=heads, convention="attention_smithy", slope_degree=degree,
                             allow_cross_attention=True)
    theirs = ALiBiPositionEmbedding(heads, slope_degree=int(degree), allow_cross_attention=True)(query=q, key=k_cross)
    torch.testing.assert_close(crossing(q, k_cross)[0], theirs)


def test_alibi_posenc_convention_is_the_papers_causal_form():
    (strategy,) = strategies("alibi", num_heads=8)
    q = torch.randn(1, 8, 4, 4)
    bias = strategy(q, q)[0]
    slopes = torch.tensor([2.0 ** (-8 * h / 8) for h in range(1, 9)])
    assert torch.equal(smithy_alibi_slopes(8), slopes)  # H = 8, degree 2: the two formulas agree
    torch.testing.assert_close(bias[:, 3, 1], -2 * slopes)
    assert torch.isinf(bias[:, 1, 3]).all() and (bias[:, 1, 3] < 0).all()  # keys after the query: -inf
    slopes4 = torch.tensor([2.0 ** (-8 * h / 4) for h in range(1, 5)])
    (four,) = strategies("alibi", num_heads=4)
    torch.testing.assert_close(four(q[:, :4], q[:, :4])[0][:, 2, 0], -2 * slopes4)
    assert not torch.allclose(smithy_alibi_slopes(4), slopes4)


def test_sinusoidal_conventions():
    x = torch.randn(2, 30, 10)
    (smithy,) = strategies("sinusoidal", dim=10, convention="attention_smithy")
    (canonical,) = strategies("sinusoidal", dim=10)
    assert torch.equal(smithy(x)[0], SinusoidalPositionEmbedding(10)(x))  # bit for bit: float32 angles
    torch.testing.assert_close(canonical(x)[0], SinusoidalPositionEmbedding(10)(x), rtol=0, atol=1e-4)
    (learned,) = strategies("learned", dim=64, max_len=512, convention="attention_smithy")
    assert 0.9 < learned.encoding.table.std().item() < 1.1  # nn.Embedding's init, as AttentionSmithy's table
    (learned,) = strategies("learned", dim=64, max_len=512)
    assert 0.015 < learned.encoding.table.std().item() < 0.025


# --- positions and cross attention ------------------------------------------------------------


def test_custom_positions_follow_attention_smithys_kwargs():
    torch.manual_seed(3)
    enc = _build("t5", bidirectional=True).double()
    _perturb(enc)
    (strategy,) = strategies(enc, positions="custom")
    q, k = torch.randn(B, H, 5, D, dtype=torch.float64), torch.randn(B, H, 5, D, dtype=torch.float64)
    qp = torch.tensor([[0, 2, 4, 6, 8], [1, 2, 3, 5, 8]])
    kp = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    bias = strategy.create_bias_tensor(query=q, key=k, alibi_query_values=qp, alibi_key_values=kp)
    idx = torch.arange(5)
    ref = enc.score_bias(q, k, qp, kp).dense(B, H, idx, idx)
    torch.testing.assert_close(bias, ref)
    with pytest.raises(ValueError, match="alibi_query_values"):
        strategy.create_bias_tensor(query=q, key=k)
    (rope,) = strategies("rope", options={"head_dim": D}, positions="custom")
    shifted = rope.modify_matrix(q, rotary_custom_values=torch.arange(5) + 3)
    torch.testing.assert_close(shifted, rope.encoding.transform_qk(q, q, (torch.arange(5) + 3)[None], (torch.arange(5) + 3)[None])[0])


def test_cross_attention_bias_is_off_unless_allowed():
    q, k = torch.randn(1, H, 3, D), torch.randn(1, H, 6, D)
    (off,) = strategies("t5", num_heads=H)
    (on,) = strategies("t5", num_heads=H, allow_cross_attention=True)
    _perturb(on)
    assert torch.equal(off(q, k), torch.zeros(1, H, 3, 6))
    bias = on(q, k)
    idx_q, idx_k = torch.arange(3), torch.arange(6)
    torch.testing.assert_close(bias, on.encoding.score_bias(q, k, idx_q[None], idx_k[None]).dense(1, H, idx_q, idx_k))
    assert bias.abs().sum() > 0


def test_posenc_method_reads_q_pos_and_kv_pos_kwargs():
    torch.manual_seed(4)
    enc = _build("rope").double()
    method = PosencAttentionMethod(enc)
    q, k, v = (torch.randn(B, H, 5, D, dtype=torch.float64) for _ in range(3))
    pos = torch.tensor([[3, 5, 7, 9, 11]])
    out, none = method(q, k, v, None, None, q_pos=pos, kv_pos=pos)
    assert none is None
    torch.testing.assert_close(out, attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc))
    assert not torch.allclose(out, method(q, k, v, None, None)[0])


def test_posenc_method_gives_self_attention_one_position_tensor(monkeypatch):
    """As posenc's MultiheadAttention: the encoding reads the positions once (RoPE's cos/sin
    tables are computed once, not for the queries and again for the keys)."""
    enc = _build("rope").double()
    seen = []
    original = type(enc).transform_qk

    def spy(self, q, k, q_pos, kv_pos):
        seen.append(kv_pos is q_pos)
        return original(self, q, k, q_pos, kv_pos)

    monkeypatch.setattr(type(enc), "transform_qk", spy)
    q, k, v = (torch.randn(B, H, 5, D, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(5)[None]
    want = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=AttentionMask(causal=True))
    seen.clear()
    out, _ = PosencAttentionMethod(enc, is_causal_masking=True)(q, k, v, None, None)
    torch.testing.assert_close(out, want)
    PosencAttentionMethod(enc)(q, k[:, :, :3], v[:, :, :3], None, None)  # cross attention: two tensors
    assert seen == [True, False]


# --- probabilities and dropout ------------------------------------------------------------------


def test_probabilities_only_when_asked_and_equal_to_the_standard_methods():
    torch.manual_seed(5)
    q, k, v = (torch.randn(B, H, 6, D, dtype=torch.float64) for _ in range(3))
    padding = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    manager = NumericEmbeddingManager([ALiBiPositionEmbedding(H)])
    ref_out, ref_probs = StandardAttentionMethod(is_causal_masking=True)(q, k, v, manager, padding)
    out, probs = PosencAttentionMethod(is_causal_masking=True, return_probabilities=True)(q, k, v, manager, padding)
    torch.testing.assert_close(probs, ref_probs)
    torch.testing.assert_close(out, ref_out)
    fast, none = PosencAttentionMethod(is_causal_masking=True)(q, k, v, manager, padding)
    assert none is None
    torch.testing.assert_close(fast, ref_out)


def test_dropout_only_in_training():
    torch.manual_seed(6)
    q, k, v = (torch.randn(B, H, 8, D, dtype=torch.float64) for _ in range(3))
    method = PosencAttentionMethod(dropout=0.5)
    plain = PosencAttentionMethod()(q, k, v, None)[0]
    method.eval()
    torch.testing.assert_close(method(q, k, v, None)[0], plain)
    method.train()
    torch.manual_seed(7)
    out, probs = method(q, k, v, None)
    assert probs is None and not torch.allclose(out, plain)
    torch.manual_seed(7)
    _, dropped = PosencAttentionMethod(dropout=0.5, return_probabilities=True).train()(q, k, v, None)
    assert ((dropped == 0).float().mean() > 0.3) and torch.allclose(dropped.sum(-1).mean(), torch.tensor(1.0, dtype=torch.float64), atol=0.2)


# --- the recipe and the example ------------------------------------------------------------------


def test_the_readme_recipe_runs():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use posenc inside AttentionSmithy", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md (AttentionSmithy)", "exec"), {})


def test_the_copy_task_example_trains_at_a_tiny_size(capsys):
    spec = importlib.util.spec_from_file_location("smithy_copy_task", ROOT / "examples" / "smithy_copy_task.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    curves = example.main(["--steps", "6", "--eval-every", "3", "--dim", "16", "--heads", "2", "--length", "5",
                           "--batch", "8", "--layers", "1"])
    assert set(curves) == {"t5", "fire", "kerple", "smithy rope"}
    for losses in curves.values():
        assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    text = capsys.readouterr().out
    assert "t5" in text and "smithy rope" in text and "step" in text
    with pytest.raises(SystemExit):
        example.main(["--steps", "0"])


# --- the bench's --smithy rows (built and run once; no timing in tests) ---------------------------


def test_bench_smithy_rows_build_run_and_summarise():
    from posenc.cli.bench import smithy_rows
    from posenc.cli.bench.attention import SMITHY_ENCODINGS, AttentionBenchConfig, Candidate, Row, candidates

    config = AttentionBenchConfig(seq_len=8, batch=1, heads=2, head_dim=8, smithy=True)
    names = [c.name for c in candidates(config, [])]
    for enc in SMITHY_ENCODINGS:
        assert {enc, f"attention-smithy {enc}", f"attention-smithy+posenc {enc}"} <= set(names)
    assert not any("linear" in n for n in names)
    x = torch.randn(1, 8, 16)
    for cand in smithy_rows.candidates(16, 2, 8, Candidate, SMITHY_ENCODINGS):
        assert cand.factory()(x).shape == x.shape
    rows = [Row("t5", "posenc", ms=2.0), Row("attention-smithy t5", "attention-smithy", ms=8.0),
            Row("attention-smithy+posenc t5", "attention-smithy+posenc", ms=2.2)]
    (line,) = smithy_rows.summary(rows)
    assert "= 1.10" in line and "= 3.64" in line


def test_bench_smithy_rows_follow_encodings():
    from posenc.cli.bench.attention import AttentionBenchConfig, candidates

    config = AttentionBenchConfig(seq_len=8, batch=1, heads=2, head_dim=8, smithy=True, encodings=("rope", "kerple", "erpe"))
    names = {c.name for c in candidates(config, [])}
    assert {"attention-smithy rope", "attention-smithy kerple"} <= names  # its own rotary; posenc's KERPLE as a strategy
    assert "attention-smithy erpe" not in names  # after the softmax: no strategy reaches it
    assert {f"attention-smithy+posenc {n}" for n in ("rope", "kerple", "erpe")} <= names
    assert not any(n.endswith((" none", " alibi", " t5", " fire")) for n in names)
    x = torch.randn(1, 8, 16)
    for cand in candidates(config, []):
        if cand.name.startswith("attention-smithy"):
            assert cand.factory()(x).shape == x.shape
