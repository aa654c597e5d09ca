"""The ``rrwp`` encoding: relative random-walk probabilities (GRIT, Ma et al. 2023,
https://arxiv.org/abs/2305.20082) as a node encoding and a per-head attention bias.

* input: ``x + W_node RRWP(u, u)`` (the diagonal, ``K`` numbers per node);
* score bias: ``bias(h, u, v) = w_h . RRWP(u, v) + b_h`` for the pairs of one graph: the pair
  features projected to one scalar per head (GRIT projects them to edge embeddings of its own
  attention; posenc's attention takes a bias, so the projection ends at the heads). A pair outside
  the ``(K-1)``-hop support has ``RRWP = 0`` and gets ``b_h``.

The structure reaches the encoding as positions, as for ``spd``: :func:`~posenc.graph.rrwp_positions`
gives each node the row ``[graph id, local index, RRWP(u, v_0), ..., RRWP(u, v_(nmax-1))]``
(``[1, N, 2 + nmax K]``), passed as ``q_pos`` and ``kv_pos`` with the block-diagonal mask
``AttentionMask.packed(batch[None])``; in :class:`~posenc.graph.gps.GPS` give ``encoding="rrwp"``
and ``node_positions`` builds them from ``AddRRWP``'s attributes. Each call projects the rows once,
``[B, N, nmax, H]``, and the bias of (query ``u``, key ``v``) reads the entry of ``v``'s local index:
a lookup per pair on every kernel path (FlexAttention ``score_mod`` on CUDA, the chunked dense path
elsewhere), no ``N x N`` tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_int, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, gather
from ..common.registry import register


def _layout(name: str, positions: Tensor, walk_length: int) -> int:
    """``nmax`` of RRWP positions ``[B or 1, T, 2 + nmax K]`` (a ValueError naming ``name`` otherwise)."""
    check_positions(name, positions)  # (bool, NaN: refused first, as by every encoding)
    width = positions.shape[-1] - 2
    if positions.dim() != 3 or not positions.is_floating_point() or width < walk_length or width % walk_length:
        raise ValueError(f"rrwp: {name} must be float rows [batch or 1, nodes, 2 + nmax * walk_length={walk_length}] "
                         f"from rrwp_positions; got {positions.dtype} {tuple(positions.shape)}")
    return width // walk_length


def _ids(name: str, positions: Tensor, nmax: int) -> tuple[Tensor, Tensor]:
    """Graph ids and local indices (long ``[B or 1, T]``) of RRWP positions, checked."""
    graph, local = positions[..., 0], positions[..., 1]
    if not torch.compiler.is_compiling() and positions.numel():
        head = positions[..., :2]
        if not bool((head == head.round()).all()) or int(local.min()) < 0 or int(local.max()) >= nmax:
            raise ValueError(f"rrwp: {name} columns 0 and 1 must be a graph id and a local index in [0, {nmax}) "
                             "(build the positions with rrwp_positions)")
    return graph.long(), local.long()


@register(
    "rrwp",
    modality="graph",
    paper="Ma et al. 2023, Graph Inductive Biases in Transformers without Message Passing (GRIT), "
    "https://arxiv.org/abs/2305.20082",
    summary="relative random-walk probabilities [I, M, ..., M^(K-1)] per pair: the diagonal projected to the "
    "model width, the pairs to a bias per head",
)
class RRWPBias(PositionEncoding):
    """Args:
        dim: model width ``C`` (the node projection).
        num_heads: heads ``H`` (the pair projection).
        walk_length: ``K``, the features per pair (as given to ``rrwp``; 8 by default, GRIT's ZINC setting).

    Parameters: ``node_proj`` (``Linear(K, C)``), ``pair_weight [H, K]``, ``pair_bias [H]``.
    Positions ``[B or 1, T, 2 + nmax K]`` float from :func:`~posenc.graph.rrwp_positions`.
    Hooks: input and score bias (one instance: the GPS model shares it across its layers).
    """

    hooks = frozenset({Hook.INPUT, Hook.SCORE_BIAS})

    def __init__(self, dim: int, num_heads: int, walk_length: int = 8) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_int("num_heads", num_heads, minimum=1)
        check_int("walk_length", walk_length, minimum=1)
        self.dim, self.num_heads, self.walk_length = dim, num_heads, walk_length
        self.node_proj = nn.Linear(walk_length, dim)
        self.pair_weight = nn.Parameter(torch.randn(num_heads, walk_length) / walk_length ** 0.5)
        self.pair_bias = nn.Parameter(torch.zeros(num_heads))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, walk_length={self.walk_length}"

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, T, C]``, ``positions [B or 1, T, 2 + nmax K]`` -> ``x + W_node RRWP(u, u)``."""
        nmax = _layout("positions", positions, self.walk_length)
        if x.dim() != 3 or positions.shape[0] not in (1, x.shape[0]) or positions.shape[1] != x.shape[1]:
            raise ValueError(f"rrwp: x [batch, nodes, dim] and positions [batch or 1, nodes, F] disagree: "
                             f"{tuple(x.shape)}, {tuple(positions.shape)}")
        _, local = _ids("positions", positions, nmax)
        rows = positions[..., 2:].unflatten(-1, (nmax, self.walk_length))  # [B, T, nmax, K]
        own = rows.gather(2, local[..., None, None].expand(-1, -1, 1, self.walk_length)).squeeze(2)
        return x + self.node_proj(own.to(x.dtype))

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        nmax = _layout("q_pos", q_pos, self.walk_length)
        if _layout("kv_pos", kv_pos, self.walk_length) != nmax:
            raise ValueError(f"rrwp: q_pos and kv_pos must come from one rrwp_positions call; got widths "
                             f"{q_pos.shape[-1]} and {kv_pos.shape[-1]}")
        q_graph, _ = _ids("q_pos", q_pos, nmax)
        kv_graph, kv_local = _ids("kv_pos", kv_pos, nmax)
        work = torch.float64 if self.pair_weight.dtype == torch.float64 else torch.float32
        rows = q_pos[..., 2:].unflatten(-1, (nmax, self.walk_length)).to(work)  # [B, Tq, nmax, K]
        # the pair features projected once per call: [B, Tq, nmax, H]
        table = torch.matmul(rows, self.pair_weight.to(work).T) + self.pair_bias.to(work)
        q_batched, kv_batched = q_pos.shape[0] > 1, kv_pos.shape[0] > 1

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bq = b if q_batched else b * 0
            bk = b if kv_batched else b * 0
            value = gather(table, bq, q_idx, gather(kv_local, bk, kv_idx), h)
            # pairs of two graphs: no pair feature (the packed mask hides them anyway)
            same = gather(q_graph, bq, q_idx) == gather(kv_graph, bk, kv_idx)
            return torch.where(same, value, torch.zeros_like(value))

        return PairwiseBias(bias, per_batch=q_batched or kv_batched, learned=(table,) if table.requires_grad else (),
                            name="rrwp")


__all__ = ["RRWPBias"]
