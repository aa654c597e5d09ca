"""Attention with position-encoding hooks: one call prepared (:func:`prepare`), planned and run
(:func:`run`), the way docs/architecture.md walks through ("One call through the core").
:func:`attend`, :func:`attend_with_weights` and :func:`plan` are views over that way, as is the
layer :class:`~posenc.common.multihead.MultiheadAttention`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from . import kernels
from .call import AttentionCall
from .encoding import NO_NEEDS, AttentionNeeds, PositionEncoding
from .kernels import NO_TERMS, EncodingTerms
from .kernels.linear import LINEAR_CHUNK_ROWS, linear_path
from .kernels.terms import ScoreTransform
from .linear_attention import FeatureMap
from .masks import AttentionMask
from .pairwise import dense_bias, shared_run_offset, sum_of_biases
from .planning import Backend, Plan, PlanInputs, decide, decoding_step


@dataclass(frozen=True, repr=False)
class PreparedCall:
    """A call ready to run.

    Attributes:
        call: the call with q and k after the encoding's q/k transform and the padded keys and
            values zeroed (``q [B, Hq, Tq, D]``, ``k, v [B, Hkv, Tk, D]``).
        terms: the encoding's terms as the kernels take them.
        plan: the kernel path.
        inputs: what the plan was decided from.
    """

    call: AttentionCall
    terms: EncodingTerms
    plan: Plan
    inputs: PlanInputs

    def __repr__(self) -> str:
        return f"PreparedCall({self.plan}; {self.call!r})"


def prepare(call: AttentionCall) -> PreparedCall:
    """Apply the q/k transform, build the encoding's terms and make the plan (no attention yet)."""
    own = call.encoding.attention_needs() if call.encoding is not None else NO_NEEDS
    q, k, v = call.q, call.k, call.v  # [B, Hq, Tq, D], [B, Hkv, Tk, D] x2
    if own.qk and not call.qk_transformed:
        q, k = call.encoding.transform_qk(q, k, call.q_pos, call.kv_pos)  # same shapes (D may differ: qk_width)
    if call.mask is not None and call.feature_map is None:  # (linear attention zeroes its key features itself)
        k, v = call.mask.zero_padding(k, v)  # padded keys never reach a real row, NaN included
    if own.score_bias and q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        # On CPU a score bias mostly runs on the dense or math path, and both compact q and k for
        # their backward. Compacted before the bias is built, a bias that keeps q or k for its own
        # gradient (DeBERTa, Shaw) holds those same copies, not strided views beside them. (The
        # plan needs the built bias, so this comes first; the key-column path widens q and k by a
        # copy of its own anyway.)
        q, k = q.contiguous(), k.contiguous()
    ready = replace(call, q=q, k=k, v=v, qk_transformed=call.qk_transformed or own.qk)
    inputs = _plan_inputs(ready)
    if call.feature_map is not None:
        return PreparedCall(ready, NO_TERMS, decide(inputs), inputs)
    terms = _encoding_terms(ready, own, decoding_step(inputs))
    bias = terms.bias
    by_offset = bias is not None and bias.by_offset is not None and not bias.per_batch
    run_offset = None
    if (ready.needs.offset_values or by_offset) and not inputs.traced:  # (reads the positions: a host sync)
        run_offset = shared_run_offset(ready.q_pos, ready.kv_pos)
    inputs = replace(
        inputs, bias_per_batch=bias is not None and bias.per_batch, bias_learned=bias is not None and bias.requires_grad,
        bias_pointwise=bias is None or bias.pointwise, bias_by_offset=by_offset, run_offset=run_offset,
        bias_key_term=bias is not None and bias.key_term is not None,
    )
    plan = decide(inputs)
    if plan.tiled_transform:
        terms = replace(terms, score_transform=_tiled_transform(ready))
    return PreparedCall(ready, terms, plan, inputs)


def _tiled_transform(call: AttentionCall) -> ScoreTransform:
    """The encoding's tiled transform, as the plan's ``tiled_transform`` asks; its plain
    :meth:`~posenc.common.encoding.PositionEncoding.transform_scores` for an input the tiled
    form cannot take."""
    enc, q_pos, kv_pos = call.encoding, call.q_pos, call.kv_pos

    def score_transform(scores: Tensor, q: Tensor, k: Tensor, rows: slice, keys: slice, allowed) -> Tensor:
        args = (scores, q, k, q_pos[:, rows], kv_pos[:, keys], allowed)
        out = enc.transform_scores_tiled(*args)
        return enc.transform_scores(*args) if out is None else out

    return score_transform


