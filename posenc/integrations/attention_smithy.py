"""posenc's encodings inside AttentionSmithy models (``pip install 'posenc[smithy]'``).

AttentionSmithy (https://github.com/xomicsdatascience/AttentionSmithy, ``attention_smithy`` 1.3)
wires positions through a ``NumericEmbeddingManager`` holding strategies of three kinds, and runs
attention through an attention method given to its ``MultiheadAttention``. This module gives both:

* :func:`strategies` -- AttentionSmithy strategy objects for every posenc encoding whose hooks its
  three kinds can express: an ``input`` hook becomes a ``NumericEmbeddingStrategyBase``, a rotary
  ``qk`` hook a ``MatrixModificationStrategyBase`` (RoPE with every scaling), a ``score_bias`` hook
  an ``AttentionBiasStrategyBase`` (ALiBi, T5, KERPLE, FIRE, vector eRPE, TUPE's position term,
  xPos). They run under AttentionSmithy's own ``StandardAttentionMethod``.
* :class:`PosencAttentionMethod` -- a drop-in for ``StandardAttentionMethod`` that runs posenc's
  attention core (:func:`posenc.common.attention.attend`: fused and chunked kernels) for every
  posenc encoding, the ones no strategy can express included (eRPE, Shaw, Transformer-XL,
  DeBERTa, CAPE, CoPE), and honours the strategies already in the manager.

::

    from attention_smithy.components import MultiheadAttention
    from attention_smithy.numeric_embeddings import NumericEmbeddingManager
    from posenc.integrations.attention_smithy import PosencAttentionMethod, strategies

    manager = NumericEmbeddingManager(strategies("t5", num_heads=8, options={"bidirectional": True}))
    attention = MultiheadAttention(512, 8, PosencAttentionMethod())          # posenc's kernels
    # or: the encoding inside the method, for any posenc encoding
    attention = MultiheadAttention(512, 8, PosencAttentionMethod(posenc.build("cope", head_dim=64, max_len=512),
                                                                 is_causal_masking=True))

Conventions. AttentionSmithy has four encodings of its own; for the three posenc has too,
``convention="attention_smithy"`` reproduces AttentionSmithy's results, and ``convention="posenc"``
(the default) gives posenc's canonical form:

============  ==========================================  =============================================
encoding      ``convention="posenc"`` (default)           ``convention="attention_smithy"``
============  ==========================================  =============================================
rope          half-split pairs ``(k, k + D/2)`` (NeoX,    interleaved pairs ``(2k, 2k+1)``
              Llama)                                      (rotary-embedding-torch)
alibi         paper slopes ``2^(-8h/H)``; causal          slopes ``(1/2)^h`` (``slope_degree``);
              ``-m(i - j)`` (future keys ``-inf``),       ``-m|i - j|`` always (``symmetric`` ignored)
              ``options={"symmetric": True}`` for
              ``-m|i - j|``
sinusoidal    angles in float64, cast to the input's      angles in float32, as AttentionSmithy does
              dtype
learned       init std 0.02                               init std 1.0 (``nn.Embedding``'s)
============  ==========================================  =============================================

Positions and cross attention follow AttentionSmithy's kwargs. With ``positions="index"`` (the
default, as its ``*PositionEmbedding`` classes) a strategy uses ``0 .. T-1`` of each tensor it is
given. With ``positions="custom"`` (as its ``*CustomEmbedding`` classes) it reads the same kwargs
those read: ``custom_values [B, T]`` (input), ``rotary_custom_values [T] or [B, T]`` (q/k, applied
to queries and keys alike), ``alibi_query_values [B, Tq]`` and ``alibi_key_values [B, Tk]`` (score
bias). A score-bias strategy called with ``Tq != Tk`` is in cross attention: like AttentionSmithy's
ALiBi it then adds nothing unless built with ``allow_cross_attention=True``.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, Mapping

import torch
from torch import Tensor, nn

from ..common.attention import attend, attend_with_weights
from ..common.checks import check_bool, check_choice, check_int, check_number, check_positions
from ..common.encoding import Hook, PositionEncoding, attention_part
from ..common.masks import AttentionMask
from ..common.planning import check_backend
from ..common.registry import available, get
from ..training.report import optional
from ..seq.alibi import ALiBi, alibi_penalty
from ..seq.rope import RotaryEncoding
from ..seq.sinusoidal import SinusoidalEncoding
from ..seq.tupe import TUPE
from ..seq.xpos import XPos

_WHAT = "posenc.integrations.attention_smithy"
optional("attention_smithy", _WHAT)  # one MissingExtra line naming the extra when it is missing
from attention_smithy.numeric_embeddings import NumericEmbeddingManager  # noqa: E402
from attention_smithy.numeric_embeddings.abstract_embedding_strategies import (  # noqa: E402
    AttentionBiasStrategyBase,
    MatrixModificationStrategyBase,
    NumericEmbeddingStrategyBase,
)

__all__ = [
    "CONVENTIONS", "POSITIONS", "PosencAttentionMethod", "PosencBiasStrategy", "PosencInputStrategy",
    "PosencRotaryStrategy", "expressible", "smithy_alibi_slopes", "strategies",
]

Convention = Literal["posenc", "attention_smithy"]
CONVENTIONS = ("posenc", "attention_smithy")
POSITIONS = ("index", "custom")
# 1D encodings: the others need grid coordinates or a graph, which AttentionSmithy's kwargs do not carry.
STRATEGY_MODALITIES = ("seq", "timeseries")
# q/k transforms that treat queries and keys differently (xPos scales them by opposite powers,
# TUPE divides queries by sqrt 2): a matrix modification, applied to q and k alike, cannot hold them,
# so their bias strategy adds the change of the scores instead (exact, one extra q.k product).
_QK_AS_SCORE_CHANGE = (XPos, TUPE)


def smithy_alibi_slopes(num_heads: int, slope_degree: float = 2.0) -> Tensor:
    """AttentionSmithy's ALiBi slopes ``(1 / slope_degree)^h``, ``h = 1..H`` (float32 ``[H]``).
    Equal to the paper's ``2^(-8h/H)`` only for ``H = 8`` with ``slope_degree = 2``;
    ``slope_degree = 2^(8/H)`` reproduces the paper for ``H`` a power of two."""
    check_int("num_heads", num_heads, minimum=1)
    check_number("slope_degree", slope_degree, minimum=1.0, strict=True)
    return (1.0 / float(slope_degree)) ** torch.arange(1, num_heads + 1, dtype=torch.float64).to(torch.float32)


def _name_of(encoding: PositionEncoding) -> tuple[str, str] | None:
    """(registered name, modality) of ``encoding``'s class, or None for an unregistered class."""
    for info in available():
        if info.cls is type(encoding):
            return info.name, info.modality
    return None


