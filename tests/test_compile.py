"""torch.compile traces a model with each proving encoding as one graph (no graph breaks),
forward and backward, and gives the eager result; the others compile (with graph breaks) and give
it too."""

from __future__ import annotations

import pytest
import torch

from posenc.cli.bench.models import lm_encoding_names
from posenc.seq.deberta import DeBERTa
from posenc.seq.models import CausalLM
from posenc.seq.transformer_xl import TransformerXLRelative
from posenc.timeseries.erpe_vector import ERPEVector


def _model(encoding: str, depth: int) -> tuple[CausalLM, torch.Tensor]:
    torch.manual_seed(0)
    return CausalLM(64, dim=32, depth=depth, num_heads=4, encoding=encoding, max_len=32), torch.randint(0, 64, (2, 12))


def _assert_compiled_training_matches_eager(model: CausalLM, tokens: torch.Tensor, fullgraph: bool) -> None:
    """One forward and backward compiled against eager: the output and every parameter's gradient."""
    eager = model(tokens)
    eager.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = torch.compile(model, fullgraph=fullgraph)(tokens)
    out.sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        # float32 rounding scales with the tensor: the embedding's gradient (entries up to ~170,
        # sums over every position) differs by 4e-5 where a sum nearly cancels when Transformer-XL's
        # traced form (angle identities) replaces the eager table on AVX2 (7e-14 in float64)
        atol = max(1e-5, 1e-6 * float(grads[name].abs().max()))
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["rope", "alibi", "erpe", "sinusoidal"])
def test_fullgraph_compile_matches_eager(encoding):
    _assert_compiled_training_matches_eager(*_model(encoding, depth=1), fullgraph=True)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["deberta", "transformer_xl", "tupe", "shaw", "erpe_vector"])
def test_shared_gradient_biases_train_under_compile_as_eagerly(encoding):
    """The encodings whose bias blocks read their tables through SharedGradTable compile (with
    graph breaks where they remain) and give the eager values and gradients. Before: DeBERTa,
    Transformer-XL and TUPE raised an internal dynamo error (tracing hashed the half-built frozen
    PairwiseBias), and Shaw and vector eRPE trained with wrong gradients (the shared buffer that
    backward nodes hand on is not replayed by a traced graph)."""
    _assert_compiled_training_matches_eager(*_model(encoding, depth=2), fullgraph=False)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["t5", "kerple", "fire", "learned", "tupe", "shaw", "erpe_vector", "deberta", "transformer_xl"])
def test_trace_whole_and_train_as_eagerly(encoding):
    """These encodings trace as one graph, without gradients and with them, and give the eager
    values and gradients. Before: T5 and KERPLE read their distance range from the positions (six
    graph breaks a block), with gradients every learned bias went through the chunked Function,
    whose backward calls torch.autograd.grad (4.5-7.5 breaks a block); the learned table's and
    TUPE's range checks, Shaw's test of consecutive positions and an unset closure cell in TUPE
    broke the graph 3-7 times a block."""
    model, tokens = _model(encoding, depth=2)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(tokens)
        assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(tokens), model(tokens), rtol=1e-5, atol=1e-5)
    _assert_compiled_training_matches_eager(model, tokens, fullgraph=True)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", [e for e in lm_encoding_names() if e != "none"])
def test_every_lm_encoding_traces_without_a_graph_break(encoding):
    """The graph-break target of the models bench (at most one a block) holds with room for every
    encoding of softmax attention a CausalLM takes: none at all, at inference. Before: LongRoPE
    broke the graph 7 times a block (its factor lists were checked as tensors at every call)."""
    model, tokens = _model(encoding, depth=2)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(tokens)
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]


_TRACED_BIASES = {
    "transformer_xl": lambda: TransformerXLRelative(32, 4, 8),
    "deberta": lambda: DeBERTa(32, 4, 8, span=3),
    "deberta_log_buckets": lambda: DeBERTa(32, 4, 8, span=4, log_buckets=True, max_position=16),
    "erpe_vector_per_head": lambda: ERPEVector(4, 8, max_len=16, per_head=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_TRACED_BIASES))
def test_traced_content_biases_equal_the_eager_ones(name):
    """Transformer-XL, DeBERTa and vector eRPE take another form of their bias while traced (no
    distance range or key start read from the positions). Both forms agree in float64, for a dense
    block whose keys do not start at 0 and for FlexAttention's scalar indices, with positions far
    from 0 and different per batch element."""
    torch.manual_seed(0)
    enc = _TRACED_BIASES[name]().double()
    q, k = torch.randn(2, 4, 5, 8, dtype=torch.float64), torch.randn(2, 4, 7, 8, dtype=torch.float64)
    q_pos = torch.stack((torch.arange(3002, 3007), torch.arange(12, 17)))
    kv_pos = q_pos[:, :1] - 2 + torch.arange(7)
    q_idx, kv_idx = torch.arange(1, 5), torch.arange(2, 7)
    grid = [t.reshape(-1) for t in torch.meshgrid(torch.arange(2), torch.arange(4), q_idx, kv_idx, indexing="ij")]

    def blocks(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, kv_pos: torch.Tensor):
        bias = enc.score_bias(q, k, q_pos, kv_pos)
        return bias.dense(2, 4, q_idx, kv_idx), bias.fn(*grid)

    dense, scalar = blocks(q, k, q_pos, kv_pos)
    traced_dense, traced_scalar = torch.compile(blocks, fullgraph=True)(q, k, q_pos, kv_pos)
    torch.testing.assert_close(traced_dense, dense, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(traced_scalar, scalar, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(dense.expand(2, 4, 4, 5).reshape(-1), scalar, rtol=1e-9, atol=1e-9)
