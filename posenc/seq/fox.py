"""FoX, the Forgetting Transformer's forget-gate bias (Lin et al. 2025, Forgetting Transformer:
Softmax Attention with a Forget Gate, ICLR, https://openreview.net/forum?id=q2Lnyegkr8).

Each head ``h`` has a forget gate per token, ``f_t = sigmoid(w_h . k_t + b_h)``, and the score of
query ``i`` on key ``j <= i`` gets

    ``D_ij = sum_{l = j+1 .. i} log f_l = F_i - F_j``,   ``F_t = sum_{l <= t} log f_l``

(``D_ii = 0``): a recency penalty whose slope is chosen by the content, ALiBi when ``f`` is constant
(``-log f = m_h``). Causal only. The query of index ``i`` is the token of key index ``i + Tk - Tq``
(the causal mask's bottom-right alignment: self-attention, or a KV cache whose newest keys are the
queries); positions are not read, only the order of the keys.

**Where the gate comes from.** The paper computes ``f_t`` from the layer's input ``x_t``. Here it
is computed from the token's key ``k_t = W_k x_t`` of the head's key group (grouped-query heads:
head ``h`` reads key head ``h // (Hq / Hkv)``): ``w_h . k_t = (W_k^T w_h) . x_t``, the paper's gate
with ``w`` restricted to the row space of the key projection. The reason is the KV cache: it holds
keys, values and positions only, and the gate of every cached token must be known at each decoding
step. From the key it is recomputed exactly, from the cached keys, with no state needed beside the
cache (the authors' cache stores ``log f`` per token; an ``x``-gate would need that, or the layer
input, which an attention hook never sees). A decoding step therefore gives the same bias as the
full forward (with a :class:`~posenc.common.decoding_state.DecodingState` the step keeps the
running sums ``F`` there and computes its new keys' gates only: :meth:`decode_score_bias`), and
padded or packed batches need nothing either: a packed segment's ``F_i - F_j`` only sums gates
inside the segment, and left padding lies before every real key.

Parameters: ``weight [H, D]`` (``N(0, init_std^2)``, the authors' 0.02) and ``bias [H]``:
``gate_init="zero"`` starts every gate at ``sigmoid(0) = 1/2`` as the authors' data-dependent gate;
``"alibi"`` sets ``b_h = -log(e^(m_h) - 1)``, so that ``-log f = softplus(-b_h) = m_h``, ALiBi's
slopes (with ``init_std=0`` the encoding starts exactly as ALiBi).

Hook: score bias, built from ``F`` alone (``[B, H, Tq]`` at the queries and ``[B, H, Tk]`` at the
keys, differentiable in ``k``, ``weight`` and ``bias``). ``F_i`` is a constant per query row, which
softmax drops, so the bias is also ``-F_j`` alone (``PairwiseBias.key_term``): off CUDA, in float32
or float64, training and prompts run SDPA's fused kernel with ``-F_j`` as one more key column
(the flash backward gives its gradient). Otherwise: on the chunked dense path each
block is ``F_i - F_j`` of its rows and keys (no ``T x T`` tensor kept; the block's gradient reaches
``F`` through its row and column sums); on CUDA a FlexAttention ``score_mod`` reading the two
cumulative sums (captured tensors with gradients); the math path alike. ``F`` is kept in float32
(float64 for a float64 module): ``F_i - F_j`` of a long sequence loses ``|F| * 6e-8`` to rounding.
Functional form: :func:`fox_log_gates`, :func:`fox_bias`.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number, check_sequence_positions
from ..common.decoding_state import LayerDecodingState
from ..common.encoding import Hook, PositionEncoding
from ..common.pairwise import PairwiseBias, gather
from ..common.registry import register
from ..primitives.budget import check_allocation
from .alibi import alibi_slopes

GATE_INITS = ("zero", "alibi")


def fox_log_gates(k: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``log f [B, Hq, T] = logsigmoid(w_h . k_t + b_h)`` from keys ``k [B, Hkv, T, D]``, ``weight
    [Hq, D]``, ``bias [Hq]`` (``Hq`` a multiple of ``Hkv``: head ``h`` reads key head ``h // (Hq /
    Hkv)``), in the dtype of ``weight`` (autocast off: the gates are summed over the sequence)."""
    if k.dim() != 4 or weight.dim() != 2 or bias.shape != weight.shape[:1] or weight.shape[1] != k.shape[-1]:
        raise ValueError(f"fox_log_gates: k [B, Hkv, T, D], weight [Hq, D] and bias [Hq] disagree: {tuple(k.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(bias.shape)}")
    batch, kv_heads, length, dim = k.shape
    heads = weight.shape[0]
    if heads % kv_heads:
        raise ValueError(f"fox_log_gates: {heads} gate heads must be a multiple of the {kv_heads} key heads")
    group = heads // kv_heads
    with torch.autocast(k.device.type, enabled=False):
        # [Hkv, G, D] x [B, Hkv, D, T]: a row of keys per gate, not a gate per key row ([T, D] x
        # [D, 1]), which BLAS runs as a skinny product several times slower (every decoding step
        # reads every cached key here)
        logits = torch.matmul(weight.view(kv_heads, group, dim), k.to(weight.dtype).transpose(-1, -2))  # [B, Hkv, G, T]
        logits = logits.reshape(batch, heads, length) + bias[:, None]
        return _log_sigmoid(logits)


