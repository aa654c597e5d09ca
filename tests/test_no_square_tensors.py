"""No encoding puts a ``T x T`` tensor on the heap: every kernel path that serves it works in
chunks of query rows, forward and backward.

A dispatch mode records the size of every tensor any operation returns while one forward and
backward pass of a causal (and a padded, a packed, a bidirectional) self-attention runs; the
largest must stay well below ``B * H * T * T`` elements."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posenc
from posenc.common.registry import ModelDims

B, H, D, T = 2, 4, 8, 256
ROWS = 16  # forced chunk: a [B, H, ROWS, T] block is 1/16 of T x T


class LargestTensor(TorchDispatchMode):
    """Remembers the largest tensor (in elements) that any operation returned, and which op."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.op = t.numel(), f"{func} -> {tuple(t.shape)}"
        return out


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr("posenc.common.kernels.chunking.CHUNK_ELEMENTS", B * H * ROWS * T)
    monkeypatch.setattr("posenc.common.kernels.chunking.MIN_CHUNK_ROWS", ROWS)
    monkeypatch.setattr("posenc.common.kernels.offset_values._OFFSET_CHUNK_ROWS", ROWS)


def _encoding(name: str, causal: bool):
    dims = ModelDims(dim=H * D, num_heads=H, max_len=T)
    options = {}
    if name == "deberta":
        options = {"span": 16}  # p2c holds 2 * span values per key: linear in T
    if name in ("alibi", "kerple") and not causal:
        options = {"symmetric": True}
    if name == "t5":
        options = {"bidirectional": not causal}
    if name == "cape":  # its MLP's hidden layer is a block times the width: keep it narrow here
        options = {"hidden": 8, "base_options": {"symmetric": not causal}}
    if name == "fire":
        options = {"mlp_width": 16}
    if name == "shaw_keys":
        return posenc.build("shaw", dims=dims, values=False)
    return posenc.build(name, dims=dims, **options)


def _masks():
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, T // 2 :] = False
    seg = (torch.arange(T) >= T // 3).long().expand(B, T)
    pos = torch.cat([torch.arange(T // 3), torch.arange(T - T // 3)]).expand(B, T)
    return {
        "causal": (posenc.AttentionMask(causal=True), None),
        "padded": (posenc.AttentionMask(causal=True, key_valid=valid), None),
        "packed": (posenc.AttentionMask.packed(seg, causal=True), pos),
        "bidirectional": (posenc.AttentionMask(key_valid=valid), None),
    }


# The encodings that used to hold a T x T (or T x 2T) tensor, under every mask; the other biases
# under the causal mask.
HEAVY = ["transformer_xl", "erpe_vector", "deberta", "cape", "cope", "shaw", "erpe"]
OTHERS = ["shaw_keys", "t5", "alibi", "fire", "kerple", "tupe"]
CAUSAL_ONLY = {"fire", "cope"}
PARAMS = [(n, m) for n in HEAVY for m in _masks() if m != "bidirectional" or n not in CAUSAL_ONLY]
PARAMS += [(n, "causal") for n in OTHERS]


@pytest.mark.parametrize("name,mask_name", PARAMS, ids=[f"{n}-{m}" for n, m in PARAMS])
def test_no_square_tensor_forward_or_backward(name, mask_name):
    mask, positions = _masks()[mask_name]
    enc = _encoding(name, causal=mask.causal)
    attn = posenc.MultiheadAttention(H * D, H, encoding=enc)
    x = torch.randn(B, T, H * D, requires_grad=True)
    plan = attn.plan(x, mask=mask, q_pos=positions)
    assert plan.path in ("dense", "math", "sdpa") and (plan.chunk_rows or ROWS) <= B * ROWS, plan
    with LargestTensor() as seen:
        out = attn(x, mask=mask, q_pos=positions)
        out.square().sum().backward()
    square = B * H * T * T  # per-chunk work (a block, or a block times an MLP's width) stays far below
    assert seen.largest <= square // 4, f"{name} under a {mask_name} mask: {seen.op} ({plan})"
    assert x.grad is not None and all(p.grad is not None for p in enc.parameters() if p.requires_grad)


@pytest.mark.parametrize("mask_name", list(_masks()) + ["packed_bidirectional"])
@pytest.mark.parametrize("features", ["elu", "favor"])
def test_linear_attention_has_no_square_tensor(features, mask_name):
    if mask_name == "packed_bidirectional":
        mask, positions = posenc.AttentionMask.packed((torch.arange(T) >= T // 3).long().expand(B, T)), None
    else:
        mask, positions = _masks()[mask_name]
    fmap = posenc.EluFeatureMap() if features == "elu" else posenc.FavorFeatureMap(D, num_features=16, seed=0)
    attn = posenc.MultiheadAttention(H * D, H, encoding=_encoding("rope", True), feature_map=fmap)
    x = torch.randn(B, T, H * D, requires_grad=True)
    assert attn.plan(x, mask=mask, q_pos=positions).path == "linear"
    with LargestTensor() as seen:
        attn(x, mask=mask, q_pos=positions).square().sum().backward()
    # linear: the largest tensors are [B, H, T, D]-sized, far below the T x T a softmax would hold
    assert seen.largest <= B * H * T * T // 8, f"{mask_name}: {seen.op}"
    assert x.grad is not None
