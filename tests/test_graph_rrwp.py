"""RRWP: the pair features against their definition on fixed graphs (dense powers of ``D^-1 A`` in
float64), the diagonal against posenc's RWSE shifted by one step, the batched and sparse paths
against the per-graph dense one, the support (only the pairs within ``K - 1`` hops), hostile
input, and the ``rrwp`` encoding's bias on every kernel path against a float64 reference."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.common.attention import attend
from posenc.graph import RRWPBias, random_walk_se, rrwp, rrwp_batch, rrwp_diagonal, rrwp_positions

from . import reference as ref


def _definition(edge_index: torch.Tensor, n: int, k: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``[n, n, K]`` from the definition: ``M = D^-1 A`` with ``D`` the weighted out-degree (self-loops
    kept, duplicates summed) clamped at 1, powers ``0 .. K-1``."""
    adj = torch.zeros(n, n, dtype=torch.float64)
    w = torch.ones(edge_index.shape[1], dtype=torch.float64) if weight is None else weight.double()
    for e in range(edge_index.shape[1]):
        adj[edge_index[0, e], edge_index[1, e]] += w[e]
    m = adj / adj.sum(1, keepdim=True).clamp(min=1.0)
    out = torch.empty(n, n, k, dtype=torch.float64)
    power = torch.eye(n, dtype=torch.float64)
    for step in range(k):
        out[:, :, step] = power
        power = power @ m
    return out


