"""Laplacian eigenvector PE, random-walk SE, SignNet and the graph-input checks: values against
PyG's transforms and the definitions, invariances, batched == per graph, sparse == dense."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

import posenc
from posenc.graph import (
    LapPE,
    RWSE,
    SignNet,
    check_edge_index,
    laplacian,
    laplacian_pe,
    laplacian_pe_batch,
    random_sign_flip,
    random_walk_se,
    random_walk_se_batch,
    symmetrize,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data
    from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE
    from torch_geometric.utils import get_laplacian, to_dense_adj


# ---- graphs -----------------------------------------------------------------------------------

def random_graph(n: int, m: int, seed: int, *, directed: bool = False, self_loops: bool = False) -> torch.Tensor:
    """``m`` random distinct node pairs (both directions unless ``directed``), no duplicates."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(0, n, (2, m), generator=g)
    if not self_loops:
        e = e[:, e[0] != e[1]]
    if not directed:
        e = torch.cat([e, e.flip(0)], 1)
    return torch.unique(e, dim=1)


def random_batch(sizes: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Random graphs of the given sizes (graph ``i`` seeded ``seed + i``, ``2 n`` pairs each) as one
    batch: the edge index with node offsets, the batch vector, and each graph's offset edges."""
    edges, offset = [], 0
    for i, n in enumerate(sizes):
        edges.append(random_graph(n, 2 * n, seed=seed + i) + offset)
        offset += n
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return torch.cat(edges, 1), batch, edges


def path_edges(n: int, offset: int = 0) -> torch.Tensor:
    a = torch.arange(offset, offset + n - 1)
    return torch.cat([torch.stack([a, a + 1]), torch.stack([a + 1, a])], 1)


def dense_lap(edge_index, n, normalization="sym"):
    ei, w = get_laplacian(edge_index, normalization=normalization, num_nodes=n)
    return to_dense_adj(ei, edge_attr=w, max_num_nodes=n)[0].double()


def spectrum_gaps(edge_index, n, k):
    vals = np.linalg.eigvalsh(dense_lap(edge_index, n).numpy())
    return np.diff(vals[: k + 2]).min()


def assert_equal_up_to_sign(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-4) -> None:
    assert a.shape == b.shape
    sign = torch.sign((a * b).sum(0))
    sign[sign == 0] = 1
    torch.testing.assert_close(a * sign, b, atol=atol, rtol=0)


def assert_same_eigenspaces(a, b, vals, edge_index, n, tol=1e-5):
    """Columns ``a`` and ``b`` span the same space per eigenvalue: projectors agree for every
    eigenvalue whose whole eigenspace is among the columns; partial ones are checked as eigenpairs."""
    spectrum = np.linalg.eigvalsh(dense_lap(edge_index, n).numpy())
    lap = dense_lap(edge_index, n)
    real = min(a.shape[1], n - 1)
    for lam in np.unique(np.round(vals[:real].numpy(), 4)):
        cols = [j for j in range(real) if abs(float(vals[j]) - lam) < 1e-3]
        pa, pb = a[:, cols].double(), b[:, cols].double()
        if int((np.abs(spectrum - lam) < 1e-3).sum()) == len(cols):
            torch.testing.assert_close(pa @ pa.T, pb @ pb.T, atol=tol * 10, rtol=0)
        for v in (pa, pb):
            torch.testing.assert_close(lap @ v, v * lam, atol=1e-3, rtol=0)


def pyg_lap(edge_index, n, k):
    data = AddLaplacianEigenvectorPE(k, is_undirected=True)(Data(edge_index=edge_index, num_nodes=n))
    return data.laplacian_eigenvector_pe


# ---- Laplacian PE: values ---------------------------------------------------------------------

@pytest.mark.parametrize("n,m,k", [(18, 40, 5), (60, 150, 8), (130, 400, 6)])  # PyG: dense eig < 100 <= eigsh
def test_lap_pe_equals_pyg_up_to_sign(n, m, k):
    e = random_graph(n, m, seed=n)
    assert spectrum_gaps(e, n, k) > 1e-3  # distinct eigenvalues: each column is defined up to sign
    vecs, vals = laplacian_pe(e, n, k)
    assert vecs.shape == (n, k) and vecs.dtype == torch.float32 and vals.shape == (k,)
    assert_equal_up_to_sign(vecs, pyg_lap(e, n, k).float())
    expected = np.linalg.eigvalsh(dense_lap(e, n).numpy())[1 : k + 1]
    np.testing.assert_allclose(vals.numpy(), expected, atol=1e-5)


def test_lap_pe_repeated_eigenvalues_span_the_same_eigenspaces():
    n, k = 8, 4  # cycle C_8: eigenvalues 1 - cos(2 pi j / 8), j and 8 - j repeated; k = 4 takes two full pairs
    a = torch.arange(n)
    e = torch.cat([torch.stack([a, (a + 1) % n]), torch.stack([(a + 1) % n, a])], 1)
    vecs, vals = laplacian_pe(e, n, k)
    expected = sorted(1 - np.cos(2 * np.pi * j / n) for j in range(n))[1 : k + 1]
    np.testing.assert_allclose(vals.numpy(), expected, atol=1e-6)
    ref = pyg_lap(e, n, k).double()
    for cols in ([0, 1], [2, 3]):  # compare projectors onto each 2-dimensional eigenspace
        ours = vecs[:, cols].double()
        torch.testing.assert_close(ours @ ours.T, ref[:, cols] @ ref[:, cols].T, atol=1e-5, rtol=0)


def check_eigenpairs(edge_index, n, k, vecs, vals, normalization="sym", real=None):
    """L v = lambda v for each real column, eigenvalues = spectrum[1 : k + 1], unit norm."""
    lap = dense_lap(edge_index, n, normalization)
    spectrum = np.sort(np.linalg.eigvals(lap.numpy()).real)
    real = min(k, n - 1) if real is None else real
    np.testing.assert_allclose(vals[:real].numpy(), spectrum[1 : real + 1], atol=1e-5)
    v = vecs[:, :real].double()
    torch.testing.assert_close(lap @ v, v * vals[:real].double(), atol=1e-5, rtol=0)
    torch.testing.assert_close(v.norm(dim=0), torch.ones(real, dtype=torch.float64), atol=1e-5, rtol=0)
    return v


def test_lap_pe_disconnected_graph_drops_only_the_first_eigenvector():
    # Two paths and an isolated node: eigenvalue 0 twice; PyG drops only the first, so one
    # zero-eigenvalue vector stays; the isolated node has L_ii = 1 (D^-1/2 = 0, as get_laplacian).
    n, k = 10, 6
    e = torch.cat([path_edges(4), path_edges(5, offset=4)], 1)
    vecs, vals = laplacian_pe(e, n, k)
    v = check_eigenpairs(e, n, k, vecs, vals)
    assert abs(float(vals[0])) < 1e-6 and float(vals[1]) > 1e-3
    torch.testing.assert_close(v.T @ v, torch.eye(k, dtype=torch.float64), atol=1e-5, rtol=0)
    assert float(dense_lap(e, n)[9, 9]) == 1.0
    # Eigenvalues equal PyG's spectrum convention; its vectors span the same space per eigenvalue
    # past the first one (the first zero vector is arbitrary within the null space).
    ref = pyg_lap(e, n, k).double()
    torch.testing.assert_close(dense_lap(e, n) @ ref, ref * vals.double(), atol=1e-4, rtol=0)


def test_lap_pe_isolated_nodes_and_padding_when_n_at_most_k():
    e = torch.tensor([[0, 1], [1, 0]])
    vecs, vals = laplacian_pe(e, 3, 5)  # nodes 2 isolated, n = 3 <= k = 5
    assert vecs.shape == (3, 5)
    check_eigenpairs(e, 3, 5, vecs, vals)
    assert torch.all(vecs[:, 2:] == 0) and torch.all(vals[2:] == 0)
    torch.testing.assert_close(vals[:2], torch.tensor([1.0, 2.0]))
    one, one_vals = laplacian_pe(torch.empty(2, 0, dtype=torch.long), 1, 3)
    assert torch.all(one == 0) and torch.all(one_vals == 0) and one.shape == (1, 3)
    none, none_vals = laplacian_pe(torch.empty(2, 0, dtype=torch.long), 0, 3)
    assert none.shape == (0, 3) and none_vals.shape == (3,)


@pytest.mark.parametrize("normalization", ["rw", None])
def test_lap_pe_other_normalizations_are_eigenvectors_of_their_laplacian(normalization):
    n, k = 15, 4
    e = torch.cat([random_graph(14, 30, seed=3)], 1)  # node 14 isolated
    vecs, vals = laplacian_pe(e, n, k, normalization=normalization)
    check_eigenpairs(e, n, k, vecs, vals, normalization)
    torch.testing.assert_close(laplacian(e, n, normalization=normalization).double(), dense_lap(e, n, normalization),
                               atol=1e-6, rtol=0)


def test_lap_pe_permutation_equivariant():
    n, k = 25, 6
    e = random_graph(n, 60, seed=7)
    assert spectrum_gaps(e, n, k) > 1e-3
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    inv = torch.argsort(perm)  # new node i is old node perm[i]
    vecs, vals = laplacian_pe(e, n, k)
    pvecs, pvals = laplacian_pe(inv[e], n, k)
    torch.testing.assert_close(pvals, vals, atol=1e-6, rtol=0)
    assert_equal_up_to_sign(pvecs, vecs[perm], atol=1e-5)


def test_lap_pe_batched_equals_per_graph():
    sizes = [12, 5, 12, 1, 30, 3, 5]  # repeated sizes share one eigh; n = 1, 3 <= k padded
    k = 4
    e, batch, edges = random_batch(sizes, seed=0)
    vecs, vals = laplacian_pe_batch(e, batch, k)
    assert vecs.shape == (sum(sizes), k) and vals.shape == (len(sizes), k)
    offset = 0
    for g, n in enumerate(sizes):
        one_vecs, one_vals = laplacian_pe(edges[g] - offset, n, k)
        torch.testing.assert_close(vals[g], one_vals, atol=1e-6, rtol=0)
        assert_same_eigenspaces(vecs[offset : offset + n], one_vecs, one_vals, edges[g] - offset, n)
        offset += n


def test_lap_pe_sparse_equals_dense_mid_size():
    n, k = 300, 5
    e = random_graph(n, 900, seed=11)
    assert spectrum_gaps(e, n, k) > 1e-4
    dense_vecs, dense_vals = laplacian_pe(e, n, k, method="dense")
    sparse_vecs, sparse_vals = laplacian_pe(e, n, k, method="sparse")
    torch.testing.assert_close(sparse_vals, dense_vals, atol=1e-5, rtol=0)
    assert_equal_up_to_sign(sparse_vecs, dense_vecs, atol=1e-4)
    lob_vecs, lob_vals = laplacian_pe(e, n, k, method="lobpcg")  # the accelerator solver, here on CPU
    torch.testing.assert_close(lob_vals, dense_vals, atol=1e-5, rtol=0)
    assert_equal_up_to_sign(lob_vecs, dense_vecs, atol=1e-3)
    # The batched function routes large graphs to the sparse solver.
    bvecs, _ = laplacian_pe_batch(e, torch.zeros(n, dtype=torch.long), k, method="sparse")
    assert_equal_up_to_sign(bvecs, dense_vecs, atol=1e-4)


def test_lap_pe_symmetrize_on_request():
    e = torch.tensor([[0, 1, 2], [1, 2, 3]])  # a directed path
    with pytest.raises(ValueError, match="undirected.*symmetrize=True"):
        laplacian_pe(e, 4, 2)
    vecs, vals = laplacian_pe(e, 4, 2, symmetrize=True)
    ref_vecs, ref_vals = laplacian_pe(path_edges(4), 4, 2)
    torch.testing.assert_close(vecs, ref_vecs)
    torch.testing.assert_close(vals, ref_vals)
    und, _ = symmetrize(e, 4)
    assert und.shape == (2, 6)


# ---- sign handling ----------------------------------------------------------------------------

def test_random_sign_flip_flips_whole_columns_with_an_explicit_generator():
    x = torch.randn(3, 10, 6)  # 4 eigenvectors + 2 eigenvalue features per node
    a = random_sign_flip(x, generator=torch.Generator().manual_seed(0), num_vecs=4)
    b = random_sign_flip(x, generator=torch.Generator().manual_seed(0), num_vecs=4)
    torch.testing.assert_close(a, b)  # reproducible from the generator
    ratio = a / x
    assert torch.all((ratio - ratio[:, :1]).abs() < 1e-6)  # one sign per (batch row, column)
    assert set(ratio[..., :4].round().unique().tolist()) <= {-1.0, 1.0}
    torch.testing.assert_close(a[..., 4:], x[..., 4:])  # eigenvalues are not flipped
    draws = torch.stack([random_sign_flip(x, generator=torch.Generator().manual_seed(s), num_vecs=4)[0, 0, 0]
                         for s in range(20)])
    assert (draws > 0).any() and (draws < 0).any()


def test_signnet_is_sign_invariant():
    torch.manual_seed(0)
    net = SignNet(k=5, out_dim=7, hidden=16)
    vecs, vals = torch.randn(11, 5), torch.rand(11, 5)
    flips = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0])
    torch.testing.assert_close(net(vecs * flips, vals), net(vecs, vals))
    assert not torch.allclose(net(vecs.roll(1, 0), vals), net(vecs, vals))  # but sees the values
    cat = SignNet(k=5, out_dim=7, reduce="concat", use_eigenvalues=False)
    torch.testing.assert_close(cat(-vecs), cat(vecs))


