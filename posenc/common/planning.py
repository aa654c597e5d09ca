"""The kernel plan: which path one attention call takes, and why.

:func:`decide` is the only place that decides. It reads a :class:`PlanInputs` (what the encoding
needs, facts of its bias, the mask, the device, the sizes; no tensor data) and returns a
:class:`Plan`, which :func:`posenc.common.attention.plan` and :meth:`posenc.MultiheadAttention.plan`
return without running anything. The rules for ``backend="auto"`` and what each field of the plan
decides are in docs/architecture.md ("One call through the core", step 3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from . import kernels
from .kernels.chunking import Form, MathBackward
from .encoding import NO_NEEDS, AttentionNeeds
from .kernels.linear import LINEAR_CHUNK_ROWS
from .linear_attention import check_linear_mask
from .masks import AttentionMask
from .tuning import BiasBackward, constant_bias_backward

Path = Literal["sdpa", "flex", "dense", "math", "linear"]
Backend = Literal["auto", "sdpa", "flex", "dense", "math"]
BACKENDS: tuple[str, ...] = ("auto", "sdpa", "flex", "dense", "math")

#: A decoding step has at most this many query rows (one token, or a few of speculative
#: decoding): few enough that its whole bias ``[B, H, rows, Tk]`` is small beside the keys.
FEW_ROWS = 8


@dataclass(frozen=True)
class Plan:
    """How one attention call runs.

    Attributes:
        path: the kernel path, ``"sdpa"``, ``"flex"``, ``"dense"`` or ``"math"``.
        reason: one line saying why.
        chunk_rows: query rows per chunk on the chunked paths (``dense``, ``math``), else None.
        prob_bias: an after-softmax bias is added beside the kernel (``(B * mask) V``).
        offset_values: the value term is computed from the fused kernel's log-sum-exp.
        decode: a decoding step (:func:`decoding_step`): the encoding's decoding hook builds the bias.
        form: how the ``dense`` and ``math`` kernels go through the rows: ``"chunked"`` (chunks of
            ``chunk_rows`` under one autograd node), ``"one_pass"`` (a decoding step: every row at
            once, no autograd node) or ``"whole"`` (traced with a learned bias: one block).
        grad: a gradient flows to q, k, v or the encoding's parameters.
        offset_start: ``kv_pos[0] - q_pos[0]`` where the dense kernel cuts the bias's blocks from
            its values along the diagonals (``PairwiseBias.by_offset`` over runs of consecutive
            positions); None otherwise.
        bias_backward: the chunked ``dense`` path's backward with a gradient: ``"explicit"``
            (written out, which also gives the bias's gradient) or ``"flash"`` (SDPA's CPU flash
            backward; a constant bias on CPU only, :func:`constant_bias_backward`); None elsewhere.
        key_column: the ``sdpa`` path carries the score bias's key term as one more key column
            (:func:`posenc.common.kernels.key_column_path`).
        math_backward: how the chunked ``math`` path's backward goes (its forward follows):
            ``"explicit"`` (the attention backward written out, autograd for the transform alone),
            ``"encoding"`` (that, with the encoding's own backward of transform and softmax,
            :meth:`~posenc.common.encoding.PositionEncoding.transform_softmax_backward`; CPU) or
            ``"autograd"`` (each row chunk differentiated whole: an after-softmax term, or traced);
            None off the math path and for a decoding step.
        tiled_transform: the math path's transform is the encoding's own tiled form
            (:meth:`~posenc.common.encoding.PositionEncoding.transform_scores_tiled`, CAPE), in
            chunks of rows twice as tall: on CPU, rows in chunks, not traced. A decoding step
            takes the encoding's decoding hook (``decode_transform_scores``) instead.
    """

    path: Path
    reason: str
    chunk_rows: int | None = None
    prob_bias: bool = False
    offset_values: bool = False
    decode: bool = False
    form: Form = "chunked"
    grad: bool = False
    offset_start: int | None = None
    bias_backward: BiasBackward | None = None
    key_column: bool = False
    math_backward: MathBackward | None = None
    tiled_transform: bool = False

    @property
    def label(self) -> str:
        """``path`` plus the extra terms, e.g. ``"sdpa+prob_bias"``, ``"dense+decode"``."""
        extras = [name for name, on in (("key_column", self.key_column), ("offset_values", self.offset_values),
                                        ("prob_bias", self.prob_bias), ("decode", self.decode)) if on]
        return "+".join([self.path, *extras])

    def __str__(self) -> str:
        chunk = f" ({self.chunk_rows} rows a chunk)" if self.chunk_rows is not None else ""
        return f"{self.label}{chunk}: {self.reason}"


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _needs_square_mask(mask: AttentionMask | None, q_len: int, kv_len: int) -> bool:
    """A mask SDPA could only take as a dense ``[Tq, Tk]`` tensor."""
    return mask is not None and not mask.is_empty and not mask.only_causal(q_len, kv_len) and not mask.only_key_padding


def check_backend(backend: str) -> None:
    """``backend`` is one of :data:`BACKENDS`; else a ValueError listing them. The one home of the rule."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan reads about one call, no tensors.

    Attributes:
        needs: what the encoding asks of attention.
        mask: the call's mask (its kind and shape matter, not its values).
        device: where the call runs.
        needs_grad: q, k or v need a gradient.
        batch, heads, q_len, kv_len: the call's sizes (query heads).
        backend: ``"auto"`` or a forced path.
        bias_per_batch: the score bias differs between sequences of the batch.
        bias_learned: the score bias needs a gradient (learned tables, content-dependent terms).
        run_offset: ``kv_pos[0] - q_pos[0]`` when both positions are one integer run of consecutive
            values shared by the batch (:func:`~posenc.common.pairwise.shared_run_offset`), else None;
            read by :func:`~posenc.common.attention.prepare` only where a plan could use it.
        what: the encoding's name, for error messages.
        feature_map: the name of a linear attention's feature map (``"elu+1"``, ``"favor+"``):
            the call is linear attention (:mod:`posenc.common.linear_attention`), not softmax.
        dtype: the dtype of q, k and v.
        head_dim: the smaller of the query/key and the value head dims.
        bias_pointwise: the score bias is lookups and arithmetic per element
            (:attr:`~posenc.common.pairwise.PairwiseBias.pointwise`).
        bias_by_offset: the score bias is a function of the offset alone, shared by the batch
            (:attr:`~posenc.common.pairwise.PairwiseBias.by_offset`).
        traced: ``torch.compile`` is tracing the call (no host reads of the data).
        bias_key_term: the score bias is a key term plus a constant per row
            (:attr:`~posenc.common.pairwise.PairwiseBias.key_term`).
    """

    needs: AttentionNeeds = NO_NEEDS
    mask: AttentionMask | None = None
    device: torch.device = torch.device("cpu")
    needs_grad: bool = False
    batch: int = 1
    heads: int = 1
    q_len: int = 1
    kv_len: int = 1
    backend: Backend = "auto"
    bias_per_batch: bool = False
    bias_learned: bool = False
    run_offset: int | None = None
    what: str = "this encoding"
    feature_map: str | None = None
    dtype: torch.dtype = torch.float32
    head_dim: int = 64
    bias_pointwise: bool = True
    bias_by_offset: bool = False
    traced: bool = False
    bias_key_term: bool = False

    @property
    def consecutive_causal(self) -> bool:
        """A causal mask alone over one run of consecutive positions, the queries its last
        ``Tq``: ``pos_j - pos_i = j - (i + Tk - Tq)``, so each relative offset is one diagonal."""
        return (self.mask is not None and self.mask.causal_alone and self.run_offset is not None
                and self.run_offset == self.q_len - self.kv_len)


def decoding_step(inputs: PlanInputs) -> bool:
    """Whether the call is a decoding step: at most :data:`FEW_ROWS` query rows and no gradient
    (a step over a KV cache, or a short prompt: whether a cache holds the keys does not change
    what is cheap). The one definition: :func:`decide` marks the plan with it, and
    :func:`~posenc.common.attention.prepare` asks it before building the bias, which a decoding
    step takes from the encoding's decoding hook."""
    return not inputs.needs_grad and 0 < inputs.q_len <= FEW_ROWS and not inputs.traced