def _encoding_terms(call: AttentionCall, own: AttentionNeeds, decode: bool) -> EncodingTerms:
    """The encoding's terms of a call whose q/k are transformed; ``own``: the encoding's needs;
    ``decode``: a decoding step (:func:`~posenc.common.planning.decoding_step`), whose bias comes
    from the encoding's decoding hook."""
    enc, q_pos, kv_pos = call.encoding, call.q_pos, call.kv_pos
    bias = None
    if own.score_bias or call.attn_bias is not None:
        mine = None
        if own.score_bias:
            if decode:
                mine = enc.decode_score_bias(call.q, call.k, q_pos, kv_pos, call.decoding_state)
            else:
                mine = enc.score_bias(call.q, call.k, q_pos, kv_pos)
        bias = sum_of_biases(mine, None if call.attn_bias is None else dense_bias(call.attn_bias))
    score_transform = value_term = transform_softmax_backward = None
    if own.score_transform:

        def score_transform(scores: Tensor, q: Tensor, k: Tensor, rows: slice, keys: slice, allowed) -> Tensor:
            args = (scores, q, k, q_pos[:, rows], kv_pos[:, keys], allowed)
            if decode:  # the plan's decoding step: the encoding's decoding hook
                return enc.decode_transform_scores(*args, call.decoding_state)
            return enc.transform_scores(*args)

        if type(enc).transform_softmax_backward is not PositionEncoding.transform_softmax_backward:

            def transform_softmax_backward(scores: Tensor, centered: Tensor, q: Tensor, k: Tensor, rows: slice,
                                           keys: slice, allowed):
                return enc.transform_softmax_backward(scores, centered, q, k, q_pos[:, rows], kv_pos[:, keys], allowed)

    if own.value_term:

        def value_term(probs: Tensor, rows: slice, keys: slice) -> Tensor:
            return enc.value_term(probs, q_pos[:, rows], kv_pos[:, keys])

    return EncodingTerms(
        bias=bias,
        prob_bias=enc.prob_bias(q_pos, kv_pos) if own.prob_bias else None,
        score_transform=score_transform,
        value_term=value_term,
        transform_inputs=tuple(enc.math_parameters()) if own.score_transform or own.value_term else (),
        transform_softmax_backward=transform_softmax_backward,
    )


def _plan_inputs(call: AttentionCall) -> PlanInputs:
    """What the plan reads of a call before its bias exists; :func:`prepare` adds the bias's facts."""
    grad = torch.is_grad_enabled() and (any(t.requires_grad for t in (call.q, call.k, call.v)) or (
        call.encoding is not None and any(p.requires_grad for p in call.encoding.parameters())))
    return PlanInputs(
        needs=call.needs, mask=call.mask, device=call.q.device, needs_grad=grad,
        batch=call.batch, heads=call.heads, q_len=call.q_len, kv_len=call.kv_len, backend=call.backend,
        what=call.what, feature_map=None if call.feature_map is None else call.feature_map.name,
        dtype=call.q.dtype, head_dim=min(call.q.shape[-1], call.v.shape[-1]),
        traced=torch.compiler.is_compiling(),
    )


def make_plan(call: AttentionCall) -> Plan:
    """The :class:`~posenc.common.planning.Plan` that :func:`run` would follow for ``call``, in the
    current grad mode (the encoding's q/k transform and bias tables are built, as the plan depends
    on them)."""
    if call.is_empty:
        return Plan("sdpa", "an empty sequence: zeros, no kernel runs")
    return prepare(call).plan


def run(prepared: PreparedCall) -> Tensor:
    """Run the kernel the plan names: ``[B, Hq, Tq, D]``."""
    call, terms, plan = prepared.call, prepared.terms, prepared.plan
    q, k, v, mask, scale = call.q, call.k, call.v, call.mask, call.scale  # [B, Hq, Tq, D], [B, Hkv, Tk, D] x2
    if plan.path == "linear":
        # the plan has checked the mask; a bidirectional unpacked call has no blocks
        return linear_path(q, k, v, call.feature_map, mask, plan.chunk_rows or LINEAR_CHUNK_ROWS)
    one_pass = plan.form == "one_pass"
    if plan.path == "math":
        return kernels.math_path(q, k, v, mask, terms, scale, plan.chunk_rows, form=plan.form,
                                 backward=plan.math_backward)
    if plan.offset_values:
        if plan.grad:  # compacted once for both terms' backward (a decoding step's keys stay a view of the cache)
            q, k = q.contiguous(), k.contiguous()
        # out [B, Hq, Tq, D] and the log-sum-exp of each row [B, Hq, Tq]
        out, lse = kernels.dense_path(q, k, v, mask, terms.bias, scale, plan.chunk_rows, return_lse=True,
                                      offset_start=plan.offset_start, form=plan.form,
                                      bias_backward=plan.bias_backward)
        out = out + kernels.offset_value_term(q, k, terms.bias, lse, call.encoding.offset_values(), scale,
                                              one_pass=one_pass)
    elif plan.path == "flex":
        out = kernels.flex_path(q, k, v, mask, terms.bias, scale)
    elif plan.path == "dense":
        out = kernels.dense_path(q, k, v, mask, terms.bias, scale, plan.chunk_rows, offset_start=plan.offset_start,
                                 form=plan.form, bias_backward=plan.bias_backward)
    elif plan.key_column:
        out = kernels.key_column_path(q, k, v, mask, scale, terms.bias.key_term)
    else:
        out = kernels.sdpa_path(q, k, v, mask, scale)
    if plan.prob_bias:  # [B, Hq, Tq, D]
        out = out + kernels.prob_bias_term(v, call.heads, mask, terms.prob_bias, call.q_len, one_pass=one_pass)
    return out


