"""Graph datasets: CSL generated on the fly, molecules from SMILES, the user's own PyG data."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset

from posenc.graph import datasets as gd


def _nx(g: Data) -> nx.Graph:
    out = nx.Graph()
    out.add_nodes_from(range(g.num_nodes))
    out.add_edges_from(g.edge_index.t().tolist())
    return out


def test_csl_graphs_are_4_regular_circulants_on_41_nodes():
    ds = gd.csl_dataset(2, seed=0)
    assert len(ds) == 20 and [int(g.y) for g in ds] == [i // 2 for i in range(20)]
    for g in ds:
        assert g.num_nodes == 41 and g.x.shape == (41, 1) and g.edge_index.shape == (2, 164)
        src, dst = g.edge_index
        assert torch.equal(torch.bincount(src, minlength=41), torch.full((41,), 4))
        assert not bool((src == dst).any())
        pairs = set(map(tuple, g.edge_index.t().tolist()))
        assert len(pairs) == 164 and all((v, u) in pairs for u, v in pairs)  # undirected, no duplicates
    # the identity-permuted graph of class c is C_41(1, s_c) exactly
    g = gd.csl_graph(3)
    expected = nx.circulant_graph(41, [1, gd.CSL_SKIPS[3]])
    assert set(map(frozenset, _nx(g).edges())) == set(map(frozenset, expected.edges()))


def test_csl_isomorphism_classes():
    ds = gd.csl_dataset(2, seed=1)
    # two samples of one class: isomorphic, but not identical (each has its own node permutation)
    for c in (0, 4, 9):
        a, b = ds[2 * c], ds[2 * c + 1]
        assert not torch.equal(a.edge_index, b.edge_index)
        assert nx.is_isomorphic(_nx(a), _nx(b))
    # different classes: adjacency spectra differ, so the graphs are not isomorphic
    spectra = [torch.linalg.eigvalsh(torch.tensor(nx.to_numpy_array(_nx(ds[2 * c])))) for c in range(10)]
    for i, j in itertools.combinations(range(10), 2):
        assert (spectra[i] - spectra[j]).abs().max() > 1e-6, (i, j)
    assert not nx.is_isomorphic(_nx(ds[0]), _nx(ds[2]))


def test_csl_permutation_is_seeded():
    a, b, c = gd.csl_graph(5, seed=7), gd.csl_graph(5, seed=7), gd.csl_graph(5, seed=8)
    assert torch.equal(a.edge_index, b.edge_index) and not torch.equal(a.edge_index, c.edge_index)
    d1, d2 = gd.csl_dataset(3, seed=0), gd.csl_dataset(3, seed=0)
    assert all(torch.equal(x.edge_index, y.edge_index) for x, y in zip(d1, d2))
    assert not torch.equal(gd.csl_dataset(3, seed=1)[0].edge_index, d1[0].edge_index)
    with pytest.raises(ValueError, match="label must be an int in 0..9; got 10"):
        gd.csl_graph(10)


def test_splits_are_deterministic_disjoint_and_stratified():
    s = gd.csl_splits(15, test_per_class=5)
    assert len(s["train"]) == 100 and len(s["test"]) == 50 and not s["val"]
    assert not set(s["train"]) & set(s["test"])
    assert sorted(i // 15 for i in s["test"]) == sorted(list(range(10)) * 5)
    with pytest.raises(ValueError, match="at least one training sample per class"):
        gd.csl_splits(5, test_per_class=5)
    r1, r2 = gd.random_splits(100, seed=3), gd.random_splits(100, seed=3)
    assert r1 == r2 and r1 != gd.random_splits(100, seed=4)
    assert sorted(r1["train"] + r1["val"] + r1["test"]) == list(range(100))
    assert (len(r1["val"]), len(r1["test"])) == (10, 10)


def _expected_target(smiles: str, ring_penalty: int) -> float:
    from rdkit import Chem
    from rdkit.Chem import Crippen
    from rdkit.Contrib.SA_Score import sascorer

    mol = Chem.MolFromSmiles(smiles)
    return Crippen.MolLogP(mol) - sascorer.calculateScore(mol) - ring_penalty


def test_molecules_build_with_right_counts_and_targets(tmp_path):
    pytest.importorskip("rdkit.Contrib.SA_Score.sascorer")
    smiles = ["CCO", "c1ccccc1", "C1CCCCCCC1", "CC(=O)[O-].[Na+]", "not a smiles", "C"]
    graphs = gd.molecule_dataset(smiles, cache_dir=tmp_path)
    # "not a smiles" fails to parse; "C" has one heavy atom (< min_atoms=2)
    assert [g.smiles for g in graphs] == smiles[:4]
    assert [g.num_nodes for g in graphs] == [3, 6, 8, 4]  # acetate keeps its largest fragment
    assert [g.edge_index.shape[1] for g in graphs] == [4, 12, 16, 6]  # both directions
    for g in graphs:
        assert g.x.shape == (g.num_nodes, gd.NODE_FEATURES) and g.edge_attr.shape == (g.edge_index.shape[1], gd.EDGE_FEATURES)
        assert torch.equal(g.x[:, : len(gd.ATOM_TYPES) + 1].sum(1), torch.ones(g.num_nodes))  # one element each
    benzene = graphs[1]
    assert torch.equal(benzene.edge_attr[:, 3], torch.ones(12))  # all aromatic bonds
    assert torch.equal(benzene.x[:, 0], torch.ones(6))  # all carbon
    expected = [_expected_target("CCO", 0), _expected_target("c1ccccc1", 0), _expected_target("C1CCCCCCC1", 2),
                _expected_target("CC(=O)[O-]", 0)]
    torch.testing.assert_close(torch.cat([g.y for g in graphs]), torch.tensor(expected, dtype=torch.float32))
    # cached: one file, written atomically (no temporary left), read back identically
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt"
    again = gd.molecule_dataset(smiles, cache_dir=tmp_path)
    for a, b in zip(graphs, again):
        assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index) and torch.equal(a.y, b.y)
    # other filters -> another cache file
    assert len(gd.molecule_dataset(smiles, cache_dir=tmp_path, max_atoms=6)) == 3
    assert len(list(tmp_path.iterdir())) == 2


def test_nci_smiles_ship_with_rdkit():
    lines = gd.nci_smiles_path().read_text().splitlines()
    assert len(lines) > 4000
    graphs = gd.molecule_dataset([ln.split()[0] for ln in lines[:20]])
    assert 10 <= len(graphs) <= 20 and all(g.edge_index.shape[1] > 0 for g in graphs)


def tiny_graphs() -> list[Data]:
    """Used by the import-by-name test (``tests.test_graph_data:tiny_graphs``)."""
    return [Data(edge_index=torch.tensor([[0, 1], [1, 0]]), y=torch.tensor([i % 2]), num_nodes=2) for i in range(4)]


def test_user_dataset_from_file_or_import(tmp_path):
    graphs = tiny_graphs()
    path = tmp_path / "list.pt"
    torch.save(graphs, path)
    loaded = gd.load_user_dataset(str(path))
    assert len(loaded) == 4 and loaded[0].x.shape == (2, 1)  # x filled with ones
    path2 = tmp_path / "inmemory.pt"
    InMemoryDataset.save([Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([1.5]))] * 3, str(path2))
    loaded = gd.load_user_dataset(str(path2))
    assert len(loaded) == 3 and loaded[2].x.shape == (3, 2)
    assert len(gd.load_user_dataset("tests.test_graph_data:tiny_graphs", entry_point=True)) == 4


def test_a_dataset_path_is_never_imported(tmp_path, monkeypatch):
    # a missing mygraphs.pt beside a mygraphs.py in the working directory: the file is reported
    # missing and the module is never run (it would create a marker file)
    marker = tmp_path / "ran"
    (tmp_path / "mygraphs.py").write_text(f"open({str(marker)!r}, 'w').close()\ngraphs = []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("mygraphs.pt", "mygraphs:graphs", "mygraphs.graphs", "shutil:rmtree"):
        with pytest.raises(FileNotFoundError, match="does not exist .*--dataset-module"):
            gd.load_user_dataset(spec)
    assert not marker.exists()


class Evil:
    """A class no weights-only load may construct."""


def test_user_dataset_bad_input(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save([Evil()], path)
    with pytest.raises(ValueError, match="cannot be loaded with weights_only=True .*Evil"):
        gd.load_user_dataset(str(path))
    with pytest.raises(ValueError, match="module 'nowhere_xyz' cannot be imported"):
        gd.load_user_dataset("nowhere_xyz:graphs", entry_point=True)
    with pytest.raises(ValueError, match="must be 'package.module:attr'"):
        gd.load_user_dataset("tests.test_graph_data.tiny_graphs", entry_point=True)
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        gd.load_user_dataset("tests.test_graph_data:missing", entry_point=True)
    torch.save([torch.zeros(2)], tmp_path / "tensors.pt")
    with pytest.raises(TypeError, match="item 0 is a Tensor, expected torch_geometric.data.Data"):
        gd.load_user_dataset(str(tmp_path / "tensors.pt"))
