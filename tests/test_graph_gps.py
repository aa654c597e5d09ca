"""The GPS-style graph transformer: shapes with every encoding, permutation equivariance and
invariance, and packed block-diagonal attention equal to attending each graph alone."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from posenc import AttentionMask, MultiheadAttention
from posenc.graph.gps import GPS, LAP_ATTR, LAP_EIGENVALUES_ATTR, RWSE_ATTR, node_positions
from posenc.graph.transforms import AddLaplacianPE, AddRandomWalkSE

ENCODINGS = [None, "lap", "rwse", "spd"]
OPTIONS = {"lap": {"k": 4}, "rwse": {"walk_length": 6}, "spd": {"max_distance": 5}}


def _graph(n: int, seed: int, in_dim: int = 3, edge_dim: int = 2) -> Data:
    g = torch.Generator().manual_seed(seed)
    # a ring plus a few random chords: connected, undirected
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    chords = torch.randint(0, n, (2, n // 2), generator=g)
    chords = chords[:, chords[0] != chords[1]]
    e = torch.cat([ring, chords], 1)
    e = torch.unique(torch.cat([e, e.flip(0)], 1), dim=1)
    attr = torch.randn(e.shape[1], edge_dim, generator=g)
    # the same features for (u, v) and (v, u)
    key = torch.minimum(e[0], e[1]) * n + torch.maximum(e[0], e[1])
    attr = attr[torch.unique(key, return_inverse=True)[1]]
    return Data(x=torch.randn(n, in_dim, generator=g), edge_index=e, edge_attr=attr, y=torch.tensor([0.0]), num_nodes=n)


def _with_pe(g: Data) -> Data:
    g = AddLaplacianPE(4, LAP_ATTR, random_sign=False, eigenvalues_attr=LAP_EIGENVALUES_ATTR)(g.clone())
    return AddRandomWalkSE(6, RWSE_ATTR)(g)


def _model(encoding, task="graph", **kw) -> GPS:
    torch.manual_seed(0)
    kw.setdefault("edge_dim", 2)
    return GPS(3, 5, dim=16, depth=2, num_heads=2, encoding=encoding, encoding_options=OPTIONS.get(encoding),
               task=task, **kw)


def _permute(g: Data, perm: torch.Tensor) -> Data:
    """Relabel node i as perm[i]; per-node tensors move with their node."""
    inv = torch.argsort(perm)
    out = g.clone()
    out.edge_index = perm[g.edge_index]
    for attr in ("x", LAP_ATTR, LAP_EIGENVALUES_ATTR, RWSE_ATTR):
        out[attr] = g[attr][inv]
    return out


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("task", ["graph", "node"])
def test_shapes_with_every_encoding(encoding, task):
    graphs = [_with_pe(_graph(n, n)) for n in (5, 9, 3)]
    batch = Batch.from_data_list(graphs)
    model = _model(encoding, task)
    out = model.forward_data(batch)
    assert out.shape == ((3, 5) if task == "graph" else (17, 5))
    out.sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "encoding" not in n or encoding)
    if encoding is not None:
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoding.parameters())


def test_without_edge_features_uses_gin():
    g = _graph(6, 1)
    del g.edge_attr
    model = _model("rwse", edge_dim=None)
    assert model.local == "gin" and type(model.layers[0].conv).__name__ == "GINConv"
    out = model.forward_data(Batch.from_data_list([_with_pe(g)]))
    assert out.shape == (1, 5)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_permutation_equivariance_and_invariance(encoding):
    a, b = _with_pe(_graph(7, 2)), _with_pe(_graph(6, 3))
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    pa = _permute(a, perm)
    node_model, graph_model = _model(encoding, "node").eval(), _model(encoding, "graph").eval()
    with torch.no_grad():
        nodes = node_model.forward_data(Batch.from_data_list([a, b]))
        nodes_p = node_model.forward_data(Batch.from_data_list([pa, b]))
        graphs = graph_model.forward_data(Batch.from_data_list([a, b]))
        graphs_p = graph_model.forward_data(Batch.from_data_list([pa, b]))
    # node i of a is node perm[i] of pa
    torch.testing.assert_close(nodes_p[:7][perm], nodes[:7], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nodes_p[7:], nodes[7:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(graphs_p, graphs, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(nodes[:7], nodes[:7][perm])  # the check is not vacuous


def test_lap_sign_flip_only_in_training():
    batch = Batch.from_data_list([_with_pe(_graph(8, 4))])
    model = _model("lap", "node", dropout=0.0)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model.forward_data(batch), model.forward_data(batch))
    model.train()
    torch.manual_seed(1)
    outs = [model.forward_data(batch) for _ in range(6)]
    assert any(not torch.allclose(outs[0], o) for o in outs[1:])  # random signs differ between calls


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_packed_batch_equals_each_graph_alone(encoding):
    graphs = [_with_pe(_graph(n, 10 + n)) for n in (6, 4, 9)]
    model = _model(encoding, "node").eval()
    with torch.no_grad():
        packed = model.forward_data(Batch.from_data_list(graphs))
        alone = torch.cat([model.forward_data(Batch.from_data_list([g])) for g in graphs])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_block_diagonal_attention_equals_separate_attention():
    torch.manual_seed(0)
    attn = MultiheadAttention(16, 4).eval()
    sizes = [5, 1, 7]
    x = torch.randn(1, sum(sizes), 16)
    ids = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    with torch.no_grad():
        packed = attn(x, mask=AttentionMask.packed(ids[None]))
        alone = torch.cat([attn(part) for part in x.split(sizes, dim=1)], dim=1)
        full = attn(x)
    torch.testing.assert_close(packed, alone, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(full, alone, atol=1e-3)  # without the mask the graphs would mix


def test_spd_positions_come_from_the_edges():
    g = _graph(5, 0)
    model = _model("spd")
    pos = node_positions(Batch.from_data_list([g, g]), model.encoding)
    assert pos.shape == (10, 2 + 5)
    assert pos[:, 0].tolist() == [0] * 5 + [1] * 5 and pos[:, 1].tolist() == list(range(5)) * 2
    assert torch.equal(pos[:, 2:].diagonal()[:5], torch.zeros(5, dtype=torch.long))


def test_bad_input():
    g = Batch.from_data_list([_graph(5, 0)])
    with pytest.raises(ValueError, match="needs data.laplacian_eigenvector_pe"):
        _model("lap").forward_data(g)
    with pytest.raises(ValueError, match="pass positions"):
        _model("rwse")(g.x, g.edge_index, edge_attr=g.edge_attr)
    with pytest.raises(ValueError, match="x must be \\[num_nodes, in_dim=3\\]"):
        _model(None)(g.x[:, :2], g.edge_index, edge_attr=g.edge_attr)
    with pytest.raises(ValueError, match="built with edge_dim=2: pass edge_attr"):
        _model(None)(g.x, g.edge_index)
    with pytest.raises(ValueError, match="local='gine' needs edge features"):
        GPS(3, 1, local="gine")
    with pytest.raises(ValueError, match="task must be 'graph' or 'node'"):
        GPS(3, 1, task="edge")
    with pytest.raises(TypeError, match="lap: unknown argument"):
        GPS(3, 1, encoding="lap", encoding_options={"walk_length": 3})


def test_num_graphs_is_checked_and_pools_empty_trailing_graphs():
    g = Batch.from_data_list([_with_pe(_graph(5, 0)), _with_pe(_graph(6, 1))])
    model = _model("rwse").eval()
    args = (g.x, g.edge_index)
    kw = dict(batch=g.batch, edge_attr=g.edge_attr, positions=g[RWSE_ATTR])
    out = model(*args, **kw)
    torch.testing.assert_close(model(*args, **kw, num_graphs=2), out)
    assert torch.equal(model.forward_data(g), out)  # forward_data passes Batch.num_graphs
    # a third, empty graph: mean pooling gives it a zero row, the head maps that like any other
    three = model(*args, **kw, num_graphs=3)
    torch.testing.assert_close(three[:2], out)
    assert three.shape == (3, 5)
    with pytest.raises(ValueError, match="num_graphs must be an int >= the largest graph id \\+ 1 \\(2\\), got 1"):
        model(*args, **kw, num_graphs=1)


def test_compiled_forward_has_no_graph_break():
    # The value checks of the graph input read data (host syncs); under torch.compile they are
    # skipped so that a GPS forward given num_graphs is one graph.
    g = Batch.from_data_list([_with_pe(_graph(5, 0)), _with_pe(_graph(6, 1))])
    model = _model("rwse").eval()
    info = torch._dynamo.explain(model)(g.x, g.edge_index, batch=g.batch, edge_attr=g.edge_attr,
                                        positions=g[RWSE_ATTR], num_graphs=2)
    assert info.graph_break_count == 0, [b.reason for b in info.break_reasons]
    assert info.graph_count == 1