def test_lap_encoding_sign_modes():
    torch.manual_seed(0)
    x, feats = torch.randn(1, 9, 16), torch.randn(1, 9, 8)  # k = 4 eigenvectors + 4 eigenvalues
    flip = posenc.build("lap", dims=posenc.ModelDims(16, 4, 64), k=4)
    assert isinstance(flip, LapPE) and flip.sign == "flip"
    flip.eval()
    torch.testing.assert_close(flip.encode_input(x, feats), x + flip.proj(feats))  # no flip in eval
    flip.train()
    outs = {tuple(flip.encode_input(x, feats).flatten().tolist()[:4]) for _ in range(12)}
    assert len(outs) > 1  # random flips in training
    signed = posenc.build("lap", dims=posenc.ModelDims(16, 4, 64), k=4, sign="signnet")
    flipped = feats.clone()
    flipped[..., :4] *= torch.tensor([-1.0, 1.0, -1.0, -1.0])
    torch.testing.assert_close(signed.encode_input(x, flipped), signed.encode_input(x, feats))
    out = signed.encode_input(x, feats)
    out.sum().backward()
    assert signed.signnet.phi[0].weight.grad is not None
    with pytest.raises(ValueError, match="positions must be"):
        flip.encode_input(x, feats[..., :5])


# ---- random-walk SE ---------------------------------------------------------------------------