def _dense_of(pairs: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(n, n, values.shape[1], dtype=torch.float64)
    out[pairs[0], pairs[1]] = values.double()
    return out


# a directed, weighted graph with a self-loop, a duplicate edge and an isolated node (6)
EDGES = torch.tensor([[0, 1, 1, 2, 3, 3, 4, 5, 2, 2], [1, 2, 0, 3, 4, 4, 5, 3, 2, 0]])
WEIGHTS = torch.tensor([1.0, 2.0, 0.5, 1.5, 1.0, 1.0, 3.0, 0.25, 2.0, 1.0])


@pytest.mark.parametrize("method", ["dense", "sparse"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pairs_equal_the_definition_and_only_the_support_is_returned(method, weighted):
    w = WEIGHTS if weighted else None
    pairs, values = rrwp(EDGES, 7, 5, edge_weight=w, method=method)
    want = _definition(EDGES, 7, 5, w)
    torch.testing.assert_close(_dense_of(pairs, values, 7), want, rtol=1e-6, atol=1e-7)
    support = (want != 0).any(-1)
    assert pairs.shape[1] == int(support.sum()) and bool(support[pairs[0], pairs[1]].all())
    keys = pairs[0] * 7 + pairs[1]
    assert torch.equal(keys, keys.sort().values)  # by source, then target
    assert values.dtype == torch.float32 and pairs.dtype == torch.long


def test_the_diagonal_is_rwse_shifted_by_one_step():
    for w in (None, WEIGHTS):
        pairs, values = rrwp(EDGES, 7, 6, edge_weight=w)
        diag = rrwp_diagonal(pairs, values, 7)
        assert torch.equal(diag[:, 0], torch.ones(7))
        torch.testing.assert_close(diag[:, 1:], random_walk_se(EDGES, 7, 5, edge_weight=w), rtol=1e-6, atol=1e-7)


def test_only_pairs_within_k_minus_one_hops_are_kept():
    """A path of 40 nodes, K = 4: the pairs at most 3 hops apart, nothing more."""
    n, k = 40, 4
    line = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    edges = torch.cat([line, line.flip(0)], 1)
    for method in ("dense", "sparse"):
        pairs, values = rrwp(edges, n, k, method=method)
        hops = (pairs[0] - pairs[1]).abs()
        assert int(hops.max()) == k - 1
        assert pairs.shape[1] == sum(min(u + 3, n - 1) - max(u - 3, 0) + 1 for u in range(n))
        torch.testing.assert_close(_dense_of(pairs, values, n), _definition(edges, n, k), rtol=1e-6, atol=1e-7)


def _molecule_like(count: int, seed: int) -> list[tuple[torch.Tensor, int]]:
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(count):
        n = int(torch.randint(3, 15, (1,), generator=gen))
        parent = [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        e = torch.tensor([list(range(1, n)), parent])
        e = torch.cat([e, torch.tensor([[0], [n - 1]])], 1)  # a ring closure
        graphs.append((torch.cat([e, e.flip(0)], 1), n))
    return graphs


def test_the_batch_equals_the_per_graph_loop():
    graphs = _molecule_like(30, 0)
    graphs.append((torch.zeros(2, 0, dtype=torch.long), 4))  # a graph with no edges
    offsets, total, edges, batch = [], 0, [], []
    for g, (e, n) in enumerate(graphs):
        offsets.append(total)
        edges.append(e + total)
        batch.append(torch.full((n,), g))
        total += n
    edge_index, batch = torch.cat(edges, 1), torch.cat(batch)
    pairs, values = rrwp_batch(edge_index, batch, 7)
    want_pairs, want_values = [], []
    for (e, n), first in zip(graphs, offsets):
        p, v = rrwp(e, n, 7)
        want_pairs.append(p + first)
        want_values.append(v)
    assert torch.equal(pairs, torch.cat(want_pairs, 1))
    torch.testing.assert_close(values, torch.cat(want_values), rtol=1e-6, atol=1e-7)
    sparse_pairs, sparse_values = rrwp_batch(edge_index, batch, 7, method="sparse")
    assert torch.equal(sparse_pairs, pairs)
    torch.testing.assert_close(sparse_values, values, rtol=1e-5, atol=1e-6)


def test_hostile_graphs():
    pairs, values = rrwp(torch.zeros(2, 0, dtype=torch.long), 3, 4)  # no edges: the diagonal alone
    assert torch.equal(pairs, torch.tensor([[0, 1, 2], [0, 1, 2]]))
    assert torch.equal(values, torch.tensor([[1.0, 0, 0, 0]] * 3))
    loops = torch.tensor([[0, 0, 1], [0, 1, 1]])  # self-loops stay in the walk
    torch.testing.assert_close(_dense_of(*rrwp(loops, 2, 3), 2), _definition(loops, 2, 3))
    with pytest.raises(ValueError, match=r"walk_length=1000000000000\).*would need .* more than the"):
        rrwp(EDGES, 7, 10**12)
    with pytest.raises(ValueError, match="walk_length must be"):
        rrwp(EDGES, 7, 0)
    with pytest.raises(ValueError, match="edge_index has node index 5 out of range"):
        rrwp(EDGES, 5, 3)
    with pytest.raises(ValueError, match="edge_weight must hold finite, non-negative weights"):
        rrwp(EDGES, 7, 3, edge_weight=-WEIGHTS)
    with pytest.raises(ValueError, match="method must be one of"):
        rrwp(EDGES, 7, 3, method="fast")


def test_a_support_too_large_to_keep_is_refused_with_an_estimate(monkeypatch):
    """The pairs are counted as the blocks come; a support that cannot fit is refused early, with
    the extrapolated count (here RAM is pretended to be 1 MB)."""
    monkeypatch.setattr("posenc.primitives.budget._device_memory", lambda device: 1 << 20)
    n = 600
    edges = torch.randint(0, n, (2, 6000), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"the pairs within 5 hops \(about \d+ of them, extrapolated"):
        rrwp(edges, n, 6, method="sparse")


def test_the_estimate_counts_the_peak_of_two_copies(monkeypatch):
    """At the end the pairs are held twice (the blocks and their concatenation, then it and its
    sorted copy): RAM pretended to be 1.5 times one copy is refused, not run into the allocator."""
    n, k = 600, 6
    edges = torch.randint(0, n, (2, 6000), generator=torch.Generator().manual_seed(0))
    pairs, _ = rrwp(edges, n, k, method="sparse")
    one_copy = pairs.shape[1] * (k + 4) * 4
    monkeypatch.setattr("posenc.primitives.budget._device_memory", lambda device: int(1.5 * one_copy))
    with pytest.raises(ValueError, match=r"twice at the peak"):
        rrwp(edges, n, k, method="sparse")
    monkeypatch.setattr("posenc.primitives.budget._device_memory", lambda device: int(2.5 * one_copy))
    assert torch.equal(rrwp(edges, n, k, method="sparse")[0], pairs)


# ---- the encoding --------------------------------------------------------------------------------

B_GRAPHS = [(torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]), 4), (torch.tensor([[0, 1, 2, 3], [1, 2, 0, 0]]), 5)]
K, HEADS = 4, 2


def _batch():
    edge_index = torch.cat([B_GRAPHS[0][0], B_GRAPHS[1][0] + 4], 1)
    batch = torch.tensor([0] * 4 + [1] * 5)
    pairs, values = rrwp_batch(edge_index, batch, K)
    return edge_index, batch, pairs, values


def test_positions_carry_each_nodes_row_of_pair_features():
    _, batch, pairs, values = _batch()
    pos = rrwp_positions(batch, pairs, values)
    assert pos.shape == (1, 9, 2 + 5 * K)
    dense = _dense_of(pairs, values, 9)
    local = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4])
    for u in range(9):
        assert pos[0, u, 0] == batch[u] and pos[0, u, 1] == local[u]
        for v in range(9):
            if batch[u] == batch[v]:
                got = pos[0, u, 2 + K * int(local[v]): 2 + K * int(local[v]) + K]
                torch.testing.assert_close(got.double(), dense[u, v])


