"""A table that bias blocks read piece by piece with one gradient buffer for all the pieces
(:class:`SharedGradTable`): Shaw's, Transformer-XL's, DeBERTa's, TUPE's and eRPE's chunked biases."""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from ..common.amp import autocast_off
from ..common.pairwise import run_start


class _DeferredTableGrad(torch.autograd.Function):
    """Ties a table to a zero-size handle. Reads of the table (:class:`SharedGradTable`) take the
    handle as an input and add their gradients into one shared buffer; when autograd reaches this
    node (after every read, since each depends on the handle) it hands the buffer on as the
    table's gradient, once."""

    @staticmethod
    def forward(ctx, table: Tensor, sink: dict) -> Tensor:
        ctx.sink = sink
        return table.new_empty(0)

    @staticmethod
    @autocast_off
    def backward(ctx, _unused: Tensor):
        return ctx.sink.pop("grad", None), None


def _sink_buffer(sink: dict, shape, dtype, device) -> Tensor:
    with sink["lock"]:  # chunks may run their backward on several threads
        if "grad" not in sink:
            sink["grad"] = torch.zeros(shape, dtype=dtype, device=device)
        return sink["grad"]


class _GatherColumns(torch.autograd.Function):
    """``table[..., :width].gather(2, index)``; the backward adds into the shared buffer."""

    @staticmethod
    def forward(ctx, table: Tensor, width: int, index: Tensor, sink: dict, handle: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.width, ctx.sink, ctx.table_shape, ctx.table_dtype = width, sink, table.shape, table.dtype
        return table[..., :width].gather(2, index)

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor):
        (index,) = ctx.saved_tensors
        acc = _sink_buffer(ctx.sink, ctx.table_shape, ctx.table_dtype, grad.device)
        with ctx.sink["lock"]:  # chunks overlap in a gathered table
            acc[..., : ctx.width].scatter_add_(2, index, grad.to(ctx.table_dtype))
        return None, None, None, None, grad.new_zeros(0)


class _SliceRows(torch.autograd.Function):
    """``table[:, :, start:stop]``; the backward adds into the shared buffer."""

    @staticmethod
    def forward(ctx, table: Tensor, start: int, stop: int, sink: dict, handle: Tensor) -> Tensor:
        ctx.start, ctx.stop, ctx.sink, ctx.table_shape, ctx.table_dtype = start, stop, sink, table.shape, table.dtype
        return table[:, :, start:stop]

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor):
        acc = _sink_buffer(ctx.sink, ctx.table_shape, ctx.table_dtype, grad.device)
        acc[:, :, ctx.start : ctx.stop] += grad.to(ctx.table_dtype)  # chunks own disjoint rows
        return None, None, None, None, grad.new_zeros(0)


class SharedGradTable:
    """A tensor ``[B', H', R, K]`` that bias blocks read piece by piece -- a slice of rows (the
    queries of a chunk) or a gather along the rows (DeBERTa's key-indexed p2c term) -- with one
    gradient buffer for all the pieces.

    Through plain autograd every chunk's read would give a gradient of the full tensor's size (a
    fresh zero tensor, filled sparsely, then added to the others): for many chunks that is most
    of the backward pass. Here every read adds into one buffer instead, which reaches the tensor
    as its gradient once. Put :attr:`learned` (not the tensor) in the :class:`PairwiseBias`'s
    ``learned``: it is what the chunked backward differentiates.

    While ``torch.compile`` traces, the reads are plain autograd (a slice, a gather, ``learned``
    the table itself): the shared buffer is Python state that backward nodes hand on to each
    other, which a traced graph does not replay (Shaw's compiled gradients came out wrong
    through it). With gradients, a traced call then takes the bias as one block of plain
    differentiable operations (``_traced_dense`` in :mod:`posenc.common.kernels.dense`), not the
    chunked Function, whose per-block ``autograd.grad`` would rerun the compiled graph's
    backward."""

    def __init__(self, table: Tensor) -> None:
        if table.dim() != 4:
            raise ValueError(f"a shared-gradient table is [B, H, rows, keys]; got shape {tuple(table.shape)}")
        self.table = table
        self._traced = torch.compiler.is_compiling()
        self._values = table if self._traced else table.detach()
        self._sink: dict = {} if self._traced else {"lock": threading.Lock()}
        self.handle = _DeferredTableGrad.apply(table, self._sink) if table.requires_grad and not self._traced else None

    @property
    def learned(self) -> tuple[Tensor, ...]:
        if self._traced:
            return (self.table,) if self.table.requires_grad else ()
        return () if self.handle is None else (self.handle,)

    def _tracked(self) -> bool:
        return self.handle is not None and torch.is_grad_enabled()

    def gather(self, index: Tensor) -> Tensor:
        """``[B', H', rows, keys]`` with ``out[b, h, i, j] = table[b, h, index[b, h, i, j], j]`` for
        ``keys <= K`` leading columns; ``index`` has the output's shape (``B', H'`` the table's)."""
        width = index.shape[-1]
        if index.shape[:2] != self.table.shape[:2]:
            raise ValueError(f"index {tuple(index.shape)} must match the table {tuple(self.table.shape)} in its first two axes")
        if not self._tracked():
            return self._values[..., :width].gather(2, index)
        return _GatherColumns.apply(self._values, width, index, self._sink, self.handle)

    def rows(self, idx: Tensor) -> Tensor:
        """``table[:, :, idx]`` for indices ``idx`` (any shape, flattened) that form one run
        ``start .. stop - 1`` (a chunk of query rows); other indices are read by plain indexing."""
        flat = idx.reshape(-1)
        if self._traced:  # no host read of the indices while tracing: plain indexing, differentiable
            return self.table.index_select(2, flat)
        start = run_start(flat)
        if start is None:
            return self.table[:, :, flat]
        stop = start + flat.numel()
        if not self._tracked():
            return self._values[:, :, start:stop]
        return _SliceRows.apply(self._values, start, stop, self._sink, self.handle)