# Compiled FlexAttention's limits (Triton on CUDA), met there on an H200 with torch 2.11: float64
# fails to compile, head dims under 16 are "NYI", and a reduction inside score_mod cannot be
# lowered ("Buffers cannot be created while lowering a pointwise subgraph").
FLEX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLEX_MIN_HEAD_DIM = 16


def flex_refusal(inputs: PlanInputs) -> str | None:
    """Why compiled FlexAttention (the CUDA flex path) cannot run this call; None when it can.
    Off CUDA flex runs eagerly (the unfused reference), which has none of these limits."""
    if inputs.device.type != "cuda":
        return None
    if inputs.dtype not in FLEX_DTYPES:
        return f"compiled FlexAttention takes float16, bfloat16 or float32, not {str(inputs.dtype).removeprefix('torch.')}"
    if inputs.head_dim < FLEX_MIN_HEAD_DIM:
        return f"compiled FlexAttention needs head dims of at least {FLEX_MIN_HEAD_DIM}, got {inputs.head_dim}"
    if inputs.needs.score_bias and not inputs.bias_pointwise:
        return (f"the bias of {inputs.what} reduces over a feature axis per element (a dot product or an MLP), "
                "which compiled FlexAttention's score_mod cannot hold")
    return None


def decide(inputs: PlanInputs) -> Plan:
    """The kernel path of one call; a forced ``backend`` that cannot honour the hooks is a
    ValueError naming the alternatives."""
    check_backend(inputs.backend)
    check_attention_kind(inputs.needs, inputs.feature_map, inputs.what)
    if inputs.feature_map is not None:
        return _linear_plan(inputs)
    plan = _softmax_plan(inputs)
    reason = plan.reason
    if plan.prob_bias:
        reason += "; the after-softmax bias is added beside it, (B * mask) V in row chunks"
    decode = decoding_step(inputs)
    form: Form = "chunked"
    if plan.path in ("dense", "math"):
        if decode:
            form = "one_pass"
            reason += f"; a decoding step ({inputs.q_len} rows, no gradient): the rows in one pass"
        elif plan.path == "dense" and inputs.traced and inputs.bias_learned:
            form = "whole"
            reason += "; traced with a learned bias: one block under plain autograd"
    offset_start = inputs.run_offset if plan.path == "dense" and _diagonal_layout(inputs) else None
    grad = inputs.needs_grad or inputs.bias_learned
    bias_backward = None
    if plan.path == "dense" and form == "chunked" and grad:
        bias_backward, why = _bias_backward(inputs, plan.offset_values)
        reason += f"; backward {bias_backward}: {why}"
    math_backward = None
    tiled = plan.path == "math" and form == "chunked" and _tiled_transform(inputs)
    if tiled:
        reason += "; the encoding's transform in its own tiles (CPU)"
    if plan.path == "math" and form == "chunked":
        math_backward, why = _math_backward(inputs)
        if grad:
            reason += f"; backward {math_backward}: {why}"
    return replace(plan, reason=reason, decode=decode, form=form, grad=grad, offset_start=offset_start,
                   bias_backward=bias_backward, math_backward=math_backward, tiled_transform=tiled)


