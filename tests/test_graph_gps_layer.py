"""posenc.graph.GPSLayer, the GPSConv-shaped layer, and AddLaplacianPE(eigenvalues=True):
block-diagonal attention, permutation equivariance, GPS as a stack of the layer, equality with
PyG's GPSConv (no encoding), a user-style PyG model, and eigenvalues against numpy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from posenc.graph import GPSLayer, ShortestPathBias, node_positions
from posenc.graph.gps import GPS, LAP_ATTR, local_conv
from posenc.graph.transforms import EIGENVALUES_ATTR, AddLaplacianPE, add_laplacian_pe_batch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Batch, Data
    from torch_geometric.nn import GINConv, GINEConv, GPSConv, global_mean_pool


def _graph(n: int, seed: int, dim: int = 8, edge_dim: int | None = None) -> Data:
    g = torch.Generator().manual_seed(seed)
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    chords = torch.randint(0, n, (2, max(1, n // 2)), generator=g)
    e = torch.cat([ring, chords[:, chords[0] != chords[1]]], 1)
    e = torch.unique(torch.cat([e, e.flip(0)], 1), dim=1)
    data = Data(x=torch.randn(n, dim, generator=g), edge_index=e, num_nodes=n)
    if edge_dim is not None:
        data.edge_attr = torch.randn(e.shape[1], edge_dim, generator=g)
    return data


def _gin(dim: int) -> GINConv:
    return GINConv(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim)), train_eps=True)


def _layer(encoding="spd", norm="batch", seed=0) -> GPSLayer:
    torch.manual_seed(seed)
    opts = {"max_distance": 4} if encoding == "spd" else None
    layer = GPSLayer(8, _gin(8), heads=2, encoding=encoding, encoding_options=opts, norm=norm)
    with torch.no_grad():  # a bias far from its small initialisation, so that distances matter
        if layer.encoding is not None:
            layer.encoding.weight.normal_(std=1.0)
        for bn in [m for m in layer.modules() if isinstance(m, nn.BatchNorm1d)]:
            bn.running_mean.normal_(std=0.1)
            bn.running_var.uniform_(0.5, 2.0)
    return layer.eval()


def _run(layer: GPSLayer, batch: Batch) -> torch.Tensor:
    pos = node_positions(batch, layer.encoding) if layer.encoding is not None else None
    return layer(batch.x, batch.edge_index, batch.batch, positions=pos)


def test_graphs_of_a_batch_never_attend_to_each_other():
    layer = _layer("spd")
    a, b = _graph(6, 1), _graph(7, 2)
    other = _graph(9, 3)  # graph 2 replaced: other features, size and edges
    with torch.no_grad():
        out = _run(layer, Batch.from_data_list([a, b]))
        out2 = _run(layer, Batch.from_data_list([a, other]))
        alone = _run(layer, Batch.from_data_list([a]))
    torch.testing.assert_close(out2[:6], out[:6], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(alone, out[:6], atol=1e-6, rtol=1e-6)
    # without the mask graph 2 would reach graph 1: attending to the whole batch differs
    with torch.no_grad():
        mixed = layer(torch.cat([a.x, b.x]), torch.cat([a.edge_index, b.edge_index + 6], 1), None,
                      positions=node_positions(Batch.from_data_list([a, b]), layer.encoding))
    assert not torch.allclose(mixed[:6], out[:6], atol=1e-3)


@pytest.mark.parametrize("encoding", [None, "spd"])
def test_permutation_equivariance(encoding):
    layer = _layer(encoding)
    a, b = _graph(7, 4), _graph(5, 5)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))  # node i of a becomes node perm[i]
    pa = a.clone()
    pa.edge_index = perm[a.edge_index]
    pa.x = a.x[torch.argsort(perm)]
    with torch.no_grad():
        out = _run(layer, Batch.from_data_list([a, b]))
        out_p = _run(layer, Batch.from_data_list([pa, b]))
    torch.testing.assert_close(out_p[:7][perm], out[:7], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_p[7:], out[7:], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out[:7], out[:7][perm], atol=1e-3)  # the check is not vacuous


def test_spd_changes_the_output_and_gets_gradients():
    batch = Batch.from_data_list([_graph(6, 1), _graph(5, 2)])
    layer = _layer("spd").train()
    out = _run(layer, batch)
    out.square().sum().backward()
    assert layer.encoding.weight.grad is not None and layer.encoding.weight.grad.abs().sum() > 0
    with torch.no_grad():
        layer.eval()
        before = _run(layer, batch)
        layer.encoding.weight.zero_()
        assert not torch.allclose(_run(layer, batch), before, atol=1e-3)


@pytest.mark.parametrize("encoding", [None, "spd", "lap"])
def test_gps_is_a_stack_of_the_layer(encoding):
    torch.manual_seed(0)
    opts = {"spd": {"max_distance": 4}, "lap": {"k": 3}}.get(encoding)
    model = GPS(8, 3, dim=16, depth=3, num_heads=2, edge_dim=4, encoding=encoding, encoding_options=opts,
                task="node").eval()
    graphs = [AddLaplacianPE(3, eigenvalues=True, random_sign=False)(_graph(n, n, edge_dim=4)) for n in (6, 9)]
    batch = Batch.from_data_list(graphs)
    # a user's own stack: GPSLayer around GINEConv, with GPS's weights
    shared = model.layers[0].encoding
    stack = nn.ModuleList(
        GPSLayer(16, GINEConv(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16)), train_eps=True), 2,
                 encoding=shared if shared is not None else None)
        for _ in range(3)
    )
    stack.load_state_dict(model.layers.state_dict())
    stack.eval()
    with torch.no_grad():
        expected = model.forward_data(batch)
        h = model.node_embed(batch.x)
        pos = node_positions(batch, model.encoding) if encoding is not None else None
        if encoding == "lap":
            h = model.encoding.encode_input(h[None], pos[None])[0]
        e = model.edge_embed(batch.edge_attr)
        for layer in stack:
            h = layer(h, batch.edge_index, batch.batch, edge_attr=e, positions=pos if encoding == "spd" else None)
        got = model.head(h)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert all(isinstance(layer, GPSLayer) for layer in model.layers)


@pytest.mark.parametrize("train", [False, True])
def test_without_an_encoding_it_computes_pyg_gpsconv(train):
    torch.manual_seed(0)
    ours = GPSLayer(8, _gin(8), heads=2)
    theirs = GPSConv(8, _gin(8), heads=2)
    theirs.conv.load_state_dict(ours.conv.state_dict())
    with torch.no_grad():
        theirs.attn.in_proj_weight.copy_(torch.cat([ours.attn.q_proj.weight, ours.attn.k_proj.weight, ours.attn.v_proj.weight]))
        theirs.attn.in_proj_bias.copy_(torch.cat([ours.attn.q_proj.bias, ours.attn.k_proj.bias, ours.attn.v_proj.bias]))
        theirs.attn.out_proj.weight.copy_(ours.attn.out_proj.weight)
        theirs.attn.out_proj.bias.copy_(ours.attn.out_proj.bias)
        for i in (0, 3):
            theirs.mlp[i].weight.copy_(ours.mlp[i].weight)
            theirs.mlp[i].bias.copy_(ours.mlp[i].bias)
        for mine, pyg in ((ours.norm_local, theirs.norm1), (ours.norm_attn, theirs.norm2), (ours.norm_out, theirs.norm3)):
            mine.weight.normal_()
            mine.bias.normal_()
            mine.running_mean.normal_(std=0.1)
            mine.running_var.uniform_(0.5, 2.0)
            pyg.module.load_state_dict(mine.state_dict())
    ours.train(train)
    theirs.train(train)
    batch = Batch.from_data_list([_graph(5, 1), _graph(8, 2)])
    with torch.no_grad():
        expected = theirs(batch.x, batch.edge_index, batch.batch)
        got = ours(batch.x, batch.edge_index, batch.batch)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


class _UserNet(nn.Module):
    """A user's own PyG graph classifier with posenc's global attention and the shortest-path bias."""

    def __init__(self, in_dim: int, dim: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(in_dim, dim)
        self.spd = ShortestPathBias(num_heads=4, max_distance=5)  # one bias table shared by the layers
        self.layers = nn.ModuleList(GPSLayer(dim, _gin(dim), heads=4, encoding=self.spd) for _ in range(2))
        self.head = nn.Linear(dim, classes)

    def forward(self, x, edge_index, batch, positions):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, edge_index, batch, positions=positions)
        return self.head(global_mean_pool(h, batch))


def test_in_a_user_style_pyg_model_with_gin_it_trains():
    torch.manual_seed(0)
    graphs = [_graph(n, n, dim=4) for n in (5, 6, 7, 8, 9, 10)]
    for i, g in enumerate(graphs):
        g.y = torch.tensor([i % 2])
    batch = Batch.from_data_list(graphs)
    net = _UserNet(4, 16, 2)
    positions = node_positions(batch, net.spd)  # once per batch, for every layer
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = nn.functional.cross_entropy(net(batch.x, batch.edge_index, batch.batch, positions), batch.y)
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None for p in net.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_layer_errors_are_clear():
    with pytest.raises(ValueError, match="LapPE acts on the input features once"):
        GPSLayer(8, None, 2, encoding="lap")
    with pytest.raises(ValueError, match="channels \\(8\\) must be divisible by heads \\(3\\)"):
        GPSLayer(8, None, 3)
    with pytest.raises(TypeError, match="conv must be a message-passing nn.Module"):
        GPSLayer(8, "gin", 2)
    with pytest.raises(ValueError, match="norm must be 'batch', 'layer' or None"):
        GPSLayer(8, None, 2, norm="graph")
    layer = _layer("spd")
    g = Batch.from_data_list([_graph(5, 0)])
    with pytest.raises(ValueError, match="needs positions \\[num_nodes, features\\]"):
        layer(g.x, g.edge_index, g.batch)
    with pytest.raises(ValueError, match="batch must be a long tensor \\[num_nodes=5\\]"):
        layer(g.x, g.edge_index, g.batch.float(), positions=node_positions(g, layer.encoding))
    with pytest.raises(ValueError, match="x must be \\[num_nodes, channels=8\\]"):
        layer(g.x[:, :4], g.edge_index, g.batch)
    with pytest.raises(ValueError, match="local must be 'gine', 'gin' or 'none'"):
        local_conv("gat", 8)
    assert GPSLayer(8, None, 2, norm=None)(g.x, g.edge_index, g.batch).shape == (5, 8)  # attention only


# ---------------------------------------------------------------------------------------------
# AddLaplacianPE(eigenvalues=True)


def _numpy_spectrum(data: Data) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of I - D^-1/2 A D^-1/2 in float64, ascending."""
    n = data.num_nodes
    adj = np.zeros((n, n))
    adj[data.edge_index[0].numpy(), data.edge_index[1].numpy()] = 1.0
    d = adj.sum(1)
    inv = np.where(d > 0, 1.0 / np.sqrt(np.maximum(d, 1e-300)), 0.0)
    lap = np.eye(n) - inv[:, None] * adj * inv[None, :]
    return np.linalg.eigh(lap)


