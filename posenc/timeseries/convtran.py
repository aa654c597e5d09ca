"""A ConvTran-style classifier (Foumani et al. 2023, https://arxiv.org/abs/2305.16642) that takes
any registered encoding, so that an encoding ablation runs through one model.

Architecture (as ConvTran's code, ``ConvTran`` in ``Models/model.py``):

1. Embedding: a temporal convolution ``Conv2d(1, 4d, [1, 8], 'same')`` over each channel, then a
   spatial one ``Conv2d(4d, d, [C, 1])`` across the channels, each followed by BatchNorm and GELU.
2. The input-hook encoding (tAPE) is added to the *attention input only*, followed by dropout;
   the residual carries the plain embedding: ``a = LN(h + Attn(drop(h + PE)))``.
3. Attention: bias-free q/k/v projections, scores scaled by ``d_model ** -0.5`` (ConvTran's
   choice; ``attn_scale="head_dim"`` for the usual ``head_dim ** -0.5``), the attention encoding's
   hooks (eRPE after the softmax) through :func:`posenc.common.attention.attend`, no output
   projection, and a LayerNorm on the output.
4. Feed-forward ``Linear(d, ff) -> ReLU -> Dropout -> Linear(ff, d) -> Dropout`` with a residual and
   LayerNorm (post-norm), global average pooling over time, a linear classifier.

Variable-length series: ``lengths`` marks the real steps; padded steps are zeroed before the
convolutions (the temporal convolution's own zero padding then matches), excluded from BatchNorm's
batch statistics, masked as attention keys (``AttentionMask(key_valid=...)``) and left out of the
pooling, so the logits of a series do not depend on how much padding it comes with.

``encoding``: a registered name, ``"none"``, or ``"a+b"`` combining an input-hook encoding with an
attention encoding, the input one first (``"tape+erpe"``, ConvTran's choice; ``"erpe+tape"`` is
refused, so that one model has one name in run directories and results). Each name is built with
``posenc.build(name, dims=ModelDims(dim, num_heads, max_len))``.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.attention import Backend, attend
from ..common.checks import check_number
from ..common.encoding import Hook, PositionEncoding
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, build, get
from ..primitives.budget import check_build
from ..training.pretrained import PretrainedMixin

AttnScale = Literal["d_model", "head_dim"]


def build_encodings(
    spec: str, *, dim: int, num_heads: int, max_len: int, options: dict | None = None
) -> tuple[PositionEncoding | None, PositionEncoding | None]:
    """``(input encoding, attention encoding)`` from a spec such as ``"tape+erpe"`` or ``"none"``.

    An encoding with both an input hook and attention hooks fills both slots; two encodings for
    the same slot are an error. ``options`` are constructor arguments: ``{"key": value}`` for a
    single encoding, ``{"name.key": value}`` for one part of a combination.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"encoding must be a name, 'none' or 'input+attention' such as 'tape+erpe'; got {spec!r}")
    if spec.strip() == "none":
        return None, None
    dims = ModelDims(dim=dim, num_heads=num_heads, max_len=max_len)
    names = [p.strip() for p in spec.split("+")]
    per_part: dict[str, dict] = {name: {} for name in names}
    for key, value in (options or {}).items():
        part, dot, arg = key.rpartition(".")
        if not dot:
            if len(names) != 1:
                raise ValueError(f"encoding option {key!r}: with the combination {spec!r}, name the part ({names[0]}.{key}=...)")
            part, arg = names[0], key
        if part not in per_part:
            raise ValueError(f"encoding option {key!r}: {part!r} is not a part of the encoding {spec!r}")
        per_part[part][arg] = value
    slots: dict[str, tuple[str, PositionEncoding]] = {}
    for name in names:
        if not name or name == "none":
            raise ValueError(f"encoding {spec!r}: each '+'-separated part must be a registered encoding name")
        try:
            get(name)
        except KeyError as exc:
            raise ValueError(f"encoding {spec!r}: {exc.args[0]}") from None
        enc = build(name, dims=dims, **per_part.get(name, {}))
        wanted = []
        if Hook.INPUT in enc.hooks:
            wanted.append("input")
        if enc.hooks - {Hook.INPUT}:
            wanted.append("attention")
        for slot in wanted:
            if slot in slots:
                raise ValueError(
                    f"encoding {spec!r}: {slots[slot][0]!r} and {name!r} both act on the {slot}; combine an input "
                    "encoding with an attention encoding"
                )
            slots[slot] = (name, enc)
    if len(names) == 2 and slots.get("input", (names[0],))[0] != names[0]:  # one spelling per model
        raise ValueError(f"encoding {spec!r}: the input encoding comes first, as in 'tape+erpe'; write "
                         f"{names[1]}+{names[0]}")
    return (slots["input"][1] if "input" in slots else None), (slots["attention"][1] if "attention" in slots else None)


