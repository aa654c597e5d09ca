"""The position-encoding interface: :class:`PositionEncoding` and its four hook points (``input``,
``qk``, ``score_bias``, ``post_softmax``; the table in README.md, "One core, four hook points").

Positions are always explicit arguments: ``q_pos`` ``[B or 1, Tq]`` and ``kv_pos`` ``[B or 1, Tk]``
(integer or float; a trailing coordinate axis for 2D encodings). Modules hold parameters and
constant buffers only, never per-call state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import Tensor, nn

from .pairwise import PairwiseBias

if TYPE_CHECKING:
    from .decoding_state import LayerDecodingState


class Hook(str, enum.Enum):
    INPUT = "input"
    QK = "qk"
    SCORE_BIAS = "score_bias"
    POST_SOFTMAX = "post_softmax"


@dataclass(frozen=True)
class AttentionNeeds:
    """What an encoding asks of the attention core; the kernel plan reads nothing else. Each field
    says whether the encoding uses the :class:`PositionEncoding` method of that role (``score_transform``:
    :meth:`~PositionEncoding.transform_scores`; ``offset_values``: the value term's clipped-offset
    form; ``linear_only``: the class attribute of that name; ``tiled_transform``:
    :meth:`~PositionEncoding.transform_scores_tiled` is implemented; ``own_transform_backward``:
    :meth:`~PositionEncoding.transform_softmax_backward` is implemented).
    """

    qk: bool = False
    score_bias: bool = False
    score_transform: bool = False
    prob_bias: bool = False
    value_term: bool = False
    offset_values: bool = False
    linear_only: bool = False
    tiled_transform: bool = False
    own_transform_backward: bool = False


NO_NEEDS = AttentionNeeds()


class PositionEncoding(nn.Module):
    """Base class of every encoding. Subclasses set ``hooks`` and implement those methods.

    Attributes (class-level defaults; an instance may override them):
        hooks: the hook points the encoding uses.
        causal_only: the encoding is defined for causal attention only (xPos, FIRE, CoPE);
            an instance may override it (ALiBi is causal-only unless symmetric).
        supports_kv_cache: cached decoding gives the same result as a full forward.
        needs_probs: ``value_term`` is implemented; only the math path can serve it.
        needs_scores: ``transform_scores`` is implemented (part of the score-bias hook); only
            the math path can serve it.
        per_layer: models build one instance per block (RoPE-Mixed, 2D relative bias) instead
            of sharing one across blocks.
        num_heads: the query head count the instance was built for (per-head parameters), or
            None when it works with any; the core checks it on every call.
        num_prefix_tokens: leading tokens (class token, registers) that a 2D grid encoding
            leaves out, or None for encodings that know no grid.
        linear_only: the encoding is defined for linear attention only (SPE); the plan refuses
            it on a softmax path.

    What the core does with an encoding is read from :meth:`attention_needs` only.
    """

    hooks: ClassVar[frozenset[Hook]] = frozenset()
    # An input encoding the models add between blocks (PEG: conditional on the features there)
    # rather than once before the first block; the hook is still ``input``.
    between_blocks: ClassVar[bool] = False
    causal_only: ClassVar[bool] = False
    supports_kv_cache: ClassVar[bool] = True
    needs_probs: ClassVar[bool] = False
    needs_scores: ClassVar[bool] = False
    per_layer: ClassVar[bool] = False
    linear_only: ClassVar[bool] = False
    num_heads: int | None = None
    num_prefix_tokens: int | None = None

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, T, C]``, ``positions [B or 1, T]`` -> encoded features ``[B, T, C']``."""
        raise TypeError(f"{type(self).__name__} has no input hook")

    def transform_qk(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]`` -> transformed ``(q, k)``: of the same
        shapes, except for an encoding whose :meth:`qk_width` differs (SPE: ``[B, Hq, T, R]`` both)."""
        raise TypeError(f"{type(self).__name__} has no q/k hook")

    def qk_width(self, head_dim: int) -> int:
        """The width of the queries and keys after :meth:`transform_qk` for inputs of width
        ``head_dim`` (a linear attention's feature map is built for it). Default: unchanged."""
        return head_dim

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        """Additive pre-softmax bias. ``q`` and ``k`` are given for content-dependent biases."""
        raise TypeError(f"{type(self).__name__} has no score-bias hook")

    def decode_score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
                          state: LayerDecodingState | None = None) -> PairwiseBias:
        """The decoding hook: :meth:`score_bias` for a decoding step
        (:func:`~posenc.common.planning.decoding_step`), with the same values; an override computes
        a few rows against the whole KV cache another way, and may keep what it computed from the
        cached keys in ``state`` (the layer's :class:`~posenc.common.decoding_state.LayerDecodingState`,
        when the caller passed one) to extend it next step (docs/architecture.md, "Add an encoding
        with a decoding hook"). Default: :meth:`score_bias`."""
        return self.score_bias(q, k, q_pos, kv_pos)

    def transform_scores(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None
    ) -> Tensor:
        """New scores from the whole score matrix (``needs_scores``; the math path only).

        ``scores [B, H, Tq, Tk]`` are ``q.k * scale`` plus the encoding's score bias, finite at
        every pair; ``q [B, H, Tq, D]`` and ``k [B, H, Tk, D]`` (key heads already repeated);
        ``allowed`` the boolean mask ``[B or 1, 1, Tq, Tk]`` or None. Masked pairs are set to
        ``-inf`` by the core after this call.
        """
        raise TypeError(f"{type(self).__name__} has no score transform")

    def transform_scores_tiled(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None
    ) -> Tensor | None:
        """Optional: :meth:`transform_scores` computed in tiles of its own that keep little beside
        the scores (CAPE's MLP a tile of pairs at a time, its hidden layer never stored), with the
        same arguments and result, or None for an input it cannot take (the core then calls
        :meth:`transform_scores`). Whether it is called is the plan's choice
        (:attr:`~posenc.common.planning.Plan.tiled_transform`: on CPU, rows in chunks, not
        traced), which also gives the math path taller chunks for it. Default: None."""
        return None

    def decode_transform_scores(
        self, scores: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor, allowed: Tensor | None,
        state: LayerDecodingState | None = None,
    ) -> Tensor:
        """The decoding hook of the score transform: :meth:`transform_scores` for a decoding step
        (:func:`~posenc.common.planning.decoding_step`: a few rows, no gradient, not traced), with
        the same values; an override may read what it keeps between steps (CAPE's static bias by
        distance). ``state`` as for :meth:`decode_score_bias`. Default: :meth:`transform_scores`."""
        return self.transform_scores(scores, q, k, q_pos, kv_pos, allowed)

    def transform_softmax_backward(
        self, scores: Tensor, centered_grad: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, kv_pos: Tensor,
        allowed: Tensor | None,
    ) -> tuple[Tensor, Tensor, tuple[tuple[Tensor, Tensor], ...]] | None:
        """Optional: the math path's backward of one block of rows in one pass, ``P =
        softmax(mask(transform(S)))`` and the gradients through the transform and the softmax
        together. ``scores`` ``S [B, H, rows, keys]`` as :meth:`transform_scores` takes
        them; ``centered_grad`` ``dO V^T - rowsum(dO * O)`` ``[B, H, rows, keys]``, so that the
        gradient of the transformed scores is ``P * centered_grad``; ``allowed`` as there
        (:func:`~posenc.common.checks.check_transform_backward_inputs` checks all three). It reads
        ``scores`` and ``centered_grad`` and writes neither (returning None, the core goes on with
        them).

        Returns ``(P, dS, ((tensor, gradient), ...))`` -- the probabilities (zero outside
        ``allowed`` and on rows that see no key), the gradient of ``S`` and of the encoding's
        tensors that need one; a transform that reads ``q`` or ``k`` (CoPE's positional logits
        read ``q``) adds the gradient it sends there as ``(q, gradient)``, ``q`` the very tensor
        passed in -- or None for an input it cannot take, which the core then differentiates
        through :meth:`transform_scores` itself. Whether it is called is the plan's choice
        (:attr:`~posenc.common.planning.Plan.math_backward`), not the encoding's: it does not
        check the device. Not overriding it keeps the core's backward."""
        return None

    def prob_bias(self, q_pos: Tensor, kv_pos: Tensor) -> PairwiseBias:
        """Additive bias on the attention probabilities (masked entries are excluded by the core)."""
        raise TypeError(f"{type(self).__name__} has no after-softmax bias")

    def value_term(self, probs: Tensor, q_pos: Tensor, kv_pos: Tensor) -> Tensor:
        """Extra output from the probabilities ``[B, H, Tq, Tk]`` -> ``[B, H, Tq, D]`` (the math
        path, unless :meth:`offset_values` gives the fused form)."""
        raise TypeError(f"{type(self).__name__} has no value term")

    def math_parameters(self) -> tuple[Tensor, ...]:
        """The tensors :meth:`transform_scores` and :meth:`value_term` read directly that may need
        a gradient (the math path differentiates each chunk against them). Default: every
        parameter. An encoding whose score bias is built from some of its parameters must leave
        those out (Shaw: only the value table), or their gradient would be counted twice: the
        bias's ``learned`` tensors already carry it."""
        return tuple(self.parameters())

    def offset_values(self) -> Tensor | None:
        """Optional fast form of :meth:`value_term`: a table ``W [2K + 1, Dv]`` such that the
        value term is ``sum_j P_ij W[clip(pos_j - pos_i, -K, K) + K]`` (Shaw). None (the
        default) when the value term has no such form."""
        return None

    @property
    def has_score_bias(self) -> bool:
        return Hook.SCORE_BIAS in self.hooks and type(self).score_bias is not PositionEncoding.score_bias

    @property
    def has_prob_bias(self) -> bool:
        return Hook.POST_SOFTMAX in self.hooks and type(self).prob_bias is not PositionEncoding.prob_bias

    def __prepare_scriptable__(self):
        """``torch.jit.script`` asks this first, of the encoding and of a model or FX graph that
        holds it: one clear refusal instead of a type-annotation error deep in the compiler."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support TorchScript (posenc encodings follow the positions of each "
            "call with Python-level shape logic); use torch.compile, torch.export or FX (torch.fx.symbolic_trace)"
        )

    def attention_needs(self) -> AttentionNeeds:
        """The attention hooks this instance uses, as the kernel plan reads them (exact: the score
        and after-softmax biases count only where implemented)."""
        return _needs(self.hooks, self.needs_probs, self.needs_scores, self.linear_only,
                      score_bias=self.has_score_bias, prob_bias=self.has_prob_bias,
                      offset_values=Hook.POST_SOFTMAX in self.hooks and bool(self.needs_probs)
                      and self.offset_values() is not None,
                      tiled_transform=type(self).transform_scores_tiled is not PositionEncoding.transform_scores_tiled,
                      own_transform_backward=type(self).transform_softmax_backward
                      is not PositionEncoding.transform_softmax_backward)


def class_needs(cls: type[PositionEncoding]) -> AttentionNeeds:
    """What any instance of ``cls`` may ask of attention, read from its declared hooks (before
    one is built: command lines check an encoding name against the attention kind up front). An
    instance's :meth:`PositionEncoding.attention_needs` is exact and can only ask for less."""
    return _needs(cls.hooks, cls.needs_probs, cls.needs_scores, cls.linear_only)