def _refusal(encoding: PositionEncoding, name: str, why: str) -> ValueError:
    if encoding.attention_needs().linear_only:
        instead = "posenc's linear attention runs it (posenc.MultiheadAttention(..., feature_map=...))"
    elif type(encoding).between_blocks:
        instead = "add its encode_input(x, positions) between the blocks of the model"
    else:
        instead = (f"run it in posenc's core instead: MultiheadAttention(dim, heads, "
                   f"PosencAttentionMethod(encoding=posenc.build({name!r}, ...)))")
    return ValueError(f"{name} ({type(encoding).__name__}) cannot be expressed as AttentionSmithy strategies: {why}; {instead}")


def expressible(encoding: PositionEncoding) -> str | None:
    """None when :func:`strategies` can express ``encoding``, else the reason it cannot."""
    found = _name_of(encoding)
    if found is not None and found[1] not in STRATEGY_MODALITIES:
        return (f"a {found[1]} encoding needs {'grid coordinates' if found[1] == 'vision' else 'the graph'}, "
                "which AttentionSmithy's strategies are not given")
    needs = encoding.attention_needs()
    hooks = encoding.hooks
    if Hook.INPUT in hooks and type(encoding).between_blocks:
        return "it is added between blocks, not once to the input"
    if needs.linear_only:
        return "it is defined for linear attention only"
    if needs.prob_bias or needs.value_term:
        return "it acts after the softmax (on the probabilities or the values), which no strategy reaches"
    if needs.score_transform:
        return "it transforms the whole score matrix, which no strategy is given"
    if needs.qk and not isinstance(encoding, (RotaryEncoding,) + _QK_AS_SCORE_CHANGE):
        return "its q/k transform is neither a rotation of each tensor alone nor a rescaling the scores can carry"
    return None