def pyg_rwse(edge_index, n, k, edge_weight=None):
    data = Data(edge_index=edge_index, num_nodes=n, edge_weight=edge_weight)
    return AddRandomWalkPE(k)(data).random_walk_pe


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("method", ["dense", "sparse"])
def test_rwse_equals_pyg(directed, method):
    n, k = 40, 9
    e = random_graph(n - 2, 70, seed=5, directed=directed, self_loops=True)  # last two nodes isolated
    out = random_walk_se(e, n, k, method=method, block_size=16)
    assert out.shape == (n, k) and out.dtype == torch.float32
    torch.testing.assert_close(out, pyg_rwse(e, n, k), atol=1e-6, rtol=1e-5)
    assert torch.all(out[-2:] == 0)  # isolated nodes: a row of zeros, as PyG


def test_rwse_weighted_and_known_values():
    # diag(P^k) with P = D^-1 A, weighted. (PyG's AddRandomWalkPE divides by the weighted degree
    # but puts 1, not the weight, in each entry; posenc follows the definition.)
    e = torch.tensor([[0, 1, 1, 2, 2, 0, 2, 3], [1, 0, 2, 1, 0, 2, 3, 2]])
    w = torch.tensor([1.0, 1.0, 2.0, 2.0, 0.5, 0.5, 3.0, 3.0])
    a = torch.zeros(4, 4, dtype=torch.float64)
    a[e[0], e[1]] = w.double()
    p = a / a.sum(1, keepdim=True).clamp(min=1)
    expected = torch.stack([torch.diagonal(torch.matrix_power(p, j)) for j in range(1, 7)], -1).float()
    for method in ("dense", "sparse"):
        torch.testing.assert_close(random_walk_se(e, 4, 6, edge_weight=w, method=method), expected)
    torch.testing.assert_close(random_walk_se(e, 4, 6), pyg_rwse(e, 4, 6), atol=1e-6, rtol=1e-5)
    path = random_walk_se(path_edges(2), 2, 4)  # one edge: back after every even step
    torch.testing.assert_close(path, torch.tensor([[0.0, 1.0, 0.0, 1.0]] * 2))


