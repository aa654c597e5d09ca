"""The pieces of the ``dense`` path: one chunk's bias block, its forward through a fused kernel
and its written-out backward, a bias laid out along the diagonals (:class:`OffsetBias`), and the
one-pass form of a bias with a part linear in the keys (:func:`key_linear_forward`).

Shapes: ``q [B, H, rows, D]``, ``k, v [B, H, keys, D]`` (key heads repeated); a ``block`` is a
bias or mask over ``[B or 1, H or 1, rows, keys]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..masks import AttentionMask, allowed_of
from ..pairwise import KeyLinearPart, PairwiseBias, offset_window, offset_window_grad
from .aten import cpu_flash_forward
from .chunking import indices
from .probs import masked_softmax

# The explicit backward of a learned bias goes through a chunk's batch and heads in groups of
# about this many score elements (it keeps two such buffers, P and dS): half the chunk budget,
# so that they stay closer to cache while the chunks stay tall.
BACKWARD_GROUP_ELEMENTS = 1 << 19


def bias_block(
    bias: PairwiseBias,
    mask: AttentionMask | None,
    batch: int,
    heads: int,
    q_idx: Tensor,
    kv_idx: Tensor,
    q_len: int,
    kv_len: int,
    dtype: torch.dtype,
    block: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Float bias for the given rows with masked entries at -inf, and a ``[B, 1, rows, 1]`` marker
    of the rows that see some key (None without a mask). No data-dependent branch: torch.compile
    traces it whole. ``block``: the bias already evaluated at these rows, if the caller has it."""
    # Half-precision inputs still get a float32 bias: a bf16 bias of -500 is off by 2 (fused
    # kernels accept a float32 mask beside bf16/fp16 q, k, v).
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    block = bias.dense(batch, heads, q_idx, kv_idx, dtype=dtype) if block is None else block.to(dtype)
    allowed = allowed_of(mask, batch, q_idx, kv_idx, q_len, kv_len)
    if allowed is None:
        return block, None
    if mask.only_causal(q_len, kv_len):  # every row sees its first key: no marker, nothing to zero after
        return torch.where(allowed, block, float("-inf")), None
    row_any = allowed.any(dim=-1, keepdim=True)
    # A row that sees no key attends everywhere inside the kernel (no NaN) and is zeroed after it.
    return torch.where(allowed | ~row_any, block, float("-inf")), row_any


def chunk_backward_with_bias_grad(
    learned: list[Tensor],
    block: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    scale: float,
    live: Tensor | None,
    grad_lse: Tensor | None = None,
    score_grad_shape: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor | None]]:
    """Attention backward for one chunk of query rows, written out so that the score gradient
    ``dS`` is at hand: it is also the gradient of the bias, passed on to the tensors it was built
    from. ``P = exp(S - lse)``, ``dS = P * (dO V^T - rowsum(dO * O) + dlse)``. ``block`` is the masked
    bias of the chunk; ``live`` the same bias unmasked, still attached to ``learned`` (None when
    nothing is learned); ``grad_lse`` the gradient of the chunk's log-sum-exp, if it is used.
    ``score_grad_shape``: instead of gradients of ``learned``, return ``[dS summed to this shape]``
    (the caller takes the bias gradient from there).

    A bias shared by the batch (``block [1, H or 1, rows, keys]``) is chunked for one batch
    element (see :func:`dense_chunk_rows`); the chunk then goes through the batch and heads in
    groups (:func:`_backward_groups`) whose buffers keep to ``BACKWARD_GROUP_ELEMENTS``, and
    ``dS`` is summed over the batch. Each buffer is written once by the operation that makes it:
    the bias minus the log-sum-exp, then ``scale * Q K^T`` added by the matmul itself
    (``baddbmm``), exponentiated in place; ``dO V^T`` minus ``delta`` the same way, times ``P`` in
    place; ``dq, dk, dv`` straight from the matmuls."""
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q, k, v, out, grad_out = (t.to(work) for t in (q, k, v, out, grad_out))
    block = block.to(work)
    b, h, rows, d = q.shape
    keys = k.shape[2]
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # [B, H, rows, 1]
    if grad_lse is not None:  # d lse_i / d S_ij = P_ij
        delta = delta - grad_lse.to(work).unsqueeze(-1)
    lse = lse.to(work).unsqueeze(-1)  # [B, H, rows, 1]
    shared, one_head = block.shape[0] == 1, block.shape[1] == 1
    wants_score_grad = score_grad_shape is not None or bool(learned)
    gq, gk, gv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous: written by bmm
    score_grad = None
    for b0, b1, h0, h1 in _backward_groups(b, h, rows * keys, shared):
        n = (b1 - b0) * (h1 - h0)
        # [n, rows or keys, D]: views where the slices are contiguous in (batch, head)
        q3, k3, v3, do3 = (t[b0:b1, h0:h1].reshape(n, -1, d) for t in (q, k, v, grad_out))
        bias = block if one_head else block[:, h0:h1]
        probs = q.new_empty((b1 - b0, h1 - h0, rows, keys))
        torch.sub(bias if shared else bias[b0:b1], lse[b0:b1, h0:h1], out=probs)
        p3 = probs.view(n, rows, keys).baddbmm_(q3, k3.transpose(1, 2), alpha=scale).exp_()
        # dS in the dO V^T buffer: [n, rows, keys]
        ds3 = torch.baddbmm(delta[b0:b1, h0:h1].reshape(n, rows, 1), do3, v3.transpose(1, 2), beta=-1).mul_(p3)
        torch.bmm(ds3, k3, out=gq[b0:b1, h0:h1].view(n, rows, d)).mul_(scale)
        torch.bmm(ds3.transpose(1, 2), q3, out=gk[b0:b1, h0:h1].view(n, keys, d)).mul_(scale)
        torch.bmm(p3.transpose(1, 2), do3, out=gv[b0:b1, h0:h1].view(n, keys, d))
        del probs, p3
        if wants_score_grad:
            part = ds3.view(b1 - b0, h1 - h0, rows, keys)
            if not shared:  # one group: the whole chunk
                score_grad = part
            else:
                part = part.sum(0, keepdim=True) if b1 - b0 > 1 else part
                if one_head:
                    part = part.sum(1, keepdim=True)
                    score_grad = part if score_grad is None else score_grad.add_(part)
                else:
                    if score_grad is None:
                        score_grad = q.new_empty((1, h, rows, keys))
                    if b0 == 0:  # the first batch element of these heads: written, not added
                        score_grad[:, h0:h1] = part
                    else:
                        score_grad[:, h0:h1] += part
        del ds3
    grads: tuple = ()
    if score_grad is not None:
        target = score_grad_shape if score_grad_shape is not None else live.shape
        score_grad = score_grad.sum_to_size(target)
        if score_grad_shape is not None:
            grads = (score_grad,)
        else:
            grads = torch.autograd.grad(live, learned, score_grad.to(live.dtype), allow_unused=True)
    return gq, gk, gv, list(grads)


