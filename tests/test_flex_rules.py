"""Where compiled FlexAttention cannot run, the plan leaves it: the rules of
:func:`posenc.common.planning.flex_refusal`, and each registered bias's ``pointwise`` flag checked
against what its scalar form really computes (Inductor lowers ``score_mod`` as a pointwise
subgraph: a reduction inside it fails to compile on CUDA, as it did on the device for
Transformer-XL, DeBERTa and FIRE)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posenc
from posenc.common import kernels
from posenc.common.planning import PlanInputs, decide, flex_refusal

NEEDS = posenc.common.AttentionNeeds
CUDA = torch.device("cuda")


def _cuda_plan(needs=NEEDS(score_bias=True), backend="auto", **kw):
    args = {"batch": 2, "heads": 4, "q_len": 64, "kv_len": 64, "needs_grad": False, "what": "TestBias"}
    args.update(kw)
    return decide(PlanInputs(needs, device=CUDA, backend=backend, **args))


@pytest.mark.parametrize("limit,words", [
    ({"dtype": torch.float64}, "not float64"),
    ({"head_dim": 8}, "head dims of at least 16, got 8"),
    ({"bias_pointwise": False}, "the bias of TestBias reduces over a feature axis"),
])
def test_a_call_compiled_flex_cannot_run_takes_dense_on_cuda_and_says_why(limit, words):
    assert _cuda_plan().path == "flex"  # the default on CUDA ...
    plan = _cuda_plan(**limit)  # ... and past one limit
    assert plan.path == "dense" and words in plan.reason and plan.chunk_rows is not None
    with pytest.raises(ValueError, match=f"backend='flex' cannot serve this call: .*{words}.*; use 'dense' or 'auto'"):
        _cuda_plan(backend="flex", **limit)


def test_a_mask_only_call_past_the_limits_takes_sdpa_with_the_mask_tensor():
    packed = posenc.AttentionMask.packed(torch.zeros(2, 64, dtype=torch.long))
    assert _cuda_plan(NEEDS(), mask=packed).path == "flex"
    plan = _cuda_plan(NEEDS(), mask=packed, dtype=torch.float64)
    assert plan.path == "sdpa" and "T x T tensor" in plan.reason and "float64" in plan.reason
    # a pointwise flag only matters for a score bias
    assert _cuda_plan(NEEDS(), mask=packed, bias_pointwise=False).path == "flex"


def test_off_cuda_flex_is_eager_and_has_no_such_limits():
    cpu = PlanInputs(NEEDS(score_bias=True), dtype=torch.float64, head_dim=4, bias_pointwise=False)
    assert flex_refusal(cpu) is None
    assert decide(PlanInputs(NEEDS(score_bias=True), backend="flex", dtype=torch.float64, head_dim=4,
                             bias_pointwise=False)).path == "flex"


def test_the_plan_reads_dtype_head_dim_and_the_bias_flag_from_the_call():
    """The facts reach PlanInputs from the tensors and the bias: a float64 call and a
    Transformer-XL call record what flex_refusal needs (checked here on the CPU, where they plan
    dense for other reasons)."""
    from posenc.common.attention import prepare
    from posenc.common.call import AttentionCall

    q = torch.randn(1, 4, 6, 8, dtype=torch.float64)
    pos = torch.arange(6)[None]
    txl = posenc.build("transformer_xl", dims=posenc.ModelDims(dim=32, num_heads=4, max_len=16)).double()
    prepared = prepare(AttentionCall.checked(q, q, q, q_pos=pos, kv_pos=pos, encoding=txl))
    inputs = prepared.inputs
    assert (inputs.dtype, inputs.head_dim, inputs.bias_pointwise) == (torch.float64, 8, False)


# ---- each registered bias's flag against its scalar form ------------------------------------

# ops that read more than one element of their inputs: a reduction, a product or a search
_NOT_POINTWISE = ("sum", "mean", "prod", "amax", "amin", "max.dim", "min.dim", "argmax", "argmin", "mm", "bmm",
                  "addmm", "mv", "dot", "matmul", "linear", "searchsorted", "bucketize", "cumsum", "logsumexp",
                  "norm", "var", "std", "any.", "all.", "nonzero")


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func).removeprefix("aten."))
        return func(*args, **(kwargs or {}))


def _reductions(bias) -> list[str]:
    """The aten ops ``bias`` runs at FlexAttention's scalar indices that are not element-wise."""
    b, h, q_idx, kv_idx = torch.tensor(0), torch.tensor(1), torch.tensor(3), torch.tensor(2)
    with _OpLog() as log:
        bias(b, h, q_idx, kv_idx)
    return [op for op in log.ops if any(op.startswith(r) for r in _NOT_POINTWISE)]