class PosencInputStrategy(NumericEmbeddingStrategyBase):
    """A posenc input encoding (sinusoidal, learned, tAPE) as AttentionSmithy's
    ``NumericEmbeddingStrategyBase``: ``NumericEmbeddingManager.create_positional_or_custom_embedding``
    returns its term, which the model adds to the token embedding.

    Args:
        encoding: an input encoding whose term does not read the features (not PEG).
        positions: "index" (``0 .. T-1``) or "custom" (the ``custom_values [B, T]`` kwarg).
        float32_angles: AttentionSmithy's sinusoidal: angles in float32 (sinusoidal only).

    Reads the kwargs ``token_embedding [B, T, C]`` (required) and, with ``positions="custom"``,
    ``custom_values [B or 1, T]``; others are ignored. Returns ``[B or 1, T, C]``.
    """

    def __init__(self, encoding: PositionEncoding, positions: str = "index", float32_angles: bool = False) -> None:
        super().__init__()
        if not isinstance(encoding, PositionEncoding) or Hook.INPUT not in encoding.hooks:
            raise TypeError(f"encoding must be a posenc input encoding; got {type(encoding).__name__}")
        check_choice("positions", positions, POSITIONS)
        check_bool("float32_angles", float32_angles)
        if float32_angles and not isinstance(encoding, SinusoidalEncoding):
            raise ValueError(f"float32_angles is AttentionSmithy's sinusoidal convention; got {type(encoding).__name__}")
        self.encoding, self.positions, self.float32_angles = encoding, positions, float32_angles

    def create_positional_or_custom_embedding(self, **kwargs: Any) -> Tensor:
        # AttentionSmithy's manager passes every kwarg of the call to every strategy.
        if "token_embedding" not in kwargs:
            raise TypeError("create_positional_or_custom_embedding needs token_embedding=[batch, tokens, dim]")
        return self(kwargs["token_embedding"], kwargs.get("custom_values"))

    def forward(self, token_embedding: Tensor, custom_values: Tensor | None = None) -> Tensor:
        """``token_embedding [B, T, C]`` -> the encoding's term ``[B or 1, T, C]``."""
        if not isinstance(token_embedding, Tensor) or token_embedding.dim() != 3:
            raise ValueError(f"token_embedding must be a [batch, tokens, dim] tensor; got {_shape(token_embedding)}")
        pos = _positions(self.positions, "custom_values", custom_values, token_embedding.shape[1], token_embedding)
        if self.float32_angles:
            return _smithy_sinusoid(pos, self.encoding.dim, self.encoding.base).to(token_embedding.dtype) * self.encoding.scale
        zeros = token_embedding.new_zeros((pos.shape[0],) + tuple(token_embedding.shape[1:]))
        term = self.encoding.encode_input(zeros, pos)  # 0 + term: exactly the term
        if term.shape != zeros.shape:
            raise ValueError(f"{type(self.encoding).__name__} changes the width to {term.shape[-1]}; AttentionSmithy adds "
                             "the term to the token embedding, so it must keep it")
        return term


