"""A drop-in for ``torch.nn.MultiheadAttention`` that applies a position encoding.

:class:`TorchMultiheadAttention` takes torch's constructor arguments and call signature,
``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
average_attn_weights=True, is_causal=False)`` -> ``(attn_output, attn_weights or None)``, plus
``encoding=`` (any posenc encoding with attention hooks: RoPE, ALiBi, T5, KERPLE, ...), so it can
replace torch's layer in existing code, including as the ``self_attn`` of
``torch.nn.TransformerEncoderLayer`` (and ``self_attn`` / ``multihead_attn`` of
``TransformerDecoderLayer``). Attention runs on posenc's core (:func:`~.attention.attend`).

Masks follow torch: ``key_padding_mask [N, S]`` and ``attn_mask [L, S]``, ``[1, L, S]`` or
``[N * H, L, S]``; a bool mask is True where a pair is *removed*, a float mask is added to the
scores. ``is_causal=True`` is taken as the causal mask, as torch's hint says (a given
``attn_mask`` is then not read; unlike torch, it may be omitted). A causal-only encoding (causal
ALiBi, FIRE, xPos) also accepts the square causal ``attn_mask`` that
``nn.Transformer.generate_square_subsequent_mask`` builds, recognised by value.

Differences from torch, by design:

* the projection weights are stored apart (``q_proj_weight``, ``k_proj_weight``,
  ``v_proj_weight``, as torch does when ``kdim``/``vdim`` differ), with ``in_proj_weight = None``
  and ``_qkv_same_embed_dim = False``: torch's fused inference paths (``TransformerEncoderLayer``'s
  ``_transformer_encoder_layer_fwd`` and ``TransformerEncoder``'s nested tensors) read the raw
  weights and would skip the encoding, and this is what turns them off. ``TransformerEncoder``
  warns that it will not use nested tensors (pass ``enable_nested_tensor=False`` to silence it).
  A state dict of torch's layer (packed ``in_proj_weight``) loads as is, and
  :meth:`TorchMultiheadAttention.from_torch` copies a torch layer;
* ``need_weights=True`` (torch's default) returns the weights and therefore runs the explicit
  math path, which keeps the whole ``[N, H, L, S]`` matrix and gives up the fused kernels; pass
  ``need_weights=False`` (as the Transformer layers do) for the fast paths;
* attention dropout (``dropout > 0`` in training) also runs on that explicit path, the only one
  that implements it;
* masked keys never reach a real row, whatever mask removes them: a key removed for every query
  (of a batch element, in every head) by ``attn_mask`` columns (bool True or float ``-inf``) is
  treated as key padding, zeroed before the kernel like posenc's padding, so NaN or inf in it stays
  out (torch lets it through). A key removed for some queries only is attended by the others, so
  its values are the caller's (in the rows that remove it, ``0 * NaN`` is still NaN);
* a query row whose keys are all removed, by any mask, gives zeros (attention output before
  ``out_proj``, and weights), as posenc's core does and as torch's layer gives with
  ``need_weights=False``; ``masked_rows="nan"`` gives NaN there, as torch's ``need_weights=True``
  path does. Such a row is computed unmasked and then overwritten, so no softmax over ``-inf``
  alone runs;
* ``add_bias_kv`` and ``add_zero_attn`` are refused: the extra key would have no position.

Positions default to ``0 .. L-1`` for the queries and ``0 .. S-1`` for the keys; pass ``q_pos``
and ``kv_pos`` (keyword-only, ``[L]`` or ``[N, L]``) for offsets, packed or 2D positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .common.attention import attend, attend_with_weights
from .common.checks import check_choice
from .common.call import normalize_positions
from .common.encoding import Hook, PositionEncoding
from .common.masks import AttentionMask
from .common.planning import Backend, check_backend


# What a query whose keys are all removed gets (see the module docstring).
MASKED_ROWS = ("zeros", "nan")


def _is_square_causal(mask: Tensor) -> bool:
    """Whether a ``[L, L]`` mask is exactly the causal one (bool: True above the diagonal; float:
    ``-inf`` above it and 0 elsewhere), as ``generate_square_subsequent_mask`` makes it."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        return False
    upper = torch.ones(mask.shape, dtype=torch.bool, device=mask.device).triu(1)
    if mask.dtype == torch.bool:
        return bool(torch.equal(mask, upper))
    return bool(torch.equal(mask.isneginf(), upper)) and bool((mask[~upper] == 0).all())