def masked_batch_norm(norm: nn.BatchNorm2d, x: Tensor, valid: Tensor | None) -> Tensor:
    """``norm(x)`` for ``x [B, C, H, T]`` with the batch statistics taken over the real steps
    (``valid [B, T]``) only; running statistics are updated as BatchNorm does (unbiased variance)."""
    if valid is None or not norm.training or bool(valid.all()):
        return norm(x)
    w = valid[:, None, None, :].to(x.dtype)
    count = w.sum() * x.shape[2]
    mean = (x * w).sum((0, 2, 3)) / count
    var = ((x - mean[:, None, None]) ** 2 * w).sum((0, 2, 3)) / count
    if norm.track_running_stats:
        with torch.no_grad():
            m = norm.momentum if norm.momentum is not None else 0.1
            norm.running_mean.lerp_(mean.detach(), m)
            norm.running_var.lerp_(var.detach() * count / max(count.item() - 1, 1), m)
            norm.num_batches_tracked += 1
    out = (x - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + norm.eps)
    if norm.affine:
        out = out * norm.weight[:, None, None] + norm.bias[:, None, None]
    return out


class ConvTranAttention(nn.Module):
    """ConvTran's attention: bias-free q/k/v, an encoding's attention hooks, LayerNorm on the output.

    Shapes: ``x [B, T, d]``, ``positions [1, T]`` -> ``[B, T, d]``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        encoding: PositionEncoding | None = None,
        scale: float | None = None,
        backend: Backend = "auto",
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim ** -0.5 if scale is None else scale
        self.backend = backend
        self.query = nn.Linear(dim, dim, bias=False)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim, bias=False)
        self.encoding = encoding
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, positions: Tensor, mask: AttentionMask | None = None) -> Tensor:
        def heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

        out = attend(
            heads(self.query(x)), heads(self.key(x)), heads(self.value(x)), q_pos=positions, kv_pos=positions,
            encoding=self.encoding, mask=mask, scale=self.scale, backend=self.backend,
        )
        return self.norm(out.transpose(1, 2).flatten(2))


class ConvTranClassifier(nn.Module, PretrainedMixin):
    """ConvTran-style time-series classifier (see the module docstring).

    Args:
        in_channels: channels ``C`` of the series.
        num_classes: classes ``K``.
        max_len: the longest series the model accepts (tAPE's ``L``, eRPE's table).
        dim: embedding width ``d`` (ConvTran: 16).
        num_heads: attention heads (ConvTran: 8).
        ff_dim: feed-forward width (ConvTran: 256).
        dropout: after the input encoding and in the feed-forward block (ConvTran: 0.01).
        encoding: ``"tape+erpe"``, ``"none"``, any registered name or ``"input+attention"`` pair.
        attn_scale: ``"d_model"`` (``d ** -0.5``, as ConvTran) or ``"head_dim"``.
        kernel_size: of the temporal convolution (ConvTran: 8).
        backend: attention kernel path (see :func:`posenc.common.attention.attend`).
        classes: the class names, ``num_classes`` of them (kept with the model: saved by
            :meth:`save_pretrained`); None when unnamed.

    Shapes: ``x [B, C, T]`` (float), ``lengths [B]`` (optional; real steps per series) ->
    logits ``[B, K]``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        max_len: int,
        *,
        dim: int = 16,
        num_heads: int = 8,
        ff_dim: int = 256,
        dropout: float = 0.01,
        encoding: str = "tape+erpe",
        attn_scale: AttnScale = "d_model",
        kernel_size: int = 8,
        backend: Backend = "auto",
        encoding_options: dict | None = None,
        classes: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if classes is not None:
            classes = [str(c) for c in classes]
            if len(classes) != num_classes:
                raise ValueError(f"classes must name num_classes={num_classes} classes; got {len(classes)}")
        self.classes = classes
        for name, value in (("in_channels", in_channels), ("num_classes", num_classes), ("max_len", max_len),
                            ("dim", dim), ("num_heads", num_heads), ("ff_dim", ff_dim), ("kernel_size", kernel_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        check_number("dropout", dropout, minimum=0.0)
        if not dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout}")
        check_build(f"ConvTranClassifier(dim={dim}, ff_dim={ff_dim}, in_channels={in_channels})",
                    parameters=4 * dim * (kernel_size + dim * in_channels) + 4 * dim * dim + 2 * dim * ff_dim, blocks=1)
        if attn_scale not in ("d_model", "head_dim"):
            raise ValueError(f"attn_scale must be 'd_model' or 'head_dim'; got {attn_scale!r}")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.in_channels, self.num_classes, self.max_len = in_channels, num_classes, max_len
        self.encoding_spec = encoding
        # 'same' padding (k - 1) // 2 before and the rest after, as torch's padding="same" (done
        # explicitly: torch warns about copying for even kernels)
        self.time_padding = ((kernel_size - 1) // 2, kernel_size - 1 - (kernel_size - 1) // 2)
        self.temporal = nn.Conv2d(1, 4 * dim, (1, kernel_size))
        self.temporal_norm = nn.BatchNorm2d(4 * dim)
        self.spatial = nn.Conv2d(4 * dim, dim, (in_channels, 1))
        self.spatial_norm = nn.BatchNorm2d(dim)
        self.input_encoding, attn_encoding = build_encodings(encoding, dim=dim, num_heads=num_heads, max_len=max_len,
                                                                options=encoding_options)
        self.input_drop = nn.Dropout(dropout)
        scale = dim ** -0.5 if attn_scale == "d_model" else None
        self.attention = ConvTranAttention(dim, num_heads, encoding=attn_encoding, scale=scale, backend=backend)
        self.norm1 = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, ff_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff_dim, dim), nn.Dropout(dropout)
        )
        self.norm2 = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def _valid(self, x: Tensor, lengths: Tensor | None) -> Tensor | None:
        b, _, t = x.shape
        if lengths is None:
            return None
        if not isinstance(lengths, Tensor) or lengths.shape != (b,) or lengths.dtype.is_floating_point:
            raise ValueError(f"lengths must be an integer tensor [batch={b}]; got {getattr(lengths, 'shape', lengths)!r}")
        if bool((lengths < 1).any()) or bool((lengths > t).any()):
            raise ValueError(
                f"lengths must be in 1..{t} (the padded length); got min {int(lengths.min())}, max {int(lengths.max())}"
                + (" (an empty series)" if bool((lengths < 1).any()) else "")
            )
        return torch.arange(t, device=x.device)[None] < lengths.to(x.device)[:, None]

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 3:
            raise ValueError(f"x must be a [batch, channels, time] tensor; got {getattr(x, 'shape', type(x).__name__)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(f"x has {x.shape[1]} channels; this model was built for in_channels={self.in_channels}")
        if x.shape[2] == 0:
            raise ValueError("x is an empty series (0 time steps)")
        if x.shape[2] > self.max_len:
            raise ValueError(f"x has {x.shape[2]} time steps; this model was built for max_len={self.max_len}")
        if not x.dtype.is_floating_point:
            raise ValueError(f"x must be a float tensor; got {x.dtype}")
        valid = self._valid(x, lengths)
        if valid is not None:
            x = x.masked_fill(~valid[:, None, :], 0.0)
        h = F.gelu(masked_batch_norm(self.temporal_norm, self.temporal(F.pad(x, self.time_padding).unsqueeze(1)), valid))  # [B, 4d, C, T]
        h = F.gelu(masked_batch_norm(self.spatial_norm, self.spatial(h), valid))  # [B, d, 1, T]
        h = h.squeeze(2).transpose(1, 2)  # [B, T, d]
        positions = torch.arange(h.shape[1], device=h.device)[None]
        attn_in = h
        if self.input_encoding is not None:
            attn_in = self.input_drop(self.input_encoding.encode_input(h, positions))
        mask = None if valid is None or bool(valid.all()) else AttentionMask(key_valid=valid)
        h = self.norm1(h + self.attention(attn_in, positions, mask))
        h = self.norm2(h + self.feed_forward(h))
        if valid is None:
            pooled = h.mean(1)
        else:
            w = valid.to(h.dtype)[..., None]
            pooled = (h * w).sum(1) / w.sum(1)
        return self.head(pooled)