class PosencRotaryStrategy(MatrixModificationStrategyBase):
    """A posenc rotary encoding (``rope`` and every ``rope_*`` scaling) as AttentionSmithy's
    ``MatrixModificationStrategyBase``; its ``MultiheadAttention`` applies it to the queries and then
    to the keys.

    Args:
        encoding: a :class:`~posenc.seq.rope.RotaryEncoding` (any scaling, any pairing).
        positions: "index" (``0 .. T-1`` of each tensor) or "custom" (``rotary_custom_values``).

    Reads, with ``positions="custom"``, ``rotary_custom_values [T] or [B or 1, T]`` (the same for
    queries and keys, as AttentionSmithy's ``RotaryCustomEmbedding``); other kwargs are ignored.
    A length-dependent scaling (dynamic NTK, LongRoPE) takes the length from each tensor's own
    positions, so in cross attention queries and keys may get different frequencies.
    """

    def __init__(self, encoding: RotaryEncoding, positions: str = "index") -> None:
        super().__init__()
        if not isinstance(encoding, RotaryEncoding):
            raise TypeError(f"encoding must be a posenc rotary encoding (RotaryEncoding); got {type(encoding).__name__}")
        check_choice("positions", positions, POSITIONS)
        self.encoding, self.positions = encoding, positions

    def modify_matrix(self, target_matrix: Tensor, **kwargs: Any) -> Tensor:
        return self(target_matrix, kwargs.get("rotary_custom_values"))

    def forward(self, target_matrix: Tensor, rotary_custom_values: Tensor | None = None) -> Tensor:
        """``target_matrix [B, H, T, D]`` (queries or keys) -> rotated, same shape."""
        if not isinstance(target_matrix, Tensor) or target_matrix.dim() != 4:
            raise ValueError(f"target_matrix must be a [batch, heads, tokens, head_dim] tensor; got {_shape(target_matrix)}")
        pos = _positions(self.positions, "rotary_custom_values", rotary_custom_values, target_matrix.shape[2], target_matrix)
        # The rotation of a query and of a key are the same: rotate this tensor as the queries,
        # with no keys (a rotary transform skips an empty key tensor).
        rotated, _ = self.encoding.transform_qk(target_matrix, target_matrix[:, :, :0], pos, pos[:, :0])
        return rotated


