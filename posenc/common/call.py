"""One attention call, built and checked once: :class:`AttentionCall`. Every entry point of the
core turns its arguments into one, and the checks of this module are the only ones on the way
(docs/architecture.md, "One call through the core")."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .checks import check_number, check_positions, check_tensor
from .decoding_state import LayerDecodingState
from .encoding import NO_NEEDS, AttentionNeeds, PositionEncoding
from .linear_attention import FeatureMap
from .masks import AttentionMask
from .planning import Backend, check_backend
from .shapes import check_qkv


def check_attention_args(
    encoding: PositionEncoding | None, mask: AttentionMask | None, batch: int, heads: int, q_len: int, kv_len: int
) -> None:
    """The checks of one attention call that need no tensor data: the types of ``encoding`` and
    ``mask``, mask shapes, causal-only encodings, and the head count of encodings with per-head
    parameters (``num_heads``)."""
    if mask is not None and not isinstance(mask, AttentionMask):
        raise TypeError(
            f"mask must be an AttentionMask (e.g. AttentionMask(key_valid=valid) for a bool [B, Tk] tensor) or None; "
            f"got {type(mask).__name__}"
        )
    check_encoding(encoding)
    if mask is not None:
        mask.validate(batch, q_len, kv_len)
    if encoding is None:
        return
    name = type(encoding).__name__
    if encoding.causal_only and (mask is None or not mask.causal):
        raise ValueError(f"{name} is defined for causal attention only; pass a causal mask")
    if encoding.num_heads is not None and encoding.num_heads != heads:
        raise ValueError(f"this {name} was built for num_heads={encoding.num_heads}; the attention has {heads} query heads")


def check_encoding(encoding: PositionEncoding | None) -> None:
    """``encoding`` is a :class:`PositionEncoding` or None; else a TypeError."""
    if encoding is not None and not isinstance(encoding, PositionEncoding):
        raise TypeError(f"encoding must be a PositionEncoding (posenc.build(name, ...)) or None; got {type(encoding).__name__}")


def check_attn_bias(attn_bias: Tensor | None, batch: int, heads: int, q_len: int, kv_len: int) -> None:
    """``attn_bias`` is None or a float ``[B or 1, H or 1, Tq, Tk]`` tensor; else a ValueError."""
    if attn_bias is None:
        return
    if (not isinstance(attn_bias, Tensor) or attn_bias.dim() != 4 or not attn_bias.dtype.is_floating_point
            or attn_bias.shape[0] not in (1, batch) or attn_bias.shape[1] not in (1, heads)
            or tuple(attn_bias.shape[2:]) != (q_len, kv_len)):
        got = f"{tuple(attn_bias.shape)} {attn_bias.dtype}" if isinstance(attn_bias, Tensor) else type(attn_bias).__name__
        raise ValueError(f"attn_bias must be a float tensor [batch={batch} or 1, heads={heads} or 1, {q_len}, {kv_len}]; "
                         f"got {got}")


def normalize_positions(pos: Tensor | None, length: int, batch: int, name: str, device=None) -> Tensor:
    """Positions as ``[B or 1, T(, C)]`` (a 1D ``[T]`` gains the batch axis); None means ``0 .. T-1``.
    A tensor of real, finite numbers (never ``bool``: ``True`` would be read as position 1); the
    range an encoding allows is its own to check."""
    if pos is None:
        return torch.arange(length, device=device).unsqueeze(0)
    check_positions(name, pos)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    if pos.dim() not in (2, 3) or pos.shape[1] != length or pos.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} must have shape [{length}], [batch={batch} or 1, {length}] or [batch or 1, {length}, coords]; "
            f"got {tuple(pos.shape)}"
        )
    return pos


def _shape(t: Tensor | None) -> str:
    return "None" if t is None else f"[{', '.join(map(str, t.shape))}]"


@dataclass(frozen=True, repr=False)
class AttentionCall:
    """The checked arguments of one attention call, built by :meth:`checked` (or by
    :class:`~posenc.common.multihead.MultiheadAttention` from tensors it checked before projecting).

    The fields are the arguments of :func:`~posenc.common.attention.attend` (which says what each
    means), with the defaults filled: positions ``[B or 1, T]`` (``0 .. T-1`` unless given) and
    ``scale`` a number (``D ** -0.5`` unless given).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    q_pos: Tensor
    kv_pos: Tensor
    encoding: PositionEncoding | None = None
    mask: AttentionMask | None = None
    scale: float = 1.0
    backend: Backend = "auto"
    qk_transformed: bool = False
    feature_map: FeatureMap | None = None
    attn_bias: Tensor | None = None
    decoding_state: LayerDecodingState | None = None  # read by a decoding step's hook only

    @classmethod
    def checked(
        cls,
        q: Tensor,
        k: Tensor,
        v: Tensor,
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
    ) -> AttentionCall:
        """Check every argument once (shapes, positions, mask, encoding, bias, backend, scale: a finite
        positive number, on every path) and fill the defaults: positions ``0 .. T-1`` on ``q``'s
        device, ``scale = D ** -0.5``."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_tensor(name, t, floating=True)
        if not q.dtype == k.dtype == v.dtype:
            raise TypeError(f"q, k and v must have one dtype; got {q.dtype}, {k.dtype}, {v.dtype} (cast them first, "
                            "e.g. k.to(q.dtype))")
        if not q.device == k.device == v.device:
            raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
        check_qkv(q, k, v)
        b, hq, tq, d = q.shape
        tk = k.shape[2]
        q_pos = normalize_positions(q_pos, tq, b, "q_pos", device=q.device)
        kv_pos = normalize_positions(kv_pos, tk, b, "kv_pos", device=q.device)
        check_attention_args(encoding, mask, b, hq, tq, tk)
        check_attn_bias(attn_bias, b, hq, tq, tk)
        check_backend(backend)
        if scale is not None:  # 0, a negative, inf or NaN scale gives NaN or a wrong output on some paths
            check_number("scale", scale, minimum=0.0, strict=True)
        if attn_bias is not None and feature_map is not None:
            raise ValueError("attn_bias is added to softmax scores; linear attention (feature_map) has none")
        return cls(q, k, v, q_pos, kv_pos, encoding, mask, d ** -0.5 if scale is None else scale, backend,
                   qk_transformed, feature_map, attn_bias)

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def heads(self) -> int:
        """Query heads ``Hq``."""
        return self.q.shape[1]

    @property
    def q_len(self) -> int:
        return self.q.shape[2]

    @property
    def kv_len(self) -> int:
        return self.k.shape[2]

    @property
    def is_empty(self) -> bool:
        """No query or no key: the result is zeros and no kernel runs."""
        return self.q_len == 0 or self.kv_len == 0

    @property
    def what(self) -> str:
        """The encoding's name for messages."""
        return type(self.encoding).__name__ if self.encoding is not None else "this call"

    @property
    def needs(self) -> AttentionNeeds:
        """What the call asks of attention: the encoding's needs, with a caller's ``attn_bias``
        taking the score-bias paths."""
        needs = self.encoding.attention_needs() if self.encoding is not None else NO_NEEDS
        return replace(needs, score_bias=True) if self.attn_bias is not None else needs

    def __repr__(self) -> str:
        enc = "None" if self.encoding is None else type(self.encoding).__name__
        parts = [
            f"q={_shape(self.q)} {str(self.q.dtype).removeprefix('torch.')} {self.q.device.type}",
            f"k={_shape(self.k)}", f"v={_shape(self.v)}",
            f"q_pos={_shape(self.q_pos)}", f"kv_pos={_shape(self.kv_pos)}",
            f"encoding={enc}", f"mask={self.mask!r}", f"scale={self.scale:.4g}", f"backend={self.backend!r}",
        ]
        if self.qk_transformed:
            parts.append("qk_transformed=True")
        if self.feature_map is not None:
            parts.append(f"feature_map={self.feature_map.name}")
        if self.attn_bias is not None:
            parts.append(f"attn_bias={_shape(self.attn_bias)}")
        return f"AttentionCall({', '.join(parts)})"


__all__ = ["AttentionCall", "check_attention_args", "check_attn_bias", "check_encoding", "normalize_positions"]
