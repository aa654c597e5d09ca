"""Reference sequence models on the shared encoder stack: a decoder-only :class:`CausalLM`
(with KV-cache generation, see :mod:`.generation`) and a bidirectional :class:`SequenceEncoder`
with a classification or regression head. Both take any registered encoding by name; which
instance each layer gets (shared or one per layer, a ``layer_schedule``, the 1D PEG between
blocks) is :mod:`.model_encodings`'.
"""

from __future__ import annotations

import math
from typing import Literal, Mapping, Sequence

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.checks import check_bool, check_int, check_number
from ..common.decoding_state import DecodingState
from ..common.encoding import PositionEncoding
from ..common.kv_cache import KVCache
from ..common.masks import AttentionMask
from ..common.registry import ModelDims
from ..primitives.budget import check_build
from ..training.pretrained import PretrainedMixin
from .context import load_rope_scaling_state, rope_scaling_state
from .generation import check_token_ids, generate as _generate
from .model_encodings import (  # the layers' encodings; their names stay importable from here
    SHARED_IN_PAPER,
    build_layer_encodings,
    build_peg_blocks,
    model_encodings,
    model_layer_encodings,
)


def check_model_arguments(
    model: str,
    *,
    dim: object,
    depth: object,
    num_heads: object,
    max_len: object,
    dropout: object,
    share_encoding: object,
    tokens: int,
) -> ModelDims:
    """The shared argument rules of the sequence models, each naming its argument (a config.json
    read by :func:`posenc.load` passes them as they are): ints not bools, a dropout probability,
    ``dim`` divisible by ``num_heads``, and a model that fits the machine and builds in minutes
    (``tokens``: rows of the input embedding, which grow the parameter count)."""
    for name, value in (("dim", dim), ("depth", depth), ("num_heads", num_heads), ("max_len", max_len)):
        check_int(name, value, minimum=1)
    check_number("dropout", dropout, minimum=0.0, maximum=1.0)
    if share_encoding is not None:
        check_bool("share_encoding", share_encoding)
    if dim % num_heads:  # type: ignore[operator]
        raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
    check_build(f"{model}(dim={dim}, depth={depth}, {tokens} embedding rows)", parameters=tokens * dim + depth * 12 * dim * dim,  # type: ignore[operator]
                blocks=depth)  # type: ignore[arg-type]
    return ModelDims(dim=dim, num_heads=num_heads, max_len=max_len)  # type: ignore[arg-type]


