"""Random-walk structural encoding (RWSE).

Dwivedi et al. 2022, Graph Neural Networks with Learnable Structural and Positional
Representations, https://arxiv.org/abs/2110.07875; GraphGPS uses ``K = 20``.

``RWSE(u) = [(P^1)_uu, ..., (P^K)_uu]`` with ``P = D^-1 A`` (``D`` the weighted out-degree,
self-loops kept, duplicate edges summed): the probability that a random walk from ``u`` is back at
``u`` after ``k`` steps. As in PyG's ``AddRandomWalkPE`` the degree is clamped at 1, so an isolated
node has a row of zeros and encoding ``0``. With edge weights ``P_uv = w_uv / D_u`` (PyG puts
``1 / D_u`` in every entry, ignoring the weight itself; unweighted graphs agree).

Computation, on the device of ``edge_index``, from ``(P^k)_uu = sum_j (P^a)_uj (P^b)_ju`` with
``a = floor(k/2)``, ``b = ceil(k/2)``: only the powers up to ``ceil(K/2)`` are needed.

* Small graphs (dense): ``M^1 .. M^ceil(K/2)`` by batched products over a stack ``[G, n, n]`` of
  the graphs of one size bucket (padded with isolated nodes, which add no walk); each diagonal is
  a row-wise product of two of them (``M`` below).
* Large graphs (sparse): blocks ``B`` of nodes, ``X_m = M^m E_B`` (``E_B`` the identity columns of
  ``B``) by sparse x dense products. For an undirected graph ``M = S = D^-1/2 A D^-1/2`` is
  symmetric and similar to ``P`` (same diagonal powers), so ``(S^2m)_uu = ||X_m e_u||^2`` and
  ``(S^(2m+1))_uu = <X_m e_u, X_(m+1) e_u>``: ``K/2`` products per block instead of ``K``. A
  directed graph runs a second chain with ``P^T`` for the rows of ``P^a`` (``K`` products).

On CPU the size-bucket chunks and node blocks are independent items of work, spread over torch's
threads with one intra-op thread each (:mod:`posenc.graph._threads`: thousands of small
multi-threaded operations stall on a machine where another process holds a core).
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Callable, Literal

import torch
from torch import Tensor

from ..common.checks import check_int
from ..primitives.budget import check_allocation
from ._threads import batch_parts, run_items, single_threaded
from .edges import check_batch, check_edge_index, check_edge_weight, check_same_graph, graph_sizes, is_undirected, local_index

Method = Literal["auto", "dense", "sparse"]

#: Graphs with at least this many nodes use the blocked sparse path under ``method="auto"``.
SPARSE_MIN_NODES = 1000

#: Small graphs of a batch are padded up to a multiple of this many nodes and stacked by size.
SIZE_BUCKET = 8

#: Size of one ``[N, block]`` float32 block of the sparse path (bytes), which sets the default
#: block size: each thread works through its own blocks, and one near the size of a core's L2
#: cache keeps them there (2 cores, 2 MB L2 each, 10k nodes: 52 columns take 1.6 CPU s, 209
#: columns 3.6 s), with at least :data:`MIN_BLOCK` columns.
BLOCK_BYTES = 2 << 20
MIN_BLOCK = 32

#: An undirected dense graph with at least this many nodes alone (one graph, or alone in its size
#: bucket) is split into row blocks for the CPU threads; smaller ones run in one piece on one
#: thread (2 cores, quiet: row blocks pay from about 192 nodes; 999 nodes: 0.11 s, one thread
#: 0.22 s, MKL's two threads 0.12 s, which stall under load: 0.14 s for a 64-node graph).
ROW_BLOCK_MIN_NODES = 192

#: A size bucket of a batch is computed in chunks of at most this many adjacency entries
#: (graphs x size^2, at least one graph): independent pieces of work for the threads.
CHUNK_ENTRIES = 1 << 16

_METHODS = ("auto", "dense", "sparse")


def _check_options(walk_length: int, method: str, block_size: int | None) -> None:
    check_int("walk_length", walk_length, minimum=1)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}")
    if block_size is not None:
        check_int("block_size", block_size, minimum=1)


def _transition_weights(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None) -> tuple[Tensor, Tensor]:
    """Edge weights as float32 and the clamped degrees ``D' = max(D, 1)`` ``[N]`` (PyG's convention:
    an isolated node keeps a zero row instead of dividing by zero)."""
    w = torch.ones(edge_index.shape[1], device=edge_index.device) if edge_weight is None else edge_weight.float()
    deg = torch.zeros(num_nodes, device=edge_index.device).index_add_(0, edge_index[0], w)
    return w, deg.clamp(min=1.0)


def _diag_of_products(powers: list[Tensor], walk_length: int, symmetric: bool, offset: int = 0) -> Tensor:
    """``[..., n, K]`` with ``(M^k)_uu = sum_j (M^a)_uj (M^b)_ju``, ``a = k // 2``, ``b = k - a``,
    from ``powers[m - 1] = M^m``, ``m = 1 .. ceil(K/2)`` (a dense stack); for a symmetric ``M``
    ``(M^b)_ju = (M^b)_uj`` needs no transpose. ``powers`` may be the rows ``offset ..`` of a
    symmetric ``M``'s powers (:func:`_dense_rows`)."""
    out = []
    for k in range(1, walk_length + 1):
        a, b = k // 2, k - k // 2
        if a == 0:
            out.append(torch.diagonal(powers[0], offset=offset, dim1=-2, dim2=-1))
        else:
            right = powers[b - 1] if symmetric else powers[b - 1].transpose(-1, -2)
            out.append((powers[a - 1] * right).sum(-1))
    return torch.stack(out, dim=-1)