def _tiled_transform(inputs: PlanInputs) -> bool:
    """Whether the math path takes the encoding's tiled transform (outside a decoding step):
    on CPU, where it was measured against the batched one, and not traced (its tiles are a
    Python loop). Elsewhere it has never been timed."""
    return inputs.needs.tiled_transform and inputs.device.type == "cpu" and not inputs.traced


def _bias_backward(inputs: PlanInputs, offset_values: bool) -> tuple[BiasBackward, str]:
    """The chunked dense path's backward and why."""
    if inputs.bias_learned:
        return "explicit", "the bias needs its gradient"
    if offset_values:
        return "explicit", "the value term needs the log-sum-exp's gradient"
    if inputs.device.type != "cpu":
        return "explicit", "no flash backward with a bias off CPU"
    return constant_bias_backward()


def _math_backward(inputs: PlanInputs) -> tuple[MathBackward, str]:
    """The chunked math path's backward and why. The encoding's own backward is taken on CPU
    only, where it was measured against the explicit one; elsewhere it has never been timed."""
    needs = inputs.needs
    if needs.prob_bias or needs.value_term:
        return "autograd", "an after-softmax term, differentiated with each row chunk"
    if inputs.traced:
        return "autograd", "traced: plain autograd"
    if not needs.own_transform_backward:
        return "explicit", "written out around the transform's autograd"
    if needs.score_bias:
        return "explicit", "a score bias beside the transform goes through autograd with it"
    if inputs.device.type != "cpu":
        return "explicit", "the encoding's own backward is for CPU"
    return "encoding", "the encoding's own backward of transform and softmax"


