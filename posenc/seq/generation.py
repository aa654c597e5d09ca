"""Autoregressive decoding for :class:`~posenc.seq.models.CausalLM`.

With a KV cache (the default where every encoding of the model supports one) the prompt is run
once and each new token attends to the cached keys; the new token's position continues after the
cached ones, so input encodings (sinusoidal, learned) see its absolute position and relative ones
the right offsets. Encodings with ``supports_kv_cache = False`` decode by running the whole prefix
again at each step (``use_cache=False``, chosen automatically); asking for ``use_cache=True``
with such an encoding is a ValueError.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_bool, check_int, check_number
from ..common.decoding_state import DecodingState


def check_token_ids(tokens: Tensor, vocab_size: int, name: str = "tokens") -> None:
    """``tokens`` hold ids in ``[0, vocab_size)``: one ValueError naming the first one outside,
    instead of the embedding's "index out of range in self" (on a GPU, a device-side assert that
    ends the process). Reads the values: call it where tokens enter, not in every step."""
    if tokens.numel() == 0 or torch.compiler.is_compiling():
        return
    low, high = (int(v) for v in torch.aminmax(tokens))
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}) (the model's vocab_size); got {bad}")


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token per row from ``logits [B, V]`` -> ``[B, 1]``: the argmax when ``greedy``, else a
    draw from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest."""
    if greedy:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


@torch.no_grad()
def generate(
    model: nn.Module,
    tokens: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
    use_cache: bool | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``tokens [B, T]`` (T >= 1) by ``max_new_tokens`` tokens -> ``[B, T + max_new_tokens]``.

    Args:
        model: a :class:`~posenc.seq.models.CausalLM` (put it in eval mode first: dropout stays
            as the model's mode says).
        tokens: the prompt, ids in ``[0, model.vocab_size)`` (one outside is a ValueError naming it).
        temperature: > 0 and finite; divides the logits before sampling.
        top_k: sample among the ``top_k`` most likely tokens only (None: all).
        greedy: take the most likely token (temperature and top_k are then irrelevant).
        use_cache: None: a KV cache when the model supports one, else full recomputation;
            True: a cache (ValueError when an encoding refuses it); False: recompute.
        generator: random generator for the draws (reproducible sampling).
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long or tokens.shape[1] == 0:
        what = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a non-empty [batch, length] long tensor; got {what}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    check_bool("greedy", greedy)
    if use_cache is not None:
        check_bool("use_cache", use_cache)  # "no" is truthy: it would decode with a cache
    if not greedy:
        if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 0):
            raise ValueError(f"temperature must be positive (or use greedy=True), got {temperature}")
        check_number("temperature", temperature, minimum=0.0, strict=True)  # inf: every token equally likely
        if top_k is not None:
            check_int("top_k", top_k, minimum=1)
    vocab_size = getattr(model, "vocab_size", None)
    if isinstance(vocab_size, int):
        check_token_ids(tokens, vocab_size)
    if use_cache is None:
        use_cache = model.supports_kv_cache
    out = tokens
    if max_new_tokens == 0:
        return out
    if use_cache:
        # refuses clearly when an encoding does not support a cache; holds the prompt and every
        # token fed back (the last one drawn is not), so its buffers never grow
        cache = model.new_cache(capacity=tokens.shape[1] + max_new_tokens - 1)
        state = DecodingState(len(cache))
        logits = model(tokens, cache=cache, decoding_state=state)[:, -1]
        for step in range(max_new_tokens):
            nxt = sample_next(logits, temperature=temperature, top_k=top_k, greedy=greedy, generator=generator)
            out = torch.cat((out, nxt), dim=1)
            if step + 1 < max_new_tokens:
                logits = model(nxt, cache=cache, decoding_state=state)[:, -1]
        return out
    for _ in range(max_new_tokens):
        logits = model(out)[:, -1]
        nxt = sample_next(logits, temperature=temperature, top_k=top_k, greedy=greedy, generator=generator)
        out = torch.cat((out, nxt), dim=1)
    return out