def _attend(call: AttentionCall) -> Tensor:
    if call.is_empty:  # nothing to attend to (or from): zeros, as for fully masked rows
        return call.q.new_zeros(call.batch, call.heads, call.q_len, call.v.shape[-1])
    return run(prepare(call))


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    q_pos: Tensor,
    kv_pos: Tensor,
    encoding: PositionEncoding | None = None,
    mask: AttentionMask | None = None,
    scale: float | None = None,
    backend: Backend = "auto",
    qk_transformed: bool = False,
    feature_map: FeatureMap | None = None,
    attn_bias: Tensor | None = None,
) -> Tensor:
    """Attention of ``q [B, Hq, Tq, D]`` over ``k, v [B, Hkv, Tk, D]`` (``Hq`` a multiple of ``Hkv``).

    Args:
        q_pos: query positions ``[B or 1, Tq]`` (a trailing coordinate axis for 2D encodings),
            integer or float.
        kv_pos: key positions ``[B or 1, Tk]``, as ``q_pos``.
        encoding: its q/k, score-bias and after-softmax hooks are applied (the input hook is not:
            that belongs to the model, before the blocks).
        mask: which keys each query sees; None for full attention.
        scale: score scale, default ``D ** -0.5``.
        backend: "auto" follows the kernel plan (:func:`posenc.common.planning.decide`); naming
            a path forces it, and a path that cannot honour the encoding is a ValueError.
            :func:`plan` tells which path a call takes.
        qk_transformed: ``q`` and ``k`` have already been through the encoding's q/k transform
            (as with a KV cache, where each key is transformed once, at its own position).
        feature_map: run linear attention with this feature map instead of softmax attention
            (:func:`posenc.common.linear_attention.linear_attention`; ``scale`` is then unused, the
            map defines the similarity). Only the q/k hooks apply; an encoding with a score bias
            or an after-softmax term is a ValueError.
        attn_bias: a float tensor ``[B or 1, Hq or 1, Tq, Tk]`` added to the scores before the
            softmax, beside the encoding's bias (a caller's additive attention mask; ``-inf``
            removes a pair, and a row removed whole gives NaN, as in torch). It takes the
            score-bias paths (dense on CPU, FlexAttention on CUDA).

    Returns:
        ``[B, Hq, Tq, D]``.
    """
    return _attend(AttentionCall.checked(
        q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=encoding, mask=mask, scale=scale, backend=backend,
        qk_transformed=qk_transformed, feature_map=feature_map, attn_bias=attn_bias,
    ))


def attend_with_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    q_pos: Tensor,
    kv_pos: Tensor,
    encoding: PositionEncoding | None = None,
    mask: AttentionMask | None = None,
    scale: float | None = None,
    qk_transformed: bool = False,
    attn_bias: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """:func:`attend` with the attention weights returned too, by the explicit math path in one
    block (:func:`posenc.common.kernels.weights_path`): ``(out [B, Hq, Tq, D], weights [B, Hq,
    Tq, Tk])``. ``weights`` is the matrix applied to ``V``: the probabilities after dropout, plus an
    after-softmax bias (eRPE). This path keeps the whole ``[B, H, Tq, Tk]`` matrix and gives up
    the fused kernels: use it when the weights are wanted, or for attention dropout
    (``dropout_p``, applied as given: pass 0 outside training), which only it implements."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p!r}")
    call = AttentionCall.checked(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=encoding, mask=mask, scale=scale,
                                 qk_transformed=qk_transformed, attn_bias=attn_bias)
    if call.is_empty:
        return q.new_zeros(call.batch, call.heads, call.q_len, v.shape[-1]), q.new_zeros(*q.shape[:3], call.kv_len)
    ready = prepare(call)
    c = ready.call
    return kernels.weights_path(c.q, c.k, c.v, c.mask, ready.terms, c.scale, dropout_p)


def plan(
    q: Tensor,
    k: Tensor,
    v: Tensor | None = None,
    *,
    q_pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    encoding: PositionEncoding | None = None,
    mask: AttentionMask | None = None,
    scale: float | None = None,
    backend: Backend = "auto",
    qk_transformed: bool = False,
    feature_map: FeatureMap | None = None,
    attn_bias: Tensor | None = None,
) -> Plan:
    """The :class:`~posenc.common.planning.Plan` that :func:`attend` would follow for these
    arguments, in the current grad mode, without running the attention (the encoding's q/k
    transform and bias tables are built, as the plan depends on them). ``v`` defaults to ``k``;
    positions to ``0 .. T-1``. A forced ``backend`` that cannot serve the call raises the same
    ValueError as :func:`attend`."""
    return make_plan(AttentionCall.checked(
        q, k, k if v is None else v, q_pos=q_pos, kv_pos=kv_pos, encoding=encoding, mask=mask, scale=scale,
        backend=backend, qk_transformed=qk_transformed, feature_map=feature_map, attn_bias=attn_bias,
    ))
