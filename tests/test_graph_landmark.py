"""Landmark distances (``landmark``): hand-worked path and cycle, unreachable anchors, directed
edges, seeded random anchors, batched equals per graph, equivariance without degree ties, the
transform's dtype, the GPS/CLI wiring, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from torch_geometric.data import Batch, Data

import posenc
from posenc.cli import main
from posenc.graph import (
    AddLandmarkPE,
    LandmarkPE,
    add_landmark_pe_batch,
    landmark_pe,
    landmark_pe_batch,
    select_anchors,
    shortest_path_distances_batch,
)


def _undirected(pairs: list[tuple[int, int]]) -> torch.Tensor:
    e = torch.tensor(pairs, dtype=torch.long).T
    return torch.cat([e, e.flip(0)], dim=1)


PATH5 = _undirected([(0, 1), (1, 2), (2, 3), (3, 4)])
CYCLE6 = _undirected([(i, (i + 1) % 6) for i in range(6)])


def _f(*ds):
    return [0.0 if d is None else 1.0 / (d + 1) for d in ds]


def test_known_values_on_a_path_and_a_cycle():
    # Path 0-1-2-3-4: degrees 1,2,2,2,1 -> anchors 1 and 2 (ties to the lower index).
    assert select_anchors(PATH5, torch.zeros(5, dtype=torch.long), 2).tolist() == [[1, 2]]
    expected = torch.tensor([_f(1, 2), _f(0, 1), _f(1, 0), _f(2, 1), _f(3, 2)])
    torch.testing.assert_close(landmark_pe(PATH5, 5, 2), expected)
    # Cycle of 6 with anchors 0 and 3: d(u, 0) = min(u, 6 - u), d(u, 3) = |u - 3|.
    expected = torch.tensor([_f(min(u, 6 - u), abs(u - 3)) for u in range(6)])
    torch.testing.assert_close(landmark_pe(CYCLE6, 6, 2, anchors=torch.tensor([0, 3])), expected)
    # every degree ties on a cycle: the anchors are nodes 0, 1, 2
    assert select_anchors(CYCLE6, torch.zeros(6, dtype=torch.long), 3).tolist() == [[0, 1, 2]]


def test_unreachable_anchors_give_zero_and_distance_follows_edge_direction():
    # components {0, 1, 2} (a path) and {3, 4}; anchors 1 (degree 2) and 0 (degree 1, lower index)
    edges = _undirected([(0, 1), (1, 2), (3, 4)])
    pe = landmark_pe(edges, 5, 2)
    torch.testing.assert_close(pe, torch.tensor([_f(1, 0), _f(0, 1), _f(1, 2), _f(None, None), _f(None, None)]))
    # directed path 0 -> 1 -> 2: d(0, 2) = 2 but 2 never reaches 0
    directed = torch.tensor([[0, 1], [1, 2]])
    pe = landmark_pe(directed, 3, 2, anchors=torch.tensor([2, 0]))
    torch.testing.assert_close(pe, torch.tensor([_f(2, 0), _f(1, None), _f(0, None)]))


def test_search_from_sources_equals_rows_of_the_full_distance_matrix():
    edges = _undirected([(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 4), (6, 7)])
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    sources = torch.tensor([[3, -1, 0], [2, 1, 3]])
    full = shortest_path_distances_batch(edges, batch)
    rows = shortest_path_distances_batch(edges, batch, sources=sources)
    assert rows.shape == (2, 3, 4)
    for g in range(2):
        for j, s in enumerate(sources[g].tolist()):
            assert rows[g, j].tolist() == ([-1] * 4 if s < 0 else full[g, s].tolist())
    with pytest.raises(ValueError, match=r"sources\[1, 2\] = 4 is not a node of graph 1"):
        shortest_path_distances_batch(edges, batch, sources=torch.tensor([[0, 0, 0], [0, 0, 4]]))


def _random_graph(n: int, p: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    upper = torch.triu(torch.rand(n, n, generator=g) < p, diagonal=1)
    return _undirected([tuple(e) for e in upper.nonzero().tolist()]) if upper.any() else torch.zeros(2, 0, dtype=torch.long)


def test_random_anchors_are_seeded_and_reproducible():
    edges = _random_graph(30, 0.15, 0)
    a = landmark_pe(edges, 30, 4, anchors="random", generator=torch.Generator().manual_seed(7))
    b = landmark_pe(edges, 30, 4, anchors="random", generator=torch.Generator().manual_seed(7))
    c = landmark_pe(edges, 30, 4, anchors="random", generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    graph = Data(edge_index=edges, num_nodes=30)
    t1, t2 = AddLandmarkPE(4, anchors="random", seed=3), AddLandmarkPE(4, anchors="random", seed=3)
    first = [t1(graph.clone()).landmark_pe for _ in range(3)]
    second = [t2(graph.clone()).landmark_pe for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    assert not torch.equal(first[0], first[1])  # a fresh draw per graph


@pytest.mark.parametrize("anchors", ["degree", "random"])
def test_batched_equals_per_graph_with_zero_padding(anchors):
    sizes = [7, 2, 12, 1, 9]  # two graphs smaller than k
    graphs = [Data(edge_index=_random_graph(n, 0.3, i), num_nodes=n) for i, n in enumerate(sizes)]
    batch = Batch.from_data_list(graphs)
    k = 4
    gen = torch.Generator().manual_seed(11)
    batched = landmark_pe_batch(batch.edge_index, batch.batch, k, anchors=anchors, generator=gen)
    gen = torch.Generator().manual_seed(11)
    single = torch.cat([landmark_pe(g.edge_index, g.num_nodes, k, anchors=anchors, generator=gen, pad=True)
                        for g in graphs])
    assert batched.shape == (sum(sizes), k) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, single, rtol=0, atol=0)
    assert torch.equal(batched[7:9, 2:], torch.zeros(2, 2))  # the 2-node graph's missing anchors
    # the batch transform equals the per-graph transform
    via_batch = add_landmark_pe_batch(batch.clone(), k, anchors=anchors, generator=torch.Generator().manual_seed(5))
    transform = AddLandmarkPE(k, anchors=anchors, seed=5)
    torch.testing.assert_close(via_batch.landmark_pe, torch.cat([transform(g.clone()).landmark_pe for g in graphs]))


def test_degree_anchors_are_permutation_equivariant_without_degree_ties():
    # A tree whose largest degrees are 5 (node 1), 4 (node 0), 3 (node 2), then 2.
    pairs = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 5), (5, 6), (6, 7), (0, 8), (8, 9), (0, 10),
             (1, 11), (1, 12), (1, 13), (2, 14)]
    edges = _undirected(pairs)
    n, k = 15, 3
    deg = torch.bincount(edges[0], minlength=n).sort(descending=True).values
    assert len(set(deg[: k + 1].tolist())) == k + 1  # the top k + 1 degrees are distinct: no ties
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))  # new index of old node u: perm[u]
    permuted = perm[edges]
    pe, pe_perm = landmark_pe(edges, n, k), landmark_pe(permuted, n, k)
    torch.testing.assert_close(pe_perm[perm], pe)
    # with ties the lower index wins, so the same check fails on a cycle (anchors follow the labels)
    cyc_perm = torch.tensor([3, 0, 4, 1, 5, 2])
    assert not torch.equal(landmark_pe(cyc_perm[CYCLE6], 6, 2)[cyc_perm], landmark_pe(CYCLE6, 6, 2))


def test_transform_stores_float32_even_for_integer_x():
    data = Data(x=torch.tensor([[3], [1], [4], [1], [5]]), edge_index=PATH5)
    out = AddLandmarkPE(2, attr_name=None)(data.clone())
    assert out.x.dtype == torch.float32 and out.x.shape == (5, 3)
    torch.testing.assert_close(out.x[:, 1:], landmark_pe(PATH5, 5, 2))
    assert out.x[:, 0].tolist() == [3.0, 1.0, 4.0, 1.0, 5.0]
    stored = AddLandmarkPE(8)(Data(x=torch.ones(5, 2, dtype=torch.long), edge_index=PATH5))
    assert stored.landmark_pe.dtype == torch.float32 and stored.landmark_pe.shape == (5, 8)
    assert torch.equal(stored.landmark_pe[:, 5:], torch.zeros(5, 3))  # five nodes, eight anchors: padded
    double = AddLandmarkPE(2, attr_name=None)(Data(x=torch.ones(5, 1, dtype=torch.float64), edge_index=PATH5))
    assert double.x.dtype == torch.float64


@pytest.mark.parametrize(
    "call, error, msg",
    [
        (lambda: landmark_pe(PATH5, 5, 0), ValueError, "k .* must be a positive int; got 0"),
        (lambda: landmark_pe(PATH5, 5, 2.0), TypeError, r"k \(the number of anchors\) must be an int; got 2.0"),
        (lambda: landmark_pe_batch(PATH5, torch.zeros(5, dtype=torch.long), -1), ValueError, "got -1"),
        (lambda: landmark_pe(PATH5[0], 5, 2), ValueError, r"edge_index must have shape \[2, num_edges\], got \(8,\)"),
        (lambda: landmark_pe(PATH5.unsqueeze(0), 5, 2), ValueError, r"edge_index must have shape \[2, num_edges\]"),
        (lambda: landmark_pe(PATH5.float(), 5, 2), TypeError, "edge_index must have dtype torch.long"),
        (lambda: landmark_pe(PATH5, 5, 6), ValueError, "k=6 anchors asked of a graph with 5 nodes; pass pad=True"),
        (lambda: landmark_pe(PATH5, 5, 2, anchors="central"), ValueError, "anchors must be one of"),
        (lambda: landmark_pe(PATH5, 5, 2, anchors=torch.tensor([0, 5])), ValueError, r"anchors\[0, 1\] = 5 is not a node of graph 0"),
        (lambda: landmark_pe(PATH5, 5, 2, anchors=torch.tensor([0, 1, 2])), ValueError, r"anchors must be \[num_graphs=1, k=2\]"),
        (lambda: AddLandmarkPE(0), ValueError, "k must be a positive int; got 0"),
        (lambda: AddLandmarkPE(2, anchors="random", seed="x"), ValueError, "seed must be an int or None"),
        (lambda: LandmarkPE(8, 0), ValueError, "k must be a positive int; got 0"),
        (lambda: LandmarkPE(True, 2), TypeError, "dim must be an int; got True"),
    ],
)
def test_bad_input_is_a_clear_error(call, error, msg):
    with pytest.raises(error, match=msg):
        call()


def test_encoding_in_gps_and_the_cli(tmp_path, capsys):
    enc = posenc.build("landmark", dims=posenc.ModelDims(8, 2, 1), k=3)
    assert isinstance(enc, LandmarkPE) and enc.hooks == frozenset({posenc.Hook.INPUT})
    with pytest.raises(ValueError, match=r"landmark: positions must be \[batch=1 or 1, nodes=5, k \(anchors\)=3\]"):
        enc.encode_input(torch.randn(1, 5, 8), torch.randn(1, 5, 2))
    from posenc.graph.gps import GPS

    graphs = [AddLandmarkPE(3)(Data(x=torch.randn(n, 2), edge_index=_random_graph(n, 0.4, n), num_nodes=n))
              for n in (4, 6)]
    model = GPS(2, 3, dim=8, depth=1, num_heads=2, encoding="landmark", encoding_options={"k": 3})
    assert model.forward_data(Batch.from_data_list(graphs)).shape == (2, 3)
    out = tmp_path / "run"
    argv = ["train", "graph", "--dataset", "csl", "--encoding", "landmark", "--landmark-k", "4", "--landmark-anchors",
            "random", "--csl-per-class", "3", "--csl-test-per-class", "1", "--batch-size", "4", "--steps", "2",
            "--out", str(out), "--dim", "8", "--depth", "1", "--heads", "2", "--no-progress"]
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["encoding"] == "landmark"
    assert torch.load(out / "checkpoint.pt", weights_only=True)["model_config"]["encoding_options"] == {"k": 4}
    capsys.readouterr()
    assert main(["train", "graph", "--dataset", "csl", "--encoding", "landmark", "--landmark-k", "0", "--steps", "1"]) == 2
    assert "argument --landmark-k: expected a positive integer, got '0'" in capsys.readouterr().err
