"""Stable and expressive positional encodings for graphs (SPE; Huang et al. 2024, On the Stability
of Expressive Positional Encodings for Graphs, ICLR, https://arxiv.org/abs/2310.02579). Registered
as ``stable_pe``: not to be confused with the stochastic positional encodings of linear attention
(``sine_spe``, ``conv_spe``; Liutkus et al. 2021), which posenc also calls SPE.

From the Laplacian's eigenpairs ``(V, lambda)`` of each graph, ``m`` matrices

    ``Q_l = V diag(phi_l(lambda)) V^T``,  ``l = 1 .. m``  (``[n, n]`` each),

with ``phi: R -> R^m`` one MLP applied to every eigenvalue alike; then node ``u`` gets
``rho(Q[u])`` with ``rho`` a DeepSets over the pairs, ``[sum_v psi(Q[u, v, :]), Q[u, u, :]]``
projected to the model width. Inside a repeated eigenvalue, ``phi`` gives every eigenvector the
same weight, so ``V_E diag(c) V_E^T = c V_E V_E^T`` does not depend on the basis the eigensolver
chose there (LapPE's eigenvectors do: on a graph of two equal components the encoding of a
permuted graph is the permuted encoding in only some of the seeds); and ``phi``, ``psi`` being
Lipschitz, a small change of the graph changes the encoding a little (the paper's stability),
where single eigenvectors of near-equal eigenvalues can rotate by any amount.

Eigenpairs: :func:`stable_pe_features` keeps the ``k`` smallest, the first (``lambda = 0``)
included. An eigenspace that ``k`` would cut (``lambda_k = lambda_(k+1)``, within ``tolerance``) is
dropped whole (its columns zero): a part of an eigenspace is a basis choice. Graphs of at most
``k`` nodes keep everything; columns past ``n`` are zero and add nothing to ``Q``. Dense
``torch.linalg.eigh`` only (graphs of one size share a call): the encoding itself holds ``n^2 m``
numbers per graph, so SPE is for graphs of up to a few thousand nodes.

Positions of the encoding: ``[graph id, v_1(u) .. v_k(u), lambda_1 .. lambda_k]`` per node
(``[B or 1, T, 1 + 2k]``; :func:`stable_pe_positions`), the graph id grouping the nodes of a packed
batch (sorted, as a PyG ``batch``).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from ..common.checks import check_int, check_number, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from ..primitives.budget import check_allocation
from ._threads import batch_parts, run_items, single_threaded
from .edges import check_batch, graph_sizes, local_index
from .laplacian import _check_options as _check_laplacian_options
from .laplacian import _laplacian_stack, _pad_eigenpairs, _prepare

CHUNK_ENTRIES = 1 << 16


def _drop_cut_eigenspace(vals: Tensor, vecs: Tensor, k: int, tolerance: float) -> tuple[Tensor, Tensor]:
    """The first ``k`` of ascending ``vals [g, n]``, ``vecs [g, n, n]``, the columns of an
    eigenvalue tied with the ``(k+1)``-th zeroed; padded to ``k``."""
    n = vals.shape[-1]
    keep_vals, keep_vecs = vals[..., :k], vecs[..., :k]
    if n > k:
        cut = vals[..., k: k + 1]  # [g, 1]
        tied = (keep_vals - cut).abs() <= tolerance * cut.abs().clamp(min=1.0)
        keep_vals = keep_vals.masked_fill(tied, 0.0)
        keep_vecs = keep_vecs.masked_fill(tied.unsqueeze(-2), 0.0)
    return _pad_eigenpairs(keep_vals, keep_vecs, k)


def _dense_part(split, p: int, weight: Tensor, k: int, normalization, tolerance: float) -> tuple[Tensor, Tensor]:
    lap, _ = _laplacian_stack(split.dense_stack(p, weight, torch.float64), normalization)
    vals, vecs = torch.linalg.eigh(lap)
    vals, vecs = _drop_cut_eigenspace(vals, vecs, k, tolerance)
    return vecs.reshape(-1, k)[split.node_flat[split.nodes[p]]], vals


def stable_pe_features_batch(
    edge_index: Tensor,
    batch: Tensor,
    k: int,
    *,
    num_graphs: int | None = None,
    normalization: str | None = "sym",
    edge_weight: Tensor | None = None,
    symmetrize: bool = False,
    tolerance: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """The eigenpairs SPE reads, for every graph of a batch: ``(vecs [N, k], vals [G, k])`` float32,
    the ``k`` smallest of each graph's Laplacian (``normalization`` as LapPE's: "sym", "rw" is not
    symmetric and is refused, None combinatorial), the first included, a cut eigenspace zeroed
    (module docstring). ``edge_index`` undirected (or ``symmetrize``), ``batch [N]`` sorted."""
    _check_laplacian_options(k, normalization, "dense")
    if normalization == "rw":
        raise ValueError("normalization='rw' is not symmetric; SPE takes 'sym' or None")
    check_number("tolerance", tolerance, minimum=0.0)
    device = edge_index.device
    with single_threaded(device) as count:
        num_graphs = check_batch(batch, num_graphs)
        num_nodes = batch.numel()
        edge_index, weight = _prepare(edge_index, num_nodes, edge_weight, symmetrize)
        sizes = graph_sizes(batch, num_graphs)
        nmax = int(sizes.max()) if num_graphs else 0
        check_allocation(f"stable_pe_features(k={k}): the encodings [N={num_nodes}, k]", (num_nodes, k), torch.float32,
                         device)
        check_allocation(f"stable_pe_features: a dense eigendecomposition of {nmax} nodes", (3, nmax, nmax),
                         torch.float64, device)
        local = local_index(batch, sizes)
        split = batch_parts(edge_index, batch, local, sizes.tolist(), lambda n: False, lambda n: n, CHUNK_ENTRIES)
        items = [partial(_dense_part, split, p, weight, k, normalization, tolerance) for p in range(len(split.parts))]
        results = run_items(items, count)
        vecs_out = torch.zeros(num_nodes, k, device=device)
        vals_out = torch.zeros(num_graphs, k, device=device)
        for (_, _, graphs), nodes, (vecs, vals) in zip(split.parts, split.nodes, results):
            vecs_out[nodes] = vecs.to(torch.float32)
            vals_out[torch.tensor(graphs, dtype=torch.long, device=device)] = vals.to(torch.float32)
    return vecs_out, vals_out


def stable_pe_features(
    edge_index: Tensor, num_nodes: int, k: int, *, normalization: str | None = "sym",
    edge_weight: Tensor | None = None, symmetrize: bool = False, tolerance: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """:func:`stable_pe_features_batch` of one graph: ``(vecs [N, k], vals [k])``."""
    batch = torch.zeros(num_nodes, dtype=torch.long, device=edge_index.device)
    vecs, vals = stable_pe_features_batch(edge_index, batch, k, num_graphs=1, normalization=normalization,
                                          edge_weight=edge_weight, symmetrize=symmetrize, tolerance=tolerance)
    return vecs, vals[0]


def stable_pe_positions(batch: Tensor, vecs: Tensor, vals: Tensor) -> Tensor:
    """Positions of ``stable_pe``: ``[1, N, 1 + 2k]`` rows ``[graph id, vecs, vals]`` from
    :func:`stable_pe_features_batch`'s ``vecs [N, k]`` and ``vals`` (``[G, k]``, or per node ``[N, k]``)."""
    num_graphs = check_batch(batch)
    if vecs.dim() != 2 or vecs.shape[0] != batch.numel():
        raise ValueError(f"vecs must be [N={batch.numel()}, k]; got {tuple(vecs.shape)}")
    per_node = vals if vals.shape[0] == batch.numel() and vals.shape[0] != num_graphs else vals[batch]
    if per_node.shape != vecs.shape:
        raise ValueError(f"vals must be [G={num_graphs}, k={vecs.shape[1]}] or [N, k]; got {tuple(vals.shape)}")
    return torch.cat([batch[:, None].to(vecs.dtype), vecs, per_node.to(vecs.dtype)], dim=1).unsqueeze(0)


