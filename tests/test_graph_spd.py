"""Shortest-path distances and the Graphormer ``spd`` bias over a packed, block-diagonal batch:
every kernel path against a float64 reference."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

import posenc
from posenc.common.attention import attend
from posenc.graph import ShortestPathBias, shortest_path_distances, shortest_path_distances_batch, spd_positions

from . import reference as ref


def random_graph(n: int, m: int, seed: int, directed: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(0, n, (2, m), generator=g)
    e = e[:, e[0] != e[1]]
    if not directed:
        e = torch.cat([e, e.flip(0)], 1)
    return torch.unique(e, dim=1)


def nx_distances(edge_index: torch.Tensor, n: int, directed: bool) -> torch.Tensor:
    g = nx.DiGraph() if directed else nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edge_index.T.tolist())
    out = torch.full((n, n), -1, dtype=torch.long)
    for u, row in nx.all_pairs_shortest_path_length(g):
        for v, d in row.items():
            out[u, v] = d
    return out


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("method", ["bfs", "scipy"])
def test_distances_equal_networkx(directed, method):
    n = 30
    e = random_graph(n, 28, seed=1, directed=directed)  # sparse: several components, unreachable pairs
    out = shortest_path_distances(e, n, method=method)
    expected = nx_distances(e, n, directed)
    assert (expected == -1).any()
    torch.testing.assert_close(out, expected)


def packed_batch(sizes, seed=0):
    edges, offset = [], 0
    for i, n in enumerate(sizes):
        edges.append(random_graph(n, n + 2, seed=seed + i) + offset)
        offset += n
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return torch.cat(edges, 1), batch, edges


def test_batched_distances_and_positions():
    sizes = [5, 9, 1, 12, 9]
    e, batch, edges = packed_batch(sizes)
    dist = shortest_path_distances_batch(e, batch)
    assert dist.shape == (5, 12, 12)
    offset = 0
    for g, n in enumerate(sizes):
        torch.testing.assert_close(dist[g, :n, :n], nx_distances(edges[g] - offset, n, False))
        assert torch.all(dist[g, n:] == -1) and torch.all(dist[g, :, n:] == -1)  # padding
        offset += n
    pos = spd_positions(batch, dist)
    assert pos.shape == (1, sum(sizes), 2 + 12) and pos.dtype == torch.long
    node = sizes[0] + 3  # graph 1, local index 3
    assert pos[0, node, 0] == 1 and pos[0, node, 1] == 3
    torch.testing.assert_close(pos[0, node, 2:], dist[1, 3])
    with pytest.raises(ValueError, match="covers only|cover only"):
        spd_positions(batch, dist[:, :5, :5])


def reference_bias(weight, dist_full, batch, max_distance):
    """``[1, H, N, N]`` float64 by loops over node pairs (the definition)."""
    n = batch.numel()
    out = torch.zeros(1, weight.shape[1], n, n, dtype=torch.float64)
    for u in range(n):
        for w in range(n):
            d = int(dist_full[u, w])
            bucket = max_distance + 1 if d < 0 or batch[u] != batch[w] else min(d, max_distance)
            out[0, :, u, w] = weight[bucket].double()
    return out


def full_distances(edges, sizes):
    n = sum(sizes)
    out = torch.full((n, n), -1, dtype=torch.long)
    offset = 0
    for g, size in enumerate(sizes):
        out[offset : offset + size, offset : offset + size] = nx_distances(edges[g] - offset, size, False)
        offset += size
    return out


@pytest.mark.parametrize("backend", ["dense", "math", "flex"])
def test_spd_bias_every_path_matches_float64_reference(backend):
    torch.manual_seed(0)
    sizes, heads, d, max_distance = [6, 11, 1, 8], 4, 8, 3  # distances beyond 3 share a bucket
    e, batch, edges = packed_batch(sizes, seed=3)
    n = batch.numel()
    enc = posenc.build("spd", dims=posenc.ModelDims(heads * d, heads, n), max_distance=max_distance, init_std=1.0)
    assert isinstance(enc, ShortestPathBias)
    pos = spd_positions(batch, shortest_path_distances_batch(e, batch))
    mask = posenc.AttentionMask.packed(batch[None])
    q, k, v = (torch.randn(1, heads, n, d) for _ in range(3))
    expected_bias = reference_bias(enc.weight.detach(), full_distances(edges, sizes), batch, max_distance)
    assert torch.unique(expected_bias[0, 0]).numel() == max_distance + 2  # every bucket occurs
    allowed = ref.allowed_matrix(1, n, n, q_segments=batch[None], kv_segments=batch[None])
    expected = ref.attention(q, k, v, allowed, score_bias=expected_bias)
    if backend == "flex":  # forward only on CPU
        with torch.no_grad():
            out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend="flex")
        torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)
        return
    q.requires_grad_(True)
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend=backend)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)
    # The learned table gets the reference's gradient.
    grad_out = torch.randn_like(out)
    (out * grad_out).sum().backward()
    weight64 = enc.weight.detach().double().requires_grad_(True)
    ref_out = ref.attention(q.detach(), k, v, allowed,
                            score_bias=reference_bias_differentiable(weight64, full_distances(edges, sizes), batch, max_distance))
    (ref_out * grad_out.double()).sum().backward()
    torch.testing.assert_close(enc.weight.grad.double(), weight64.grad, atol=1e-4, rtol=1e-3)


def reference_bias_differentiable(weight, dist_full, batch, max_distance):
    same = batch[:, None] == batch[None, :]
    bucket = torch.where(same & (dist_full >= 0), dist_full.clamp(max=max_distance), max_distance + 1)
    return weight[bucket].permute(2, 0, 1).unsqueeze(0)


def test_spd_in_a_transformer_layer_and_bad_positions():
    torch.manual_seed(0)
    sizes = [4, 7]
    e, batch, _ = packed_batch(sizes)
    pos = spd_positions(batch, shortest_path_distances_batch(e, batch))
    enc = posenc.build("spd", dims=posenc.ModelDims(16, 2, 64))
    attn = posenc.MultiheadAttention(16, 2, encoding=enc)
    x = torch.randn(1, 11, 16)
    out = attn(x, q_pos=pos, kv_pos=pos, mask=posenc.AttentionMask.packed(batch[None]))
    out.sum().backward()
    assert out.shape == (1, 11, 16) and enc.weight.grad is not None
    with pytest.raises(ValueError, match="spd needs integer positions"):
        attn(x, q_pos=pos.float(), kv_pos=pos.float())
    with pytest.raises(ValueError, match="spd needs integer positions"):
        attn(x, q_pos=torch.arange(11)[None], kv_pos=torch.arange(11)[None])
    short = pos.clone()
    short[0, 0, 1] = 50
    with pytest.raises(ValueError, match="local index 50"):
        attn(x, q_pos=pos, kv_pos=short)