@pytest.mark.parametrize("backend,path", [("auto", "dense"), ("dense", "dense"), ("math", "math"), ("flex", "flex")])
def test_the_bias_is_the_projected_pair_features_on_every_path(backend, path):
    _, batch, pairs, values = _batch()
    pos = rrwp_positions(batch, pairs, values).double()
    torch.manual_seed(0)
    enc = RRWPBias(16, HEADS, K).double()
    with torch.no_grad():
        enc.pair_bias.normal_()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, HEADS, 9, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    mask = posenc.AttentionMask.packed(batch[None])
    dense = _dense_of(pairs, values, 9)
    bias = torch.einsum("uvk,hk->huv", dense, enc.pair_weight) + enc.pair_bias[:, None, None]
    allowed = (batch[:, None] == batch[None, :])[None]
    expected = ref.attention(q, k, v, allowed, score_bias=bias[None])
    with torch.set_grad_enabled(path != "flex"):
        assert posenc.plan(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend=backend).path == path
        out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend=backend)
    torch.testing.assert_close(out, expected.detach(), rtol=1e-9, atol=1e-10)
    if path == "flex":
        return
    grad = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    params = [q, k, v, enc.pair_weight, enc.pair_bias]
    for g, w in zip(torch.autograd.grad(out, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10)


def test_the_node_encoding_is_the_projected_diagonal():
    _, batch, pairs, values = _batch()
    pos = rrwp_positions(batch, pairs, values)
    enc = RRWPBias(16, HEADS, K)
    x = torch.randn(1, 9, 16)
    want = x + enc.node_proj(rrwp_diagonal(pairs, values, 9))[None]
    torch.testing.assert_close(enc.encode_input(x, pos), want)


def test_gps_and_gps_layer_take_rrwp():
    from torch_geometric.data import Batch, Data

    from posenc.graph import GPS, AddRRWP, GPSLayer, node_positions

    graphs = [AddRRWP(K)(Data(x=torch.randn(n, 3), edge_index=e, num_nodes=n)) for e, n in B_GRAPHS]
    data = Batch.from_data_list(graphs)
    assert torch.equal(data.rrwp_index, _batch()[2])  # PyG shifted the pair index by the node counts
    torch.manual_seed(0)
    model = GPS(3, 2, dim=16, depth=2, num_heads=HEADS, encoding="rrwp", encoding_options={"walk_length": K})
    out = model.forward_data(data)
    assert out.shape == (2, 2)
    out.sum().backward()
    enc = model.encoding
    assert enc.pair_weight.grad.abs().sum() > 0 and enc.node_proj.weight.grad.abs().sum() > 0
    layer = GPSLayer(16, None, HEADS, encoding=RRWPBias(16, HEADS, K))
    assert layer(torch.randn(9, 16), data.edge_index, data.batch, positions=node_positions(data, enc)).shape == (9, 16)


def test_bad_positions_are_refused():
    enc = RRWPBias(16, HEADS, K)
    q = torch.randn(1, HEADS, 3, 8)
    bad = torch.zeros(1, 3, 2 + K + 1)
    with pytest.raises(ValueError, match=r"rrwp: q_pos must be float rows \[batch or 1, nodes, 2 \+ nmax \* walk_length=4\]"):
        attend(q, q, q, q_pos=bad, kv_pos=bad, encoding=enc)
    bad = torch.zeros(1, 3, 2 + K)
    bad[0, 1, 1] = 2  # local index past nmax = 1
    with pytest.raises(ValueError, match=r"columns 0 and 1 must be a graph id and a local index in \[0, 1\)"):
        attend(q, q, q, q_pos=bad, kv_pos=bad, encoding=enc)
    with pytest.raises(ValueError, match=r"pairs must be a long tensor \[2, P\]"):
        rrwp_positions(torch.zeros(3, dtype=torch.long), torch.zeros(2, 1), torch.zeros(1, K))