def _backward_groups(batch: int, heads: int, pairs: int, shared: bool) -> list[tuple[int, int, int, int]]:
    """``(b0, b1, h0, h1)`` ranges that cover a chunk's ``batch x heads`` in the explicit
    backward, each with at most ``BACKWARD_GROUP_ELEMENTS`` score elements (``pairs`` per
    head), or one when ``rows x keys`` alone is more. Several batch elements per group only with
    every head, so each group is contiguous in ``[B, H, ...]``; the batch and heads in order, so
    the score gradient's first write of each head comes from batch element 0. A bias that
    differs along the batch (``shared`` False) is a block of the whole batch already: one group."""
    if not shared:
        return [(0, batch, 0, heads)]
    per_group = max(1, BACKWARD_GROUP_ELEMENTS // max(1, pairs))  # (batch, head) pairs per group
    if per_group >= heads:
        step = min(batch, per_group // heads)
        return [(b0, min(batch, b0 + step), 0, heads) for b0 in range(0, batch, step)]
    step = per_group
    return [(b0, b0 + 1, h0, min(heads, h0 + step)) for b0 in range(batch) for h0 in range(0, heads, step)]


def chunk_forward(q: Tensor, k: Tensor, v: Tensor, block: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """One chunk of rows with its bias block: ``(out [B, H, rows, D], lse [B, H, rows])``. The CPU
    flash kernel on CPU; elsewhere explicit (``[B, H, rows, keys]`` scores live for the chunk only)."""
    if q.device.type == "cpu":
        return cpu_flash_forward(q, k, v, block, scale)
    return explicit_forward(q, k, v, block, scale)


def explicit_forward(q: Tensor, k: Tensor, v: Tensor, block: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """``(softmax(scale Q K^T + block) V, lse)`` as plain differentiable operations, the scores
    ``[B, H, rows, keys]`` in float32 for half-precision inputs: ``(out [B, H, rows, D], lse [B, H, rows])``."""
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)) * scale + block.to(work)  # [B, H, rows, keys]
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, rows]
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.to(work))  # [B, H, rows, D]
    return out.to(q.dtype), lse