# Below it, log(sigmoid(x)) would underflow; logsigmoid(x) = x - log1p(e^x) is x there to e^-80.
_LOG_SIGMOID_FLOOR = -80.0


def _log_sigmoid(x: Tensor) -> Tensor:
    """``logsigmoid(x)`` within the dtype's rounding (absolute error at most its epsilon), as
    ``log(sigmoid(x))``: aten's logsigmoid is several times slower on CPU, and every decoding step
    computes the gate of every cached key. At and below the floor it is ``x``; the clamp keeps
    ``sigmoid`` above zero there, so the branch not taken has no NaN gradient."""
    return torch.where(x <= _LOG_SIGMOID_FLOOR, x, torch.sigmoid(x.clamp(min=_LOG_SIGMOID_FLOOR)).log())


def fox_bias(log_gates: Tensor, q_len: int | None = None) -> Tensor:
    """The dense FoX bias ``[B, H, Tq, Tk]`` from ``log_gates [B, H, Tk]`` (:func:`fox_log_gates`;
    finite and <= 0, else a ValueError):
    ``F_i' - F_j`` for the keys ``j <= i' = i + Tk - Tq`` of query ``i`` and ``-inf`` after it, a
    complete float mask for ``F.scaled_dot_product_attention(q, k, v, attn_mask=bias)``.
    ``q_len``: the queries, the last ``Tq`` tokens (default all ``Tk``)."""
    if log_gates.dim() != 3 or not log_gates.is_floating_point():
        raise ValueError(f"log_gates must be a float tensor [batch, heads, keys]; got {tuple(log_gates.shape)} "
                         f"{log_gates.dtype}")
    if log_gates.numel() and not torch.compiler.is_compiling():
        # a log forget gate is finite and <= 0 (logsigmoid of a finite logit): NaN, -inf (the running
        # sums then meet as -inf - -inf) or a gate above 1 would make rows of the bias NaN or growing
        bad = ~torch.isfinite(log_gates) | (log_gates > 0)
        if bool(bad.any()):
            raise ValueError(f"log_gates must be log forget gates, finite and <= 0 (logsigmoid of the gate logits, as "
                             f"fox_log_gates gives); got {log_gates[bad][0].item()}")
    batch, heads, kv_len = log_gates.shape
    q_len = kv_len if q_len is None else check_int("q_len", q_len, minimum=0, maximum=kv_len)
    check_allocation(f"fox_bias(q_len={q_len}): the bias [B, H, Tq, Tk]", (batch, heads, q_len, kv_len),
                     log_gates.dtype, log_gates.device)
    cum = log_gates.cumsum(-1)
    rows = cum[..., kv_len - q_len:]
    bias = rows[..., :, None] - cum[..., None, :]
    i = torch.arange(kv_len - q_len, kv_len, device=cum.device)[:, None]
    j = torch.arange(kv_len, device=cum.device)[None, :]
    return bias.masked_fill(j > i, float("-inf"))


def _alibi_gate_bias(num_heads: int) -> Tensor:
    """``b_h`` with ``softplus(-b_h) = m_h`` (ALiBi's slopes): ``b = -log(e^m - 1)``."""
    slopes = alibi_slopes(num_heads).double()
    return (-torch.log(torch.expm1(slopes))).float()