class PosencBiasStrategy(AttentionBiasStrategyBase):
    """A posenc score-bias encoding as AttentionSmithy's ``AttentionBiasStrategyBase``: the dense
    bias ``[B or 1, H, Tq, Tk]`` its ``StandardAttentionMethod`` adds to the scores.

    Args:
        encoding: ALiBi, T5, KERPLE, FIRE, vector eRPE, TUPE, xPos, ... (:func:`expressible`).
            For xPos and TUPE, whose q/k transform treats queries and keys differently, the bias
            also carries the change that transform makes to ``q.k / sqrt(D)`` (computed from the
            ``query`` and ``key`` kwargs, exact; give the model no other q/k strategy then).
        positions: "index" or "custom" (``alibi_query_values``, ``alibi_key_values``).
        allow_cross_attention: add the bias when ``Tq != Tk`` too (positions ``0 .. Tq-1`` and
            ``0 .. Tk-1``); by default nothing is added there, as AttentionSmithy's ALiBi does.
        smithy_alibi_slope_degree: with an ALiBi encoding, use AttentionSmithy's formula instead:
            slopes ``(1/degree)^h`` and ``-m|i - j|`` (None: posenc's).

    Reads the kwargs ``query [B, H, Tq, D]`` and ``key [B, H, Tk, D]`` (given by
    ``StandardAttentionMethod``) and, with ``positions="custom"``, ``alibi_query_values [B or 1, Tq]``
    and ``alibi_key_values [B or 1, Tk]``; others are ignored. A causal-only encoding (ALiBi's and
    KERPLE's causal forms, FIRE, xPos) folds the causal mask into its bias: keys after the query
    get ``-inf``, so it stays what it is defined as under any method.
    """

    def __init__(
        self,
        encoding: PositionEncoding,
        positions: str = "index",
        allow_cross_attention: bool = False,
        smithy_alibi_slope_degree: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(encoding, PositionEncoding):
            raise TypeError(f"encoding must be a posenc PositionEncoding; got {type(encoding).__name__}")
        needs = encoding.attention_needs()
        qk_change = isinstance(encoding, _QK_AS_SCORE_CHANGE)
        if not (needs.score_bias or qk_change):
            raise ValueError(f"{type(encoding).__name__} has no score bias")
        check_choice("positions", positions, POSITIONS)
        check_bool("allow_cross_attention", allow_cross_attention)
        slopes = None
        if smithy_alibi_slope_degree is not None:
            if not isinstance(encoding, ALiBi):
                raise ValueError(f"smithy_alibi_slope_degree is AttentionSmithy's ALiBi formula; got {type(encoding).__name__}")
            slopes = smithy_alibi_slopes(encoding.num_heads, smithy_alibi_slope_degree)
        self.encoding, self.positions, self.allow_cross_attention = encoding, positions, allow_cross_attention
        self.qk_change = qk_change
        self.register_buffer("smithy_slopes", slopes, persistent=False)

    def create_bias_tensor(self, **kwargs: Any) -> Tensor:
        for name in ("query", "key"):
            if name not in kwargs:
                raise TypeError(f"create_bias_tensor needs {name}=[batch, heads, tokens, head_dim] (StandardAttentionMethod "
                                "passes it)")
        return self(kwargs["query"], kwargs["key"], kwargs.get("alibi_query_values"), kwargs.get("alibi_key_values"))

    def forward(
        self, query: Tensor, key: Tensor, alibi_query_values: Tensor | None = None, alibi_key_values: Tensor | None = None
    ) -> Tensor:
        """``query [B, H, Tq, D]``, ``key [B, H, Tk, D]`` -> the bias ``[B or 1, H, Tq, Tk]`` (query's dtype)."""
        for name, t in (("query", query), ("key", key)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a [batch, heads, tokens, head_dim] tensor; got {_shape(t)}")
        if query.shape[0] != key.shape[0] or query.shape[1] != key.shape[1] or query.shape[3] != key.shape[3]:
            raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)} must share batch, heads and head_dim")
        b, h, tq, _ = query.shape
        tk = key.shape[2]
        if tq != tk and not self.allow_cross_attention:
            return query.new_zeros(1, h, tq, tk)
        q_pos = _positions(self.positions, "alibi_query_values", alibi_query_values, tq, query)
        kv_pos = _positions(self.positions, "alibi_key_values", alibi_key_values, tk, key)
        enc = self.encoding
        if enc.num_heads is not None and enc.num_heads != h:
            raise ValueError(f"this {type(enc).__name__} was built for num_heads={enc.num_heads}; the attention has {h} heads")
        q, k = query, key
        total = None
        if self.qk_change:
            q, k = enc.transform_qk(query, key, q_pos, kv_pos)
            scale = query.shape[-1] ** -0.5
            total = (torch.matmul(q, k.transpose(-1, -2)) - torch.matmul(query, key.transpose(-1, -2))) * scale
        if self.smithy_slopes is not None:
            dist = (q_pos[:, None, :, None] - kv_pos[:, None, None, :]).to(torch.float32)
            bias = alibi_penalty(dist, self.smithy_slopes.float()[None, :, None, None], symmetric=True)
        elif enc.attention_needs().score_bias:
            q_idx = torch.arange(tq, device=query.device)
            kv_idx = torch.arange(tk, device=query.device)
            bias = enc.score_bias(q, k, q_pos, kv_pos).dense(b, h, q_idx, kv_idx)
        else:
            bias = None
        if bias is not None:
            bias = bias.to(query.dtype)
            total = bias if total is None else total + bias
        if enc.causal_only:
            future = (kv_pos[:, None, None, :] > q_pos[:, None, :, None])  # [B or 1, 1, Tq, Tk]
            total = total.masked_fill(future, float("-inf"))
        return total


def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, Tensor) else type(value).__name__


def _positions(mode: str, name: str, values: Tensor | None, length: int, like: Tensor) -> Tensor:
    """Positions ``[B or 1, length]``: ``0 .. length-1`` (mode "index") or the kwarg ``values``."""
    if mode == "index":
        return torch.arange(length, device=like.device).unsqueeze(0)
    if values is None:
        raise ValueError(f"this strategy reads custom positions (positions='custom'): pass {name}=[batch or 1, {length}]")
    check_positions(name, values, ndim=(1, 2))
    values = values.unsqueeze(0) if values.dim() == 1 else values
    if values.shape[-1] != length or values.shape[0] not in (1, like.shape[0]):
        raise ValueError(f"{name} must be [{length}] or [batch={like.shape[0]} or 1, {length}]; got {tuple(values.shape)}")
    return values.to(like.device)


def _smithy_sinusoid(positions: Tensor, dim: int, base: float) -> Tensor:
    """AttentionSmithy's sinusoidal table: angles ``p / base^(2k/d)`` in float32, sin at even and
    cos at odd features. ``positions [B or 1, T]`` -> ``[B or 1, T, dim]``."""
    exponent = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim
    angles = positions.to(torch.float32).unsqueeze(-1) / (float(base) ** exponent)
    table = torch.empty(positions.shape + (dim,), dtype=torch.float32, device=positions.device)
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles)
    return table


