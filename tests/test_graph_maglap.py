"""MagLapPE: q = 0 is LapPE exactly; every eigenpair satisfies the dense complex magnetic
Laplacian's equation and its eigenvalues are the smallest; the paper's phase convention and posenc's;
reversing the edges conjugates the encoding; batched and sparse paths equal the dense per-graph one;
hostile input; the encoding in GPS on a batch of directed graphs."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.graph import (
    MagLapPE,
    laplacian_pe,
    magnetic_laplacian,
    magnetic_laplacian_pe,
    magnetic_laplacian_pe_batch,
)
from posenc.graph.magnetic import fix_phase


def _random_digraph(n: int, m: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, n, (2, m), generator=gen)
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])  # connected, directed cycle
    return torch.cat([edges, ring], 1).unique(dim=1)  # each directed edge once


def _undirected(n: int, seed: int) -> torch.Tensor:
    """Each undirected edge once per direction (no duplicates): ``[2, 2m]``, the reverses last."""
    e = _random_digraph(n, 2 * n, seed)
    e = e[:, e[0] < e[1]].unique(dim=1)
    return torch.cat([e, e.flip(0)], 1)


def _complex(vecs: torch.Tensor, k: int) -> torch.Tensor:
    return torch.complex(vecs[:, :k].double(), vecs[:, k:].double())


@pytest.mark.parametrize("normalization", ["sym", None])
@pytest.mark.parametrize("weighted", [False, True])
def test_q_zero_is_lappe_exactly(normalization, weighted):
    edges = _undirected(15, 0)
    w = torch.rand(edges.shape[1] // 2, generator=torch.Generator().manual_seed(1)) + 0.5 if weighted else None
    w = None if w is None else torch.cat([w, w])
    vecs, vals = magnetic_laplacian_pe(edges, 15, 5, q=0.0, normalization=normalization, edge_weight=w)
    want_vecs, want_vals = laplacian_pe(edges, 15, 5, normalization=normalization, edge_weight=w)
    assert torch.equal(vecs[:, :5], want_vecs) and torch.equal(vals, want_vals)
    assert torch.equal(vecs[:, 5:], torch.zeros(15, 5))
    # a directed graph at q = 0: the Laplacian of its undirected version
    directed = _random_digraph(12, 20, 2)
    got, _ = magnetic_laplacian_pe(directed, 12, 4, q=0.0)
    assert torch.equal(got[:, :4], laplacian_pe(directed, 12, 4, symmetrize=True)[0])


@pytest.mark.parametrize("q", [0.1, 0.25, 0.5])
@pytest.mark.parametrize("normalization", ["sym", None])
@pytest.mark.parametrize("phase", ["largest", "paper"])
def test_eigenpairs_solve_the_dense_complex_laplacian(q, normalization, phase):
    n, k = 14, 6
    edges = _random_digraph(n, 25, 3)
    lap = magnetic_laplacian(edges, n, q=q, normalization=normalization)
    torch.testing.assert_close(lap, lap.conj().T, rtol=0, atol=1e-12)  # Hermitian
    vecs, vals = magnetic_laplacian_pe(edges, n, k, q=q, normalization=normalization, phase=phase)
    v = _complex(vecs, k)
    torch.testing.assert_close(torch.linalg.eigvalsh(lap)[:k], vals.double(), rtol=1e-5, atol=1e-5)  # the smallest, first kept
    torch.testing.assert_close(lap @ v, v * vals.double(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v.abs().pow(2).sum(0), torch.ones(k, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    if phase == "largest":  # the entry of largest modulus is real and positive
        top = v.abs().argmax(0)
        ref = v[top, torch.arange(k)]
        assert (ref.real > 0).all() and ref.imag.abs().max() < 1e-6
    else:  # every eigenvector real and non-negative at one node (where the first one's imaginary part was largest)
        assert ((v.imag.abs() < 1e-6) & (v.real >= -1e-7)).all(1).any()


def test_the_phases_of_one_edge_follow_the_paper():
    """``L(u, v) = -A_s e^(i 2 pi q)`` for an edge ``u -> v`` (combinatorial), its conjugate the other way."""
    lap = magnetic_laplacian(torch.tensor([[0], [1]]), 2, q=0.25, normalization=None)
    torch.testing.assert_close(lap, torch.tensor([[1, -1j], [1j, 1]], dtype=torch.complex128))
    both = magnetic_laplacian(torch.tensor([[0, 1], [1, 0]]), 2, q=0.25, normalization=None)
    torch.testing.assert_close(both, torch.tensor([[1, -1], [-1, 1]], dtype=torch.complex128))  # no direction: real
    rel = magnetic_laplacian(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3, q=0.3, relative_q=True, normalization=None)
    torch.testing.assert_close(rel[0, 1], -torch.exp(torch.tensor(2j * math.pi * 0.1, dtype=torch.complex128)))


def test_reversing_every_edge_conjugates_the_encoding():
    edges = _random_digraph(16, 30, 4)
    vecs, vals = magnetic_laplacian_pe(edges, 16, 5, q=0.2)
    rev, rev_vals = magnetic_laplacian_pe(edges.flip(0), 16, 5, q=0.2)
    torch.testing.assert_close(rev_vals, vals, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rev[:, :5], vecs[:, :5], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rev[:, 5:], -vecs[:, 5:], rtol=1e-4, atol=1e-5)


def test_the_direction_is_seen_and_a_tiny_q_approaches_lappe():
    edges = _undirected(12, 5)  # no one-way edge: no phase at any q, the Laplacian of the graph
    real = magnetic_laplacian_pe(edges, 12, 4, q=0.25, drop_first=True)[0]
    torch.testing.assert_close(real[:, :4], laplacian_pe(edges, 12, 4)[0], rtol=1e-4, atol=1e-5)
    assert real[:, 4:].abs().max() < 1e-6
    directed = _random_digraph(12, 18, 6)
    small = magnetic_laplacian_pe(directed, 12, 4, q=1e-9, drop_first=True)[0]
    lap = laplacian_pe(directed, 12, 4, symmetrize=True)[0]
    torch.testing.assert_close(small[:, :4], lap, rtol=1e-4, atol=1e-4)
    assert small[:, 4:].abs().max() < 1e-6
    assert magnetic_laplacian_pe(directed, 12, 4, q=0.25)[0][:, 4:].abs().max() > 0.05


def test_the_batch_and_the_sparse_solver_equal_the_per_graph_dense_one():
    graphs = [(_random_digraph(n, 2 * n, s), n) for s, n in enumerate([6, 9, 9, 12, 6, 3])]
    graphs.append((torch.zeros(2, 0, dtype=torch.long), 2))
    edges, batch, first = [], [], 0
    for g, (e, n) in enumerate(graphs):
        edges.append(e + first)
        batch.append(torch.full((n,), g))
        first += n
    vecs, vals = magnetic_laplacian_pe_batch(torch.cat(edges, 1), torch.cat(batch), 4, q=0.15, relative_q=True)
    start = 0
    for g, (e, n) in enumerate(graphs):
        one, one_vals = magnetic_laplacian_pe(e, n, 4, q=0.15, relative_q=True)
        torch.testing.assert_close(vecs[start: start + n], one, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(vals[g], one_vals, rtol=1e-6, atol=1e-6)
        start += n
    big = _random_digraph(60, 100, 7)
    dense, dense_vals = magnetic_laplacian_pe(big, 60, 4, q=0.2, method="dense")
    sparse, sparse_vals = magnetic_laplacian_pe(big, 60, 4, q=0.2, method="sparse")
    torch.testing.assert_close(sparse_vals, dense_vals, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse, dense, rtol=1e-3, atol=1e-4)


def test_hostile_graphs():
    vecs, vals = magnetic_laplacian_pe(torch.zeros(2, 0, dtype=torch.long), 4, 3, q=0.25)  # no edges: L = I
    assert torch.equal(vals, torch.ones(3))
    loops = torch.tensor([[0, 0, 1, 2], [0, 1, 2, 2]])  # self-loops are ignored, as for LapPE
    torch.testing.assert_close(magnetic_laplacian(loops, 3, q=0.2), magnetic_laplacian(loops[:, 1:3], 3, q=0.2))
    w = torch.tensor([2.0, 2.0, 0.5])  # weights enter A_s (the mean of both directions), not the phases
    lap = magnetic_laplacian(torch.tensor([[0, 1, 1], [1, 0, 2]]), 3, q=0.25, edge_weight=w, normalization=None)
    torch.testing.assert_close(lap[1, 2], torch.tensor(-0.5j, dtype=torch.complex128))
    torch.testing.assert_close(lap[0, 1], torch.tensor(-2.0 + 0j, dtype=torch.complex128))
    assert magnetic_laplacian_pe(torch.tensor([[0, 1], [1, 2]]), 3, 8, q=0.25)[0].shape == (3, 16)  # n <= k: zeros
    with pytest.raises(ValueError, match=r"magnetic_laplacian_pe\(k=1000000000000\).*would need .* more than the"):
        magnetic_laplacian_pe(loops, 3, 10**12)
    with pytest.raises(ValueError, match="q must be a number >= 0"):
        magnetic_laplacian_pe(loops, 3, 2, q=-0.1)
    with pytest.raises(ValueError, match="normalization must be 'sym' or None"):
        magnetic_laplacian_pe(loops, 3, 2, normalization="rw")
    with pytest.raises(ValueError, match="phase must be one of 'largest', 'paper'"):
        fix_phase(torch.zeros(2, 2, dtype=torch.complex128), "random")
    with pytest.raises(ValueError, match="edge_index has node index 3 out of range"):
        magnetic_laplacian_pe(torch.tensor([[0], [3]]), 3, 2)


def test_the_encoding_and_gps_on_directed_graphs():
    from torch_geometric.data import Batch, Data

    from posenc.graph import GPS, AddMagneticLaplacianPE

    graphs = [Data(x=torch.randn(n, 2), edge_index=_random_digraph(n, n, s), num_nodes=n) for s, n in ((0, 7), (1, 5))]
    data = Batch.from_data_list([AddMagneticLaplacianPE(4, q=0.25)(g) for g in graphs])
    assert data.maglap_pe.shape == (12, 8) and data.maglap_eigenvalues.shape == (12, 4)
    for sign in ("flip", "plain", "signnet"):
        torch.manual_seed(0)
        model = GPS(2, 3, dim=16, depth=1, num_heads=2, encoding="maglap", encoding_options={"k": 4, "sign": sign})
        out = model.forward_data(data)
        out.sum().backward()
        assert out.shape == (2, 3) and all(p.grad is not None for p in model.encoding.parameters())
    enc = MagLapPE(16, 4, sign="signnet").eval()
    x = torch.zeros(1, 12, 16)
    feats = torch.cat([data.maglap_pe, data.maglap_eigenvalues], -1)[None]
    flipped = feats.clone()
    flipped[..., [1, 5]] *= -1  # one eigenvector's sign (real and imaginary parts)
    torch.testing.assert_close(enc.encode_input(x, flipped), enc.encode_input(x, feats))
    with pytest.raises(ValueError, match=r"maglap: positions must be float \[batch or 1, nodes, 3k"):
        enc.encode_input(x, feats[..., :8])


def test_the_dag_depth_task_labels_the_longest_path_to_each_node():
    import networkx as nx

    from posenc.graph.directed_tasks import dag_depth_dataset

    graphs = dag_depth_dataset(20, min_nodes=5, max_nodes=15, max_depth=4, seed=3)
    assert graphs[0].edge_index.shape[0] == 2 and len(dag_depth_dataset(20, min_nodes=5, max_nodes=15, seed=3)) == 20
    for g in graphs:
        dag = nx.DiGraph()
        dag.add_nodes_from(range(g.num_nodes))
        dag.add_edges_from(g.edge_index.T.tolist())
        assert nx.is_directed_acyclic_graph(dag)
        depth = {}
        for v in nx.topological_sort(dag):
            depth[v] = max((depth[u] + 1 for u in dag.predecessors(v)), default=0)
        assert g.y.tolist() == [min(depth[v], 4) for v in range(g.num_nodes)]
    with pytest.raises(ValueError, match="max_nodes must be"):
        dag_depth_dataset(3, min_nodes=5, max_nodes=4)
