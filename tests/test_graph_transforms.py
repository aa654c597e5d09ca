"""The PyG drop-in transforms and the whole-Batch functions against PyG's own transforms."""

from __future__ import annotations

import warnings

import pytest
import torch

from posenc.graph.transforms import AddLaplacianPE, AddRandomWalkSE, add_laplacian_pe_batch, add_random_walk_se_batch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.transforms as T
    from torch_geometric.data import Batch, Data
    from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE, BaseTransform


def graph(n: int, seed: int, features: int | None = 3) -> Data:
    g = torch.Generator().manual_seed(seed)
    ring = torch.arange(n)
    chords = torch.randint(0, n, (2, n), generator=g)
    e = torch.cat([torch.stack([ring, (ring + 1) % n]), chords], 1)
    e = e[:, e[0] != e[1]]
    e = torch.unique(torch.cat([e, e.flip(0)], 1), dim=1)
    x = None if features is None else torch.randn(n, features, generator=g)
    return Data(x=x, edge_index=e, num_nodes=n)


def same_up_to_column_sign(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-4) -> bool:
    sign = torch.sign((a * b).sum(0))
    sign[sign == 0] = 1
    return torch.allclose(a * sign, b, atol=atol)


def test_laplacian_transform_is_a_drop_in_for_pyg():
    assert issubclass(AddLaplacianPE, BaseTransform)
    data = graph(20, seed=0)
    ours = AddLaplacianPE(4, is_undirected=True)(data.clone())
    theirs = AddLaplacianEigenvectorPE(4, is_undirected=True)(data.clone())
    a, b = ours.laplacian_eigenvector_pe, theirs.laplacian_eigenvector_pe
    assert a.shape == b.shape == (20, 4) and a.dtype == b.dtype == torch.float32
    assert same_up_to_column_sign(a, b)
    # attr_name=None concatenates to x, as PyG does
    cat = AddLaplacianPE(4, attr_name=None)(data.clone())
    assert cat.x.shape == (20, 7) and torch.equal(cat.x[:, :3], data.x)
    assert same_up_to_column_sign(cat.x[:, 3:], b)
    nox = AddLaplacianPE(4, attr_name=None)(graph(20, seed=0, features=None))
    assert nox.x.shape == (20, 4)


def test_laplacian_transform_signs_and_eigenvalues():
    data = graph(15, seed=1)
    fixed = [AddLaplacianPE(3, random_sign=False)(data.clone()).laplacian_eigenvector_pe for _ in range(2)]
    torch.testing.assert_close(fixed[0], fixed[1])
    torch.manual_seed(0)
    drawn = torch.stack([AddLaplacianPE(3)(data.clone()).laplacian_eigenvector_pe[:, 0] for _ in range(12)])
    assert torch.allclose(drawn.abs(), fixed[0][:, 0].abs().expand(12, -1), atol=1e-6)
    assert {float(torch.sign((d * fixed[0][:, 0]).sum())) for d in drawn} == {-1.0, 1.0}
    with_vals = AddLaplacianPE(3, eigenvalues_attr="eigvals")(data.clone())
    assert with_vals.eigvals.shape == (15, 3) and torch.all(with_vals.eigvals == with_vals.eigvals[0])


def test_random_walk_transform_is_a_drop_in_for_pyg():
    data = graph(25, seed=2)
    ours = AddRandomWalkSE(7)(data.clone())
    theirs = AddRandomWalkPE(7)(data.clone())
    assert ours.random_walk_pe.shape == (25, 7) and ours.random_walk_pe.dtype == theirs.random_walk_pe.dtype
    torch.testing.assert_close(ours.random_walk_pe, theirs.random_walk_pe, atol=1e-6, rtol=1e-5)
    cat_ours = AddRandomWalkSE(7, attr_name=None)(data.clone())
    cat_theirs = AddRandomWalkPE(7, attr_name=None)(data.clone())
    torch.testing.assert_close(cat_ours.x, cat_theirs.x, atol=1e-6, rtol=1e-5)
    composed = T.Compose([AddLaplacianPE(3), AddRandomWalkSE(4)])(data.clone())
    assert composed.laplacian_eigenvector_pe.shape == (25, 3) and composed.random_walk_pe.shape == (25, 4)


def test_batch_functions_equal_the_per_graph_transforms():
    datas = [graph(n, seed=n) for n in (6, 13, 6, 3, 21)]
    batch = Batch.from_data_list([d.clone() for d in datas])
    add_random_walk_se_batch(batch, 9)
    expected = torch.cat([AddRandomWalkPE(9)(d.clone()).random_walk_pe for d in datas])
    torch.testing.assert_close(batch.random_walk_pe, expected, atol=1e-6, rtol=1e-5)
    add_laplacian_pe_batch(batch, 4, random_sign=False, eigenvalues_attr="eigvals")
    offset = 0
    for d in datas:
        one = AddLaplacianPE(4, random_sign=False, eigenvalues_attr="eigvals")(d.clone())
        n = d.num_nodes
        torch.testing.assert_close(batch.eigvals[offset : offset + n], one.eigvals, atol=1e-5, rtol=0)
        assert same_up_to_column_sign(batch.laplacian_eigenvector_pe[offset : offset + n], one.laplacian_eigenvector_pe)
        offset += n
    assert torch.all(batch.laplacian_eigenvector_pe[25:28, 2:] == 0)  # the 3-node graph is padded past n - 1
    single = add_random_walk_se_batch(datas[1].clone(), 9, attr_name=None)  # a plain Data works too
    assert single.x.shape == (13, 12)


def test_transform_errors():
    with pytest.raises(ValueError, match="k must be a positive int"):
        AddLaplacianPE(0)
    with pytest.raises(ValueError, match="walk_length must be a positive int"):
        AddRandomWalkSE(-1)
    directed = Data(edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=3)
    with pytest.raises(ValueError, match="symmetrize=True"):
        AddLaplacianPE(2)(directed)
    assert AddLaplacianPE(2, symmetrize=True)(directed).laplacian_eigenvector_pe.shape == (3, 2)
    bad = Data(edge_index=torch.tensor([[0, 1], [1, 7]]), num_nodes=3)
    with pytest.raises(ValueError, match="node index 7 out of range"):
        AddRandomWalkSE(3)(bad)
