"""Laplacian eigenvector positional encoding (LapPE).

Dwivedi et al. 2020, Benchmarking Graph Neural Networks, https://arxiv.org/abs/2003.00982;
with eigenvalues as in SAN (Kreuzer et al. 2021) and GraphGPS (Rampasek et al. 2022).

``L = I - D^-1/2 A D^-1/2`` (``normalization="sym"``, the default), ``L = D - A`` (``None``,
combinatorial) or ``L = I - D^-1 A`` (``"rw"``). Self-loops are ignored and a node of degree 0
gets ``D^-1/2 = 0`` (so ``L_ii = 1`` for an isolated node under "sym" and "rw"), exactly as PyG's
``get_laplacian``. The encoding of node ``u`` is ``[v_2(u), ..., v_(k+1)(u)]``: the eigenvectors of
the ``k`` smallest eigenvalues after dropping the first one (ascending order), PyG's
``AddLaplacianEigenvectorPE`` convention. Only the single first eigenvector is dropped, also for a
disconnected graph (whose eigenvalue 0 repeats once per component): the values then equal PyG's
up to sign and, inside a repeated eigenvalue, up to a rotation of the eigenspace (any orthonormal
basis of it is as valid). A graph with ``n <= k`` nodes has only ``n - 1`` such eigenvectors; the
remaining columns are zero (PyG returns fewer columns there, which cannot be batched).

Computation: batched dense ``torch.linalg.eigh`` for small graphs (graphs of equal size share one
call), ``scipy.sparse.linalg.eigsh`` for large graphs on CPU and ``torch.lobpcg`` on an
accelerator; all on the device of ``edge_index``. On CPU the chunks of equal-size graphs and the
large graphs of a batch are spread over torch's threads with one intra-op thread each
(:mod:`posenc.graph._threads`).

Eigenvectors are defined up to sign: :func:`random_sign_flip` flips them at random per training
step, or :class:`~posenc.graph.signnet.SignNet` makes the model invariant to the sign.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Callable, Literal

import numpy as np
import torch
from torch import Tensor

from ..common.checks import check_int
from ..primitives.budget import check_allocation
from ._threads import batch_parts, blas_single_threaded, run_items, single_threaded
from .edges import (
    check_batch,
    check_edge_index,
    check_edge_weight,
    check_same_graph,
    graph_sizes,
    local_index,
    require_undirected,
)

Normalization = Literal["sym", "rw"] | None
Method = Literal["auto", "dense", "sparse", "lobpcg"]

#: Graphs with at least this many nodes use the sparse eigensolver under ``method="auto"``.
SPARSE_MIN_NODES = 400

#: The graphs of one size in a batch are solved in chunks of at most this many matrix entries
#: (graphs x size^2, at least one graph): independent pieces of work for the threads.
CHUNK_ENTRIES = 1 << 16


_NORMALIZATIONS = ("sym", "rw", None)
_METHODS = ("auto", "dense", "sparse", "lobpcg")


def _check_options(k: int, normalization, method: str) -> None:
    check_int("k", k, minimum=1)
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"normalization must be 'sym', 'rw' or None (combinatorial D - A); got {normalization!r}")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}")


#: The keyword arguments of ``scipy.sparse.linalg.eigsh`` that may be passed on (the others are
#: set by posenc: ``k``, ``which="SA"``, ``return_eigenvectors``; shift-invert would change ``which``).
EIGSH_OPTIONS = ("tol", "maxiter", "ncv", "v0")


def check_eigsh_options(options: dict | None, k: int, method: str = "auto") -> dict:
    """Validate keyword arguments for ``scipy.sparse.linalg.eigsh`` (as PyG's
    ``AddLaplacianEigenvectorPE(**kwargs)`` passes on): ``tol`` (>= 0), ``maxiter`` (> 0), ``ncv``
    (> k + 1, capped at the graph size), ``v0`` (1D, one entry per node, checked per graph).
    Returns a new dict; a ValueError/TypeError names the bad key and value."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(EIGSH_OPTIONS))
    if unknown:
        raise TypeError(
            f"unknown eigsh argument(s) {', '.join(unknown)}; accepted: {', '.join(EIGSH_OPTIONS)} "
            "(k, which and return_eigenvectors are set by posenc)"
        )
    if options and method == "lobpcg":
        raise ValueError(f"eigsh options {sorted(options)} apply to scipy's eigsh; method='lobpcg' uses torch.lobpcg")
    if "tol" in options:
        tol = options["tol"]
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise ValueError(f"tol must be a number >= 0 (0: machine precision); got {tol!r}")
    if "maxiter" in options:
        maxiter = options["maxiter"]
        if maxiter is not None and (isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1):
            raise ValueError(f"maxiter must be a positive int or None; got {maxiter!r}")
    if "ncv" in options:
        ncv = options["ncv"]
        if isinstance(ncv, bool) or not isinstance(ncv, int) or ncv <= k + 1:
            raise ValueError(f"ncv must be an int > k + 1 = {k + 1} (Lanczos vectors for k + 1 eigenpairs); got {ncv!r}")
    if "v0" in options:
        v0 = options["v0"]
        v0 = v0.detach().cpu().numpy() if isinstance(v0, Tensor) else np.asarray(v0)
        if v0.ndim != 1 or not np.issubdtype(v0.dtype, np.number):
            raise ValueError(f"v0 must be a 1D numeric array with one entry per node; got shape {v0.shape} {v0.dtype}")
        options["v0"] = v0
    return options


