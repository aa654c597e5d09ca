"""Which position encoding each layer of a sequence model gets (:class:`~.models.CausalLM`,
:class:`~.models.SequenceEncoder`): what :class:`~posenc.common.block.TransformerEncoder` takes as
``encoding`` and as ``conditional``.

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
:class:`~.models.CausalLM` builds it causal (left padding; cached decoding supported), the
:class:`~.models.SequenceEncoder` symmetric (it keeps a ``pool="cls"`` token out of the convolution and
reads padding tokens as zeros).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..common.block import TransformerEncoder
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import ModelDims, build, get
from .layer_schedule import scheduled_encodings
from .peg1d import PEG1d

# Encodings whose learned parameters are shared by all layers in their paper.
SHARED_IN_PAPER = frozenset({"t5", "tupe"})


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


__all__ = ["SHARED_IN_PAPER", "build_layer_encodings", "model_layer_encodings", "build_peg_blocks", "model_encodings"]
