"""Pairwise functions over (batch, head, query index, key index): :class:`PairwiseBias`, the one
form of a score bias (ALiBi, T5, shortest path...) or an after-softmax bias (eRPE) that every
kernel path takes (README.md, "One core, four hook points"). Inside ``fn`` only element-wise
operations and indexing of captured tensors are allowed: that is what both of its uses support,
FlexAttention's ``score_mod`` (scalar indices) and a dense block (broadcast ``arange`` indices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import check_tensor

PairFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def is_dense_block(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> bool:
    """True when a bias function is called for a whole block of query rows by key columns (the
    broadcast layout of :meth:`PairwiseBias.dense`: ``q_idx`` varies along dim 2 only, ``kv_idx``
    along dim 3 only, ``b`` and ``h`` along neither), not with FlexAttention's scalar indices.

    A function is element-wise by contract; content-dependent terms (a ``d``-long dot product per
    element: Transformer-XL, DeBERTa, TUPE, vector eRPE) use this to compute a block by one matmul
    over the rows asked for, so that no ``[B, H, T, R]`` table is ever built and the chunked
    backward only needs gradients of small tensors."""
    if not all(t.dim() == 4 for t in (b, h, q_idx, kv_idx)):
        return False
    return (
        b.shape[2] == b.shape[3] == h.shape[2] == h.shape[3] == 1
        and q_idx.shape[3] == 1 and kv_idx.shape[2] == 1
    )


def rows_times_table(rows: Tensor, table: Tensor) -> Tensor:
    """``rows [B, H, r, d] @ table [H or 1, d, R]`` -> ``[B, H, r, R]`` (a view of a
    ``[H, B, r, R]`` tensor): one matmul per head over all the batch's rows. A plain broadcast
    matmul would copy the table once per batch element in the forward pass and sum that many
    gradients in the backward pass, for every block of rows."""
    b, h, r, d = rows.shape
    if table.shape[0] == 1 and h > 1:
        out = torch.matmul(rows.reshape(1, b * h * r, d), table)  # [1, B*H*r, R]
        return out.view(b, h, r, -1)
    out = torch.matmul(rows.transpose(0, 1).reshape(h, b * r, d), table)  # [H, B*r, R]
    return out.view(h, b, r, -1).transpose(0, 1)


def matvec(matrix: Tensor, vector: Tensor) -> Tensor:
    """``matrix [..., n, d]`` times ``vector [..., d]`` -> ``[..., n]`` (batch axes broadcast),
    computed as the row ``vector`` times ``matrix^T``: torch's CPU matmul runs a matrix times one
    column several times slower than one row times a matrix."""
    return torch.matmul(vector.unsqueeze(-2), matrix.transpose(-1, -2)).squeeze(-2)


def shared_run_offset(q_pos: Tensor, kv_pos: Tensor) -> int | None:
    """``kv_pos[0] - q_pos[0]`` when both are integer runs of consecutive values shared by the
    batch (``[1, T]``), so that ``kv_pos[j] - q_pos[i]`` is that offset plus ``j - i``; else None."""
    q0 = run_first(q_pos)
    k0 = None if q0 is None else run_first(kv_pos)
    return None if k0 is None else k0 - q0


def run_first(positions: Tensor) -> int | None:
    """The first position when ``positions`` ``[1, T]`` (``T >= 1``) are one integer run
    ``p, p + 1, ...`` shared by the batch, else None. Reads the positions (a host sync)."""
    check_tensor("positions", positions)
    if positions.dim() != 2 or positions.shape[0] != 1 or positions.dtype.is_floating_point or positions.numel() == 0:
        return None
    first = int(positions[0, 0])
    return first if _is_run(positions[0], first) else None


def offset_window(values: Tensor, q_len: int, s: int, e: int, kv_end: int) -> Tensor:
    """The block of query rows ``s:e`` and keys ``:kv_end`` of a function of ``j - i`` alone
    (query index ``i``, key index ``j``), laid out as ``values [..., Tq + Tk - 1]`` whose column
    ``m`` holds ``j - i = m - (q_len - 1)``: ``[..., e - s, kv_end]``, a row-major copy.
    ``values.unfold`` gives row ``w`` as ``values[w : w + kv_end]``, which is query ``q_len - 1 -
    w``'s row, so the block is that window's rows in reverse order (no per-element gather). They
    are taken by an index of rows: ``flip`` keeps the window's strides and writes the block
    column by column, which SDPA's CPU kernel then reads more slowly."""
    window = values.unfold(-1, kv_end, 1)[..., q_len - e: q_len - s, :]  # [..., rows, kv_end], overlapping rows
    return window[..., torch.arange(e - s - 1, -1, -1, device=values.device), :]