def _mlp(inputs: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden))


@register(
    "stable_pe",
    modality="graph",
    paper="Huang et al. 2024, On the Stability of Expressive Positional Encodings for Graphs (SPE), "
    "https://arxiv.org/abs/2310.02579",
    summary="V diag(phi(lambda)) V^T for m learned eigenvalue filters, a DeepSets over each node's row: "
    "invariant to the eigenbasis, stable",
)
class StablePE(PositionEncoding):
    """SPE: ``x + W [sum_v psi(Q[u, v]), Q[u, u]]``, ``Q[u, v, l] = sum_i phi_l(lambda_i) v_i(u) v_i(v)``.

    Args:
        dim: model width ``C``.
        k: eigenpairs per graph (as given to :func:`stable_pe_features`).
        hidden: the filters ``m`` and the width of ``phi`` and ``psi``.

    Positions ``[B or 1, T, 1 + 2k]`` float from :func:`stable_pe_positions`. Hook: input.
    """

    hooks = frozenset({Hook.INPUT})

    def __init__(self, dim: int, k: int = 16, hidden: int = 16) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_int("k", k, minimum=1)
        check_int("hidden", hidden, minimum=1)
        self.dim, self.k, self.hidden = dim, k, hidden
        self.phi = _mlp(1, hidden)
        self.psi = _mlp(hidden, hidden)
        self.proj = nn.Linear(2 * hidden, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, k={self.k}, hidden={self.hidden}"

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, T, C]``, ``positions [B or 1, T, 1 + 2k]`` -> ``[B, T, C]``."""
        check_positions("positions", positions)  # (bool, NaN: refused first, as by every encoding)
        width = 1 + 2 * self.k
        if x.dim() != 3 or positions.dim() != 3 or positions.shape[0] not in (1, x.shape[0]) \
                or positions.shape[1] != x.shape[1] or positions.shape[2] != width or not positions.is_floating_point():
            raise ValueError(f"stable_pe: positions must be float [batch={x.shape[0] if x.dim() == 3 else '?'} or 1, "
                             f"nodes, 1 + 2k={width}] (stable_pe_positions) for x [batch, nodes, dim]; got "
                             f"{positions.dtype} {tuple(positions.shape)} and x {tuple(x.shape)}")
        terms = [self._row(positions[b].to(x.dtype)) for b in range(positions.shape[0])]
        return x + torch.stack(terms)

    def _row(self, pos: Tensor) -> Tensor:
        """The encoding of one packed row ``pos [T, 1 + 2k]`` -> ``[T, C]``."""
        k, length = self.k, pos.shape[0]
        graph = pos[:, 0]
        if not torch.compiler.is_compiling() and length and (
                not bool((graph == graph.round()).all()) or bool((graph[1:] < graph[:-1]).any())):
            raise ValueError("stable_pe: positions column 0 must hold sorted integer graph ids (stable_pe_positions)")
        _, counts = torch.unique_consecutive(graph.long(), return_counts=True)
        groups, nmax = counts.numel(), int(counts.max()) if length else 0
        check_allocation(f"stable_pe: Q of {groups} graph(s) of up to {nmax} nodes [G, n, n, hidden]",
                         (groups, nmax, nmax, self.hidden), pos.dtype, pos.device)
        group = torch.repeat_interleave(torch.arange(groups, device=pos.device), counts)
        local = torch.arange(length, device=pos.device) - (torch.cumsum(counts, 0) - counts)[group]
        vecs = pos.new_zeros(groups, nmax, k)
        vecs[group, local] = pos[:, 1: 1 + k]
        first = torch.cumsum(counts, 0) - counts
        filters = self.phi(pos[first, 1 + k:].unsqueeze(-1))  # [G, k, m]: phi of each eigenvalue
        q = torch.einsum("gui,gim,gvi->guvm", vecs, filters, vecs)  # [G, n, n, m]
        real = (torch.arange(nmax, device=pos.device) < counts[:, None]).to(pos.dtype)  # [G, n]
        pooled = (self.psi(q) * real[:, None, :, None]).sum(2)  # [G, n, m]: a sum over the graph's nodes v
        own = torch.diagonal(q, dim1=1, dim2=2).transpose(1, 2)  # [G, n, m]: Q[u, u]
        return self.proj(torch.cat([pooled, own], dim=-1))[group, local]


__all__ = ["StablePE", "stable_pe_features", "stable_pe_features_batch", "stable_pe_positions"]
