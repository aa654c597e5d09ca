"""Linear attention: ``out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j)``.

With a positive feature map ``phi`` the similarity ``phi(q).phi(k)`` replaces ``exp(q.k / sqrt(d))``
and the sums factor through ``phi(K)^T V`` (``[m, D]`` per head): time and memory linear in ``T``,
no score matrix. The feature maps: :class:`EluFeatureMap` (Katharopoulos et al. 2020, Transformers
are RNNs, https://arxiv.org/abs/2006.16236) and :class:`FavorFeatureMap` (Choromanski et al. 2021,
Rethinking Attention with Performers, https://arxiv.org/abs/2009.14794). The kernel, and the masks
it has a form for, are :mod:`posenc.common.kernels.linear`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .kernels.linear import LINEAR_CHUNK_ROWS, linear_path
from .masks import AttentionMask
from .shapes import check_qkv


class FeatureMap(nn.Module):
    """A positive feature map for linear attention: ``[..., d] -> [..., m]``.

    ``is_query`` lets a map treat queries and keys differently (FAVOR+ rescales each query row for
    range, which the normalisation cancels); the similarity is ``phi(q, True).phi(k, False)``."""

    name: str = "feature map"

    def forward(self, x: Tensor, is_query: bool) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement forward(x, is_query)")


class EluFeatureMap(FeatureMap):
    """``phi(x) = elu(x) + 1`` (``m = d``), Katharopoulos et al. 2020."""

    name = "elu+1"

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        return F.elu(x) + 1


def orthogonal_random_features(num_features: int, head_dim: int, generator: torch.Generator | None = None) -> Tensor:
    """``[num_features, head_dim]``: blocks of ``head_dim`` orthogonal directions (QR of a Gaussian
    block), each row scaled to the norm of a Gaussian vector (chi with ``head_dim`` degrees of
    freedom), so that every row is marginally ``N(0, I)`` and rows in a block are orthogonal."""
    if num_features < 1 or head_dim < 1:
        raise ValueError(f"num_features and head_dim must be positive; got {num_features}, {head_dim}")
    blocks = []
    for _ in range(math.ceil(num_features / head_dim)):
        gauss = torch.randn(head_dim, head_dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)
        q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # a Haar-distributed rotation
        blocks.append(q.t())
    directions = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, head_dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (directions * norms).float()


class FavorFeatureMap(FeatureMap):
    """Performer's FAVOR+ positive orthogonal random features: ``phi(x) = exp(W x' - |x'|^2 / 2) /
    sqrt(m)`` with ``x' = x / d^(1/4)``, so that ``E[phi(q).phi(k)] = exp(q.k / sqrt(d))``.

    Args:
        head_dim: ``d``.
        num_features: ``m``; default ``round(d * ln d)`` (Performer's default).
        seed: seed of the first draw (None: torch's global generator).
        eps: added to every feature (Performer's kernel epsilon), keeps the normaliser positive.

    The projection ``W [m, d]`` (:func:`orthogonal_random_features`) is a buffer saved with the
    model: drawn here and by :meth:`redraw` only, so evaluation is deterministic.
    """

    name = "favor+"

    def __init__(self, head_dim: int, num_features: int | None = None, seed: int | None = None, eps: float = 1e-4) -> None:
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
        if num_features is None:
            num_features = max(1, round(head_dim * math.log(head_dim))) if head_dim > 1 else 1
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be a positive int, got {num_features!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        self.head_dim, self.m, self.eps = head_dim, num_features, float(eps)
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        self.register_buffer("projection", orthogonal_random_features(num_features, head_dim, gen))

    @torch.no_grad()
    def redraw(self, generator: torch.Generator | None = None) -> None:
        """Draw a new ``W`` in place (same device and dtype)."""
        fresh = orthogonal_random_features(self.m, self.head_dim, generator)
        self.projection.copy_(fresh.to(self.projection))

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"FAVOR+ features were drawn for head_dim={self.head_dim}; got inputs of width {x.shape[-1]}")
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        xs = x.to(work) * self.head_dim ** -0.25
        proj = torch.matmul(xs, self.projection.to(work).t())  # [..., m]
        logits = proj - (xs * xs).sum(-1, keepdim=True) / 2
        if is_query:
            # Per query row: a constant factor of phi(q_i) cancels in out_i's normalisation and
            # keeps exp in range. Keys get none (a shared one would mix positions' features).
            logits = logits - logits.amax(-1, keepdim=True).detach()
        return torch.exp(logits) * self.m ** -0.5 + self.eps


FEATURE_MAPS: tuple[str, ...] = ("elu", "favor")


def make_feature_map(name: str, width: int) -> FeatureMap:
    """The feature map called ``name`` (``"elu"``: elu+1; ``"favor"``: FAVOR+ with Performer's
    default number of features) for queries and keys of ``width`` (the head size, or what the
    encoding's q/k transform makes of it: :meth:`~posenc.common.encoding.PositionEncoding.qk_width`).
    FAVOR+ draws its projection from torch's generator (seed it for a reproducible model)."""
    if name == "elu":
        return EluFeatureMap()
    if name == "favor":
        return FavorFeatureMap(width)
    raise ValueError(f"feature_map must be one of {', '.join(FEATURE_MAPS)} (or None for softmax attention); got {name!r}")


def check_linear_mask(mask: AttentionMask | None, q_len: int, kv_len: int) -> None:
    """The masks linear attention has a form for (the one home of these rules: the plan and
    :func:`linear_attention` both call it); anything else is a ValueError saying why."""
    if mask is None:
        return
    if mask.window is not None:
        raise ValueError(f"linear attention has no sliding window (mask.window={mask.window}); use softmax attention")
    if mask.q_segments is None:
        return
    if q_len != kv_len or not torch.equal(mask.q_segments, mask.kv_segments):
        raise ValueError(
            "linear attention takes packed sequences as self-attention (AttentionMask.packed: the same segment "
            "ids for queries and keys)"
        )
    seg = mask.q_segments
    if seg.shape[1] > 1:
        runs = (seg[:, 1:] != seg[:, :-1]).sum(1)  # run starts after the first, per row
        ordered = seg.sort(dim=1).values
        distinct = (ordered[:, 1:] != ordered[:, :-1]).sum(1)  # distinct ids after the first, per row
        if bool((runs != distinct).any()):
            raise ValueError("linear attention needs each packed segment to be one contiguous run of tokens")


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map: FeatureMap,
    mask: AttentionMask | None = None,
    chunk: int | None = None,
) -> Tensor:
    """Linear attention of ``q [B, Hq, Tq, d]`` over ``k [B, Hkv, Tk, d]``, ``v [B, Hkv, Tk, Dv]``
    (``Hq`` a multiple of ``Hkv``) with ``feature_map``, under ``mask`` (causal, key padding,
    packed: :mod:`posenc.common.kernels.linear`). ``chunk``: query rows per block of the causal / packed
    scan (default :data:`LINEAR_CHUNK_ROWS`). Returns ``[B, Hq, Tq, Dv]``; no ``T x T`` tensor is
    built."""
    check_qkv(q, k, v, value_width=False)
    b, tq, tk = q.shape[0], q.shape[2], k.shape[2]
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    if mask is not None:
        mask.validate(b, tq, tk)
    check_linear_mask(mask, tq, tk)
    return linear_path(q, k, v, feature_map, mask, LINEAR_CHUNK_ROWS if chunk is None else chunk)
