"""The ``flex`` path: FlexAttention with the score bias as ``score_mod`` and the mask as a
``BlockMask``; compiled on CUDA, eager (the unfused reference, forward only) elsewhere."""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor

from ..masks import AttentionMask
from ..pairwise import PairwiseBias


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # Default dynamism: a fixed training length compiles once; a length that changes (cached
    # decoding) recompiles once with dynamic shapes instead of once per length.
    return torch.compile(flex_attention)


# Each encoding's score_mod, each mask_mod and each prefill/decode shape is an entry in the one
# compiled flex_attention's cache. Past dynamo's default limit (8) torch runs the unfused flex
# instead, which materializes every score: seconds for one prefill on a GPU.
FLEX_RECOMPILE_LIMIT = 64


def run_compiled_flex(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """The compiled flex_attention with room for :data:`FLEX_RECOMPILE_LIMIT` cache entries
    while it runs (dynamo reads the limit when a call misses the cache); inside a caller's own
    ``torch.compile`` the call is traced into their graph and their settings apply."""
    import torch._dynamo.config as dynamo_config

    before = dynamo_config.recompile_limit
    if torch.compiler.is_compiling() or before >= FLEX_RECOMPILE_LIMIT:
        return _compiled_flex()(q, k, v, **kwargs)
    # set and restored by hand: config.patch costs more than this in every layer of a decoding step
    dynamo_config.recompile_limit = FLEX_RECOMPILE_LIMIT
    try:
        return _compiled_flex()(q, k, v, **kwargs)
    finally:
        dynamo_config.recompile_limit = before


def flex_path(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, bias: PairwiseBias | None, scale: float
) -> Tensor:
    """FlexAttention: the bias as ``score_mod``, the mask as a ``BlockMask``."""
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = None
    # (a causal mask over one query, a cached decoding step, hides nothing: no BlockMask to build
    # at every step for a key count that changes at every step)
    if mask is not None and not mask.hides_nothing(q.shape[2]):
        block_mask = mask.block_mask(q.shape[0], q.shape[2], k.shape[2], q.device)
    score_mod = None
    if bias is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias(b, h, q_idx, kv_idx).to(score.dtype)

    kwargs = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if q.device.type == "cuda":
        return run_compiled_flex(q, k, v, **kwargs)
    if not torch.is_grad_enabled():
        # torch refuses CPU flex for inputs that merely *could* need a gradient.
        q, k, v = q.detach(), k.detach(), v.detach()
    with warnings.catch_warnings():
        # Eager flex is the unfused reference implementation; fine off CUDA, where it is only asked for.
        warnings.simplefilter("ignore")
        return flex_attention(q, k, v, **kwargs)
