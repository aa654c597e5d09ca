"""KERPLE, kernelized relative positional embedding (Chi et al. 2022, https://arxiv.org/abs/2205.09921).

A conditionally positive definite kernel of the distance, per head, added to the scores:

* ``"log"``:   ``bias(h, i, j) = -r1_h * ln(1 + r2_h * |i - j|)``
* ``"power"``: ``bias(h, i, j) = -r1_h * |i - j| ^ r2_h`` with ``0 < r2_h <= 2``

``r1, r2 > 0`` are learned per head. The paper's code keeps them positive by clamping the
parameters in place to ``>= 0.01`` (and ``r2 <= 2`` for the power kernel) at every forward; here
the constraint is a reparametrisation with no state change in the forward pass:
``r = 0.01 + softplus(raw)`` (and ``r2 = 2 * sigmoid(raw)`` for the power exponent), initialised
so that ``r1``, ``r2`` start at the paper's initial ranges (``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``
for log; ``r1 ~ U(0, 1)`` and ``r2 ~ U(0, 2)`` for power, clamped to ``>= 0.01``).
``init_distance_scale = s`` starts the kernel at distance ``d`` where the paper's initial kernel
is at ``s * d`` (log: ``r2`` times ``s``; power: ``r1`` times ``s ** r2``): a model trained at
length ``L`` starts with the paper's kernel at its training length 512 when ``s = 512 / L``.

Causal by default (the paper's setting: ``|i - j| = i - j``); ``symmetric=True`` allows
bidirectional attention with the same ``|i - j|``.

Hook: score bias, a function of ``|i - j|`` and two scalars per head. Kernel: the chunked dense
path on CPU (learned: the chunked backward yields the parameter gradients), FlexAttention on CUDA;
at inference (``torch.no_grad()`` or frozen parameters) a constant bias for SDPA's fused kernel,
its kernel of each distance cut from a table kept while ``raw_r1`` and ``raw_r2`` are unchanged
(a cached decoding step computes no logarithm).
Shapes: positions ``[B or 1, T]``, integer or float.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_bool, check_choice, check_int, check_number, check_sequence_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, gather, take
from ..common.registry import register
from ..primitives.derived import DerivedTensors, doubling_length

KERPLE_VARIANTS = ("log", "power")
_EPS = 0.01  # the floor of r1 and r2 in the paper's code


def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


def kerple_bias(distance: Tensor, r1: Tensor, r2: Tensor, variant: str) -> Tensor:
    """The KERPLE kernel of non-negative ``distance`` with broadcastable ``r1``, ``r2``."""
    if variant == "log":
        return -r1 * torch.log1p(r2 * distance)
    if variant == "power":
        return -r1 * distance.pow(r2)
    raise ValueError(f"variant must be one of {KERPLE_VARIANTS}; got {variant!r}")


@register(
    "kerple",
    modality="seq",
    paper="Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding, https://arxiv.org/abs/2205.09921",
    summary="learned log or power kernel of the distance per head; causal or symmetric",
)
class KERPLE(PositionEncoding):
    """Args:
        num_heads: query heads ``H``.
        variant: ``"log"`` (default) or ``"power"``.
        symmetric: allow bidirectional attention (``|i - j|``); otherwise causal-only.
        init_distance_scale: start the kernel at distance ``d`` where the paper's initial kernel
            is at ``init_distance_scale * d`` (default 1: the paper's initialisation).

    Parameters: ``raw_r1 [H]``, ``raw_r2 [H]``; the constrained values are :attr:`r1`, :attr:`r2`.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    causal_only = True  # the default; the symmetric variant lifts it

    def __init__(self, num_heads: int, variant: str = "log", symmetric: bool = False,
                 init_distance_scale: float = 1.0) -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        check_choice("variant", variant, KERPLE_VARIANTS)
        check_bool("symmetric", symmetric)
        scale = check_number("init_distance_scale", init_distance_scale, minimum=0.0, strict=True)
        self.num_heads, self.variant, self.symmetric = num_heads, variant, symmetric
        self.causal_only = not symmetric
        r1_scale, r2_scale = (2.0, 1.0) if variant == "log" else (1.0, 2.0)
        r1 = (torch.rand(num_heads) * r1_scale).clamp(min=2 * _EPS)
        r2 = (torch.rand(num_heads) * r2_scale).clamp(min=2 * _EPS, max=1.99)
        if variant == "log":
            r2 = (r2 * scale).clamp(min=2 * _EPS)  # -r1 ln(1 + r2 s d): the paper's kernel at s d
        else:
            r1 = (r1 * scale ** r2).clamp(min=2 * _EPS)  # -r1 (s d)^r2 = -(r1 s^r2) d^r2
        self.raw_r1 = nn.Parameter(_inverse_softplus(r1 - _EPS))
        if variant == "log":
            self.raw_r2 = nn.Parameter(_inverse_softplus(r2 - _EPS))
        else:
            self.raw_r2 = nn.Parameter(torch.logit(r2 / 2))
        self._kernel: DerivedTensors[Tensor] = DerivedTensors()  # kernel by distance, without gradients

    @property
    def r1(self) -> Tensor:
        return _EPS + F.softplus(self.raw_r1)

    @property
    def r2(self) -> Tensor:
        if self.variant == "log":
            return _EPS + F.softplus(self.raw_r2)
        return 2 * torch.sigmoid(self.raw_r2)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        check_sequence_positions(q_pos, kv_pos)
        variant, device = self.variant, self.raw_r1.device
        work = torch.float64 if self.raw_r1.dtype == torch.float64 else torch.float32
        per_batch = max(q_pos.shape[0], kv_pos.shape[0]) > 1
        if not (q_pos.dtype.is_floating_point or kv_pos.dtype.is_floating_point or torch.compiler.is_compiling()):
            # Integer positions: the kernel of every distance that occurs, [R, H], once per call;
            # the pairwise function is a gather and the gradient flows back through this table.
            # (Not while torch.compile traces: the range is read from the positions, a graph
            # break; there the kernel is evaluated per pair, which the compiled kernel fuses.)
            lo = int(q_pos.min()) - int(kv_pos.max())
            hi = int(q_pos.max()) - int(kv_pos.min())
            if lo >= 0 and DerivedTensors.keeps((self.raw_r1, self.raw_r2)):
                rel = self._kept_kernel(hi, work, device)[lo: hi + 1]  # a cached decoding step: no logarithms
            else:
                dist = torch.arange(lo, hi + 1, device=device).to(work).abs()[:, None]
                rel = kerple_bias(dist, self.r1[None], self.r2[None], variant)

            def gathered(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return gather(rel, take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx) - lo, h)

            def by_offset(offsets: Tensor) -> Tensor:  # offsets kv - q [R] -> [H, R]
                return rel.index_select(0, -offsets - lo).T

            return PairwiseBias(gathered, per_batch=per_batch, learned=(rel,), name="KERPLE", by_offset=by_offset)

        r1, r2 = self.r1, self.r2

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            dist = (take(q_pos, b, q_idx) - take(kv_pos, b, kv_idx)).to(work).abs()
            return kerple_bias(dist, r1[h], r2[h], variant)

        # learned: the constrained values (the chunked backward stops there; autograd carries on to raw_*)
        return PairwiseBias(bias, per_batch=per_batch, learned=(r1, r2), name="KERPLE")

    def _kept_kernel(self, distance: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The kernel of the distances ``0 .. n - 1`` ``[n, H]`` for an ``n >= distance + 1`` (a
        power of two, at least 256), kept between calls without gradients to ``raw_r1, raw_r2``
        (:class:`~posenc.primitives.derived.DerivedTensors`; comparing them costs ``2H`` values). A
        cached decoding step reaches one distance further each time: one table per doubling of
        the context instead of a logarithm per distance, head and layer at every step."""
        n = doubling_length(distance)

        def build() -> Tensor:
            dist = torch.arange(n, device=device, dtype=dtype)[:, None]
            return kerple_bias(dist, self.r1.to(dtype)[None], self.r2.to(dtype)[None], self.variant)

        return self._kernel.get((self.raw_r1, self.raw_r2), build, key=(n, dtype, device))