def test_rwse_batched_equals_pyg_per_graph_and_is_permutation_equivariant():
    sizes, k = [7, 20, 1, 9, 13, 7], 11
    datas, edges, offset = [], [], 0
    for i, n in enumerate(sizes):
        e = random_graph(n, 2 * n, seed=20 + i) if n > 1 else torch.empty(2, 0, dtype=torch.long)
        datas.append(pyg_rwse(e, n, k))
        edges.append(e + offset)
        offset += n
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    out = random_walk_se_batch(torch.cat(edges, 1), batch, k)
    torch.testing.assert_close(out, torch.cat(datas), atol=1e-6, rtol=1e-5)
    sparse = random_walk_se_batch(torch.cat(edges, 1), batch, k, method="sparse")
    torch.testing.assert_close(sparse, out, atol=1e-6, rtol=1e-5)
    e = edges[1] - sizes[0]
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    inv = torch.argsort(perm)
    torch.testing.assert_close(random_walk_se(inv[e], 20, k), random_walk_se(e, 20, k)[perm], atol=1e-6, rtol=0)


def test_rwse_encoding_projects_features():
    enc = posenc.build("rwse", dims=posenc.ModelDims(12, 3, 64), walk_length=5)
    assert isinstance(enc, RWSE)
    x, feats = torch.randn(2, 6, 12), torch.rand(1, 6, 5)
    torch.testing.assert_close(enc.encode_input(x, feats), x + enc.proj(feats))
    with pytest.raises(ValueError, match="walk_length=5"):
        enc.encode_input(x, feats[..., :4])


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "edge_index,error,match",
    [
        (torch.tensor([[0, 1], [1, 5]]), ValueError, r"node index 5 out of range .*edge 1: \(1, 5\).*num_nodes=4"),
        (torch.tensor([[0, -1], [1, 0]]), ValueError, r"negative node index -1 .*edge 1"),
        (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), TypeError, r"edge_index must have dtype torch.long.*float32"),
        (torch.tensor([[0, 1], [1, 0]], dtype=torch.int32), TypeError, r"torch.long.*int32"),
        (torch.tensor([[0, 1, 2], [1, 0, 2], [0, 0, 0]]), ValueError, r"shape \[2, num_edges\], got \(3, 3\)"),
        (torch.tensor([0, 1]), ValueError, r"shape \[2, num_edges\]"),
        ([[0, 1], [1, 0]], TypeError, "torch.Tensor"),
    ],
)
def test_bad_edge_index_errors(edge_index, error, match):
    with pytest.raises(error, match=match):
        check_edge_index(edge_index, 4)
    for fn in (lambda: laplacian_pe(edge_index, 4, 2), lambda: random_walk_se(edge_index, 4, 3)):
        with pytest.raises(error, match=match):
            fn()


