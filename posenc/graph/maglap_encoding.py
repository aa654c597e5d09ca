"""The ``maglap`` encoding: magnetic Laplacian eigenvectors (:mod:`posenc.graph.magnetic`) projected
to the model width, for directed graphs (Geisler et al. 2023, https://arxiv.org/abs/2302.00049).

Per node the positions carry ``[Re v_1 .. Re v_k, Im v_1 .. Im v_k]`` and, with
``use_eigenvalues``, ``lambda_1 .. lambda_k`` (``F = 2k`` or ``3k``), as
:func:`~posenc.graph.magnetic_laplacian_pe` returns them. The phase of each eigenvector is fixed
there (``phase``); what remains is handled here (``sign``):

* ``"flip"`` -- a linear projection, each eigenvector (its real and imaginary parts together)
  multiplied by a random sign per batch row in training (LapPE's augmentation; at ``q = 0`` this
  is LapPE exactly);
* ``"plain"`` -- the linear projection alone, trusting the phase convention (the paper's naive
  MagLapPE);
* ``"signnet"`` -- ``rho(sum_i [phi(v_i) + phi(-v_i)])`` with ``phi`` an MLP of ``(Re v_i(u), Im
  v_i(u), lambda_i)``: invariant to the sign of every eigenvector (the authors' SignNet-style
  MagLapNet, without its GNN), not to a general phase.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_bool, check_choice, check_int, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register

SIGNS = ("flip", "plain", "signnet")


@register(
    "maglap",
    modality="graph",
    paper="Geisler et al. 2023, Transformers Meet Directed Graphs, https://arxiv.org/abs/2302.00049",
    summary="eigenvectors of the magnetic Laplacian (direction in their phases; q = 0: LapPE), real and imaginary "
    "parts projected to the model width",
)
class MagLapPE(PositionEncoding):
    """Args:
        dim: model width ``C``.
        k: eigenvectors per node.
        use_eigenvalues: the positions carry the ``k`` eigenvalues after the ``2k`` parts.
        sign: "flip", "plain" or "signnet" (module docstring).
        signnet_hidden: width of SignNet's ``phi`` and ``rho``.

    Positions ``[B or 1, T, F]`` float: :func:`~posenc.graph.magnetic_laplacian_pe`'s ``vecs``
    (then ``vals[batch]``). Hook: input. Kernel: none.
    """

    hooks = frozenset({Hook.INPUT})

    def __init__(self, dim: int, k: int = 8, use_eigenvalues: bool = True, sign: str = "flip",
                 signnet_hidden: int = 32) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_int("k", k, minimum=1)
        check_bool("use_eigenvalues", use_eigenvalues)
        check_choice("sign", sign, SIGNS)
        check_int("signnet_hidden", signnet_hidden, minimum=1)
        self.dim, self.k, self.use_eigenvalues, self.sign = dim, k, use_eigenvalues, sign
        self.features = 3 * k if use_eigenvalues else 2 * k
        if sign == "signnet":
            inputs = 3 if use_eigenvalues else 2
            self.phi = nn.Sequential(nn.Linear(inputs, signnet_hidden), nn.ReLU(),
                                     nn.Linear(signnet_hidden, signnet_hidden))
            self.rho = nn.Sequential(nn.Linear(signnet_hidden, signnet_hidden), nn.ReLU(),
                                     nn.Linear(signnet_hidden, dim))
        else:
            self.proj = nn.Linear(self.features, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, k={self.k}, use_eigenvalues={self.use_eigenvalues}, sign={self.sign!r}"

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, T, C]``, ``positions [B or 1, T, F]`` -> ``[B, T, C]``."""
        check_positions("positions", positions)  # (bool, NaN: refused first, as by every encoding)
        if x.dim() != 3 or positions.dim() != 3 or positions.shape[0] not in (1, x.shape[0]) \
                or positions.shape[1] != x.shape[1] or positions.shape[2] != self.features \
                or not positions.is_floating_point():
            what = "3k (real, imaginary parts, eigenvalues)" if self.use_eigenvalues else "2k (real, imaginary parts)"
            raise ValueError(f"maglap: positions must be float [batch or 1, nodes, {what}={self.features}] for x "
                             f"[batch, nodes, dim]; got {positions.dtype} {tuple(positions.shape)} and x {tuple(x.shape)}")
        feats = positions.to(x.dtype)
        k = self.k
        if self.sign == "signnet":
            parts = [feats[..., :k], feats[..., k: 2 * k]]
            vals = [feats[..., 2 * k:]] if self.use_eigenvalues else []
            pos = torch.stack(parts + vals, dim=-1)  # [B, T, k, 2 or 3]
            neg = torch.stack([-parts[0], -parts[1]] + vals, dim=-1)
            return x + self.rho((self.phi(pos) + self.phi(neg)).sum(-2))
        if self.sign == "flip" and self.training:
            signs = torch.randint(0, 2, (*feats.shape[:-2], 1, k), device=feats.device).to(feats.dtype) * 2 - 1
            rest = feats.new_ones((*signs.shape[:-1], self.features - 2 * k))
            feats = feats * torch.cat([signs, signs, rest], dim=-1)
        return x + self.proj(feats)


__all__ = ["MagLapPE", "SIGNS"]
