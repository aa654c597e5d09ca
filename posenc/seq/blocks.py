"""Recognising the dense-block layout of :meth:`posenc.common.pairwise.PairwiseBias.dense`.

A bias function is element-wise by contract, so that FlexAttention can call it with scalar
indices. Content-dependent low-rank terms (TUPE's position correlation, DeBERTa's c2p) are a
``d``-long dot product per element; when the function is called for a whole block of query rows
by key columns, one matmul computes the block instead, and the chunked backward then only needs
gradients of the small projected tables (not of ``[B, H, T, R]`` or ``[H, T, T]`` tensors).
"""

from __future__ import annotations

from torch import Tensor


def is_dense_block(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> bool:
    """``q_idx`` varies along dim 2 only, ``kv_idx`` along dim 3 only, ``b`` and ``h`` along neither
    (the broadcast layout ``PairwiseBias.dense`` uses)."""
    if not all(t.dim() == 4 for t in (b, h, q_idx, kv_idx)):
        return False
    return (
        b.shape[2] == b.shape[3] == h.shape[2] == h.shape[3] == 1
        and q_idx.shape[3] == 1 and kv_idx.shape[2] == 1
    )