def test_bad_options_and_batch_errors():
    e = path_edges(3)
    with pytest.raises(ValueError, match="k must be a positive int"):
        laplacian_pe(e, 3, 0)
    with pytest.raises(ValueError, match="normalization must be"):
        laplacian_pe(e, 3, 2, normalization="random")
    with pytest.raises(ValueError, match="walk_length must be a positive int"):
        random_walk_se(e, 3, 0)
    with pytest.raises(ValueError, match="method must be"):
        random_walk_se(e, 3, 2, method="fast")
    with pytest.raises(ValueError, match="edge_weight must have shape"):
        random_walk_se(e, 3, 2, edge_weight=torch.ones(3))
    crossing = torch.tensor([[0, 2], [2, 0]])
    with pytest.raises(ValueError, match="joins graph 0 to graph 1"):
        random_walk_se_batch(crossing, torch.tensor([0, 0, 1]), 3)
    with pytest.raises(ValueError, match="batch must be sorted"):
        laplacian_pe_batch(torch.empty(2, 0, dtype=torch.long), torch.tensor([1, 0, 1]), 2)
    with pytest.raises(TypeError, match="batch must have dtype torch.long"):
        random_walk_se_batch(e, torch.zeros(3), 2)


# ---- CPU threads --------------------------------------------------------------------------------