def _seq_biases():
    dims = posenc.ModelDims(dim=64, num_heads=4, max_len=64)
    out = []
    for name in ("alibi", "t5", "kerple", "shaw", "fire", "transformer_xl", "deberta", "tupe", "erpe_vector"):
        out.append((name, posenc.build(name, dims=dims)))
    return out


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_every_registered_bias_says_truly_whether_it_is_pointwise(mode):
    torch.manual_seed(0)
    q = k = torch.randn(1, 4, 12, 16)
    pos = torch.arange(12)[None]
    checked = []
    for name, enc in _seq_biases():
        enc.train(mode == "train")
        with torch.set_grad_enabled(mode == "train"):
            bias = enc.score_bias(q, k, pos, pos)
            found = _reductions(bias)
        assert bias.pointwise == (not found), (name, bias.pointwise, found)
        checked.append((name, bias.pointwise))
    flags = dict(checked)
    assert flags["alibi"] and flags["t5"] and flags["kerple"] and flags["shaw"]
    assert not (flags["transformer_xl"] or flags["deberta"] or flags["tupe"] or flags["fire"] or flags["erpe_vector"])


def test_the_2d_relative_bias_and_a_sum_of_biases_keep_the_flag():
    from posenc.common.pairwise import sum_of_biases
    from posenc.vision import RelativePositionBias2D, grid_positions

    pos = grid_positions(3, 4, num_prefix_tokens=1)
    q2 = torch.randn(1, 2, 13, 8)
    rel = RelativePositionBias2D(2, (3, 4), num_prefix_tokens=1).score_bias(q2, q2, pos, pos)
    assert rel.pointwise and not _reductions(rel)
    dims = posenc.ModelDims(dim=64, num_heads=4, max_len=64)
    q, p = torch.randn(1, 4, 5, 16), torch.arange(5)[None]
    alibi = posenc.build("alibi", dims=dims).score_bias(q, q, p, p)
    txl = posenc.build("transformer_xl", dims=dims).score_bias(q, q, p, p)
    assert sum_of_biases(alibi, alibi).pointwise
    assert not sum_of_biases(alibi, txl).pointwise


def test_flex_recompiles_are_not_cut_off_at_dynamos_default(monkeypatch):
    """Every encoding, mask and prefill/decode shape is its own entry in the one compiled
    flex_attention's cache; past dynamo's default limit (8) torch falls back to the unfused
    flex, which materializes the whole score matrix (seen on the device: the generate bench's
    ALiBi prefill took 4.6 s). The compiled call runs with a larger limit, and leaves it as it was."""
    import torch._dynamo.config as dynamo_config

    seen = []
    monkeypatch.setattr("posenc.common.kernels.flex._compiled_flex", lambda: lambda *a, **kw: seen.append(dynamo_config.recompile_limit))
    before = dynamo_config.recompile_limit
    kernels.run_compiled_flex(None, None, None)
    assert seen == [max(before, kernels.FLEX_RECOMPILE_LIMIT)] and kernels.FLEX_RECOMPILE_LIMIT >= 64
    assert dynamo_config.recompile_limit == before


def test_a_decoding_step_on_flex_builds_no_block_mask(monkeypatch):
    """One query under a causal mask sees every key: flex runs without a BlockMask (on CUDA one
    would be compiled at every step, for a key count that changes at every step), with the same
    output as with the mask."""
    from posenc.seq.alibi import ALiBi

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 9, 16), torch.randn(1, 4, 9, 16)
    q_pos, kv_pos = torch.tensor([[8]]), torch.arange(9)[None]
    causal = posenc.AttentionMask(causal=True)
    with torch.no_grad():
        want = posenc.attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=ALiBi(4), mask=causal, backend="dense")
        monkeypatch.setattr(posenc.AttentionMask, "block_mask", lambda *a, **kw: pytest.fail("a BlockMask was built"))
        got = posenc.attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=ALiBi(4), mask=causal, backend="flex")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