def key_linear_forward(
    q: Tensor, k: Tensor, v: Tensor, part: KeyLinearPart, allowed: Tensor | None, scale: float, with_lse: bool,
) -> tuple[Tensor, Tensor | None]:
    """A few rows without gradients whose bias has a part linear in the keys (:class:`~posenc.
    common.pairwise.KeyLinearPart`): the bias's weights go through the product with the keys as
    extra query rows, ``[s q; w] k^T``, so the keys are read once for the content scores and the
    bias (DeBERTa's decoding step: its separate product over the keys beyond the span and the
    fused kernel's own pass read them twice), then softmax and the values explicitly, the scores
    in float32 for half-precision inputs. Rows that see no key are zero, with ``lse`` -inf.
    ``q [B, H, R, D]``, ``k, v [B, H, Tk, D]``, ``allowed [B or 1, 1, R, Tk]`` or None ->
    ``(out [B, H, R, Dv], lse [B, H, R] or None without with_lse)``.

    Where the linear term reaches every key (``stop == Tk``), nothing is masked and ``q`` is
    float32 or float64 on CPU, ``s q.k + w.k = s (q + w / s).k``: the query moves by the weights
    and SDPA's fused kernel takes the rest as its float mask, reading the keys once and the
    values once with no scores tensor. Half-precision queries keep the explicit form: the moved
    query would be rounded to their precision."""
    if part.stop == k.shape[2] and allowed is None and q.device.type == "cpu" and q.dtype in (torch.float32,
                                                                                            torch.float64):
        moved = q + part.weights.to(q.dtype) / scale  # [B, H, R, D]
        out, lse = cpu_flash_forward(moved, k, v, part.rest.to(q.dtype), scale)
        return out, (lse if with_lse else None)
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    b, h, r, _ = q.shape
    rows = torch.cat((q.to(work) * scale, part.weights.to(work).expand(b, h, r, -1)), dim=2)  # [B, H, 2R, D]
    products = torch.matmul(rows, k.to(work).transpose(-1, -2))  # [B, H, 2R, Tk]
    scores = products[:, :, :r] + part.rest.to(work)  # [B, H, R, Tk], a new tensor
    if part.stop:
        scores[..., : part.stop] += products[:, :, r:, : part.stop]
    lse = None
    if with_lse:
        lse = torch.logsumexp(scores if allowed is None else torch.where(allowed, scores, float("-inf")), dim=-1)
    out = torch.matmul(masked_softmax(scores, allowed), v.to(work))  # [B, H, R, Dv]
    return out.to(q.dtype), lse


class OffsetBias:
    """A bias of the offset alone over consecutive positions, as one row of values per head.

    ``values [H or 1, Tq + Tk - 1]``: column ``m`` is the bias where ``j - i = m - (Tq - 1)``
    (query index ``i``, key index ``j``), a causal mask folded in as ``-inf``. The block of query
    rows ``s:e`` and keys ``:kv_end`` is a window of it (:func:`~posenc.common.pairwise.
    offset_window`: one copy; no index tensor, no per-element gather, no mask tensor). Its
    gradient goes back along the diagonals to ``values`` and from there, once per call, to the
    tensors ``by_offset`` read.
    """

    def __init__(self, bias: PairwiseBias, start: int, q_len: int, kv_len: int, causal: bool, device) -> None:
        self.bias, self.q_len, self.kv_len, self.causal = bias, q_len, kv_len, causal
        self.offsets = torch.arange(start - q_len + 1, start + kv_len, device=device)  # [Tq + Tk - 1]

    def values(self, dtype: torch.dtype) -> Tensor:
        if dtype in (torch.float16, torch.bfloat16):  # a float32 bias beside half inputs (see bias_block)
            dtype = torch.float32
        values = self.bias.by_offset(self.offsets).to(dtype)  # [H or 1, Tq + Tk - 1]
        if self.causal and self.q_len > 1:  # key j visible from query i when j - i <= Tk - Tq, i.e. column m <= Tk - 1
            hidden = indices(values.shape[-1], values.device) > self.kv_len - 1
            values = values.masked_fill(hidden, float("-inf"))
        return values

    def block(self, values: Tensor, s: int, e: int, kv_end: int) -> Tensor:
        """``[1, H or 1, e - s, kv_end]``: the bias of query rows ``s:e`` over keys ``:kv_end``."""
        return offset_window(values, self.q_len, s, e, kv_end).unsqueeze(0)

    def values_grad(self, grad_block: Tensor, width: int, s: int, e: int) -> Tensor:
        """The gradient of ``values [H or 1, width]`` from the gradient of one block
        ``[1, H or 1, rows, kv_end]``: the sum along each diagonal."""
        return offset_window_grad(grad_block[0], width, self.q_len, s, e)


def forward_rows(
    q: Tensor, k: Tensor, v: Tensor, bias: PairwiseBias, mask: AttentionMask | None, offsets: "OffsetBias | None",
    values: Tensor | None, idx: Tensor, s: int, e: int, kv_end: int, scale: float,
) -> tuple[Tensor, Tensor]:
    """Query rows ``s:e`` against keys ``:kv_end`` with their bias block (cut from ``values`` of
    ``offsets``, or evaluated): ``(out [B, H, rows, D], lse [B, H, rows])``, rows that see no key
    zeroed."""
    b, h, tq, _ = q.shape
    if values is not None:  # every row sees a key (the plan's diagonal layout requires it)
        block, row_any = offsets.block(values, s, e, kv_end), None  # [1, H or 1, rows, kv_end]
    else:  # [B or 1, H, rows, kv_end] (masked entries -inf), row_any [B or 1, 1, rows, 1]
        # the whole call's block of a dense table is the table itself
        whole = bias.table if s == 0 and e == tq and kv_end == k.shape[2] else None
        block, row_any = bias_block(bias, mask, b, h, idx[s:e], idx[:kv_end], tq, k.shape[2], q.dtype, whole)
    o, lse = chunk_forward(q[:, :, s:e], k[:, :, :kv_end], v[:, :, :kv_end], block, scale)
    return (o if row_any is None else o.masked_fill(~row_any, 0.0)), lse