def test_thread_helper_runs_items_in_order_on_one_intra_op_thread_each():
    from posenc.graph import _threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with _threads.single_threaded(torch.device("cpu")) as count:
            assert count == 2 and torch.get_num_threads() == 1
            with _threads.single_threaded(torch.device("cpu")) as inner:  # nested: stays at one
                assert inner == 1
            assert torch.get_num_threads() == 1
            items = [lambda i=i: (i, torch.get_num_threads()) for i in range(7)]
            assert _threads.run_items(items, 3) == [(i, 1) for i in range(7)]
            assert _threads.run_items([], 3) == []
            started = threading.Event()  # the two items run at once, on two threads

            def first():
                return started.wait(10), threading.current_thread().name

            def second():
                started.set()
                return True, threading.current_thread().name

            (ok, one), (_, two) = _threads.run_items([first, second], 2)
            assert ok and one != two
        assert _threads.run_items([lambda: threading.current_thread().name] * 4, 2) == [
            threading.current_thread().name] * 4  # outside single_threaded: no helpers
        with _threads.single_threaded(torch.device("cpu")) as count:

            def boom():
                raise RuntimeError("item failed")

            with pytest.raises(RuntimeError, match="item failed"):
                _threads.run_items([items[0], boom, items[1]], 2)
        assert torch.get_num_threads() == 2
        with _threads.single_threaded(torch.device("cuda")) as count:  # an accelerator: unchanged
            assert count == 1 and torch.get_num_threads() == 2
        key = torch.tensor([2, 0, 2, 1, 0])
        assert [p.tolist() for p in _threads.positions_by_part(key, 4)] == [[1, 4], [3], [0, 2], []]
    finally:
        torch.set_num_threads(before)


def test_blas_limit_is_set_by_the_main_thread_and_restored():
    from posenc.graph import _threads

    threadpoolctl = pytest.importorskip("threadpoolctl")
    import scipy.sparse.linalg  # noqa: F401  (scipy's BLAS loaded)

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    seen = []

    def item():
        with _threads.blas_single_threaded():  # nested; a no-op in a helper thread
            seen.append(blas_threads())

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with _threads.single_threaded(torch.device("cpu")) as count:
            with _threads.blas_single_threaded():
                _threads.run_items([item] * 4, count)
            assert seen == [[1] * len(before)] * 4  # the main thread's limit holds in the helpers
            _threads.run_items([item] * 4, count)
    finally:
        torch.set_num_threads(threads)
    assert blas_threads() == before and _threads._blas_users == 0


def test_batched_and_blocked_paths_do_not_depend_on_the_thread_count():
    sizes, k = [30, 9, 16, 30, 3, 17, 9], 6
    e, batch, _ = random_batch(sizes, seed=60)
    big = random_graph(300, 900, seed=5)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            outs.append([
                *laplacian_pe_batch(e, batch, 4, num_graphs=len(sizes) + 1),
                *laplacian_pe_batch(e, batch, 2, method="sparse"),
                random_walk_se_batch(e, batch, k, num_graphs=len(sizes) + 2),
                random_walk_se_batch(e, batch, k, method="sparse"),
                random_walk_se(big, 300, 9, method="sparse", block_size=37),
            ])
            assert torch.get_num_threads() == threads  # restored
    finally:
        torch.set_num_threads(before)
    for one, many in zip(*outs):
        assert torch.equal(one, many)


def test_rwse_row_blocks_of_a_mid_size_graph_equal_one_piece():
    from posenc.graph.random_walk import ROW_BLOCK_MIN_NODES

    n, k = ROW_BLOCK_MIN_NODES + 9, 9
    e = random_graph(n, 3 * n, seed=7)
    small = random_graph(10, 20, seed=8) + n
    batch = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(10, dtype=torch.long)])
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):  # one piece (M = P), then row blocks of M = D^-1/2 A D^-1/2
            torch.set_num_threads(threads)
            outs.append((random_walk_se(e, n, k, method="dense"), random_walk_se_batch(torch.cat([e, small], 1), batch, k)))
    finally:
        torch.set_num_threads(before)
    (one, one_b), (rows, rows_b) = outs
    torch.testing.assert_close(rows, one, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rows_b, one_b, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rows, pyg_rwse(e, n, k), atol=1e-6, rtol=1e-5)


def test_concurrent_batched_calls_restore_the_thread_count():
    sizes = [12, 30, 7, 30, 19]
    e, batch, _ = random_batch(sizes, seed=80)
    expected = random_walk_se_batch(e, batch, 8)
    before = torch.get_num_threads()
    results, counts = [], []

    def call():
        for _ in range(5):
            results.append(random_walk_se_batch(e, batch, 8))
            laplacian_pe_batch(e, batch, 3)
        counts.append(torch.get_num_threads())

    try:
        torch.set_num_threads(2)
        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        call()
        for t in threads:
            t.join()
        assert torch.get_num_threads() == 2
        assert len(counts) == 4 and len(results) == 20
        assert all(torch.equal(r, expected) for r in results)
    finally:
        torch.set_num_threads(before)