def _prepare(
    edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None, symmetrize: bool
) -> tuple[Tensor, Tensor]:
    """Validated, undirected edges without self-loops, and their float weights."""
    check_edge_index(edge_index, num_nodes)
    check_edge_weight(edge_weight, edge_index.shape[1])
    edge_index, edge_weight = require_undirected(
        edge_index, num_nodes, edge_weight, symmetrize_graph=symmetrize, what="the Laplacian PE"
    )
    keep = edge_index[0] != edge_index[1]  # self-loops do not enter the Laplacian (as in PyG)
    edge_index = edge_index[:, keep]
    if edge_weight is None:
        edge_weight = torch.ones(edge_index.shape[1], device=edge_index.device)
    else:
        edge_weight = edge_weight[keep]
    return edge_index, edge_weight


def _laplacian_stack(adj: Tensor, normalization: Normalization) -> tuple[Tensor, Tensor]:
    """``L [..., n, n]`` from adjacency ``[..., n, n]`` (duplicates summed, no self-loops), and the
    degrees ``[..., n]``. A node of degree 0 has ``D^-1/2 = D^-1 = 0``."""
    deg = adj.sum(-1)
    eye = torch.eye(adj.shape[-1], dtype=adj.dtype, device=adj.device)
    if normalization is None:
        return torch.diag_embed(deg) - adj, deg
    inv = torch.where(deg > 0, deg.clamp(min=torch.finfo(adj.dtype).tiny).rsqrt(), 0.0)
    if normalization == "sym":
        return eye - inv.unsqueeze(-1) * adj * inv.unsqueeze(-2), deg
    return eye - (inv * inv).unsqueeze(-1) * adj, deg


def laplacian(
    edge_index: Tensor,
    num_nodes: int,
    *,
    normalization: Normalization = "sym",
    edge_weight: Tensor | None = None,
    symmetrize: bool = False,
) -> Tensor:
    """The dense Laplacian ``[N, N]`` (float32) of one undirected graph: ``I - D^-1/2 A D^-1/2``
    ("sym"), ``I - D^-1 A`` ("rw") or ``D - A`` (None); self-loops ignored, duplicate edges summed,
    ``D^-1/2 = 0`` for isolated nodes (PyG's ``get_laplacian``)."""
    _check_options(1, normalization, "auto")
    edge_index, edge_weight = _prepare(edge_index, num_nodes, edge_weight, symmetrize)
    check_allocation(f"laplacian(num_nodes={num_nodes}): the dense Laplacian", (num_nodes, num_nodes), torch.float64,
                     edge_index.device)
    adj = torch.zeros(num_nodes, num_nodes, dtype=torch.float64, device=edge_index.device)
    adj.index_put_((edge_index[0], edge_index[1]), edge_weight.to(torch.float64), accumulate=True)
    return _laplacian_stack(adj, normalization)[0].to(torch.float32)