def _build(name: str, dim: int | None, num_heads: int | None, max_len: int | None, options: dict) -> PositionEncoding:
    """``posenc.build(name, ...)`` with the sizes the constructor takes (head_dim = dim // num_heads)."""
    from ..common.registry import build

    params = inspect.signature(get(name).cls.__init__).parameters
    sizes = {"dim": dim, "num_heads": num_heads, "max_len": max_len}
    if dim is not None and num_heads is not None:
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        sizes["head_dim"] = dim // num_heads
    for arg, value in sizes.items():
        if value is not None and arg in params and arg not in options:
            options[arg] = value
    return build(name, **options)


def strategies(
    name_or_encoding: str | PositionEncoding,
    *,
    dim: int | None = None,
    num_heads: int | None = None,
    max_len: int | None = None,
    options: Mapping[str, Any] | None = None,
    convention: Convention = "posenc",
    positions: Literal["index", "custom"] = "index",
    allow_cross_attention: bool = False,
    slope_degree: float = 2.0,
) -> list[nn.Module]:
    """AttentionSmithy strategy objects for a posenc encoding: the list to give
    ``NumericEmbeddingManager`` (one strategy per hook; they hold the encoding, so its parameters
    train with the model).

    Args:
        name_or_encoding: a registered 1D encoding name (built here) or a built encoding.
        dim: the model width, passed to the constructor where it takes it (``head_dim = dim //
            num_heads`` too); by name only.
        num_heads: query heads, likewise.
        max_len: the longest sequence, likewise.
        options: other constructor arguments (``{"num_buckets": 64}``), checked by
            :func:`posenc.build`; by name only.
        convention: "posenc" or "attention_smithy" for rope, alibi, sinusoidal and learned (the
            module docstring's table); the other encodings have one form.
        positions: "index" or "custom" (AttentionSmithy's custom-value kwargs; module docstring).
        allow_cross_attention: score biases are added when ``Tq != Tk`` too (default: not, as
            AttentionSmithy's ALiBi).
        slope_degree: AttentionSmithy's ALiBi ``slope_degree`` (``convention="attention_smithy"``).

    Returns ``[PosencInputStrategy]``, ``[PosencRotaryStrategy]`` and/or ``[PosencBiasStrategy]``.
    NoPE gives ``[]``. An encoding the strategies cannot express (eRPE, Shaw, Transformer-XL,
    DeBERTa, CAPE, CoPE) is a ValueError pointing to :class:`PosencAttentionMethod`; SPE (linear
    attention only), PEG (between blocks), 2D and graph encodings are ValueErrors saying why.
    """
    check_choice("convention", convention, CONVENTIONS)
    check_choice("positions", positions, POSITIONS)
    check_bool("allow_cross_attention", allow_cross_attention)
    check_number("slope_degree", slope_degree, minimum=1.0, strict=True)
    for arg, value in (("dim", dim), ("num_heads", num_heads), ("max_len", max_len)):
        if value is not None:
            check_int(arg, value, minimum=1)
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"options must be a mapping of constructor arguments or None; got {type(options).__name__}")
    smithy = convention == "attention_smithy"
    if isinstance(name_or_encoding, PositionEncoding):
        if options or any(v is not None for v in (dim, num_heads, max_len)):
            raise ValueError("dim, num_heads, max_len and options build an encoding by name; this one is built already")
        encoding = name_or_encoding
        found = _name_of(encoding)
        name = found[0] if found else type(encoding).__name__
    elif isinstance(name_or_encoding, str):
        name = name_or_encoding
        if get(name).modality not in STRATEGY_MODALITIES:  # refused before a build that would need a grid or graph
            info = get(name)
            raise ValueError(f"{name} is a {info.modality} encoding; AttentionSmithy's strategies carry 1D positions only "
                             f"({', '.join(STRATEGY_MODALITIES)} encodings)")
        opts = dict(options or {})
        if smithy and name == "rope":
            opts.setdefault("pairing", "interleaved")
        if smithy and name == "learned":
            opts.setdefault("init_std", 1.0)
        if smithy and name == "alibi":
            opts.setdefault("symmetric", True)
        encoding = _build(name, dim, num_heads, max_len, opts)
    else:
        raise TypeError(f"name_or_encoding must be an encoding name or a posenc PositionEncoding; got "
                        f"{type(name_or_encoding).__name__}")
    why = expressible(encoding)
    if why is not None:
        raise _refusal(encoding, name, why)
    hooks = encoding.hooks  # none (NoPE): no strategy at all
    out: list[nn.Module] = []
    if Hook.INPUT in hooks:
        out.append(PosencInputStrategy(encoding, positions, float32_angles=smithy and isinstance(encoding, SinusoidalEncoding)))
    if Hook.QK in hooks and isinstance(encoding, RotaryEncoding):
        out.append(PosencRotaryStrategy(encoding, positions))
    if encoding.attention_needs().score_bias or isinstance(encoding, _QK_AS_SCORE_CHANGE):
        degree = slope_degree if smithy and isinstance(encoding, ALiBi) else None
        out.append(PosencBiasStrategy(encoding, positions, allow_cross_attention, smithy_alibi_slope_degree=degree))
    return out


