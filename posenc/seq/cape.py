"""CAPE / DAPE, context-adaptive positional encoding (Zheng et al. 2024, https://arxiv.org/abs/2405.14722).

``A = QK^T + B + f([QK^T; B])``: ``B`` is a static positional bias (ALiBi, KERPLE or FIRE, built
by name through the registry), and ``f`` an MLP applied at every pair ``(i, j)`` across the head
axis, ``2H -> hidden -> H`` (LeakyReLU, as in the authors' code), so the bias adapts to the
attention scores. ``QK^T`` here is the scaled score ``q.k / sqrt(d)``.

It needs the whole score matrix: the encoding sets ``needs_scores`` and implements
``transform_scores``, which only the math path serves (``backend="auto"`` picks it; another
backend is a clear error). Memory is ``O(B * T^2 * hidden)`` for the MLP activations, inherent to
the method. ``f`` sees the scores of masked pairs too (they are finite there); it acts on each
pair separately, so nothing leaks from a masked pair into a visible one, and the core masks the
result afterwards: masked entries stay masked.

Shapes: ``scores [B, H, Tq, Tk]``; positions as the base bias takes them. Causal-only exactly
when the base bias is (ALiBi and KERPLE unless ``symmetric``; FIRE always).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_choice, check_int
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import ModelDims, build, register

CAPE_BASES = ("alibi", "kerple", "fire")


@register(
    "cape",
    modality="seq",
    paper="Zheng et al. 2024, DAPE: Data-Adaptive Positional Encoding, https://arxiv.org/abs/2405.14722",
    summary="an MLP over heads of [scores; static bias] added to a static bias (ALiBi, KERPLE, FIRE)",
)
class CAPE(PositionEncoding):
    """Args:
        dim: model width (passed to the base bias, like ``num_heads`` and ``max_len``).
        base: the static bias, ``"alibi"`` (default), ``"kerple"`` or ``"fire"``.
        hidden: hidden width of ``f`` (32 in the paper).
        base_options: keyword arguments for the base bias (e.g. ``{"symmetric": True}``).

    Parameters: ``mlp`` (``Linear(2H, hidden)``, LeakyReLU, ``Linear(hidden, H)``) and the base's.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    needs_scores = True

    def __init__(
        self, dim: int, num_heads: int, max_len: int, base: str = "alibi", hidden: int = 32,
        base_options: dict | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("num_heads", num_heads), ("max_len", max_len), ("hidden", hidden)):
            check_int(name, value, minimum=1)
        check_choice("base", base, CAPE_BASES)
        if base_options is not None and not isinstance(base_options, dict):
            raise TypeError(f"base_options must be a dict of {base}'s arguments or None; got {base_options!r}")
        self.num_heads, self.base_name = num_heads, base
        self.base = build(base, dims=ModelDims(dim=dim, num_heads=num_heads, max_len=max_len), **(base_options or {}))
        self.causal_only = self.base.causal_only
        self.mlp = nn.Sequential(nn.Linear(2 * num_heads, hidden), nn.LeakyReLU(), nn.Linear(hidden, num_heads))

    def transform_scores(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None
    ) -> Tensor:
        b, h, tq, tk = scores.shape
        idx = torch.arange(max(tq, tk), device=scores.device)
        static = self.base.score_bias(q, k, q_pos, kv_pos).dense(b, h, idx[:tq], idx[:tk], dtype=scores.dtype)
        static = static.expand(-1, h, -1, -1)  # [B or 1, H, Tq, Tk]: one for the batch unless the base differs
        first, act, second = self.mlp
        dtype = first.weight.dtype
        # f in the head-major layout of the scores, as batched products of its small weights
        # with the [B, H, Tq * Tk] block (no channel-last copies of the scores, their gradient
        # or the result): [hidden, H] x [H, pairs] per batch row. The first layer splits into a
        # part on the scores and a part on the static bias, made once when the batch shares the
        # bias and added by the product itself; the activation runs in place; the second
        # layer's product adds onto scores + static. (B=4, H=8, a 24 x 600 block on one thread,
        # forward + backward of f: 13.9 -> 7.5 ms against the channel-last F.linear.)
        pairs = tq * tk
        w_scores, w_static = first.weight[:, :h], first.weight[:, h:]  # [hidden, H] x2
        flat_static = static.reshape(static.shape[0], h, pairs).to(dtype)  # [B or 1, H, pairs]
        if flat_static.shape[0] == 1:
            on_static = torch.addmm(first.bias[:, None], w_static, flat_static[0]).expand(b, -1, -1)
        else:
            on_static = torch.baddbmm(first.bias[:, None], w_static.expand(b, -1, -1), flat_static)
        hidden = torch.baddbmm(on_static, w_scores.expand(b, -1, -1), scores.reshape(b, h, pairs).to(dtype))
        hidden = F.leaky_relu(hidden, act.negative_slope, inplace=True)  # [B, hidden, pairs]
        w_out = second.weight.expand(b, -1, -1)  # [B, H, hidden]
        if dtype == scores.dtype:
            base = torch.add(scores, static).add_(second.bias[:, None, None]).reshape(b, h, pairs)
            return torch.baddbmm(base, w_out, hidden).view(b, h, tq, tk)
        adapt = torch.baddbmm(second.bias[:, None], w_out, hidden).to(scores.dtype)  # [B, H, pairs]
        return (scores + static).add_(adapt.view(b, h, tq, tk))