def _key_column_refusal(inputs: PlanInputs) -> str | None:
    """Why the score bias cannot ride as a key column on SDPA; None when it can. In half
    precision the column would round the bias to a few bits: its key term grows with the
    sequence (FoX's sums of log-gates), where the dense path adds the bias in float32."""
    if not inputs.bias_key_term:
        return "it is not a term of the key alone"
    if inputs.dtype not in (torch.float32, torch.float64):
        return f"a key column in {str(inputs.dtype).removeprefix('torch.')} would round the bias"
    return None


def _diagonal_layout(inputs: PlanInputs) -> bool:
    """The dense kernel can cut the bias's blocks from one row of values along the diagonals: a
    bias of the offset alone shared by the batch, positions one run of consecutive integers, and
    no mask but the causal rule with every query seeing a key."""
    mask = inputs.mask
    if not inputs.bias_by_offset or inputs.run_offset is None or inputs.traced or inputs.q_len == 0 or inputs.kv_len == 0:
        return False
    return mask is None or (mask.plain and not (mask.causal and inputs.q_len > inputs.kv_len))


def check_attention_kind(needs: AttentionNeeds, feature_map: str | None, what: str) -> None:
    """Whether an encoding can run on this kind of attention (softmax when ``feature_map`` is None,
    else linear): the one home of the rule; :func:`decide` applies it on every call and the
    blocks at construction, so a model with an illegal pair fails when it is built."""
    if feature_map is None:
        if needs.linear_only:
            raise ValueError(
                f"{what} is defined for linear attention only (its codes estimate the kernel in expectation, which "
                "softmax's exponential does not keep); use linear attention (feature_map='elu' or 'favor' on a "
                "model, a FeatureMap on attend)"
            )
        return
    for hook, on in (("score bias", needs.score_bias), ("after-softmax bias", needs.prob_bias),
                     ("value term over the probabilities", needs.value_term), ("score transform", needs.score_transform)):
        if on:
            raise ValueError(
                f"linear attention never forms the scores, so the {hook} of {what} cannot apply; encodings on the "
                "input or on q and k (NoPE, sinusoidal, learned, RoPE, SPE) work with it"
            )


def _linear_plan(inputs: PlanInputs) -> Plan:
    mask, backend, feature_map = inputs.mask, inputs.backend, inputs.feature_map
    if backend != "auto":
        raise ValueError(
            f"backend={backend!r} is a softmax kernel; linear attention (feature map {feature_map}) has its own "
            "path: use backend='auto'"
        )
    check_linear_mask(mask, inputs.q_len, inputs.kv_len)
    if mask is not None and (mask.causal or mask.q_segments is not None):
        return Plan("linear", f"linear attention, {feature_map} features: a running state over blocks of rows, no T x T",
                    LINEAR_CHUNK_ROWS)
    return Plan("linear", f"linear attention, {feature_map} features: phi(Q) (phi(K)^T V), no T x T")