def test_eigenvalues_match_numpy_and_pair_with_the_vectors():
    data = _graph(9, 7)
    out = AddLaplacianPE(4, eigenvalues=True)(data.clone())
    vals_np, _ = _numpy_spectrum(data)
    vals = out[EIGENVALUES_ATTR]
    assert vals.shape == (9, 4) and vals.dtype == torch.float32
    np.testing.assert_allclose(vals.numpy(), np.broadcast_to(vals_np[1:5], (9, 4)), atol=1e-5)
    # each stored vector is an eigenvector of its stored eigenvalue: L v = lambda v
    n = data.num_nodes
    adj = torch.zeros(n, n, dtype=torch.float64)
    adj[data.edge_index[0], data.edge_index[1]] = 1.0
    inv = adj.sum(1).rsqrt()
    lap = torch.eye(n, dtype=torch.float64) - inv[:, None] * adj * inv[None, :]
    vecs = out[LAP_ATTR].double()
    torch.testing.assert_close(lap @ vecs, vecs * vals[0].double(), atol=1e-5, rtol=0)
    # attr_name=None: x = [x, vecs, vals], the layout lap reads
    cat = AddLaplacianPE(4, attr_name=None, eigenvalues=True, random_sign=False)(data.clone())
    assert cat.x.shape == (9, 8 + 8)
    np.testing.assert_allclose(cat.x[:, 12:].numpy(), np.broadcast_to(vals_np[1:5], (9, 4)), atol=1e-5)
    # the batch version stores the same
    batch = add_laplacian_pe_batch(Batch.from_data_list([data, _graph(6, 1)]), 4, eigenvalues=True)
    torch.testing.assert_close(batch[EIGENVALUES_ATTR][:9], vals, atol=1e-5, rtol=0)