class TorchMultiheadAttention(nn.Module):
    """``torch.nn.MultiheadAttention`` with a position encoding (see the module docstring).

    Args:
        embed_dim: as for ``torch.nn.MultiheadAttention``, like ``num_heads``, ``dropout``, ``bias``,
            ``kdim``, ``vdim``, ``batch_first``, ``device`` and ``dtype``.
        add_bias_kv: must stay False (as ``add_zero_attn``).
        encoding: a :class:`~posenc.common.encoding.PositionEncoding` with attention hooks (q/k
            transform, score bias, after-softmax), built for ``head_dim = embed_dim // num_heads``
            and ``num_heads`` where it asks; None for none (then the layer computes what torch's
            does). An encoding with an input hook only (sinusoidal, learned) belongs before the
            layers and is refused here.
        backend: posenc kernel path for ``need_weights=False`` ("auto" picks the fastest the
            encoding allows; see :func:`posenc.attend`).
        masked_rows: what a query whose keys are all removed gets: "zeros" (posenc's convention)
            or "nan" (torch's with ``need_weights=True``; torch gives zeros without weights).

    Shapes: ``query [L, N, E]`` (``[N, L, E]`` with ``batch_first``, or ``[L, E]`` unbatched),
    ``key [S, N, kdim]``, ``value [S, N, vdim]`` -> ``attn_output`` like ``query`` and
    ``attn_weights [N, L, S]`` (averaged over heads) or ``[N, H, L, S]``.
    """

    __constants__ = ["batch_first"]

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device=None,
        dtype=None,
        *,
        encoding: PositionEncoding | None = None,
        backend: Backend = "auto",
        masked_rows: str = "zeros",
    ) -> None:
        super().__init__()
        check_choice("masked_rows", masked_rows, MASKED_ROWS)
        self.masked_rows = masked_rows
        widths = [("kdim", kdim)] * (kdim is not None) + [("vdim", vdim)] * (vdim is not None)
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), *widths):  # kdim=0: a [E, 0] weight
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout!r}")
        if add_bias_kv or add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported: the extra key would have no position")
        check_backend(backend)
        if encoding is not None:
            if not isinstance(encoding, PositionEncoding):
                raise TypeError(f"encoding must be a posenc PositionEncoding or None; got {type(encoding).__name__}")
            if not encoding.hooks - {Hook.INPUT}:
                raise ValueError(
                    f"{type(encoding).__name__} acts on the input only (add encode_input's result to the tokens "
                    "before the layers); this layer applies attention hooks"
                )
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first, self.backend = float(dropout), batch_first, backend
        # Separate weights and False here: torch's fused inference paths check this flag and
        # would otherwise run attention themselves, without the encoding (module docstring).
        self._qkv_same_embed_dim = False
        self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
        self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
        self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
        self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.modules.linear.NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **factory)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self.encoding = encoding
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """torch's initialisation for separate projection weights."""
        for weight in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            nn.init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)

    @classmethod
    def from_torch(
        cls, mha: nn.MultiheadAttention, *, encoding: PositionEncoding | None = None, backend: Backend = "auto",
        masked_rows: str = "zeros",
    ) -> TorchMultiheadAttention:
        """A copy of torch's layer ``mha`` (sizes, dropout, batch_first, weights) with ``encoding``."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"mha must be a torch.nn.MultiheadAttention; got {type(mha).__name__}")
        ref = mha.out_proj.weight
        layer = cls(
            mha.embed_dim, mha.num_heads, mha.dropout, bias=mha.in_proj_bias is not None,
            add_bias_kv=mha.bias_k is not None, add_zero_attn=mha.add_zero_attn, kdim=mha.kdim, vdim=mha.vdim,
            batch_first=mha.batch_first, device=ref.device, dtype=ref.dtype, encoding=encoding, backend=backend,
            masked_rows=masked_rows,
        )
        own = layer.state_dict()
        state = {k: v for k, v in mha.state_dict().items()}
        state.update({k: v for k, v in own.items() if k.startswith("encoding.")})
        layer.load_state_dict(state)
        return layer

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        # torch's layer with kdim == vdim == embed_dim packs the three weights in in_proj_weight.
        packed = state_dict.get(prefix + "in_proj_weight")
        if packed is not None:
            if packed.shape != (3 * self.embed_dim, self.embed_dim) or self.kdim != self.embed_dim or self.vdim != self.embed_dim:
                error_msgs.append(f"{prefix}in_proj_weight of shape {tuple(packed.shape)} does not fit this layer "
                                  f"(embed_dim={self.embed_dim}, kdim={self.kdim}, vdim={self.vdim})")
            else:
                state_dict = dict(state_dict)
                del state_dict[prefix + "in_proj_weight"]
                for name, part in zip(("q", "k", "v"), packed.chunk(3)):
                    state_dict[f"{prefix}{name}_proj_weight"] = part
        elif prefix + "in_proj_weight" in state_dict:  # None, as written by a layer like this one
            state_dict = {k: v for k, v in state_dict.items() if k != prefix + "in_proj_weight"}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"kdim={self.kdim}, vdim={self.vdim}, batch_first={self.batch_first}")

    # -- forward ----------------------------------------------------------------------------------

    def _heads(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``[N, T, in]`` -> ``[N, H, T, D]``."""
        return F.linear(x, weight, bias).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def _masks(
        self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool, n: int, l: int, s: int,
        dtype: torch.dtype,
    ) -> tuple[AttentionMask | None, Tensor | None, Tensor | None]:
        """torch's masks as posenc's: a boolean :class:`AttentionMask` (causal, key padding), an
        additive float bias ``[N or 1, H or 1, L, S]`` for everything else, and the query rows
        ``[N or 1, H or 1, L]`` whose keys are all removed (None when there are none to find)."""
        for name, m in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask)):
            if m is not None and not isinstance(m, Tensor):
                raise TypeError(f"{name} must be a bool or float tensor or None; got {type(m).__name__}")
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal must be True or False; got {is_causal!r} ({type(is_causal).__name__})")
        causal = bool(is_causal)
        if causal and l != s:
            raise ValueError(f"is_causal needs as many queries as keys (torch's square causal mask); got L={l}, S={s}")
        enc = self.encoding
        if not causal and attn_mask is not None and enc is not None and enc.causal_only and _is_square_causal(attn_mask):
            causal = True  # the causal mask given as a tensor: what a causal-only encoding needs to see
        bias = None
        if attn_mask is not None and not causal:
            if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (l, s):
                full = attn_mask[None, None]
            elif attn_mask.dim() == 3 and attn_mask.shape[0] in (1, n * self.num_heads) and tuple(attn_mask.shape[1:]) == (l, s):
                full = attn_mask[None] if attn_mask.shape[0] == 1 else attn_mask.view(n, self.num_heads, l, s)
            else:
                raise ValueError(f"attn_mask must be [L={l}, S={s}] or [N*num_heads={n * self.num_heads} (or 1), {l}, {s}]; "
                                 f"got {tuple(attn_mask.shape)}")
            bias = self._additive(full, dtype, "attn_mask")
        key_valid = None
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (n, s):
                raise ValueError(f"key_padding_mask must be [N={n}, S={s}]; got {tuple(key_padding_mask.shape)}")
            if key_padding_mask.dtype == torch.bool:
                key_valid = ~key_padding_mask
            elif key_padding_mask.dtype.is_floating_point and bool(
                    (key_padding_mask.isneginf() | (key_padding_mask == 0)).all()):
                # 0 / -inf only: a boolean mask in float form (torch's Transformer layers convert
                # one when the other mask is float), which the fused kernels take as such.
                key_valid = ~key_padding_mask.isneginf()
            else:
                padding = self._additive(key_padding_mask[:, None, None, :], dtype, "key_padding_mask")
                padding = padding.expand(n, 1, l, s)
                bias = padding if bias is None else bias + padding
        dead_rows = None
        if bias is not None:
            removed = bias.isneginf()  # [N or 1, H or 1, L, S]
            column = removed.all(dim=2).all(dim=1).expand(n, s)  # removed for every query and head
            if key_valid is not None or bool(column.any()):
                key_valid = ~column if key_valid is None else key_valid & ~column
            if key_valid is not None:
                removed = removed | ~key_valid[:, None, None, :]
            if causal:  # causal rows keep their diagonal unless the other masks remove it
                removed = removed | torch.ones(l, s, dtype=torch.bool, device=bias.device).triu(1)
            dead_rows = removed.all(dim=-1)  # [N or 1, H or 1, L]
            # an empty row is computed unmasked (then overwritten): no softmax over -inf alone
            bias = bias.masked_fill(dead_rows[..., None], 0.0)
        elif key_valid is not None:
            dead = ~key_valid  # [N, S]
            if causal:
                dead = dead[:, None, :] | torch.ones(l, s, dtype=torch.bool, device=dead.device).triu(1)
                dead_rows = dead.all(dim=-1)[:, None]  # [N, 1, L]
            else:
                dead_rows = dead.all(dim=-1)[:, None, None].expand(n, 1, l)
        mask = AttentionMask(causal=causal, key_valid=key_valid) if causal or key_valid is not None else None
        return mask, bias, dead_rows

    @staticmethod
    def _additive(mask: Tensor, dtype: torch.dtype, name: str) -> Tensor:
        if mask.dtype == torch.bool:
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
        if not mask.dtype.is_floating_point:
            raise TypeError(f"{name} must be a bool or float tensor; got {mask.dtype}")
        return mask.to(dtype)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        q_pos: Tensor | None = None,
        kv_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """torch's call (see the module docstring); ``q_pos [L]`` / ``[N, L]`` and ``kv_pos`` are
        posenc's explicit positions (default ``0 .. L-1`` and ``0 .. S-1``)."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a tensor; got {type(t).__name__}")
            if t.is_nested:
                raise ValueError(f"{name} is a nested tensor, which this layer does not take: build "
                                 "torch.nn.TransformerEncoder(..., enable_nested_tensor=False)")
        batched = query.dim() == 3
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"query, key and value must all be 3D (batched) or 2D (unbatched); got {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}")
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        # now [T, N, E]
        l, n, e = query.shape
        s = key.shape[0]
        if e != self.embed_dim or key.shape[-1] != self.kdim or value.shape[-1] != self.vdim:
            raise ValueError(f"expected query/key/value widths {self.embed_dim}/{self.kdim}/{self.vdim}; got "
                             f"{e}/{key.shape[-1]}/{value.shape[-1]}")
        if key.shape[:2] != value.shape[:2] or key.shape[1] != n:
            raise ValueError(f"key and value must be [S, N={n}, ...] alike; got {tuple(key.shape)} and {tuple(value.shape)}")
        b_q, b_k, b_v = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        q = self._heads(query.transpose(0, 1), self.q_proj_weight, b_q)  # [N, H, L, D]
        k = self._heads(key.transpose(0, 1), self.k_proj_weight, b_k)  # [N, H, S, D]
        v = self._heads(value.transpose(0, 1), self.v_proj_weight, b_v)
        mask, bias, dead_rows = self._masks(attn_mask, key_padding_mask, is_causal, n, l, s, q.dtype)
        q_pos = normalize_positions(q_pos, l, n, "q_pos", device=q.device)
        kv_pos = normalize_positions(kv_pos, s, n, "kv_pos", device=q.device)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights or dropout_p > 0.0:
            out, weights = attend_with_weights(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=self.encoding, mask=mask,
                                               attn_bias=bias, dropout_p=dropout_p)
        else:
            out = attend(q, k, v, q_pos=q_pos, kv_pos=kv_pos, encoding=self.encoding, mask=mask, attn_bias=bias,
                         backend=self.backend)
        if dead_rows is not None:
            fill = 0.0 if self.masked_rows == "zeros" else float("nan")
            out = out.masked_fill(dead_rows[..., None], fill)
            if weights is not None:
                weights = weights.masked_fill(dead_rows[..., None], fill)
        out = self.out_proj(out.transpose(1, 2).flatten(2))  # [N, L, E]
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(dim=1)
        return out, (weights if batched else weights.squeeze(0))


__all__ = ["TorchMultiheadAttention"]