def _softmax_plan(inputs: PlanInputs) -> Plan:
    needs, mask, device, backend, what = inputs.needs, inputs.mask, inputs.device, inputs.backend, inputs.what
    batch, heads, q_len, kv_len = inputs.batch, inputs.heads, inputs.q_len, inputs.kv_len
    bias_per_batch, bias_learned = inputs.bias_per_batch, inputs.bias_learned
    on_cuda = device.type == "cuda"
    grad = inputs.needs_grad or bias_learned
    prob_bias = needs.prob_bias
    offset_ok = needs.offset_values and needs.score_bias and inputs.consecutive_causal and backend in ("auto", "dense")
    needs_probs = needs.value_term and not offset_ok

    if needs_probs and backend not in ("auto", "math"):
        raise ValueError(f"backend={backend!r} cannot serve {what}: it needs the attention probabilities; use 'math' or 'auto'")
    if needs.score_transform and backend not in ("auto", "math"):
        raise ValueError(f"backend={backend!r} cannot serve {what}: it transforms the whole score matrix; use 'math' or 'auto'")
    key_column = _key_column_refusal(inputs)
    if needs.score_bias and backend == "sdpa" and key_column is not None:
        raise ValueError(f"backend='sdpa' cannot apply the score bias of {what}: {key_column}; use 'auto', 'dense', "
                         "'flex' or 'math'")
    if backend == "flex":
        if not flex_available():
            raise ValueError("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)")
        if device.type == "cpu" and grad:
            raise ValueError(
                "backend='flex' has no backward pass on CPU; use 'dense' (or 'auto') for training on CPU, "
                "or call under torch.no_grad()"
            )
        refusal = flex_refusal(inputs)
        if refusal is not None:
            raise ValueError(f"backend='flex' cannot serve this call: {refusal}; use 'dense' or 'auto'")

    def dense(reason: str, **extra) -> Plan:
        rows = kernels.dense_chunk_rows(batch, heads, kv_len, q_len,
                                        bias_per_batch or (mask is not None and mask.per_batch))
        return Plan("dense", reason, rows, prob_bias=prob_bias, **extra)

    def math(reason: str) -> Plan:
        rows = (kernels.math_chunk_rows if _tiled_transform(inputs) else kernels.chunk_rows)(batch, heads, kv_len, q_len)
        return Plan("math", reason, rows, prob_bias=False)

    if backend == "math":
        return math("asked for (backend='math')")
    if backend == "flex":
        return Plan("flex", "asked for (backend='flex')", prob_bias=prob_bias)
    if backend == "sdpa":
        if needs.score_bias:
            return Plan("sdpa", "asked for (backend='sdpa'): the bias's key term as one more key column",
                        prob_bias=prob_bias, key_column=True)
        return Plan("sdpa", "asked for (backend='sdpa')", prob_bias=prob_bias)
    if backend == "dense":
        if not needs.score_bias:
            return Plan("sdpa", "asked for 'dense' with no score bias: the masks go to SDPA as they would anyway",
                        prob_bias=prob_bias)
        return dense("asked for (backend='dense')", offset_values=offset_ok)

    # backend == "auto"
    if offset_ok:
        return dense(
            "value term over clipped offsets, causal over consecutive positions: read from the fused "
            "kernel's log-sum-exp and a few diagonals", offset_values=True,
        )
    if needs_probs:
        return math("the value term needs the attention probabilities")
    if needs.score_transform:
        return math("the encoding transforms the whole score matrix")
    refusal = flex_refusal(inputs) if on_cuda and flex_available() else "no FlexAttention"
    if not needs.score_bias:
        if on_cuda and _needs_square_mask(mask, q_len, kv_len):
            if refusal is None:
                return Plan("flex", "a mask SDPA could only take as a T x T tensor: FlexAttention's block mask",
                            prob_bias=prob_bias)
            return Plan("sdpa", f"a mask SDPA could only take as a T x T tensor, and {refusal}: SDPA with that tensor",
                        prob_bias=prob_bias)
        return Plan("sdpa", "nothing touches the scores: SDPA's fused kernel", prob_bias=prob_bias)
    if on_cuda and refusal is None:
        return Plan("flex", "score bias on CUDA: FlexAttention score_mod", prob_bias=prob_bias)
    if not on_cuda and key_column is None and not decoding_step(inputs):
        return Plan("sdpa", "a bias of the key alone (and a constant per row, which softmax drops): one more key "
                    "column into SDPA's fused kernel, backward included", prob_bias=prob_bias, key_column=True)
    if on_cuda:
        return dense(f"score bias on CUDA, but {refusal}: the bias chunk by chunk into the fused kernel")
    return dense("score bias off CUDA: the bias chunk by chunk into the fused kernel")