def test_eigsh_keyword_arguments_are_passed_and_validated():
    data = _graph(40, 3)
    vals_np, _ = _numpy_spectrum(data)
    sparse = AddLaplacianPE(3, eigenvalues=True, method="sparse", random_sign=False, tol=1e-10, ncv=16, maxiter=5000)
    out = sparse(data.clone())
    np.testing.assert_allclose(out[EIGENVALUES_ATTR][0].numpy(), vals_np[1:4], atol=1e-4)
    assert sparse.kwargs == {"tol": 1e-10, "ncv": 16, "maxiter": 5000}
    # eigsh really receives them: too few iterations is ARPACK's own error
    from scipy.sparse.linalg import ArpackNoConvergence

    with pytest.raises(ArpackNoConvergence):
        AddLaplacianPE(3, method="sparse", maxiter=1, tol=1e-12)(data.clone())
    with pytest.raises(TypeError, match="unknown eigsh argument\\(s\\) which; accepted: tol, maxiter, ncv, v0"):
        AddLaplacianPE(3, which="LM")
    with pytest.raises(ValueError, match="ncv must be an int > k \\+ 1 = 4"):
        AddLaplacianPE(3, ncv=4)
    with pytest.raises(ValueError, match="tol must be a number >= 0"):
        AddLaplacianPE(3, tol=-1.0)
    with pytest.raises(ValueError, match="maxiter must be a positive int"):
        AddLaplacianPE(3, maxiter=0)
    with pytest.raises(ValueError, match="method='lobpcg' uses torch.lobpcg"):
        AddLaplacianPE(3, method="lobpcg", tol=1e-3)
    with pytest.raises(ValueError, match="v0 has 5 entries; this graph has 40 nodes"):
        AddLaplacianPE(3, method="sparse", v0=np.ones(5))(data.clone())
    with pytest.raises(TypeError, match="eigenvalues must be True or False"):
        AddLaplacianPE(3, eigenvalues="yes")
