"""The input-hook graph encodings ``lap``, ``rwse`` and ``landmark``: learned projections of
precomputed structural features to the model width, added to the node features.

The features are computed once per graph (:func:`~posenc.graph.laplacian_pe`,
:func:`~posenc.graph.random_walk_se`, :func:`~posenc.graph.landmark_pe`, or the PyG transforms of
:mod:`posenc.graph.transforms`)
and reach the encoding as the ``positions`` of ``encode_input`` with a trailing feature axis:
``positions [B or 1, T, F]`` for node features ``x [B, T, C]`` (``T`` nodes; a batch of graphs
packed into one sequence is ``B = 1``, ``T = N``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from torch import Tensor, nn

from ..common.checks import check_bool, check_choice, check_int, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import register
from .laplacian import random_sign_flip
from .signnet import SignNet


def _check_features(name: str, x: Tensor, positions: Tensor, features: int, what: str) -> None:
    if x.dim() != 3:
        raise ValueError(f"{name}: x must be [batch, nodes, dim], got {tuple(x.shape)}")
    if positions.dim() != 3 or positions.shape[0] not in (1, x.shape[0]) or positions.shape[1] != x.shape[1] \
            or positions.shape[2] != features:
        raise ValueError(
            f"{name}: positions must be [batch={x.shape[0]} or 1, nodes={x.shape[1]}, {what}={features}] "
            f"(precomputed per node), got {tuple(positions.shape)}"
        )
    if not positions.dtype.is_floating_point:
        raise TypeError(f"{name}: positions must be floating-point features, got {positions.dtype}")
    check_positions("positions", positions)  # finite: a NaN feature would reach every node it is added to


@register(
    "lap",
    modality="graph",
    paper="Dwivedi et al. 2020, Benchmarking Graph Neural Networks, https://arxiv.org/abs/2003.00982 "
    "(eigenvalues as in SAN/GraphGPS; SignNet: Lim et al. 2022, https://arxiv.org/abs/2202.13013)",
    summary="Laplacian eigenvectors (+eigenvalues) projected to the model width; random sign flips or SignNet",
)
class LapPE(PositionEncoding):
    """Laplacian eigenvector PE: ``x + W [v_2(u) .. v_(k+1)(u), lambda_2 .. lambda_(k+1)]``.

    Args:
        dim: model width ``C``.
        k: eigenvectors per node.
        use_eigenvalues: the positions carry the ``k`` eigenvalues after the ``k`` eigenvector
            entries (``F = 2k``); otherwise ``F = k``.
        sign: "flip" -- during training each eigenvector column gets a random sign per batch row
            (torch's global RNG, like dropout; GraphGPS flips per batch likewise), a linear
            projection; "signnet" -- :class:`~posenc.graph.signnet.SignNet` (sign-invariant, no
            flips needed).
        signnet_hidden: SignNet width.

    Positions ``[B or 1, T, F]`` float: per node ``laplacian_pe``'s ``vecs`` (then ``vals[batch]``).
    Hook: input. Kernel: none (attention is untouched: SDPA).
    """

    hooks = frozenset({Hook.INPUT})

    def __init__(
        self,
        dim: int,
        k: int = 8,
        use_eigenvalues: bool = True,
        sign: Literal["flip", "signnet"] = "flip",
        signnet_hidden: int = 32,
    ) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_int("k", k, minimum=1)
        check_bool("use_eigenvalues", use_eigenvalues)
        check_choice("sign", sign, ("flip", "signnet"))
        check_int("signnet_hidden", signnet_hidden, minimum=1)
        self.dim, self.k, self.use_eigenvalues, self.sign = dim, k, use_eigenvalues, sign
        self.features = 2 * k if use_eigenvalues else k
        if sign == "signnet":
            self.signnet = SignNet(k, dim, hidden=signnet_hidden, use_eigenvalues=use_eigenvalues)
        else:
            self.proj = nn.Linear(self.features, dim)

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, T, C]``, ``positions [B or 1, T, F]`` -> ``[B, T, C]``."""
        _check_features("lap", x, positions, self.features, "2k (eigenvectors, eigenvalues)" if self.use_eigenvalues else "k")
        feats = positions.to(x.dtype)
        if self.sign == "signnet":
            vecs = feats[..., : self.k]
            vals = feats[..., self.k:] if self.use_eigenvalues else None
            return x + self.signnet(vecs, vals)
        if self.training:
            feats = random_sign_flip(feats, num_vecs=self.k)
        return x + self.proj(feats)


class ProjectedNodeFeatures(PositionEncoding):
    """Precomputed per-node features added through a linear map: ``x + W f(u)``, ``f(u)`` of
    ``features`` numbers (random-walk returns, anchor distances). The base of :class:`RWSE` and
    :class:`LandmarkPE`, which name their features (``label`` and ``feature_words`` for messages).

    Positions ``[B or 1, T, features]`` float. Hook: input. Kernel: none.
    """

    hooks = frozenset({Hook.INPUT})
    label: ClassVar[str] = "features"
    feature_words: ClassVar[str] = "features"

    def __init__(self, dim: int, features: int) -> None:
        super().__init__()
        self.dim, self.features = dim, features
        self.proj = nn.Linear(features, dim)

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, T, C]``, ``positions [B or 1, T, features]`` -> ``[B, T, C]``."""
        _check_features(self.label, x, positions, self.features, self.feature_words)
        return x + self.proj(positions.to(x.dtype))


@register(
    "rwse",
    modality="graph",
    paper="Dwivedi et al. 2022, Graph Neural Networks with Learnable Structural and Positional "
    "Representations, https://arxiv.org/abs/2110.07875",
    summary="random-walk return probabilities diag(P^k), k = 1..K, projected to the model width",
)
class RWSE(ProjectedNodeFeatures):
    """Random-walk SE: ``x + W [(P^1)_uu, ..., (P^K)_uu]``, ``P = D^-1 A``.

    Args:
        dim: model width ``C``.
        walk_length: ``K`` (GraphGPS: 20).

    Positions ``[B or 1, T, K]`` float: ``random_walk_se`` per node. Hook: input. Kernel: none.
    """

    label, feature_words = "rwse", "walk_length"

    def __init__(self, dim: int, walk_length: int = 20) -> None:
        check_int("dim", dim, minimum=1)
        check_int("walk_length", walk_length, minimum=1)
        super().__init__(dim, walk_length)
        self.walk_length = walk_length


@register(
    "landmark",
    modality="graph",
    paper="You et al. 2019, Position-aware Graph Neural Networks (P-GNN), https://arxiv.org/abs/1906.04817; "
    "Li et al. 2020, Distance Encoding, https://arxiv.org/abs/2009.00142",
    summary="1/(d+1) shortest-path distances to k anchor nodes (top degree or random), projected to the model width",
)
class LandmarkPE(ProjectedNodeFeatures):
    """Landmark distances: ``x + W [1/(d(u, a_1) + 1), ..., 1/(d(u, a_k) + 1)]`` (0 where an anchor
    is unreachable or missing).

    Args:
        dim: model width ``C``.
        k: anchors per graph.

    Positions ``[B or 1, T, k]`` float: :func:`~posenc.graph.landmark_pe` per node (the anchors
    are chosen there: by degree or at random). Hook: input. Kernel: none.
    """

    label, feature_words = "landmark", "k (anchors)"

    def __init__(self, dim: int, k: int = 8) -> None:
        check_int("dim", dim, minimum=1)
        check_int("k", k, minimum=1)
        super().__init__(dim, k)
        self.k = k


__all__ = ["LandmarkPE", "LapPE", "RWSE"]
