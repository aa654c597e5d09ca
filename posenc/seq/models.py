"""Reference sequence models on the shared encoder stack: a decoder-only :class:`CausalLM`
(with KV-cache generation, see :mod:`.generation`) and a bidirectional :class:`SequenceEncoder`
with a classification or regression head. Both take any registered encoding by name.

Sharing an encoding across layers. ``share_encoding=None`` (the default) decides per encoding:
one instance serves every layer when the encoding has no learned parameters (sharing is then
free and changes nothing), has an input hook (it acts once, before the first block), or is
shared in its paper (T5's bucket table, TUPE's position term: :data:`SHARED_IN_PAPER`);
otherwise each layer gets its own instance built from the registry (KERPLE, FIRE, CAPE, CoPE,
Shaw, ...). ``share_encoding=True``/``False`` forces one or the other.

Different encodings in different layers (Llama 4's NoPE layers among RoPE ones, Gemma's local
and global bases): ``layer_schedule`` (:mod:`.layer_schedule`).

The 1D PEG (``encoding="peg1d"``, :mod:`.peg1d`) is no input or attention hook here: like CPVT's
PEG in a ViT it sits between blocks, after each block of ``peg_blocks`` (default ``(0,)``, after
the first), one instance per block (``share_encoding=True``: one for all of them). The
:class:`CausalLM` builds it causal (left padding; cached decoding supported), the
:class:`SequenceEncoder` symmetric (it keeps a ``pool="cls"`` token out of the convolution and
reads padding tokens as zeros).
"""

from __future__ import annotations

import math
from typing import Literal, Mapping, Sequence

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.checks import check_bool, check_build, check_int, check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.kv_cache import KVCache
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, build, get
from ..training.pretrained import PretrainedMixin
from .context import load_rope_scaling_state, rope_scaling_state
from .generation import generate as _generate
from .layer_schedule import scheduled_encodings
from .peg1d import PEG1d

# Encodings whose learned parameters are shared by all layers in their paper.
SHARED_IN_PAPER = frozenset({"t5", "tupe"})


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


def _build_named(encoding: str, dims: ModelDims, options: Mapping[str, object]) -> PositionEncoding:
    """``build(encoding)`` with a size rule it refuses reported with the model's arguments it came
    from (``head_dim must be even`` alone does not say that ``dim / num_heads`` is the head_dim)."""
    try:
        return build(encoding, dims=dims, **options)
    except (TypeError, ValueError) as exc:
        derived = f"head_dim = dim / num_heads = {dims.dim} / {dims.num_heads} = {dims.head_dim}"
        message = str(exc)
        if "head_dim" in message and "head_dim" not in options:
            raise type(exc)(f"encoding {encoding!r} with dim={dims.dim}, num_heads={dims.num_heads}: {message} "
                            f"({derived})") from None
        raise


def build_layer_encodings(
    encoding: str | PositionEncoding | None,
    *,
    depth: int,
    dims: ModelDims,
    share_encoding: bool | None = None,
    encoding_options: Mapping[str, object] | None = None,
) -> PositionEncoding | list[PositionEncoding] | None:
    """What :class:`~posenc.common.block.TransformerEncoder` takes as ``encoding``: one shared
    instance, or ``depth`` per-layer instances built from the registry (see the module docstring).

    Args:
        encoding: a registered name, an instance (always shared), or None (no position signal).
        depth: number of layers.
        dims: the sizes the encoding is built for.
        share_encoding: None for the per-encoding default, or force sharing on or off.
        encoding_options: constructor arguments for :func:`posenc.build` (with a name only).
    """
    if encoding is None:
        if encoding_options:
            raise ValueError("encoding_options needs an encoding name; got encoding=None")
        return None
    if isinstance(encoding, PositionEncoding):
        if encoding_options:
            raise ValueError("encoding_options applies to an encoding given by name, not to an instance")
        if share_encoding is False:
            raise ValueError(
                f"share_encoding=False needs the encoding by name (to build one per layer); got an instance of "
                f"{type(encoding).__name__}"
            )
        return encoding
    if not isinstance(encoding, str):
        raise TypeError(f"encoding must be a registered name, a PositionEncoding or None; got {type(encoding).__name__}")
    try:
        info = get(encoding)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    if encoding_options is not None and not isinstance(encoding_options, Mapping):
        raise TypeError(f"encoding_options must be a mapping of constructor arguments or None; got "
                        f"{encoding_options!r} ({type(encoding_options).__name__})")
    options = dict(encoding_options or {})
    first = _build_named(encoding, dims, options)
    has_input = Hook.INPUT in first.hooks
    if share_encoding is None:
        has_params = any(True for _ in first.parameters())
        share_encoding = has_input or not has_params or info.name in SHARED_IN_PAPER
    if share_encoding:
        return first
    if has_input:
        raise ValueError(
            f"share_encoding=False: {encoding!r} has an input hook, which acts once before the first block; "
            "it cannot have one instance per layer"
        )
    return [first] + [_build_named(encoding, dims, options) for _ in range(depth - 1)]


def model_layer_encodings(
    encoding: str | PositionEncoding | None,
    *,
    depth: int,
    dims: ModelDims,
    share_encoding: bool | None,
    encoding_options: Mapping[str, object] | None,
    layer_schedule: Mapping[str, object] | None,
    conditional: object,
) -> PositionEncoding | list[PositionEncoding | None] | None:
    """The models' encodings: :func:`build_layer_encodings`, or one per layer from a
    ``layer_schedule`` (:mod:`.layer_schedule`); nothing when the encoding sits between blocks."""
    if layer_schedule is None:
        return None if conditional is not None else build_layer_encodings(
            encoding, depth=depth, dims=dims, share_encoding=share_encoding, encoding_options=encoding_options)
    if conditional is not None:
        raise ValueError("layer_schedule applies to attention encodings; peg1d sits between blocks")
    return scheduled_encodings(layer_schedule, encoding, depth=depth, options=dict(encoding_options or {}),
                               share=share_encoding, build=lambda name, opts: _build_named(name, dims, opts),
                               shared_in_paper=SHARED_IN_PAPER)