def offset_window_grad(grad: Tensor, width: int, q_len: int, s: int, e: int) -> Tensor:
    """The gradient of ``values [..., width]`` from that of one :func:`offset_window` block
    ``grad [..., rows, kv_end]``: the sum along each diagonal. The rows, back in window order
    and padded to ``kv_end + rows + 1`` columns, read as rows of ``kv_end + rows`` put row ``w``
    ``w`` columns to the right; a sum over the rows is then the sum over each diagonal (one
    copy; unfold's own backward is several times slower)."""
    lead = grad.shape[:-2]
    g = grad.reshape(-1, *grad.shape[-2:]).flip(-2)  # [n, rows, kv_end], row w = window w
    n, rows, kv_end = g.shape
    wide = kv_end + rows
    skewed = F.pad(g, (0, rows + 1)).flatten(1)[:, : rows * wide].view(n, rows, wide)
    out = g.new_zeros(n, width)
    first = q_len - e  # the window of the block's last row
    out[:, first: first + wide - 1] = skewed.sum(1)[:, : wide - 1]
    return out.view(*lead, width)


def _is_run(pos: Tensor, start: int) -> bool:
    """``pos [T]`` is ``start, start + 1, ...`` (one element always is: a decoding step's query)."""
    n = pos.shape[0]
    return n == 1 or torch.equal(pos, torch.arange(start, start + n, device=pos.device, dtype=pos.dtype))


def run_start(idx: Tensor) -> int | None:
    """``start`` when the integer indices ``idx`` (any shape, read flattened) are one run ``start,
    start + 1, ...`` (a block of the dense path), else None (also for no index). Checked exactly:
    a reader that takes such a block as a slice relies on it."""
    if not isinstance(idx, Tensor) or idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        got = f"{idx.dtype} tensor" if isinstance(idx, Tensor) else type(idx).__name__
        raise TypeError(f"idx must be an integer tensor of indices; got {got}")
    flat = idx.reshape(-1)
    n = flat.numel()
    if n == 0:
        return None
    start = int(flat[0])
    if n == 1 or (int(flat[-1]) == start + n - 1 and _is_run(flat, start)):
        return start
    return None


def gather(table: Tensor, *index: Tensor) -> Tensor:
    """``table[index...]``, one integer index per axis of ``table`` (broadcast together), for a
    learned table a bias reads.

    A block of indices (the dense path's chunks) reads the flattened table with ``index_select``,
    whose backward is an ``index_add_``: the same sums in the same order on every run, and faster
    than the backward of advanced indexing, whose CPU kernel accumulates with atomic adds across
    threads (a gradient that differs in its last bits from run to run). Scalar indices (FlexAttention's ``score_mod``) keep plain indexing, the form
    compiled flex lowers. Indices must lie in range (no negative wrap-around)."""
    if len(index) != table.dim():
        raise ValueError(f"gather takes one index per axis of the table ({table.dim()}); got {len(index)}")
    if all(i.dim() == 0 for i in index):
        return table[index]
    flat = index[0]
    for i, size in zip(index[1:], table.shape[1:]):
        flat = flat * size + i
    return table.reshape(-1).index_select(0, flat.reshape(-1)).view(flat.shape)


def take(table: Tensor, b: Tensor, idx: Tensor) -> Tensor:
    """``table[b, idx]`` for a ``[B or 1, T, ...]`` tensor (positions, segment ids, key validity),
    where a batch of one serves every ``b``. Works densely and inside FlexAttention."""
    return table[b if table.shape[0] > 1 else b * 0, idx]


@dataclass(frozen=True, eq=False)
class KeyLinearPart:
    """A bias of a few query rows written as ``rest[b, h, r, j] + k[b, h, j] . weights[b, h, r]``
    for the keys ``j < stop`` (``rest`` alone after them): DeBERTa's position-to-content term of
    a decoding row, ``k.Qr[0]`` for every key (``stop = Tk``) plus ``k.(Qr[m] - Qr[0])`` within the
    span in ``rest``. A kernel can send ``weights`` through the product of queries and keys
    beside the queries themselves, or, reaching every key, move the queries by them, reading the
    keys once for both (:func:`posenc.common.kernels.dense_path`).

    ``rest [B or 1, H, R, Tk]``, ``weights [B or 1, H, R, D]`` (in score units: added as they
    are, not scaled), ``0 <= stop <= Tk``."""

    rest: Tensor
    weights: Tensor
    stop: int