class CausalLM(nn.Module, PretrainedMixin):
    """Decoder-only language model: token embedding, pre-norm causal blocks, tied output head.

    Token embeddings are multiplied by ``sqrt(dim)`` as in Vaswani et al.: input encodings of
    unit amplitude (sinusoidal) would otherwise drown the small initial embeddings.

    Args:
        vocab_size: tokens in the vocabulary.
        dim: width.
        depth: blocks.
        num_heads: attention heads.
        encoding: a registered name (built for these sizes), an encoding instance (shared by all
            layers), or None (no position signal besides the causal mask).
        max_len: the longest sequence the encoding is built for (learned tables); other
            encodings ignore it.
        dropout: residual and MLP dropout.
        share_encoding: one encoding instance for all layers or one per layer; None chooses per
            encoding (see :mod:`posenc.seq.models`).
        encoding_options: extra constructor arguments of the named encoding
            (``{"symmetric": True}``, ``{"factor": 4.0}``, ...).
        backend: attention kernel path ("auto" picks the fastest the encoding allows).
        feature_map: None for softmax attention; ``"elu"`` or ``"favor"`` for linear attention
            (:mod:`posenc.common.linear_attention`), where only encodings on the input or on q
            and k apply (NoPE, sinusoidal, learned, RoPE, SPE, 1D PEG); one with a score bias is
            a ValueError here, at construction.
        peg_blocks: with ``encoding="peg1d"``: the blocks (0-based) after which a causal 1D PEG
            is added (default ``(0,)``); a ValueError with any other encoding.
        layer_schedule: a per-layer schedule of encodings (:mod:`.layer_schedule`): iRoPE's NoPE
            layers with Llama 4's temperature (``{"schedule": "irope", "interval": 4}``), or Gemma's
            local and global bases (``{"schedule": "local_global", ...}``); ``encoding`` names
            what the RoPE (local) layers use.

    Shapes: ``tokens [B, T]`` (long) -> logits ``[B, T, vocab_size]``.

    Decoding: :meth:`generate`; ``forward(tokens, cache=KVCache(depth))`` runs incrementally
    (positions continue after the cached ones), which encodings with
    ``supports_kv_cache = False`` refuse.

    Saving: :meth:`save_pretrained` / :meth:`from_pretrained` (:mod:`posenc.training.pretrained`);
    the RoPE scaling of each rotary layer is saved with the config, so a model switched by
    :func:`~posenc.seq.extend_context` reloads extended.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        *,
        encoding: str | PositionEncoding | None = None,
        max_len: int = 1024,
        dropout: float = 0.0,
        share_encoding: bool | None = None,
        encoding_options: Mapping[str, object] | None = None,
        backend: str = "auto",
        feature_map: str | None = None,
        peg_blocks: Sequence[int] | None = None,
        layer_schedule: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        dims = check_model_arguments("CausalLM", dim=dim, depth=depth, num_heads=num_heads, max_len=max_len,
                                     dropout=dropout, share_encoding=share_encoding, tokens=vocab_size)
        conditional = build_peg_blocks(
            encoding, depth=depth, dims=dims, causal=True, peg_blocks=peg_blocks, share_encoding=share_encoding,
            encoding_options=encoding_options,
        )
        layer_encodings = model_layer_encodings(
            encoding, depth=depth, dims=dims, share_encoding=share_encoding, encoding_options=encoding_options,
            layer_schedule=layer_schedule, conditional=conditional,
        )
        self.vocab_size, self.max_len, self.depth = vocab_size, max_len, depth
        self.embed_scale = math.sqrt(dim)
        self.embed = nn.Embedding(vocab_size, dim)
        self.feature_map = feature_map
        self.encoder = TransformerEncoder(
            dim, depth, num_heads, encoding=layer_encodings, dropout=dropout, backend=backend, feature_map=feature_map,
            conditional=conditional,
        )
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)

    @property
    def encodings(self) -> list[PositionEncoding]:
        """The distinct encoding instances the model uses."""
        return model_encodings(self.encoder)

    @property
    def supports_kv_cache(self) -> bool:
        """Whether every encoding of the model allows incremental decoding with a KV cache."""
        return all(enc.supports_kv_cache for enc in self.encodings)

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty KV cache for this model (refused when an encoding does not support one);
        ``capacity``: the tokens per sequence it reserves at the first append, when the final length
        is known (:class:`~posenc.common.kv_cache.KVCache`)."""
        self._check_cache_allowed()
        return KVCache(self.depth, capacity)

    def _check_cache_allowed(self) -> None:
        refusing = [type(e).__name__ for e in self.encodings if not e.supports_kv_cache]
        if refusing:
            raise ValueError(
                f"{', '.join(refusing)} does not support a KV cache (cached decoding would differ from the full "
                "forward pass); decode with use_cache=False, which recomputes the whole prefix at each step"
            )

    def forward(self, tokens: Tensor, *, positions: Tensor | None = None, cache: KVCache | None = None,
                decoding_state: DecodingState | None = None) -> Tensor:
        """Logits ``[B, T, V]`` of ``tokens [B, T]``.

        Args:
            positions: ``[B or 1, T]``; default ``0 .. T-1``, or continuing after the cache.
            cache: a :class:`~posenc.KVCache` of ``depth`` layers, filled as a side effect.
            decoding_state: with ``cache``, a :class:`~posenc.DecodingState` of ``depth`` layers, the
                same at every step: what encodings keep between steps instead of recomputing it
                from the cached keys (FoX's running gate sums); the result is the same within rounding.
        """
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a [batch, length] long tensor; got {tuple(tokens.shape)} {tokens.dtype}")
        if cache is not None:
            self._check_cache_allowed()
        try:
            x = self.embed(tokens) * self.embed_scale
        except IndexError:  # the embedding names no id; name it (read only then: no check on every step)
            check_token_ids(tokens, self.vocab_size)
            raise
        h = self.encoder(x, positions=positions, mask=AttentionMask(causal=True), cache=cache,
                         decoding_state=decoding_state)
        return self.head(h)

    def pretrained_state(self) -> dict:
        return rope_scaling_state(self)

    def load_pretrained_state(self, state) -> None:
        load_rope_scaling_state(self, state)

    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        use_cache: bool | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue ``tokens [B, T]`` by ``max_new_tokens``; returns ``[B, T + max_new_tokens]``.
        See :func:`posenc.seq.generation.generate`."""
        return _generate(
            self, tokens, max_new_tokens, temperature=temperature, top_k=top_k, greedy=greedy,
            use_cache=use_cache, generator=generator,
        )


Pool = Literal["mean", "cls"]
TaskKind = Literal["classification", "regression"]


class SequenceEncoder(nn.Module, PretrainedMixin):
    """Bidirectional transformer encoder with a pooled classification or regression head.

    Args:
        vocab_size: token vocabulary (inputs are ``[B, T]`` long tensors); or
        input_dim: feature width (inputs are ``[B, T, input_dim]`` float tensors). Exactly one.
        dim: width.
        depth: blocks.
        num_heads: attention heads.
        encoding: a registered name, an instance, or None. Causal-only encodings (FIRE, CoPE,
            xPos, causal ALiBi) are refused here: this model attends both ways (use
            ``encoding_options={"symmetric": True}`` for ALiBi).
        num_outputs: classes (classification) or regression targets.
        task: "classification" (logits; :meth:`loss` is cross-entropy) or "regression"
            (:meth:`loss` is the mean squared error).
        pool: "mean" over the real (unpadded) tokens, or "cls": a learned token prepended at
            position 0 (the sequence then takes positions ``1 .. T``, so ``max_len >= T + 1``).
        max_len: as for :class:`CausalLM`, like ``dropout``, ``share_encoding``, ``encoding_options``,
            ``backend`` and ``feature_map``.
        peg_blocks: with ``encoding="peg1d"``: the blocks after which a 1D PEG is added (default
            ``(0,)``); symmetric unless ``encoding_options={"causal": True}``.
        layer_schedule: as for :class:`CausalLM`.

    Shapes: ``x [B, T]`` or ``[B, T, input_dim]``, ``key_valid [B, T]`` bool (True = real
    token) -> ``[B, num_outputs]``.
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        *,
        input_dim: int | None = None,
        encoding: str | PositionEncoding | None = None,
        num_outputs: int = 2,
        task: TaskKind = "classification",
        pool: Pool = "mean",
        max_len: int = 1024,
        dropout: float = 0.0,
        share_encoding: bool | None = None,
        encoding_options: Mapping[str, object] | None = None,
        backend: str = "auto",
        feature_map: str | None = None,
        peg_blocks: Sequence[int] | None = None,
        layer_schedule: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__()
        if (vocab_size is None) == (input_dim is None):
            raise ValueError(f"give exactly one of vocab_size and input_dim; got vocab_size={vocab_size}, input_dim={input_dim}")
        for name, v in (("vocab_size", vocab_size), ("input_dim", input_dim)):
            if v is not None:
                check_int(name, v, minimum=1)
        check_int("num_outputs", num_outputs, minimum=1)
        if task not in ("classification", "regression"):
            raise ValueError(f"task must be 'classification' or 'regression'; got {task!r}")
        if pool not in ("mean", "cls"):
            raise ValueError(f"pool must be 'mean' or 'cls'; got {pool!r}")
        dims = check_model_arguments("SequenceEncoder", dim=dim, depth=depth, num_heads=num_heads, max_len=max_len,
                                     dropout=dropout, share_encoding=share_encoding,
                                     tokens=(vocab_size or input_dim) + num_outputs)
        conditional = build_peg_blocks(
            encoding, depth=depth, dims=dims, causal=False, peg_blocks=peg_blocks, share_encoding=share_encoding,
            encoding_options=encoding_options, num_prefix_tokens=1 if pool == "cls" else 0,
        )
        layer_encodings = model_layer_encodings(
            encoding, depth=depth, dims=dims, share_encoding=share_encoding, encoding_options=encoding_options,
            layer_schedule=layer_schedule, conditional=conditional,
        )
        encs = [] if layer_encodings is None else (
            [layer_encodings] if isinstance(layer_encodings, PositionEncoding)
            else [e for e in layer_encodings if e is not None]
        )
        for enc in encs:
            if enc.causal_only:
                label = encoding if isinstance(encoding, str) else type(enc).__name__
                raise ValueError(
                    f"SequenceEncoder attends in both directions, but encoding {label!r} ({type(enc).__name__}) is "
                    "defined for causal attention only; use a bidirectional encoding"
                    + (" (for ALiBi: encoding_options={'symmetric': True})" if label == "alibi" else "")
                    + " or a CausalLM"
                )
        self.vocab_size, self.input_dim, self.task, self.pool = vocab_size, input_dim, task, pool
        self.num_outputs, self.max_len = num_outputs, max_len
        if vocab_size is not None:
            self.embed: nn.Module = nn.Embedding(vocab_size, dim)
            nn.init.normal_(self.embed.weight, std=0.02)
            self.embed_scale = math.sqrt(dim)
        else:
            self.embed = nn.Linear(input_dim, dim)
            self.embed_scale = 1.0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        self.feature_map = feature_map
        self.encoder = TransformerEncoder(
            dim, depth, num_heads, encoding=layer_encodings, dropout=dropout, backend=backend, feature_map=feature_map,
            conditional=conditional,
        )
        self.head = nn.Linear(dim, num_outputs)

    @property
    def encodings(self) -> list[PositionEncoding]:
        return model_encodings(self.encoder)

    def pretrained_state(self) -> dict:
        return rope_scaling_state(self)

    def load_pretrained_state(self, state) -> None:
        load_rope_scaling_state(self, state)

    def forward(self, x: Tensor, *, key_valid: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        """``[B, num_outputs]`` logits (classification) or predictions (regression).

        Args:
            x: ``[B, T]`` token ids or ``[B, T, input_dim]`` features.
            key_valid: ``[B, T]`` bool, False for padding (padding is neither attended to nor pooled).
            positions: ``[B or 1, T]``; default ``0 .. T-1`` (``1 .. T`` with ``pool="cls"``).
        """
        if self.vocab_size is not None:
            if x.dim() != 2 or x.dtype != torch.long:
                raise ValueError(f"x must be a [batch, length] long tensor of token ids; got {tuple(x.shape)} {x.dtype}")
        elif x.dim() != 3 or x.shape[-1] != self.input_dim or not x.dtype.is_floating_point:
            raise ValueError(f"x must be a [batch, length, input_dim={self.input_dim}] float tensor; got {tuple(x.shape)} {x.dtype}")
        b, t = x.shape[:2]
        if key_valid is not None and (key_valid.dtype != torch.bool or tuple(key_valid.shape) != (b, t)):
            raise ValueError(f"key_valid must be a [batch={b}, length={t}] bool tensor; got {tuple(key_valid.shape)} {key_valid.dtype}")
        try:
            h = self.embed(x) * self.embed_scale
        except IndexError:  # a token id past the vocabulary, named as CausalLM.forward names it
            check_token_ids(x, self.vocab_size, "x")
            raise
        if positions is None:
            positions = torch.arange(t, device=x.device).unsqueeze(0)
            if self.cls_token is not None:
                positions = positions + 1
        elif positions.dim() == 1:
            positions = positions.unsqueeze(0)
        if self.cls_token is not None:
            h = torch.cat((self.cls_token.expand(b, 1, -1), h), dim=1)
            positions = torch.cat((positions.new_zeros(positions.shape[0], 1), positions), dim=1)
            if key_valid is not None:
                key_valid = torch.cat((key_valid.new_ones(b, 1), key_valid), dim=1)
        mask = AttentionMask(key_valid=key_valid) if key_valid is not None else None
        h = self.encoder(h, positions=positions, mask=mask)
        if self.cls_token is not None:
            pooled = h[:, 0]
        elif key_valid is None:
            pooled = h.mean(1)
        else:
            w = key_valid.to(h.dtype).unsqueeze(-1)
            pooled = (h * w).sum(1) / w.sum(1).clamp_min(1.0)
        return self.head(pooled)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Cross-entropy against class ids ``[B]`` (classification) or the mean squared error
        against ``[B, num_outputs]`` or ``[B]`` (regression, one output)."""
        if self.task == "classification":
            return nn.functional.cross_entropy(outputs, targets)
        if targets.dim() == 1 and self.num_outputs == 1:
            targets = targets.unsqueeze(-1)
        return nn.functional.mse_loss(outputs, targets.to(outputs.dtype))


__all__: Sequence[str] = (
    "CausalLM", "SequenceEncoder", "SHARED_IN_PAPER", "build_layer_encodings", "build_peg_blocks", "model_encodings",
    "model_layer_encodings",
)