def _needs(
    hooks: frozenset[Hook], needs_probs: bool, needs_scores: bool, linear_only: bool, *,
    score_bias: bool | None = None, prob_bias: bool | None = None, offset_values: bool = False,
    tiled_transform: bool = False, own_transform_backward: bool = False,
) -> AttentionNeeds:
    """The one derivation of an encoding's needs from its hooks and flags. ``score_bias`` and
    ``prob_bias`` (None: as the hooks declare) say whether the bias methods are implemented."""
    post = Hook.POST_SOFTMAX in hooks
    return AttentionNeeds(
        qk=Hook.QK in hooks,
        score_bias=Hook.SCORE_BIAS in hooks if score_bias is None else score_bias,
        score_transform=Hook.SCORE_BIAS in hooks and bool(needs_scores),
        prob_bias=(post and not needs_probs) if prob_bias is None else prob_bias,
        value_term=post and bool(needs_probs),
        offset_values=offset_values,
        linear_only=bool(linear_only),
        tiled_transform=Hook.SCORE_BIAS in hooks and bool(needs_scores) and bool(tiled_transform),
        own_transform_backward=Hook.SCORE_BIAS in hooks and bool(needs_scores) and own_transform_backward,
    )


def attention_part(encoding: PositionEncoding | None) -> PositionEncoding | None:
    """The encoding as attention layers see it: None when it acts on the input only."""
    if encoding is None or not (encoding.hooks - {Hook.INPUT}):
        return None
    return encoding