@register(
    "fox",
    modality="seq",
    paper="Lin et al. 2025, Forgetting Transformer: Softmax Attention with a Forget Gate (ICLR), "
    "https://openreview.net/forum?id=q2Lnyegkr8",
    summary="data-dependent forget gates per head, sum of log f over the keys between; ALiBi with learned, "
    "content-chosen slopes; causal",
)
class ForgettingGate(PositionEncoding):
    """Args:
        num_heads: query heads ``H`` (one gate each).
        head_dim: the key width ``D`` the gate reads.
        init_std: the gate weights start as ``N(0, init_std^2)`` (0.02 as the authors; 0: constant gates).
        gate_init: ``"zero"`` (gates start at 1/2, the authors') or ``"alibi"`` (ALiBi's slopes).

    Parameters: ``weight [H, D]``, ``bias [H]``. One instance per layer (the models build one per
    block): the paper learns a gate per layer.
    """

    hooks = frozenset({Hook.SCORE_BIAS})
    causal_only = True
    per_layer = True

    def __init__(self, num_heads: int, head_dim: int, init_std: float = 0.02, gate_init: str = "zero") -> None:
        super().__init__()
        check_int("num_heads", num_heads, minimum=1)
        check_int("head_dim", head_dim, minimum=1)
        check_number("init_std", init_std, minimum=0.0)
        check_choice("gate_init", gate_init, GATE_INITS)
        self.num_heads, self.head_dim, self.gate_init = num_heads, head_dim, gate_init
        self.weight = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)
        start = _alibi_gate_bias(num_heads) if gate_init == "alibi" else torch.zeros(num_heads)
        self.bias = nn.Parameter(start)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, gate_init={self.gate_init!r}"

    def _work_dtype(self) -> torch.dtype:
        return torch.float64 if self.weight.dtype == torch.float64 else torch.float32

    def log_gates(self, k: Tensor) -> Tensor:
        """``log f [B, H, Tk]`` of keys ``k [B, Hkv, Tk, D]``."""
        if k.shape[-1] != self.head_dim:
            raise ValueError(f"fox: keys of width {k.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        work = self._work_dtype()
        return fox_log_gates(k, self.weight.to(work), self.bias.to(work))

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        check_sequence_positions(q_pos, kv_pos)
        return self._bias(self.log_gates(k).cumsum(-1), q.shape[2])  # F [B, H, Tk]

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
                          state: LayerDecodingState | None = None) -> PairwiseBias:
        """:meth:`score_bias`, with ``F`` of the cached keys kept in ``state`` between steps: a step
        computes the gates of its new keys only (else every step reads every cached key once more).
        Kept under this module's parameters' versions: an edited gate recomputes ``F``."""
        if state is None:
            return self.score_bias(q, k, q_pos, kv_pos)
        check_sequence_positions(q_pos, kv_pos)
        # this module (a weak reference: a new module at a freed address is another key), its
        # parameters' versions (an in-place edit changes the gates), dtype and the batch of keys
        key = (weakref.ref(self), self.weight._version, self.bias._version, self.weight.dtype, k.shape[:2])
        kept = state.kept("fox", key)  # F [B, H, n] of the oldest n cached keys, or None
        if kept is None:
            cum = self.log_gates(k).cumsum(-1)
        else:
            # F continues from the last kept sum: F_t = F_n-1 + sum of the new log gates up to t
            new = self.log_gates(k[:, :, kept.shape[-1]:]).cumsum(-1) + kept[..., -1:]
            cum = torch.cat((kept, new), dim=-1)
        state.keep("fox", key, cum)
        return self._bias(cum, q.shape[2])

    def _bias(self, cum: Tensor, q_len: int) -> PairwiseBias:
        """The bias of the last ``q_len`` tokens as queries against every key, from ``F [B, H, Tk]``."""
        shift = cum.shape[-1] - q_len  # query i is the token of key i + shift

        def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            # F at the query's own token minus F at the key. A dense block: [B, H, rows, 1] minus
            # [B, H, 1, keys], read with index_select (the same sums on every run); FlexAttention's
            # scalar indices: two plain lookups. A query with no key of its own (more queries than
            # keys) reads index 0: its row is masked whole. Both reads come from the one tensor F,
            # whose gradient is the block's row sums minus its column sums.
            return gather(cum, b, h, (q_idx + shift).clamp(min=0)) - gather(cum, b, h, kv_idx)

        learned = (cum,) if cum.requires_grad else ()
        # F_i is a constant per query row, which softmax drops: -F_j alone is the key term
        return PairwiseBias(bias, per_batch=cum.shape[0] > 1, learned=learned, name="FoX", key_term=-cum)


__all__ = ["ForgettingGate", "GATE_INITS", "fox_bias", "fox_log_gates"]
