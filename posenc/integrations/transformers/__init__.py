"""posenc inside Hugging Face transformers models: an attention function and a one-call encoding swap.

Two pieces (extra ``hf``):

* :func:`register` adds :func:`posenc_attention` to ``transformers.AttentionInterface`` under
  ``"posenc"`` (a model picks it with ``attn_implementation="posenc"``), with a boolean mask
  function under the same name that records where each call's keys sit in the cache. The function
  runs posenc's attention core (:func:`posenc.common.attention.attend`: SDPA, FlexAttention or the
  chunked dense kernel, as the plan decides) with the encoding attached to the Hugging Face
  attention module, if any, for every cache class transformers offers (dynamic, static,
  sliding-window and offloaded): the keys' positions and the causal alignment come from what the
  cache told transformers, not from a guess at its layout.
* :func:`swap_position_encoding` removes a model's own position mechanism and attaches a posenc
  encoding to every self-attention layer (or, for an input encoding, puts it where the model added
  its position table). ``encoding="identity"`` is the model's own encoding expressed in posenc.

Saving: the swap is recorded in ``config.json``; after :func:`register`, ``from_pretrained`` of
such a checkpoint rebuilds the swap before the weights load, and without it transformers refuses
the checkpoint in one line that says to call :func:`register` (it never loads as the plain model).

The parts, one module each: :mod:`.attention` (the attention function), :mod:`.masks` (masks and
cache layouts), :mod:`.families` (the supported architectures: Llama, Qwen2, Mistral, SmolLM3, Gemma 3, Llama 4
(text and multimodal), Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GPT-2, BERT), :mod:`.axes` (M-RoPE's ``(t, h, w)`` positions
from a Qwen-VL model's rotary to the attention function, kept with the cache), :mod:`.swap`
(building and installing the encodings, the saved record), :mod:`.registration` (:func:`register`,
the swap entry point, the checks on load).
"""

from __future__ import annotations

from ...training.report import optional

transformers = optional("transformers", "posenc.integrations.transformers")

from .attention import posenc_attention  # noqa: E402  (after the guarded import)
from .families import (  # noqa: E402
    ATTACHED,
    IMPLEMENTATION,
    INPUT_ATTACHED,
    SUPPORTED_MODEL_TYPES,
    NoComplexRotary,
    NoRotary,
    PositionInput,
)
from .masks import CacheLayout, hf_mask_to_posenc, posenc_mask  # noqa: E402
from .registration import check_finite_weights, is_registered, register, swap_position_encoding  # noqa: E402
from .swap import CONFIG_KEY, IDENTITY, LOAD_GUARD, RECORD_FORMAT, swapped_encoding  # noqa: E402

__all__ = [
    "IMPLEMENTATION", "IDENTITY", "CONFIG_KEY", "RECORD_FORMAT", "LOAD_GUARD", "ATTACHED", "INPUT_ATTACHED",
    "SUPPORTED_MODEL_TYPES", "register", "is_registered", "posenc_attention", "posenc_mask", "CacheLayout",
    "swap_position_encoding", "swapped_encoding", "check_finite_weights", "hf_mask_to_posenc", "NoRotary",
    "NoComplexRotary", "PositionInput",
]