def build_peg_blocks(
    encoding: str | PositionEncoding | None,
    *,
    depth: int,
    dims: ModelDims,
    causal: bool,
    peg_blocks: Sequence[int] | None = None,
    share_encoding: bool | None = None,
    encoding_options: Mapping[str, object] | None = None,
    num_prefix_tokens: int = 0,
) -> dict[int, PEG1d] | None:
    """The ``conditional`` modules of :class:`~posenc.common.block.TransformerEncoder` for
    ``encoding="peg1d"`` (or a :class:`~posenc.seq.peg1d.PEG1d` instance): ``{block: PEG1d}``
    after each block of ``peg_blocks`` (default ``(0,)``); None for any other encoding.

    Args:
        causal: the model attends causally: the PEG must be causal (built so by name; an
            instance or ``encoding_options={"causal": False}`` that is not is a ValueError).
        share_encoding: True: one instance after every chosen block; otherwise one per block.
        num_prefix_tokens: leading tokens kept out of the convolution (a class token).
    """
    is_peg = isinstance(encoding, PEG1d) or (isinstance(encoding, str) and encoding == "peg1d")
    if not is_peg:
        if peg_blocks is not None:
            label = encoding if isinstance(encoding, str) or encoding is None else type(encoding).__name__
            raise ValueError(f"peg_blocks applies to encoding 'peg1d' only; got encoding={label!r}")
        return None
    blocks = (0,) if peg_blocks is None else tuple(peg_blocks)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in blocks):
        raise ValueError(f"peg_blocks must be block indices (ints); got {blocks!r}")
    blocks = tuple(sorted(set(blocks)))
    if not blocks:
        raise ValueError("peg_blocks must name at least one block for encoding 'peg1d'")
    bad = [i for i in blocks if not 0 <= i < depth]
    if bad:
        raise ValueError(f"peg_blocks {bad} are outside 0..{depth - 1} (the model has depth {depth})")
    where = "a causal model" if causal else "this model"
    if isinstance(encoding, PEG1d):
        if encoding_options:
            raise ValueError("encoding_options applies to an encoding given by name, not to an instance")
        if share_encoding is False:
            raise ValueError("share_encoding=False needs the encoding by name (to build one per block); got a PEG1d instance")
        if causal and not encoding.causal:
            raise ValueError(f"{where} needs a causal PEG1d (causal=True): symmetric padding reads the next tokens")
        if encoding.num_prefix_tokens != num_prefix_tokens:
            raise ValueError(f"the PEG1d instance keeps {encoding.num_prefix_tokens} prefix tokens out of the "
                             f"convolution; {where} has {num_prefix_tokens} (a class token counts as one)")
        return {i: encoding for i in blocks}
    options = dict(encoding_options or {})
    if "num_prefix_tokens" in options:
        raise ValueError(f"encoding_options: num_prefix_tokens is set by the model ({num_prefix_tokens} here)")
    if causal:
        if options.get("causal", True) is not True:
            raise ValueError(f"encoding_options causal={options['causal']!r}: {where} needs a causal peg1d "
                             "(symmetric padding reads the next tokens)")
        options["causal"] = True
    first = build("peg1d", dims=dims, num_prefix_tokens=num_prefix_tokens, **options)
    if share_encoding:
        return {i: first for i in blocks}
    return {i: first if n == 0 else build("peg1d", dims=dims, num_prefix_tokens=num_prefix_tokens, **options)
            for n, i in enumerate(blocks)}


def model_encodings(encoder: TransformerEncoder) -> list[PositionEncoding]:
    """The distinct encoding instances of an encoder stack (input, every layer's and the
    conditional ones between blocks)."""
    seen: dict[int, PositionEncoding] = {}
    if encoder.encoding is not None:
        seen[id(encoder.encoding)] = encoder.encoding
    for block in encoder.blocks:
        enc = block.attn.encoding
        if enc is not None:
            seen.setdefault(id(enc), enc)
    for module in encoder.conditional.values():
        if isinstance(module, PositionEncoding):
            seen.setdefault(id(module), module)
    return list(seen.values())


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

    def new_cache(self) -> KVCache:
        """An empty KV cache for this model (refused when an encoding does not support one)."""
        self._check_cache_allowed()
        return KVCache(self.depth)

    def _check_cache_allowed(self) -> None:
        refusing = [type(e).__name__ for e in self.encodings if not e.supports_kv_cache]
        if refusing:
            raise ValueError(
                f"{', '.join(refusing)} does not support a KV cache (cached decoding would differ from the full "
                "forward pass); decode with use_cache=False, which recomputes the whole prefix at each step"
            )

    def forward(self, tokens: Tensor, *, positions: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Logits ``[B, T, V]`` of ``tokens [B, T]``.

        Args:
            positions: ``[B or 1, T]``; default ``0 .. T-1``, or continuing after the cache.
            cache: a :class:`~posenc.KVCache` of ``depth`` layers, filled as a side effect.
        """
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a [batch, length] long tensor; got {tuple(tokens.shape)} {tokens.dtype}")
        if cache is not None:
            self._check_cache_allowed()
        x = self.embed(tokens) * self.embed_scale
        h = self.encoder(x, positions=positions, mask=AttentionMask(causal=True), cache=cache)
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
        h = self.embed(x) * self.embed_scale
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