def _walk_matrix(adj: Tensor, symmetric: bool) -> Tensor:
    """``M = D'^-1/2 A D'^-1/2`` (symmetric) or ``P = D'^-1 A`` from adjacency ``[..., n, n]``."""
    deg = adj.sum(-1).clamp(min=1.0)
    if symmetric:
        inv = deg.rsqrt()
        return inv.unsqueeze(-1) * adj * inv.unsqueeze(-2)
    return adj / deg.unsqueeze(-1)


def _dense_rwse(adj: Tensor, walk_length: int, symmetric: bool) -> Tensor:
    """RWSE of a stack ``adj [g, n, n]`` (float32, padding nodes isolated) -> ``[g, n, K]``:
    the powers ``M^1 .. M^ceil(K/2)`` by batched products, then each diagonal from two of them.
    ``M = D'^-1/2 A D'^-1/2`` for an undirected graph (symmetric, no transposes needed), else
    ``M = P``."""
    mat = _walk_matrix(adj, symmetric)
    powers = [mat]
    for _ in range((walk_length + 1) // 2 - 1):
        powers.append(powers[-1] @ mat)
    return _diag_of_products(powers, walk_length, symmetric)


def _dense_rows(mat: Tensor, start: int, end: int, walk_length: int) -> Tensor:
    """RWSE ``[end - start, K]`` of the nodes ``start .. end`` of one graph from its symmetric
    ``M [n, n]``: the rows ``start .. end`` of ``M^m`` by row-block products (independent of the
    other rows), then the diagonals as in :func:`_dense_rwse`."""
    rows = [mat[start:end]]
    for _ in range((walk_length + 1) // 2 - 1):
        rows.append(rows[-1] @ mat)
    return _diag_of_products(rows, walk_length, True, offset=start)


def _row_items(mat: Tensor, num_nodes: int, walk_length: int, count: int) -> list[tuple[int, int, Callable[[], Tensor]]]:
    """One mid-size graph's dense RWSE (symmetric ``M``) as ``2 count`` row blocks of its first
    ``num_nodes`` rows, ``(start, end, compute -> [end - start, K])``: work for ``count`` threads
    instead of one multi-threaded product per power."""
    pieces = min(num_nodes, 2 * count)
    cuts = [num_nodes * i // pieces for i in range(pieces + 1)]
    return [(s, t, partial(_dense_rows, mat, s, t, walk_length)) for s, t in zip(cuts[:-1], cuts[1:]) if t > s]


def _csr(rows: Tensor, cols: Tensor, vals: Tensor, n: int) -> Tensor:
    order = torch.argsort(rows * n + cols)
    rows, cols, vals = rows[order], cols[order], vals[order]
    crow = torch.zeros(n + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, cols, vals, (n, n), check_invariants=False)


class _SparseWalk:
    """The operator ``M`` of one large graph (CSR, and ``M^T`` for a directed graph) and its edges
    sorted by target, from which the blocks of :meth:`block` are computed independently."""

    def __init__(self, edge_index: Tensor, w: Tensor, deg: Tensor, num_nodes: int, symmetric: bool):
        n = self.num_nodes = num_nodes
        row, col = edge_index
        self.symmetric = symmetric
        self.device = edge_index.device
        if symmetric:
            inv = deg.rsqrt()
            val = inv[row] * w * inv[col]
        else:
            val = w / deg[row]
        self.fwd = _csr(row, col, val, n)
        self.bwd = None if symmetric else _csr(col, row, val, n)  # M^T, for the rows of M^a
        # Edges by target (for the first power of a block) and, directed, by source (its rows).
        by_col = torch.argsort(col, stable=True)
        self.by_col = (row[by_col], col[by_col], val[by_col])
        if not symmetric:
            by_row = torch.argsort(row, stable=True)
            self.by_row = (row[by_row], col[by_row], val[by_row])

    def _first(self, edges: tuple[Tensor, Tensor, Tensor], key: int, start: int, end: int) -> Tensor:
        """``[N, end - start]``: the columns ``start .. end`` of ``M`` (``key`` 1) or ``M^T`` (0)."""
        row, col, val = edges
        sorted_key = edges[key]
        bounds = torch.searchsorted(sorted_key, torch.tensor([start, end], device=self.device)).tolist()
        sl = slice(bounds[0], bounds[1])
        out = torch.zeros(self.num_nodes, end - start, device=self.device)
        other = col if key == 0 else row
        out.index_put_((other[sl], sorted_key[sl] - start), val[sl], accumulate=True)
        return out

    def block(self, start: int, end: int, walk_length: int) -> Tensor:
        """RWSE ``[end - start, K]`` of the nodes ``start .. end``: ``X_m = M^m E_B`` by sparse x
        dense products, the diagonal entries from column inner products (module docstring). Only
        two or three ``[N, |B|]`` blocks are alive."""
        width = end - start
        top = (walk_length + 1) // 2
        out = torch.empty(width, walk_length, device=self.device)
        # First power by scattering the edges that end in the block (no product needed).
        first = self._first(self.by_col, 1, start, end)
        if self.symmetric:
            cols_prev, rows_prev = first, first
        else:
            rows_prev = self._first(self.by_row, 0, start, end)  # columns of (M^T)^1 = rows of M
            cols_prev = first
        block = torch.arange(width, device=self.device)
        out[:, 0] = first[start + block, block]
        for m in range(1, top + 1):
            # k = 2m: <rows of M^m, columns of M^m>; k = 2m + 1: <rows of M^m, columns of M^(m+1)>.
            if 2 * m <= walk_length:
                out[:, 2 * m - 1] = (rows_prev * cols_prev).sum(0)
            if 2 * m + 1 > walk_length:
                break
            cols_next = self.fwd @ cols_prev
            out[:, 2 * m] = (rows_prev * cols_next).sum(0)
            if self.symmetric:
                rows_prev = cols_prev = cols_next
            else:
                if 2 * m + 2 <= walk_length:
                    rows_prev = self.bwd @ rows_prev
                cols_prev = cols_next
            del cols_next
        return out


def _block_size(num_nodes: int, block_size: int | None) -> int:
    if block_size is None:
        block_size = max(MIN_BLOCK, BLOCK_BYTES // (4 * max(num_nodes, 1)))
    return max(1, min(num_nodes, block_size))


def _sparse_items(
    edge_index: Tensor, w: Tensor, deg: Tensor, num_nodes: int, walk_length: int, symmetric: bool,
    block_size: int | None,
) -> list[tuple[int, int, Callable[[], Tensor]]]:
    """The blocks of the sparse RWSE of one graph, as ``(start, end, compute -> [end - start, K])``."""
    walk = _SparseWalk(edge_index, w, deg, num_nodes, symmetric)
    size = _block_size(num_nodes, block_size)
    return [
        (s, min(num_nodes, s + size), partial(walk.block, s, min(num_nodes, s + size), walk_length))
        for s in range(0, num_nodes, size)
    ]


def random_walk_se(
    edge_index: Tensor,
    num_nodes: int,
    walk_length: int,
    *,
    edge_weight: Tensor | None = None,
    method: Method = "auto",
    block_size: int | None = None,
) -> Tensor:
    """RWSE of one graph.

    Args:
        edge_index: ``[2, E]`` long (directed graphs are allowed).
        num_nodes: ``N``.
        walk_length: ``K >= 1``.
        edge_weight: optional ``[E]`` non-negative weights.
        method: "dense", "sparse" or "auto" (sparse from :data:`SPARSE_MIN_NODES` nodes).
        block_size: nodes per block of the sparse path (default: blocks of about
            :data:`BLOCK_BYTES`; two or three blocks are alive per CPU thread at a time, four for a
            directed graph).

    Returns:
        ``[N, K]`` float32 on the device of ``edge_index``.
    """
    _check_options(walk_length, method, block_size)
    check_edge_index(edge_index, num_nodes)
    sparse = method == "sparse" or (method == "auto" and num_nodes >= SPARSE_MIN_NODES)
    # Sizes first: walk_length = 10^9 or a huge num_nodes would otherwise fail deep in an allocator.
    check_allocation(f"random_walk_se(num_nodes={num_nodes}, walk_length={walk_length}): the encodings [N, K]",
                     (num_nodes, walk_length), torch.float32, edge_index.device)
    if not sparse:  # the transition matrix and two of its powers, N x N each
        check_allocation(f"random_walk_se(num_nodes={num_nodes}, method={method!r}): the dense walk matrices",
                         (3, num_nodes, num_nodes), torch.float32, edge_index.device)
    if sparse:
        # The blocks are independent: spread over threads with one intra-op thread each (_threads).
        with single_threaded(edge_index.device) as count:
            check_edge_weight(edge_weight, edge_index.shape[1])
            w, deg = _transition_weights(edge_index, num_nodes, edge_weight)
            symmetric = is_undirected(edge_index, num_nodes, edge_weight)
            items = _sparse_items(edge_index, w, deg, num_nodes, walk_length, symmetric, block_size)
            blocks = run_items([fn for _, _, fn in items], count)
        return torch.cat(blocks) if blocks else torch.zeros(0, walk_length, device=edge_index.device)
    # Dense, on one intra-op thread (_threads): in one piece, or in row blocks for the threads
    # (ROW_BLOCK_MIN_NODES).
    with single_threaded(edge_index.device) as count:
        check_edge_weight(edge_weight, edge_index.shape[1])
        w, deg = _transition_weights(edge_index, num_nodes, edge_weight)
        adj = torch.zeros(num_nodes, num_nodes, device=edge_index.device)
        adj.index_put_((edge_index[0], edge_index[1]), w, accumulate=True)
        if count > 1 and num_nodes >= ROW_BLOCK_MIN_NODES and torch.equal(adj, adj.T):
            items = _row_items(_walk_matrix(adj, True), num_nodes, walk_length, count)
            return torch.cat(run_items([fn for _, _, fn in items], count))
        # A small or directed graph: M = P (for a small one a symmetry check would cost more).
        return _dense_rwse(adj, walk_length, symmetric=False)


def random_walk_se_batch(
    edge_index: Tensor,
    batch: Tensor,
    walk_length: int,
    *,
    num_graphs: int | None = None,
    edge_weight: Tensor | None = None,
    method: Method = "auto",
) -> Tensor:
    """RWSE of every graph of a batch at once (``data.edge_index``, ``data.batch`` of a PyG ``Batch``).

    Small graphs are padded with isolated nodes (harmless: they add no walk) to a multiple of
    :data:`SIZE_BUCKET` nodes and each size bucket, in chunks of at most :data:`CHUNK_ENTRIES`
    adjacency entries, is one chain of batched products; graphs of :data:`SPARSE_MIN_NODES` nodes
    or more (``method="auto"``) take the blocked sparse path. On CPU the chunks and blocks are
    spread over torch's threads, each running its operations on one intra-op thread.

    Returns:
        ``[N, K]`` float32.
    """
    _check_options(walk_length, method, None)
    device = edge_index.device
    with single_threaded(device) as count:
        num_graphs = check_batch(batch, num_graphs)
        num_nodes = batch.numel()
        check_allocation(f"random_walk_se_batch(walk_length={walk_length}): the encodings [N={num_nodes}, K]",
                         (num_nodes, walk_length), torch.float32, device)
        check_edge_index(edge_index, num_nodes)
        check_edge_weight(edge_weight, edge_index.shape[1])
        check_same_graph(edge_index, batch)
        w, deg = _transition_weights(edge_index, num_nodes, edge_weight)
        sizes = graph_sizes(batch, num_graphs)
        local = local_index(batch, sizes)
        symmetric = is_undirected(edge_index, num_nodes, edge_weight)  # once for the whole batch

        sparse = (lambda n: True) if method == "sparse" else (lambda n: method == "auto" and n >= SPARSE_MIN_NODES)
        split = batch_parts(
            edge_index, batch, local, sizes.tolist(), sparse, lambda n: -(-n // SIZE_BUCKET) * SIZE_BUCKET,
            CHUNK_ENTRIES,
        )
        out = torch.zeros(num_nodes, walk_length, device=device)

        def dense_part(p: int) -> Tensor:
            pe = _dense_rwse(split.dense_stack(p, w, torch.float32), walk_length, symmetric)
            return pe.reshape(-1, walk_length)[split.node_flat[split.nodes[p]]]

        tasks: list[tuple[float, Tensor | slice, Callable[[], Tensor]]] = []  # (cost, nodes, compute)
        for p, (part, edges, nodes) in enumerate(zip(split.parts, split.edges, split.nodes)):
            if part[0] == "dense":
                _, size, graphs = part
                n, first = nodes.numel(), int(nodes[0])
                if count > 1 and symmetric and len(graphs) == 1 and n >= ROW_BLOCK_MIN_NODES:
                    # One mid-size graph alone: row blocks of it for the threads.
                    mat = _walk_matrix(split.dense_stack(p, w, torch.float32)[0], True)
                    for s, t, fn in _row_items(mat, n, walk_length, count):
                        tasks.append(((t - s) * float(size) ** 2, slice(first + s, first + t), fn))
                    continue
                tasks.append((len(graphs) * float(size) ** 3, nodes, partial(dense_part, p)))
                continue
            first, n = int(nodes[0]), nodes.numel()  # a graph's nodes are contiguous (sorted batch)
            for s, t, fn in _sparse_items(
                local[edge_index[:, edges]], w[edges], deg[first : first + n], n, walk_length, symmetric, None
            ):
                tasks.append(((t - s) * float(edges.numel() + n), slice(first + s, first + t), fn))
        tasks.sort(key=lambda task: -task[0])  # the largest first: the threads end together
        results = run_items([fn for _, _, fn in tasks], count)
        for (_, nodes, _), pe in zip(tasks, results):
            out[nodes] = pe
    return out