# eq=False: hashed and compared by identity. A bias holds closures and tensors, whose equality
# means nothing here, and torch.compile hashes a callable it meets while tracing, which for a
# field-hashed frozen dataclass failed when the object was not built yet (DeBERTa, TUPE, TXL).
@dataclass(frozen=True, eq=False)
class PairwiseBias:
    """A bias defined per (batch, head, query index, key index).

    Args:
        fn: ``fn(b, h, q_idx, kv_idx)``; indices are integer tensors that broadcast together.
            ``q_idx`` and ``kv_idx`` index the query and key sequences of this attention call
            (not positions: positions are captured tensors the function indexes).
        per_batch: whether the value depends on ``b``. When False, ``fn`` is only ever called
            with ``b == 0`` and a dense bias has batch size 1 (broadcast over the batch).
        learned: tensors ``fn`` reads that may require a gradient. A bias whose learned tensors
            need no gradient can be handed to fused kernels as a constant.
        name: what the bias is, for error messages.
        by_offset: the same bias as a function of the position offset ``kv_pos - q_pos`` alone,
            for a bias that depends on nothing else (ALiBi, T5, KERPLE) or of a call with one
            query (FIRE in a cached decoding step): ``by_offset(offsets)`` takes an integer
            tensor ``[R]`` of offsets and returns ``[H or 1, R]``, built from ``learned`` (the
            plan's ``offset_start``: each block cut from its diagonals).
        pointwise: ``fn`` at scalar indices is lookups and arithmetic only, no reduction over a
            feature axis, which compiled FlexAttention (CUDA) refuses in ``score_mod``: a bias with
            a dot product (Transformer-XL, DeBERTa, TUPE, vector eRPE) or an MLP (FIRE) per
            element says False and takes the dense path there.
        table: the dense tensor ``[B or 1, H or 1, Tq, Tk]`` that ``fn`` reads, when the bias
            is one (:func:`dense_bias`): a kernel that needs the whole call's bias at once (a
            cached decoding step) takes it as it is, with no indices built and no block cut.
        key_linear: the same bias as a dense remainder plus a term linear in the keys
            (:class:`KeyLinearPart`, built by :func:`key_linear_bias`), for a kernel that folds
            that term into its product of queries and keys.
        key_term: ``[B or 1, H, Tk]`` when the bias is a constant per query row plus
            ``key_term[b, h, j]`` on every pair (FoX: ``F_i - F_j``). Softmax drops the row
            constant, so the ``sdpa`` path carries such a bias as one more key column, backward
            included (:func:`posenc.common.kernels.key_column_path`).
    """

    fn: PairFn
    per_batch: bool = False
    learned: tuple[Tensor, ...] = field(default=())
    name: str = "bias"
    by_offset: Callable[[Tensor], Tensor] | None = None
    pointwise: bool = True
    table: Tensor | None = None
    key_linear: KeyLinearPart | None = None
    key_term: Tensor | None = None

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if not self.per_batch:
            b = torch.zeros_like(b)
        return self.fn(b, h, q_idx, kv_idx)

    @property
    def requires_grad(self) -> bool:
        return torch.is_grad_enabled() and any(t.requires_grad for t in self.learned)

    def dense(
        self,
        batch: int,
        heads: int,
        q_idx: Tensor,
        kv_idx: Tensor,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """Materialise the bias over the given query and key indices.

        Returns a tensor broadcastable to ``[batch, heads, len(q_idx), len(kv_idx)]``; its batch
        dimension is 1 when the bias is not ``per_batch``.
        """
        device = q_idx.device
        b = torch.arange(batch if self.per_batch else 1, device=device).view(-1, 1, 1, 1)
        h = torch.arange(heads, device=device).view(1, -1, 1, 1)
        out = self.fn(b, h, q_idx.view(1, 1, -1, 1), kv_idx.view(1, 1, 1, -1))
        if out.dim() != 4:
            raise ValueError(f"{self.name}: fn must broadcast to 4 dims (b, h, q, k), got shape {tuple(out.shape)}")
        return out if dtype is None else out.to(dtype)


def _select_run(table: Tensor, dim: int, idx: Tensor) -> Tensor:
    """``table.index_select(dim, idx)``, as a view (``narrow``) when ``idx`` is one run ``start,
    start + 1, ...`` (the dense path's blocks; a decoding step's whole bias): no copy. Checked
    exactly, not assumed; traced code takes the copy (no host read)."""
    start = None if torch.compiler.is_compiling() else run_start(idx)
    return table.index_select(dim, idx) if start is None else table.narrow(dim, start, idx.numel())


def _read_dense(table: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """``table [B or 1, H or 1, Tq, Tk]`` read as a pair function: a block of rows by keys (the
    dense path) as a slice where it is one run, keeping the broadcast axes; scalar or other
    broadcast indices (FlexAttention) by indexing."""
    if is_dense_block(b, h, q_idx, kv_idx):
        return _select_run(_select_run(table, 2, q_idx.reshape(-1)), 3, kv_idx.reshape(-1))
    return table[b if table.shape[0] > 1 else b * 0, h if table.shape[1] > 1 else h * 0, q_idx, kv_idx]


def dense_bias(table: Tensor, name: str = "attn_bias") -> PairwiseBias:
    """A :class:`PairwiseBias` that reads a dense tensor ``[B or 1, H or 1, Tq, Tk]`` (a float
    attention mask given by the caller, e.g. torch's ``attn_mask``); differentiable in ``table``."""
    if table.dim() != 4 or not table.dtype.is_floating_point:
        raise ValueError(f"{name} must be a float tensor [batch or 1, heads or 1, queries, keys]; got "
                         f"{tuple(table.shape)} {table.dtype}")

    def fn(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return _read_dense(table, b, h, q_idx, kv_idx)

    learned = (table,) if table.requires_grad else ()
    return PairwiseBias(fn, per_batch=table.shape[0] > 1, learned=learned, name=name, table=table)


def key_linear_bias(rest: Tensor, keys: Tensor, weights: Tensor, stop: int, name: str = "bias") -> PairwiseBias:
    """The bias ``rest + k_j . weights_r`` over the keys ``j < stop`` (:class:`KeyLinearPart`) as a
    :class:`PairwiseBias`: ``fn`` reads the whole sum, built once on first use (every path can
    take it), and ``key_linear`` carries the parts for a kernel that folds the products in.

    ``rest [B or 1, H, R, Tk]``, ``keys [B, H, Tk, D]`` (the call's keys, at the query heads),
    ``weights [B or 1, H, R, D]``."""
    for what, t in (("rest", rest), ("keys", keys), ("weights", weights)):
        check_tensor(f"{name}: {what}", t, floating=True)
    if weights.dtype != keys.dtype:
        raise TypeError(f"{name}: weights and keys must have one dtype (they are multiplied); got {weights.dtype} and "
                        f"{keys.dtype}")
    if rest.dim() != 4 or keys.dim() != 4 or weights.dim() != 4:
        raise ValueError(f"{name}: rest, keys and weights must be 4-D; got {tuple(rest.shape)}, {tuple(keys.shape)}, "
                         f"{tuple(weights.shape)}")
    if rest.shape[-1] != keys.shape[2] or weights.shape[-1] != keys.shape[-1] or weights.shape[2] != rest.shape[2]:
        raise ValueError(f"{name}: rest [B, H, R, Tk], keys [B, H, Tk, D] and weights [B, H, R, D] disagree: "
                         f"{tuple(rest.shape)}, {tuple(keys.shape)}, {tuple(weights.shape)}")
    if isinstance(stop, bool) or not isinstance(stop, int) or not 0 <= stop <= keys.shape[2]:
        raise ValueError(f"{name}: stop must be an int in [0, {keys.shape[2]}] (keys); got {stop!r}")
    built: list[Tensor] = []

    def whole() -> Tensor:  # [B, H, R, Tk]
        if not built:
            products = torch.matmul(weights, keys[:, :, :stop].transpose(-1, -2))  # [B, H, R, stop]
            built.append(rest + F.pad(products, (0, rest.shape[-1] - stop)))
        return built[0]

    def fn(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return _read_dense(whole(), b, h, q_idx, kv_idx)

    learned = tuple(t for t in (rest, keys, weights) if t.requires_grad)
    return PairwiseBias(fn, per_batch=True, learned=learned, name=name, pointwise=False,
                        key_linear=KeyLinearPart(rest, weights, stop))


def sum_of_biases(*biases: PairwiseBias | None) -> PairwiseBias | None:
    """The sum of the biases given (None ones skipped), as one :class:`PairwiseBias`; None if none."""
    present = [x for x in biases if x is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def fn(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        total = present[0](b, h, q_idx, kv_idx)
        for x in present[1:]:
            total = total + x(b, h, q_idx, kv_idx)
        return total

    by_offset = None
    if all(x.by_offset is not None for x in present):

        def by_offset(offsets: Tensor) -> Tensor:
            total = present[0].by_offset(offsets)
            for x in present[1:]:
                total = total + x.by_offset(offsets)
            return total

    return PairwiseBias(fn, per_batch=any(x.per_batch for x in present),
                        learned=tuple(t for x in present for t in x.learned), name=" + ".join(x.name for x in present),
                        by_offset=by_offset, pointwise=all(x.pointwise for x in present))