def _canonical_sign(vecs: Tensor) -> Tensor:
    """Flip each column so that its entry of largest magnitude is positive (deterministic output)."""
    if vecs.shape[-2] == 0:
        return vecs
    idx = vecs.abs().argmax(dim=-2, keepdim=True)
    sign = torch.sign(vecs.gather(-2, idx))
    return vecs * torch.where(sign == 0, 1.0, sign).to(vecs.dtype)


def _rw_vectors(vecs: Tensor, deg: Tensor) -> Tensor:
    """Eigenvectors of ``I - D^-1 A`` from those of the symmetric ``I - D^-1/2 A D^-1/2``:
    ``L_rw = M L_sym M^-1`` with ``M = D^-1/2`` (1 on isolated nodes), so ``v = M u``, renormalised."""
    m = torch.where(deg > 0, deg.clamp(min=torch.finfo(deg.dtype).tiny).rsqrt(), 1.0)
    out = vecs * m.unsqueeze(-1)
    return out / out.norm(dim=-2, keepdim=True).clamp(min=torch.finfo(out.dtype).tiny)


def _pad_eigenpairs(vals: Tensor, vecs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``vals [..., m]`` and ``vecs [..., n, m]`` with zero columns appended up to ``k`` (a graph
    with fewer eigenpairs than asked)."""
    missing = k - vals.shape[-1]
    if missing > 0:
        vals = torch.nn.functional.pad(vals, (0, missing))
        vecs = torch.nn.functional.pad(vecs, (0, missing))
    return vals, vecs


def _select(vals: Tensor, vecs: Tensor, k: int, skip: int = 1) -> tuple[Tensor, Tensor]:
    """Columns ``skip .. skip + k - 1`` of ascending eigenpairs ``vals [..., n]``, ``vecs [..., n, n]``
    (LapPE skips the trivial first one), zero-padded to ``k``."""
    return _pad_eigenpairs(vals[..., skip: skip + k], vecs[..., skip: skip + k], k)


def _dense_eigen(adj: Tensor, k: int, normalization: Normalization) -> tuple[Tensor, Tensor]:
    """Batched dense LapPE of a stack of equal-size graphs ``adj [g, n, n]`` (float64):
    ``(vals [g, k], vecs [g, n, k])``."""
    lap, deg = _laplacian_stack(adj, "sym" if normalization == "rw" else normalization)
    vals, vecs = torch.linalg.eigh(lap)
    vals, vecs = _select(vals, vecs, k)
    if normalization == "rw":
        vecs = _rw_vectors(vecs, deg)
    return vals, _canonical_sign(vecs)


def _sparse_eigen(
    edge_index: Tensor, edge_weight: Tensor, num_nodes: int, k: int, normalization: Normalization,
    solver: str = "auto", eigsh_options: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """LapPE of one large graph with a sparse eigensolver: ``(vals [k], vecs [N, k])`` float64.

    CPU: ``scipy.sparse.linalg.eigsh`` (ARPACK, smallest algebraic eigenvalues, the solver PyG
    uses). Other devices (or ``solver="lobpcg"``): ``torch.lobpcg`` on the device, for the largest
    eigenvalues of ``c I - L`` (``c`` bounds the spectrum), which are the smallest of ``L``."""
    device = edge_index.device
    row, col = edge_index
    w = edge_weight.to(torch.float64)
    deg = torch.zeros(num_nodes, dtype=torch.float64, device=device).index_add_(0, row, w)
    base = "sym" if normalization == "rw" else normalization
    if base == "sym":
        inv = torch.where(deg > 0, deg.clamp(min=1e-300).rsqrt(), 0.0)
        off = -inv[row] * w * inv[col]
        diag = torch.ones(num_nodes, dtype=torch.float64, device=device)
        bound = 2.0
    else:
        off = -w
        diag = deg
        bound = 2.0 * float(deg.max()) if num_nodes else 0.0
    nodes = torch.arange(num_nodes, device=device)
    idx = torch.cat([edge_index, torch.stack([nodes, nodes])], 1)
    val = torch.cat([off, diag])
    want = min(k + 1, num_nodes)
    if device.type == "cpu" and solver != "lobpcg":
        import scipy.sparse as sp
        from scipy.sparse.linalg import eigsh

        # float32 ARPACK to float32 precision (as PyG's float32 Laplacian): the output is float32.
        lap = sp.coo_matrix(
            (val.numpy().astype(np.float32), (idx[0].numpy(), idx[1].numpy())), shape=(num_nodes, num_nodes)
        ).tocsr()
        opts = dict(eigsh_options or {})
        v0 = opts.pop("v0", None)
        if v0 is None:
            v0 = np.random.default_rng(0).uniform(0.5, 1.5, num_nodes)  # reproducible output
        elif v0.shape != (num_nodes,):
            raise ValueError(f"v0 has {v0.shape[0]} entries; this graph has {num_nodes} nodes")
        opts.setdefault("tol", 0)
        opts["ncv"] = min(num_nodes, opts.get("ncv", max(2 * want + 1, 20)))
        with blas_single_threaded():  # ARPACK's many small BLAS calls gain nothing from threads
            vals_np, vecs_np = eigsh(lap, k=want, which="SA", v0=v0.astype(np.float32), **opts)
        order = np.argsort(vals_np)
        vals = torch.from_numpy(vals_np[order].astype(np.float64))
        vecs = torch.from_numpy(vecs_np[:, order].astype(np.float64))
    else:
        shifted_val = torch.cat([-off, bound - diag])  # c I - L
        shifted = torch.sparse_coo_tensor(idx, shifted_val, (num_nodes, num_nodes), check_invariants=False).coalesce()
        gen = torch.Generator(device=device).manual_seed(0)
        x0 = torch.rand(num_nodes, want, dtype=torch.float64, device=device, generator=gen)
        top, vecs = torch.lobpcg(shifted, k=want, X=x0, largest=True, tol=1e-7, niter=1000)
        vals = bound - top
        order = torch.argsort(vals)
        vals, vecs = vals[order], vecs[:, order]
    vals, vecs = _select(vals, vecs, k)
    if normalization == "rw":
        vecs = _rw_vectors(vecs, deg)
    return vals, _canonical_sign(vecs)


def laplacian_pe(
    edge_index: Tensor,
    num_nodes: int,
    k: int,
    *,
    normalization: Normalization = "sym",
    edge_weight: Tensor | None = None,
    symmetrize: bool = False,
    method: Method = "auto",
    eigsh_options: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """LapPE of one graph.

    Args:
        edge_index: ``[2, E]`` long, undirected (both directions listed); a directed graph raises
            unless ``symmetrize``.
        num_nodes: ``N``.
        k: number of non-trivial eigenvectors.
        normalization: "sym" (default), "rw" or None (combinatorial ``D - A``).
        edge_weight: optional ``[E]`` non-negative weights.
        symmetrize: add missing reverse edges instead of raising for a directed graph.
        method: "dense" (``torch.linalg.eigh``), "sparse" (eigsh on CPU, LOBPCG elsewhere),
            "lobpcg" (``torch.lobpcg`` on any device) or "auto" (sparse from
            :data:`SPARSE_MIN_NODES` nodes). Graphs with ``N <= 3 (k + 1)`` always go dense.
        eigsh_options: keyword arguments for ``scipy.sparse.linalg.eigsh`` when it runs (the
            sparse path on CPU): ``tol``, ``maxiter``, ``ncv``, ``v0`` (:func:`check_eigsh_options`).

    Returns:
        ``(vecs [N, k], vals [k])``, float32 on the device of ``edge_index``; columns past
        ``N - 1`` are zero (``vals`` too). Unit-norm eigenvectors (for "rw", the right eigenvectors
        of ``I - D^-1 A``, normalised to unit norm), each with its largest-magnitude entry positive.
    """
    _check_options(k, normalization, method)
    check_edge_index(edge_index, num_nodes)
    eigsh_options = check_eigsh_options(eigsh_options, k, method)
    sparse = num_nodes > 3 * (k + 1) and (
        method in ("sparse", "lobpcg") or (method == "auto" and num_nodes >= SPARSE_MIN_NODES)
    )
    # Sizes first: k = 10^9 or a huge num_nodes would otherwise fail deep in an allocator.
    check_allocation(f"laplacian_pe(num_nodes={num_nodes}, k={k}): the encodings [N, k]", (num_nodes, k),
                     torch.float64, edge_index.device)
    if not sparse:  # adjacency, Laplacian and eigenvectors, N x N each
        check_allocation(f"laplacian_pe(num_nodes={num_nodes}, method={method!r}): the dense eigendecomposition",
                         (3, num_nodes, num_nodes), torch.float64, edge_index.device)
    # On one intra-op thread (_threads): eigsh is single-threaded ARPACK, whose torch set-up gains
    # nothing from threads; MKL's multi-threaded dense eigh gains at most 1.4x on a quiet machine
    # (2 cores, 399 nodes) and stalls when another process holds a core (5 s instead of 16 ms).
    with single_threaded(edge_index.device) if not (sparse and method == "lobpcg") else nullcontext():
        edge_index, edge_weight = _prepare(edge_index, num_nodes, edge_weight, symmetrize)
        if sparse:
            vals, vecs = _sparse_eigen(edge_index, edge_weight, num_nodes, k, normalization, method, eigsh_options)
        else:
            adj = torch.zeros(1, num_nodes, num_nodes, dtype=torch.float64, device=edge_index.device)
            adj.index_put_(
                (torch.zeros_like(edge_index[0]), edge_index[0], edge_index[1]), edge_weight.to(torch.float64),
                accumulate=True,
            )
            vals, vecs = _dense_eigen(adj, k, normalization)
            vals, vecs = vals[0], vecs[0]
    return vecs.to(torch.float32), vals.to(torch.float32)


def laplacian_pe_batch(
    edge_index: Tensor,
    batch: Tensor,
    k: int,
    *,
    num_graphs: int | None = None,
    normalization: Normalization = "sym",
    edge_weight: Tensor | None = None,
    symmetrize: bool = False,
    method: Method = "auto",
    eigsh_options: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """LapPE of every graph of a batch at once (a PyG ``Batch``: ``data.edge_index``, ``data.batch``).

    Graphs of equal size share one batched ``eigh`` call (in chunks of at most
    :data:`CHUNK_ENTRIES` matrix entries; no padding, so no foreign eigenpairs); graphs of
    :data:`SPARSE_MIN_NODES` nodes or more (``method="auto"``) go to the sparse solver one by one.
    On CPU the chunks and large graphs are spread over torch's threads, each running its
    operations on one intra-op thread. Arguments as in :func:`laplacian_pe`; ``batch [N]`` sorted
    graph ids.

    Returns:
        ``(vecs [N, k], vals [G, k])`` float32; per-node eigenvalues are ``vals[batch]``.
    """
    _check_options(k, normalization, method)
    eigsh_options = check_eigsh_options(eigsh_options, k, method)
    device = edge_index.device
    with single_threaded(device) as count:
        num_graphs = check_batch(batch, num_graphs)
        num_nodes = batch.numel()
        check_allocation(f"laplacian_pe_batch(k={k}): the encodings [N={num_nodes}, k]", (num_nodes, k), torch.float32,
                         device)
        edge_index, edge_weight = _prepare(edge_index, num_nodes, edge_weight, symmetrize)
        check_same_graph(edge_index, batch)
        sizes = graph_sizes(batch, num_graphs)
        local = local_index(batch, sizes)

        def sparse(n: int) -> bool:
            chosen = method in ("sparse", "lobpcg") or (method == "auto" and n >= SPARSE_MIN_NODES)
            return chosen and n > 3 * (k + 1)

        split = batch_parts(edge_index, batch, local, sizes.tolist(), sparse, lambda n: n, CHUNK_ENTRIES)
        vecs_out = torch.zeros(num_nodes, k, dtype=torch.float32, device=device)
        vals_out = torch.zeros(num_graphs, k, dtype=torch.float32, device=device)

        def dense_part(p: int) -> tuple[Tensor, Tensor]:
            vals, vecs = _dense_eigen(split.dense_stack(p, edge_weight, torch.float64), k, normalization)
            return vecs.reshape(-1, k)[split.node_flat[split.nodes[p]]], vals

        def sparse_part(edges: Tensor, nodes: Tensor) -> tuple[Tensor, Tensor]:
            first = int(nodes[0])  # a graph's nodes are contiguous (sorted batch)
            vals, vecs = _sparse_eigen(
                edge_index[:, edges] - first, edge_weight[edges], nodes.numel(), k, normalization, method, eigsh_options
            )
            return vecs, vals[None]

        tasks: list[tuple[float, Tensor, Tensor, Callable]] = []  # (cost, nodes, graphs, compute)
        for p, (part, edges, nodes) in enumerate(zip(split.parts, split.edges, split.nodes)):
            if part[0] == "dense":
                _, n, graphs = part
                ids = torch.tensor(graphs, dtype=torch.long, device=device)
                tasks.append((len(graphs) * float(n) ** 3, nodes, ids, partial(dense_part, p)))
            else:
                cost = float(nodes.numel()) * (edges.numel() + nodes.numel()) * (k + 1)
                ids = torch.tensor([part[1]], dtype=torch.long, device=device)
                tasks.append((cost, nodes, ids, partial(sparse_part, edges, nodes)))
        tasks.sort(key=lambda task: -task[0])  # the largest first: the threads end together
        # The BLAS limit for eigsh is set here, in the calling thread (_threads.blas_single_threaded).
        eigsh_parts = device.type == "cpu" and method != "lobpcg" and any(p[0] == "sparse" for p in split.parts)
        with blas_single_threaded() if eigsh_parts else nullcontext():
            results = run_items([task[3] for task in tasks], count)
        for (_, nodes, ids, _), (vecs, vals) in zip(tasks, results):
            vecs_out[nodes] = vecs.to(torch.float32)
            vals_out[ids] = vals.to(torch.float32)
    return vecs_out, vals_out


def random_sign_flip(vecs: Tensor, *, generator: torch.Generator | None = None, num_vecs: int | None = None) -> Tensor:
    """Multiply each eigenvector column by an independent random sign (a new tensor).

    Args:
        vecs: ``[..., T, F]``; the first ``num_vecs`` features (default all) are eigenvectors,
            flipped with one sign per column and leading index (per batch row: a packed batch of
            graphs shares one sign pattern, as GraphGPS flips one sign per eigenvector and batch);
            later features (eigenvalues) are kept.
        generator: the random source (default torch's global one); signs are drawn on its device.
    """
    if vecs.dim() < 2:
        raise ValueError(f"vecs must be [..., nodes, features], got {tuple(vecs.shape)}")
    features = vecs.shape[-1]
    num_vecs = features if num_vecs is None else num_vecs
    if not 0 <= num_vecs <= features:
        raise ValueError(f"num_vecs must be in [0, {features}] (the feature axis), got {num_vecs}")
    shape = (*vecs.shape[:-2], 1, num_vecs)
    draw_on = generator.device if generator is not None else vecs.device
    signs = torch.randint(0, 2, shape, generator=generator, device=draw_on).to(vecs.device, vecs.dtype) * 2 - 1
    if num_vecs < features:
        signs = torch.cat([signs, signs.new_ones((*shape[:-1], features - num_vecs))], dim=-1)
    return vecs * signs
