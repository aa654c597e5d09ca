"""Magnetic Laplacian eigenvectors for directed graphs (MagLapPE; Geisler et al. 2023, Transformers
Meet Directed Graphs, ICML, https://arxiv.org/abs/2302.00049).

The Hermitian magnetic Laplacian with potential ``q``:

    ``L = I - D_s^-1/2 (A_s * exp(i Theta)) D_s^-1/2``  (``normalization="sym"``), or
    ``L = D_s - A_s * exp(i Theta)``                    (``None``, combinatorial),

``A_s`` the symmetrised adjacency (``A_s(u, v) = w`` for an edge listed one way, the mean of the
two weights for one listed both ways: the authors' ``A + A^T``, halved where both directions
exist), ``D_s`` its degrees, and ``Theta(u, v) = 2 pi q (a(u, v) - a(v, u))`` with ``a`` the
edge's existence (its direction, not its weight). Self-loops are ignored and a node of degree 0
gets ``D_s^-1/2 = 0``, as for LapPE. ``q = 0`` is the Laplacian of the undirected graph, and
:func:`magnetic_laplacian_pe` at ``q = 0`` is :func:`~posenc.graph.laplacian_pe` of ``A_s``
exactly; ``q > 0`` puts the direction of each edge in the phases of the eigenvectors (``q = 1/4``
makes ``u -> v`` and ``v -> u`` opposite, ``+-i``). ``relative_q=True`` divides ``q`` by the number
of one-way edges (at most ``N``, at least 1), the authors' graph-size normalisation.

The encoding of node ``u`` is ``[Re v_1(u) .. Re v_k(u), Im v_1(u) .. Im v_k(u)]``: the
eigenvectors of the ``k`` smallest eigenvalues, after dropping the first (``drop_first``: by
default at ``q = 0``, LapPE's convention; kept at ``q > 0``, where its phases carry the order of
the nodes, as in the authors' setting ``excl_k_eigenvectors = 0``). A complex eigenvector is
defined up to a unit phase ``e^(i phi)``; ``phase`` picks one:

* ``"largest"`` (default): the entry of largest modulus (the first one on ties) is real and
  positive. Canonical, and at ``q = 0`` LapPE's sign rule (the largest-magnitude entry positive);
* ``"paper"``: the authors' ``sign_rotate``: each eigenvector's sign makes its largest real part
  positive, then every eigenvector is turned so that it is real and non-negative at the node
  where the first eigenvector's imaginary part is largest. That node depends on the phase the
  eigensolver returned for the first eigenvector, so this rule is reproducible for one solver only.

Computation as :mod:`posenc.graph.laplacian`: a batched dense ``torch.linalg.eigh`` of the complex
matrices (graphs of equal size share one call), ``scipy.sparse.linalg.eigsh`` on the complex
Hermitian sparse matrix for large graphs (on the CPU; graphs on an accelerator are solved there
and moved back).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from functools import partial
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ..common.checks import check_bool, check_choice, check_int, check_number
from ..primitives.budget import check_allocation
from ._threads import batch_parts, blas_single_threaded, run_items, single_threaded
from .edges import check_batch, check_edge_index, check_edge_weight, check_same_graph, graph_sizes, local_index
from .laplacian import SPARSE_MIN_NODES, _select, laplacian_pe_batch

PHASES = ("largest", "paper")
_NORMALIZATIONS = ("sym", None)
_METHODS = ("auto", "dense", "sparse")
CHUNK_ENTRIES = 1 << 16


def _check_options(k: int, q: float, normalization, method: str, phase: str, relative_q: bool, drop_first) -> bool:
    check_int("k", k, minimum=1)
    check_number("q", q, minimum=0.0)
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"normalization must be 'sym' or None (combinatorial D_s - A_s e^(i Theta)); got {normalization!r}")
    check_choice("method", method, _METHODS)
    check_choice("phase", phase, PHASES)
    check_bool("relative_q", relative_q)
    if drop_first is not None:
        check_bool("drop_first", drop_first)
    return q == 0 if drop_first is None else drop_first


def _pairs(edge_index: Tensor, weight: Tensor, num_nodes: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The unordered pairs ``lo < hi`` joined one way or both (self-loops dropped): ``(lo, hi,
    a_s [P], direction [P])``, ``direction`` = 1 for ``lo -> hi`` only, -1 for ``hi -> lo`` only,
    0 for both; ``a_s`` the weight of the one direction, or the mean of the two."""
    src, dst = edge_index
    keep = src != dst
    src, dst, weight = src[keep], dst[keep], weight[keep].to(torch.float64)
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    key, inverse = torch.unique(lo * max(num_nodes, 1) + hi, return_inverse=True)
    forward = torch.zeros(key.numel(), dtype=torch.float64, device=key.device).index_add_(0, inverse, weight * (src < dst))
    backward = torch.zeros_like(forward).index_add_(0, inverse, weight * (src > dst))
    has_f, has_b = forward > 0, backward > 0
    a_s = torch.where(has_f & has_b, (forward + backward) / 2, forward + backward)
    direction = has_f.to(torch.float64) - has_b.to(torch.float64)
    present = a_s > 0  # an edge of weight 0 is no edge
    n = max(num_nodes, 1)
    return (key // n)[present], (key % n)[present], a_s[present], direction[present]


def _effective_q(q: float, relative: bool, one_way: Tensor, sizes: Tensor) -> Tensor:
    """``q`` per graph ``[g]`` (float64): divided by ``max(min(one-way edges, n), 1)`` when relative."""
    q = torch.full(sizes.shape, float(q), dtype=torch.float64, device=sizes.device)
    if not relative:
        return q
    return q / torch.minimum(one_way.to(torch.float64), sizes.to(torch.float64)).clamp(min=1.0)


def magnetic_laplacian_stack(sym: Tensor, direction: Tensor, q: Tensor, normalization) -> Tensor:
    """``L [g, n, n]`` complex128 from the symmetrised weights ``sym``, the directions ``direction``
    (``a(u, v) - a(v, u)``, antisymmetric) ``[g, n, n]`` and ``q [g]``."""
    deg = sym.sum(-1)
    phase = torch.polar(torch.ones_like(direction), 2 * math.pi * q[:, None, None] * direction)
    if normalization is None:
        return torch.diag_embed(deg).to(phase.dtype) - sym * phase
    inv = torch.where(deg > 0, deg.clamp(min=torch.finfo(deg.dtype).tiny).rsqrt(), 0.0)
    eye = torch.eye(sym.shape[-1], dtype=phase.dtype, device=sym.device)
    return eye - (inv.unsqueeze(-1) * sym * inv.unsqueeze(-2)) * phase


def magnetic_laplacian(
    edge_index: Tensor, num_nodes: int, *, q: float = 0.25, normalization: str | None = "sym",
    edge_weight: Tensor | None = None, relative_q: bool = False,
) -> Tensor:
    """The dense magnetic Laplacian ``[N, N]`` (complex128, Hermitian) of one graph (module docstring)."""
    _check_options(1, q, normalization, "auto", "largest", relative_q, None)
    check_edge_index(edge_index, num_nodes)
    check_edge_weight(edge_weight, edge_index.shape[1])
    check_allocation(f"magnetic_laplacian(num_nodes={num_nodes}): the dense matrix", (num_nodes, num_nodes),
                     torch.complex128, edge_index.device)
    weight = torch.ones(edge_index.shape[1], device=edge_index.device) if edge_weight is None else edge_weight
    lo, hi, a_s, direction = _pairs(edge_index, weight, num_nodes)
    sym = torch.zeros(1, num_nodes, num_nodes, dtype=torch.float64, device=edge_index.device)
    dirs = torch.zeros_like(sym)
    sym[0, lo, hi] = sym[0, hi, lo] = a_s
    dirs[0, lo, hi], dirs[0, hi, lo] = direction, -direction
    one_way = (direction != 0).sum().view(1)
    qs = _effective_q(q, relative_q, one_way, torch.tensor([num_nodes], device=edge_index.device))
    return magnetic_laplacian_stack(sym, dirs, qs, normalization)[0]


def fix_phase(vecs: Tensor, phase: str = "largest") -> Tensor:
    """Eigenvectors ``[..., n, k]`` (complex) turned by a unit phase each, by the ``phase`` rule of
    the module docstring; zero columns (padding) stay zero."""
    check_choice("phase", phase, PHASES)
    if vecs.shape[-2] == 0:
        return vecs
    if phase == "largest":
        idx = vecs.abs().argmax(dim=-2, keepdim=True)
        ref = vecs.gather(-2, idx)
    else:
        real = vecs.real
        top = real.abs().argmax(dim=-2, keepdim=True)
        sign = torch.sign(real.gather(-2, top))
        vecs = vecs * torch.where(sign == 0, 1.0, sign).to(vecs.dtype)
        node = vecs[..., :, :1].imag.argmax(dim=-2, keepdim=True)  # [..., 1, 1]
        ref = vecs.gather(-2, node.expand(*node.shape[:-1], vecs.shape[-1]))
    size = ref.abs()
    turn = torch.where(size > 0, ref.conj() / size.clamp(min=torch.finfo(size.dtype).tiny), torch.ones_like(ref))
    return vecs * turn


def _features(vals: Tensor, vecs: Tensor, k: int, skip: int, phase: str) -> tuple[Tensor, Tensor]:
    """From ascending eigenpairs ``vals [..., n]``, ``vecs [..., n, n]`` (complex), whichever solver
    gave them: pairs ``skip .. skip + k - 1``, zero-padded to ``k``, phases fixed, as
    ``(vecs [..., n, 2k] = [Re, Im], vals [..., k])`` float32."""
    vals, vecs = _select(vals, vecs, k, skip)
    vecs = fix_phase(vecs, phase)
    return torch.cat([vecs.real, vecs.imag], dim=-1).to(torch.float32), vals.real.to(torch.float32)


def _dense_part(sym: Tensor, dirs: Tensor, qs: Tensor, k: int, skip: int, normalization, phase: str):
    lap = magnetic_laplacian_stack(sym, dirs, qs, normalization)
    vals, vecs = torch.linalg.eigh(lap)
    return _features(vals, vecs, k, skip, phase)


def _sparse_part(lo: Tensor, hi: Tensor, a_s: Tensor, direction: Tensor, n: int, q: float, k: int, skip: int,
                 normalization, phase: str) -> tuple[Tensor, Tensor]:
    """One large graph by ARPACK on the complex Hermitian sparse matrix (on the CPU)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import eigsh

    lo, hi, a_s, direction = (t.cpu() for t in (lo, hi, a_s, direction))
    deg = torch.zeros(n, dtype=torch.float64).index_add_(0, lo, a_s).index_add_(0, hi, a_s)
    off = torch.polar(a_s, 2 * math.pi * q * direction)  # the entry (lo, hi); (hi, lo) is its conjugate
    if normalization == "sym":
        inv = torch.where(deg > 0, deg.clamp(min=1e-300).rsqrt(), 0.0)
        off, diag = -off * inv[lo] * inv[hi], torch.ones(n, dtype=torch.float64)
    else:
        off, diag = -off, deg
    nodes = torch.arange(n)
    rows = torch.cat([lo, hi, nodes]).numpy()
    cols = torch.cat([hi, lo, nodes]).numpy()
    data = torch.cat([off, off.conj(), diag.to(off.dtype)]).numpy()
    lap = sp.coo_matrix((data, (rows, cols)), shape=(n, n)).tocsr()
    want = min(n - 1, skip + k)
    v0 = np.random.default_rng(0).uniform(0.5, 1.5, n).astype(np.complex128)  # reproducible output
    with blas_single_threaded():
        vals_np, vecs_np = eigsh(lap, k=want, which="SA", v0=v0, tol=0, ncv=min(n, max(2 * want + 1, 20)))
    order = np.argsort(vals_np)
    return _features(torch.from_numpy(vals_np[order].copy()), torch.from_numpy(vecs_np[:, order].copy()), k, skip,
                     phase)


def magnetic_laplacian_pe(
    edge_index: Tensor,
    num_nodes: int,
    k: int,
    *,
    q: float = 0.25,
    normalization: str | None = "sym",
    edge_weight: Tensor | None = None,
    relative_q: bool = False,
    drop_first: bool | None = None,
    phase: str = "largest",
    method: str = "auto",
) -> tuple[Tensor, Tensor]:
    """MagLapPE of one graph (module docstring).

    Args:
        edge_index: ``[2, E]`` long, directed (an undirected graph lists both directions).
        num_nodes: ``N``.
        k: eigenvectors per node.
        q: the potential, ``>= 0`` (0: LapPE; the authors use 0.1 to 0.25).
        normalization: "sym" (default) or None (combinatorial).
        edge_weight: optional ``[E]`` non-negative weights (they enter ``A_s``, not the phases).
        relative_q: divide ``q`` by the graph's one-way edges (at most ``N``).
        drop_first: drop the first eigenpair (default: at ``q = 0`` only).
        phase: "largest" or "paper" (module docstring).
        method: "dense", "sparse" (ARPACK) or "auto" (sparse from ``SPARSE_MIN_NODES`` nodes).

    Returns:
        ``(vecs [N, 2k], vals [k])`` float32 on the device of ``edge_index``: real parts, then
        imaginary parts; columns past the graph's eigenpairs are zero.
    """
    batch = torch.zeros(num_nodes, dtype=torch.long, device=edge_index.device)
    vecs, vals = magnetic_laplacian_pe_batch(
        edge_index, batch, k, num_graphs=1, q=q, normalization=normalization, edge_weight=edge_weight,
        relative_q=relative_q, drop_first=drop_first, phase=phase, method=method)
    return vecs, vals[0]


def magnetic_laplacian_pe_batch(
    edge_index: Tensor,
    batch: Tensor,
    k: int,
    *,
    num_graphs: int | None = None,
    q: float = 0.25,
    normalization: str | None = "sym",
    edge_weight: Tensor | None = None,
    relative_q: bool = False,
    drop_first: bool | None = None,
    phase: str = "largest",
    method: str = "auto",
) -> tuple[Tensor, Tensor]:
    """MagLapPE of every graph of a batch at once (``data.edge_index``, ``data.batch``): graphs of
    equal size share one batched complex ``eigh`` (no padding, so no foreign eigenpairs), large
    ones go to ARPACK one by one; spread over the CPU threads. Arguments as
    :func:`magnetic_laplacian_pe`. Returns ``(vecs [N, 2k], vals [G, k])`` float32."""
    skip = 1 if _check_options(k, q, normalization, method, phase, relative_q, drop_first) else 0
    num_graphs = check_batch(batch, num_graphs)
    num_nodes = batch.numel()
    check_edge_index(edge_index, num_nodes)
    check_edge_weight(edge_weight, edge_index.shape[1])
    check_same_graph(edge_index, batch)
    device = edge_index.device
    check_allocation(f"magnetic_laplacian_pe(k={k}): the encodings [N={num_nodes}, 2k]", (num_nodes, 2 * k),
                     torch.float32, device)
    weight = torch.ones(edge_index.shape[1], device=device) if edge_weight is None else edge_weight
    lo, hi, a_s, direction = _pairs(edge_index, weight, num_nodes)
    if q == 0 and skip == 1:  # exactly LapPE of the symmetrised graph
        both = torch.stack([torch.cat([lo, hi]), torch.cat([hi, lo])])
        vecs, vals = laplacian_pe_batch(both, batch, k, num_graphs=num_graphs, normalization=normalization,
                                        edge_weight=torch.cat([a_s, a_s]),
                                        method=method)
        return torch.cat([vecs, torch.zeros_like(vecs)], dim=-1), vals
    with single_threaded(device) as count:
        sizes = graph_sizes(batch, num_graphs)
        local = local_index(batch, sizes)
        one_way = torch.zeros(num_graphs, dtype=torch.long, device=device).index_add_(
            0, batch[lo], (direction != 0).long())
        qs = _effective_q(q, relative_q, one_way, sizes)

        def sparse(n: int) -> bool:
            chosen = method == "sparse" or (method == "auto" and n >= SPARSE_MIN_NODES)
            return chosen and n > 3 * (k + skip)

        pair_index = torch.stack([lo, hi])
        split = batch_parts(pair_index, batch, local, sizes.tolist(), sparse, lambda n: n, CHUNK_ENTRIES)
        tasks: list[tuple[float, Tensor, Tensor, Callable]] = []  # (cost, nodes, graphs, compute)
        for p, (part, pairs, nodes) in enumerate(zip(split.parts, split.edges, split.nodes)):
            if part[0] == "dense":
                _, n, graphs = part
                check_allocation(f"magnetic_laplacian_pe: {len(graphs)} dense matrices of {n} nodes",
                                 (3, len(graphs), n, n), torch.complex128, device)
                at = split.coords[:, pairs]
                sym = torch.zeros(len(graphs), n, n, dtype=torch.float64, device=device)
                dirs = torch.zeros_like(sym)
                sym[at[0], at[1], at[2]] = sym[at[0], at[2], at[1]] = a_s[pairs]
                dirs[at[0], at[1], at[2]], dirs[at[0], at[2], at[1]] = direction[pairs], -direction[pairs]
                ids = torch.tensor(graphs, dtype=torch.long, device=device)
                compute = partial(_dense_part, sym, dirs, qs[ids], k, skip, normalization, phase)
                tasks.append((len(graphs) * float(n) ** 3, nodes, ids, partial(_dense_rows, compute, split, p, k)))
            else:
                g, first, n = part[1], int(nodes[0]), nodes.numel()
                compute = partial(_sparse_part, lo[pairs] - first, hi[pairs] - first, a_s[pairs], direction[pairs], n,
                                  float(qs[g]), k, skip, normalization, phase)
                ids = torch.tensor([g], dtype=torch.long, device=device)
                tasks.append((float(n) * (pairs.numel() + n) * (k + 1), nodes, ids, compute))
        tasks.sort(key=lambda task: -task[0])  # the largest first: the threads end together
        eigsh_parts = device.type == "cpu" and any(part[0] == "sparse" for part in split.parts)
        with blas_single_threaded() if eigsh_parts else nullcontext():
            results = run_items([task[3] for task in tasks], count)
        vecs_out = torch.zeros(num_nodes, 2 * k, device=device)
        vals_out = torch.zeros(num_graphs, k, device=device)
        for (_, nodes, ids, _), (vecs, vals) in zip(tasks, results):
            vecs_out[nodes] = vecs.to(device)
            vals_out[ids] = vals.to(device).view(len(ids), k)
    return vecs_out, vals_out


def _dense_rows(compute: Callable, split, p: int, k: int) -> tuple[Tensor, Tensor]:
    """A dense chunk's encodings in the order of its nodes."""
    vecs, vals = compute()  # [g, n, 2k], [g, k]
    return vecs.reshape(-1, 2 * k)[split.node_flat[split.nodes[p]]], vals


__all__ = ["PHASES", "fix_phase", "magnetic_laplacian", "magnetic_laplacian_pe", "magnetic_laplacian_pe_batch",
           "magnetic_laplacian_stack"]
