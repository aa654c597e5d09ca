"""1D PEG: CPVT's positional encoding generator over a token sequence (a conditional encoding).

Paper: Chu et al. 2023, Conditional Positional Encodings for Vision Transformers (CPVT),
https://arxiv.org/abs/2102.10882. The 2D original is :class:`posenc.vision.peg.PEG`; here the
same generator acts along the token order of text.

``Y = X + DWConv1d_k(X)``: a depthwise convolution over the tokens (``groups = C``, with bias),
``term[t, c] = bias[c] + sum_j weight[c, j] * x[t + j - left, c]`` with zero padding:

* causal (decoders): ``left = k - 1`` zeros before the sequence and none after it, so token ``t``
  reads tokens ``t - k + 1 .. t`` only and never the future; any ``k >= 1``;
* symmetric (bidirectional models): ``left = k // 2`` zeros on each side; ``k`` must be odd.

The encoding is conditioned on the content and equivariant to shifts; absolute position leaks
in through the zero padding at the start (and, symmetric, the end) of the sequence, as in CPVT.

Where it goes: after chosen blocks, like CPVT (after the first by default):
``CausalLM(encoding="peg1d", peg_blocks=(0,))`` or ``SequenceEncoder(...)``, or
``TransformerEncoder(conditional={i: PEG1d(...)})``, whose slot adds
``module(x, positions, mask=mask, cache=cache.rows(i))``; :meth:`PEG1d.forward` returns the
convolution term. As a plain input encoding (:meth:`PEG1d.encode_input`) it acts once, before the
first block.

Explicit structure, never module state:

* ``positions`` are not read: the convolution follows the token order, whatever the position
  values (offsets, gaps); given, they are still checked as every encoding checks them (real and
  finite, never ``bool``: such positions are a bug upstream, not something to pass silently);
* packed sequences: the mask's segments (``AttentionMask.packed(segments)``) stop every tap at a
  segment boundary -- each sequence is convolved as if alone, zero-padded at its own ends;
* padding tokens (``mask.key_valid`` False) enter the convolution as zeros, so real tokens next
  to them see what they would see at the end of an unpadded sequence;
* KV cache (causal only): supported. The convolution after block ``i`` reads the last ``k - 1``
  rows of the tokens before from the cache's :class:`~posenc.common.kv_cache.TokenRows` of its
  place (zeros before the first token) and appends its own, so cached decoding equals the full
  forward pass, after a ``crop`` too. Packing or padding masks are refused with a cache.

Kernel: no attention hook (plain SDPA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_bool, check_int, check_positions
from ..common.encoding import Hook, PositionEncoding
from ..common.kv_cache import TokenRows
from ..common.masks import AttentionMask
from ..common.registry import register


def _check_kernel_size(kernel_size: object, causal: bool, name: str = "kernel_size") -> None:
    check_int(name, kernel_size, minimum=1)
    if not causal and kernel_size % 2 == 0:
        raise ValueError(
            f"{name} must be odd for symmetric (non-causal) padding, which puts {name} // 2 zeros on each "
            f"side; got {kernel_size} (causal=True allows any size)"
        )


def _check_per_token(name: str, t: Tensor | None, batch: int, length: int, what: str) -> None:
    if t is None:
        return
    if not isinstance(t, Tensor) or t.dim() != 2 or t.shape[0] not in (1, batch) or t.shape[1] != length:
        shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be [batch={batch} or 1, tokens={length}] {what}; got {shape}")


def peg1d_term(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    causal: bool,
    segments: Tensor | None = None,
    valid: Tensor | None = None,
    history: Tensor | None = None,
) -> Tensor:
    """The 1D PEG term ``DWConv1d(X)`` (see the module docstring).

    Args:
        x: ``[B, T, C]`` token features.
        weight: ``[C, k]`` depthwise taps (``nn.Conv1d(C, C, k, groups=C).weight[:, 0]``).
        bias: ``[C]`` or None.
        causal: left padding ``k - 1`` (token ``t`` reads ``t - k + 1 .. t``); otherwise
            symmetric padding ``k // 2`` with an odd ``k``.
        segments: ``[B or 1, T]`` integer sequence id per token (packed sequences): no tap reads
            a token of another segment.
        valid: ``[B or 1, T]`` bool, False for padding tokens, which are read as zeros.
        history: causal only, ``[B, k - 1, C]``: the inputs just before ``x`` (a cached prefix)
            in place of the zero padding. Not with ``segments``.

    Returns:
        ``[B, T, C]``.
    """
    if not isinstance(x, Tensor) or x.dim() != 3 or not x.dtype.is_floating_point:
        what = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a floating-point [batch, tokens, channels] tensor; got {what}")
    b, t, c = x.shape
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[0] != c:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be [channels={c}, kernel_size]; got {shape}")
    k = weight.shape[1]
    _check_kernel_size(k, causal, "kernel_size (weight.shape[1])")
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (c,)):
        shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(f"bias must be [channels={c}] or None; got {shape}")
    _check_per_token("segments", segments, b, t, "integer segment ids")
    if segments is not None and (segments.dtype.is_floating_point or segments.dtype == torch.bool):
        raise ValueError(f"segments must be an integer tensor of sequence ids; got {segments.dtype}")
    _check_per_token("valid", valid, b, t, "bool (True = real token)")
    if valid is not None and valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool tensor (True = real token); got {valid.dtype}")
    left = k - 1 if causal else k // 2
    right = 0 if causal else k // 2
    if history is not None:
        if not causal:
            raise ValueError("history (a cached prefix) needs causal=True: a symmetric convolution reads the future")
        if segments is not None:
            raise ValueError("history (a cached prefix) cannot be combined with segments (packed sequences)")
        if not isinstance(history, Tensor) or tuple(history.shape) != (b, k - 1, c):
            shape = tuple(history.shape) if isinstance(history, Tensor) else type(history).__name__
            raise ValueError(f"history must be [batch={b}, kernel_size - 1={k - 1}, channels={c}]; got {shape}")
    w = weight.to(x.dtype)
    bias = None if bias is None else bias.to(x.dtype)
    if valid is not None:
        x = x * valid.unsqueeze(-1).to(x.dtype)
    if segments is None:
        # One depthwise conv over the padded sequence (the cached history replaces the left zeros).
        xt = x.transpose(1, 2)  # [B, C, T]
        if history is not None:
            xt = torch.cat((history.to(x.dtype).transpose(1, 2), xt), dim=2)
            xt = F.pad(xt, (0, right))
        else:
            xt = F.pad(xt, (left, right))
        return F.conv1d(xt, w.unsqueeze(1), bias, groups=c).transpose(1, 2)
    # Packed: tap j reads token s = t + j - left, kept only inside t's own segment.
    out = x.new_zeros(b, t, c) if bias is None else bias.expand(b, t, c).clone()
    for j in range(k):
        o = j - left
        lo, hi = max(0, -o), min(t, t - o)  # the outputs t whose source s lies in the sequence
        if lo >= hi:
            continue
        same = (segments[:, lo + o : hi + o] == segments[:, lo:hi]).unsqueeze(-1).to(x.dtype)  # [B or 1, n, 1]
        contrib = x[:, lo + o : hi + o] * w[:, j] * same
        out = out + F.pad(contrib, (0, 0, lo, t - hi))
    return out


def peg1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    causal: bool,
    segments: Tensor | None = None,
    valid: Tensor | None = None,
    history: Tensor | None = None,
) -> Tensor:
    """``Y = X + DWConv1d(X)``, ``[B, T, C]``: :func:`peg1d_term` added to ``x``."""
    return x + peg1d_term(x, weight, bias, causal=causal, segments=segments, valid=valid, history=history)


@register(
    "peg1d",
    modality="seq",
    paper="Chu et al. 2023, CPVT, https://arxiv.org/abs/2102.10882 (PEG along the token order)",
    summary="depthwise 1D conv over the tokens added between blocks (conditional on the features); causal or symmetric zero padding",
)
class PEG1d(PositionEncoding):
    """Args:
        dim: model width ``C``.
        kernel_size: ``k`` (3 as CPVT); odd unless ``causal``.
        causal: causal padding (decoders; a causal mask refuses ``causal=False``), otherwise
            symmetric.
        num_prefix_tokens: leading tokens (a class token) kept out of the convolution: their
            term is zero and they feed no other token.

    Shapes: ``x [B, T, C]``, ``positions [B or 1, T]`` (not read) -> ``[B, T, C]`` (``forward``:
    the added term; ``encode_input``: ``x`` plus it). Hook: input. Kernel: none.
    """

    hooks = frozenset({Hook.INPUT})
    between_blocks = True

    def __init__(self, dim: int, kernel_size: int = 3, causal: bool = False, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        check_bool("causal", causal)
        _check_kernel_size(kernel_size, causal)
        check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        self.dim, self.kernel_size, self.causal, self.num_prefix_tokens = dim, kernel_size, causal, num_prefix_tokens
        self.proj = nn.Conv1d(dim, dim, kernel_size, groups=dim, bias=True)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, kernel_size={self.kernel_size}, causal={self.causal}, "
                f"num_prefix_tokens={self.num_prefix_tokens}")

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        mask: AttentionMask | None = None,
        cache: TokenRows | None = None,
    ) -> Tensor:
        """The term ``DWConv1d(X)`` at every token (zeros at prefix tokens): ``[B, T, C]``.

        Args:
            positions: ``[B or 1, T]``; not read (the convolution follows token order), only
                checked (a tensor of real, finite numbers, never bool) when given.
            mask: the model's attention mask: its segments separate packed sequences, its
                ``key_valid`` marks padding (read as zeros); a causal mask needs ``causal=True``.
            cache: during incremental decoding (causal only), the rows of the tokens before
                (:class:`~posenc.common.kv_cache.TokenRows`, ``KVCache.rows(i)``): the last
                ``k - 1`` are read, and ``x`` is appended.
        """
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}]; got {shape}")
        b, t, _ = x.shape
        if positions is not None:
            # Not read, but checked like every encoding's: bool or NaN positions are a caller's bug.
            check_positions("positions", positions)
            if positions.dim() < 2 or positions.shape[1] != t:
                raise ValueError(f"positions must be [batch or 1, tokens={t}(, ...)]; got {tuple(positions.shape)}")
        segments = valid = None
        if mask is not None:
            if mask.causal and not self.causal:
                raise ValueError(
                    "PEG1d was built with causal=False (symmetric padding reads the next tokens) but the model "
                    "attends causally; build it with causal=True"
                )
            segments, valid = mask.q_segments, mask.key_valid
            if cache is None and valid is not None:
                _check_per_token("mask.key_valid", valid, b, t, "bool")
        p = self.num_prefix_tokens
        weight, bias = self.proj.weight[:, 0], self.proj.bias
        if cache is not None:
            return self._cached(x, weight, bias, segments, valid, cache)
        if p > t:
            raise ValueError(f"got {t} tokens; this PEG1d keeps {p} prefix tokens out of the convolution")
        body = peg1d_term(
            x[:, p:], weight, bias, causal=self.causal,
            segments=None if segments is None else segments[:, p:], valid=None if valid is None else valid[:, p:],
        )
        return torch.cat((body.new_zeros(b, p, self.dim), body), dim=1) if p else body

    def _cached(self, x: Tensor, weight: Tensor, bias: Tensor, segments, valid, cache: TokenRows) -> Tensor:
        if not self.causal:
            raise ValueError("PEG1d with causal=False cannot decode with a KV cache: it reads the next tokens")
        if segments is not None or valid is not None:
            raise ValueError("PEG1d decodes with a KV cache only without padding or packing masks "
                             "(mask.key_valid, mask segments); run the full sequence instead")
        if self.num_prefix_tokens:
            raise ValueError("PEG1d with num_prefix_tokens > 0 cannot decode with a KV cache")
        if not isinstance(cache, TokenRows):
            raise TypeError(f"cache must be the TokenRows of this PEG1d's place (KVCache.rows(i)); got "
                            f"{type(cache).__name__}")
        history = cache.last(self.kernel_size - 1, x)  # zeros before the first token, as in the full pass
        out = peg1d_term(x, weight, bias, causal=True, history=history)
        cache.append(x)
        return out

    def encode_input(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self(x, positions)


__all__ = ["PEG1d", "peg1d", "peg1d_term"]
