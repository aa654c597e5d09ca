"""SignNet: a sign-invariant encoder of Laplacian eigenvectors.

Lim et al. 2022, Sign and Basis Invariant Networks for Spectral Graph Representation Learning,
https://arxiv.org/abs/2202.13013.

``f(v_1, ..., v_k) = rho( sum_i [phi(v_i, lambda_i) + phi(-v_i, lambda_i)] )`` (``reduce="sum"``,
the form in REFERENCES), or ``rho( concat_i [phi(v_i, lambda_i) + phi(-v_i, lambda_i)] )``
(``reduce="concat"``, as GraphGPS's MLP SignNet). ``phi`` is an MLP on the entry of one
eigenvector at a node together with its eigenvalue (invariant to the sign, so it keeps the
eigenvectors apart under the sum); ``rho`` an MLP. Flipping the sign of any ``v_i`` leaves the
output unchanged exactly. Padded eigenvectors (``n <= k``: zero vector and eigenvalue) are masked
out of the sum when ``mask`` is given.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn


class SignNet(nn.Module):
    """Args:
        k: number of eigenvectors.
        out_dim: output width.
        hidden: width of ``phi`` and ``rho``.
        reduce: "sum" or "concat" over the eigenvectors.
        use_eigenvalues: feed ``lambda_i`` to ``phi`` beside ``v_i``.

    Shapes:
        ``vecs [..., k]``, ``vals [..., k]`` (per node) -> ``[..., out_dim]``.
    """

    def __init__(
        self,
        k: int,
        out_dim: int,
        *,
        hidden: int = 32,
        reduce: Literal["sum", "concat"] = "sum",
        use_eigenvalues: bool = True,
    ) -> None:
        super().__init__()
        if k <= 0 or out_dim <= 0 or hidden <= 0:
            raise ValueError(f"k, out_dim and hidden must be positive; got {k}, {out_dim}, {hidden}")
        if reduce not in ("sum", "concat"):
            raise ValueError(f"reduce must be 'sum' or 'concat'; got {reduce!r}")
        self.k, self.out_dim, self.reduce, self.use_eigenvalues = k, out_dim, reduce, use_eigenvalues
        self.phi = nn.Sequential(nn.Linear(2 if use_eigenvalues else 1, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        rho_in = hidden if reduce == "sum" else hidden * k
        self.rho = nn.Sequential(nn.Linear(rho_in, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))

    def forward(self, vecs: Tensor, vals: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """``vecs [..., k]``; ``vals [..., k]`` (needed when ``use_eigenvalues``); ``mask [..., k]``
        bool, True for real eigenvectors (default all)."""
        if vecs.shape[-1] != self.k:
            raise ValueError(f"vecs must have k={self.k} features in the last axis, got {tuple(vecs.shape)}")
        if self.use_eigenvalues:
            if vals is None or vals.shape != vecs.shape:
                got = None if vals is None else tuple(vals.shape)
                raise ValueError(f"vals must have the shape of vecs {tuple(vecs.shape)}; got {got}")
            pos = torch.stack([vecs, vals], dim=-1)
            neg = torch.stack([-vecs, vals], dim=-1)
        else:
            pos, neg = vecs.unsqueeze(-1), -vecs.unsqueeze(-1)
        h = self.phi(pos) + self.phi(neg)  # [..., k, hidden], invariant to each sign
        if mask is not None:
            h = h * mask.unsqueeze(-1).to(h.dtype)
        h = h.sum(-2) if self.reduce == "sum" else h.flatten(-2)
        return self.rho(h)