def _has_bias_strategies(manager: Any) -> bool:
    return any(isinstance(m, AttentionBiasStrategyBase) for m in manager.children())


class PosencAttentionMethod(nn.Module):
    """A drop-in for AttentionSmithy's ``StandardAttentionMethod`` that runs posenc's attention core.

    ``MultiheadAttention(dim, heads, PosencAttentionMethod(...))`` computes what
    ``StandardAttentionMethod`` computes (scaled dot product, the manager's score biases, causal and
    padding masks, softmax, dropout) through :func:`posenc.common.attention.attend`: SDPA's fused
    kernel when nothing touches the scores, the chunked dense path or FlexAttention for a score
    bias, the math path where an encoding needs the probabilities.

    Args:
        encoding: a posenc encoding whose attention hooks (q/k, score bias, score transform,
            after-softmax) this method applies, any of them (eRPE, Shaw, Transformer-XL, DeBERTa,
            CAPE, CoPE included); None for none. It is a submodule: its parameters train. An
            input-only encoding is refused (give it to the manager through :func:`strategies`).
            For speed, hand a score-bias encoding here rather than its strategy to the manager:
            the manager's biases are materialised ``[B, H, Tq, Tk]``.
        is_causal_masking: query ``i`` sees keys ``j <= i`` (bottom-right aligned when Tq != Tk).
        dropout: attention dropout on the probabilities, applied in training mode only (then the
            explicit weights path runs: the fused kernels implement none).
        return_probabilities: return ``(outputs, probabilities)`` as ``StandardAttentionMethod``
            does, through the explicit path (:func:`~posenc.common.attention.attend_with_weights`:
            the matrix applied to V, after dropout, plus an after-softmax bias). When False (the
            default) it returns ``(outputs, None)`` and never forms the probabilities.
        backend: posenc's kernel choice ("auto", "sdpa", "flex", "dense", "math").

    The manager's strategies are honoured: its matrix modifications are applied to q and k by
    AttentionSmithy's ``MultiheadAttention`` before this method is called (so not again here), its
    score biases are built with ``create_bias_tensor(attention_score_matrix=zeros [B, H, Tq, Tk],
    query=q, key=k, **kwargs)`` (the scores themselves are never formed: a strategy reading their
    values sees zeros) and added as ``attn_bias``; ``numeric_embedding_manager=None`` is allowed.

    Call: ``forward(q, k, v, numeric_embedding_manager, padding_and_loss_attention_mask=None,
    **kwargs)`` with ``q [B, H, Tq, D]``, ``k, v [B, H, Tk, D]`` and the mask ``[B, Tk]`` (0 = not
    attended). The kwargs AttentionSmithy passes through are forwarded to the manager's bias
    strategies; this method reads ``q_pos [B or 1, Tq]`` and ``kv_pos [B or 1, Tk]`` from them
    (positions for ``encoding``; default ``0 .. T-1``). A query row whose keys are all masked gives
    zeros (``StandardAttentionMethod`` gives NaN).
    """

    def __init__(
        self,
        encoding: PositionEncoding | None = None,
        *,
        is_causal_masking: bool = False,
        dropout: float = 0.0,
        return_probabilities: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if encoding is not None and not isinstance(encoding, PositionEncoding):
            raise TypeError(f"encoding must be a posenc PositionEncoding (posenc.build(name, ...)) or None; "
                            f"got {type(encoding).__name__}")
        if encoding is not None and attention_part(encoding) is None:
            raise ValueError(f"{type(encoding).__name__} acts on the input only; give it to the NumericEmbeddingManager "
                             "through strategies(...) instead")
        check_bool("is_causal_masking", is_causal_masking)
        check_number("dropout", dropout, minimum=0.0)
        if dropout >= 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout}")
        check_bool("return_probabilities", return_probabilities)
        check_backend(backend)
        self.encoding = encoding
        self.is_causal_masking, self.dropout, self.return_probabilities = is_causal_masking, float(dropout), return_probabilities
        self.backend = backend

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        numeric_embedding_manager: NumericEmbeddingManager | None,
        padding_and_loss_attention_mask: Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        """``(outputs [B, H, Tq, D], probabilities [B, H, Tq, Tk] or None)``."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a [batch, heads, tokens, head_dim] tensor; got {_shape(t)}")
        manager = numeric_embedding_manager
        if manager is not None and not isinstance(manager, NumericEmbeddingManager):
            raise TypeError(f"numeric_embedding_manager must be an AttentionSmithy NumericEmbeddingManager or None; "
                            f"got {type(manager).__name__}")
        b, h, tq, _ = q.shape
        tk = k.shape[2]
        mask = self._mask(padding_and_loss_attention_mask, b, tk, q.device)
        attn_bias = None
        if manager is not None and _has_bias_strategies(manager):
            zeros = q.new_zeros(()).expand(b, h, tq, tk)
            extra = {n: x for n, x in kwargs.items() if n not in ("attention_score_matrix", "query", "key")}
            attn_bias = manager.create_bias_tensor(attention_score_matrix=zeros, query=q, key=k, **extra).to(q.dtype)
        q_pos, kv_pos = kwargs.get("q_pos"), kwargs.get("kv_pos")
        if q_pos is None and kv_pos is None and tq == tk and self.encoding is not None:
            # one tensor for both, as posenc's MultiheadAttention passes them: the encoding then reads
            # the positions once (RoPE's cos/sin tables, a bias's run of positions), not once per side
            q_pos = kv_pos = torch.arange(tq, device=q.device).unsqueeze(0)
        weights = self.return_probabilities or (self.training and self.dropout > 0)
        if weights:
            out, probs = attend_with_weights(
                q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=self.encoding, mask=mask, attn_bias=attn_bias,
                dropout_p=self.dropout if self.training else 0.0,
            )
            return out, (probs if self.return_probabilities else None)
        out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=self.encoding, mask=mask, attn_bias=attn_bias,
                     backend=self.backend)
        return out, None

    def _mask(self, padding: Tensor | None, batch: int, kv_len: int, device: torch.device) -> AttentionMask | None:
        """AttentionSmithy's ``padding_and_loss_attention_mask [B, Tk]`` (0 = masked) and causal flag
        as a posenc :class:`AttentionMask`."""
        key_valid = None
        if padding is not None:
            if not isinstance(padding, Tensor) or padding.dim() != 2 or padding.shape[-1] != kv_len \
                    or padding.shape[0] not in (1, batch) or padding.is_complex():
                raise ValueError(f"padding_and_loss_attention_mask must be a [batch={batch} or 1, keys={kv_len}] tensor "
                                 f"(0 = masked); got {_shape(padding)}")
            key_valid = (padding != 0).to(device)
        if key_valid is None and not self.is_causal_masking:
            return None
        return AttentionMask(causal=self.is_causal_masking, key_valid=key_valid)

    def extra_repr(self) -> str:
        return (f"is_causal_masking={self.is_causal_masking}, dropout={self.dropout}, "
                f"return_probabilities={self.return_probabilities}, backend={self.backend!r}")

