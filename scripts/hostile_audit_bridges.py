"""The bridges' cases of ``scripts/hostile_audit.py`` (issue 51): the Hugging Face bridge (the
attention function, the mask reader, rope configs, swapping, saving and loading a swapped model)
and the AttentionSmithy bridge. Tiny random models built from configs in code, in float64."""

from __future__ import annotations

import json
import math

import torch

import posenc
from hostile_audit_library import PyCase, _close, _tmp

from tests.test_integration_hf_hostile import _llama  # the tests' tiny Llama


def _saved(encoding: str, edit_config=None, edit_weights=None):
    """A swapped Llama saved to a new directory, its config and weights edited, then loaded."""
    from transformers import LlamaForCausalLM

    from posenc.integrations import transformers as posenc_hf

    directory = _tmp()
    posenc_hf.swap_position_encoding(_llama(), encoding).save_pretrained(directory)
    if edit_config is not None:
        config = json.loads((directory / "config.json").read_text())
        edit_config(config)
        (directory / "config.json").write_text(json.dumps(config))
    if edit_weights is not None:
        from safetensors.torch import load_file, save_file

        weights = load_file(directory / "model.safetensors")
        edit_weights(weights)
        save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return LlamaForCausalLM.from_pretrained(directory, dtype=torch.float64)


def _nan_weight(weights) -> None:
    name = "model.layers.1.self_attn.q_proj.weight"
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = math.nan


def _set(path: tuple, value):
    def edit(config):
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _round_trip() -> str | None:
    from transformers import LlamaForCausalLM

    from posenc.integrations import transformers as posenc_hf

    directory = _tmp()
    model = posenc_hf.swap_position_encoding(_llama(), "alibi")
    model.save_pretrained(directory)
    ids = torch.tensor([[5, 9, 2, 7, 3]])
    with torch.no_grad():
        return _close(LlamaForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()(ids).logits,
                      model(ids).logits, 1e-12)


def _identity_equals_sdpa() -> str | None:
    from posenc.integrations import transformers as posenc_hf

    plain = _llama()
    plain.set_attn_implementation("sdpa")
    swapped = posenc_hf.swap_position_encoding(_llama(), "identity")
    ids = torch.tensor([[5, 9, 2, 7, 3, 11, 4]])
    with torch.no_grad():
        # transformers computes the rotary angles in float32 even in a float64 model: agreement to
        # float32 angles, not 1e-10 (tests/test_integration_hf.py swaps in float64 angles for that)
        return _close(swapped(ids).logits, plain(ids).logits, 1e-6)


def hf_cases() -> list[PyCase]:
    from posenc.integrations import transformers as posenc_hf
    from posenc.seq import rope_from_hf_config

    s = "Hugging Face bridge"
    attn = posenc_hf.swap_position_encoding(_llama(), "alibi").model.layers[0].self_attn
    q4, k4 = torch.randn(1, 4, 3, 8, dtype=torch.float64), torch.randn(1, 2, 3, 8, dtype=torch.float64)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()

    def rope(**fields):
        return lambda: rope_from_hf_config({"head_dim": 8, "max_position_embeddings": 64, **fields})

    return [
        PyCase(s, "a saved config naming another modality's encoding",
               lambda: _saved("alibi", _set(("posenc", "encoding"), "rope2d_axial")), ("encoding", "rope2d_axial")),
        PyCase(s, "NaN weights in the swapped model's safetensors", lambda: _saved("alibi", edit_weights=_nan_weight),
               ("q_proj.weight", "NaN")),
        PyCase(s, "posenc_attention with a 3-D query",
               lambda: posenc_hf.posenc_attention(attn, torch.randn(4, 3, 8), k4, k4, None), ("query", "(4, 3, 8)")),
        PyCase(s, "hf_mask_to_posenc(dtype='float32')",
               lambda: posenc_hf.hf_mask_to_posenc(mask, causal=True, batch=1, q_len=3, kv_len=3, dtype="float32"),
               ("dtype", "'float32'")),
        PyCase(s, "a string rope_scaling", rope(rope_scaling="linear"), ("rope_scaling", "'linear'")),
        PyCase(s, "max_position_embeddings 0 with yarn",
               lambda: rope_from_hf_config({"head_dim": 8, "max_position_embeddings": 0,
                                            "rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                                                "rope_theta": 10000.0}}),
               ("max_position_embeddings", "0")),
        # of our own
        PyCase(s, "swap to an unknown encoding", lambda: posenc_hf.swap_position_encoding(_llama(), "alibo"),
               ("encoding", "alibo")),
        PyCase(s, "swap to a vision encoding", lambda: posenc_hf.swap_position_encoding(_llama(), "rope2d_axial"),
               ("rope2d_axial", "vision")),
        PyCase(s, "swap with an option the encoding lacks",
               lambda: posenc_hf.swap_position_encoding(_llama(), "t5", options={"buckets": 8}), ("buckets",)),
        PyCase(s, "swap with a NaN option",
               lambda: posenc_hf.swap_position_encoding(_llama(), "kerple", options={"init_distance_scale": math.nan}),
               ("init_distance_scale", "nan")),
        PyCase(s, "swap a model twice",
               lambda: posenc_hf.swap_position_encoding(posenc_hf.swap_position_encoding(_llama(), "alibi"), "t5"),
               ("already", "alibi")),
        PyCase(s, "swap a module that is no transformers model",
               lambda: posenc_hf.swap_position_encoding(torch.nn.Linear(2, 2), "alibi"), ("model", "Linear")),
        PyCase(s, "hf_mask_to_posenc with a mask of the wrong keys",
               lambda: posenc_hf.hf_mask_to_posenc(mask, causal=True, batch=1, q_len=3, kv_len=4, dtype=torch.float32),
               ("attention mask", "(1, 1, 3, 3)")),
        PyCase(s, "posenc_attention(scaling=0)",
               lambda: posenc_hf.posenc_attention(attn, q4, k4, k4, None, scaling=0.0), ("scale", "0")),
        PyCase(s, "posenc_attention(dropout=1.5)",
               lambda: posenc_hf.posenc_attention(attn, q4, k4, k4, None, dropout=1.5), ("dropout", "1.5")),
        PyCase(s, "rope config: linear factor -2",
               rope(rope_parameters={"rope_type": "linear", "factor": -2.0, "rope_theta": 1e4}), ("factor", "-2")),
        PyCase(s, "rope config: rope_theta NaN",
               rope(rope_parameters={"rope_type": "default", "rope_theta": math.nan}), ("rope_theta", "nan")),
        PyCase(s, "rope config: head_dim 0",
               lambda: rope_from_hf_config({"head_dim": 0, "max_position_embeddings": 64}), ("head_dim", "0")),
        PyCase(s, "rope config: linear without a factor",
               rope(rope_parameters={"rope_type": "linear", "rope_theta": 1e4}), ("factor",)),
        PyCase(s, "a saved config whose options are out of range",
               lambda: _saved("t5", _set(("posenc", "options"), {"num_buckets": -1})), ("num_buckets", "-1")),
        PyCase(s, "a saved config whose record is a list", lambda: _saved("alibi", _set(("posenc",), ["alibi"])),
               ("posenc", "['alibi']")),
        PyCase(s, "saved, loaded: the same logits", _round_trip, right=lambda r: r),
        PyCase(s, "swap 'identity' = transformers' sdpa", _identity_equals_sdpa, right=lambda r: r),
    ]


# ---- AttentionSmithy ----------------------------------------------------------------------------


def _smithy_equals_attend() -> str | None:
    from posenc.integrations.attention_smithy import PosencAttentionMethod

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 16, dtype=torch.float64) for _ in range(3))
    enc = posenc.build("alibi", num_heads=2)
    out, _ = PosencAttentionMethod(enc, is_causal_masking=True)(q, k, v, None)
    pos, causal = torch.arange(6), posenc.AttentionMask(causal=True)
    return _close(out, posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=causal))


def smithy_cases() -> list[PyCase]:
    from posenc.integrations.attention_smithy import PosencAttentionMethod, strategies

    s = "AttentionSmithy bridge"
    q = torch.randn(2, 2, 4, 16)
    (rope,) = strategies("rope", options={"head_dim": 16}, positions="custom")
    (bias,) = strategies("t5", num_heads=2, positions="custom")
    nan4 = torch.tensor([0.0, 1.0, math.nan, 3.0])
    return [
        PyCase(s, "strategies(slope_degree=nan)", lambda: strategies("alibi", num_heads=2, slope_degree=math.nan),
               ("slope_degree", "nan")),
        PyCase(s, "strategies(num_heads=0)", lambda: strategies("t5", num_heads=0), ("num_heads", "0")),
        PyCase(s, "PosencAttentionMethod(dropout=True)", lambda: PosencAttentionMethod(dropout=True),
               ("dropout", "True")),
        PyCase(s, "PosencAttentionMethod(backend='cuda')", lambda: PosencAttentionMethod(backend="cuda"),
               ("backend", "cuda")),
        PyCase(s, "a 3-D q", lambda: PosencAttentionMethod()(q[0], q, q, None), ("q", "(2, 4, 16)")),
        PyCase(s, "a padding mask of the wrong keys", lambda: PosencAttentionMethod()(q, q, q, None, torch.ones(2, 5)),
               ("padding_and_loss_attention_mask", "(2, 5)")),
        PyCase(s, "rotary_custom_values with nan", lambda: rope.modify_matrix(q, rotary_custom_values=nan4),
               ("rotary_custom_values", "nan")),
        PyCase(s, "alibi_query_values with inf",
               lambda: bias.create_bias_tensor(query=q, key=q, alibi_query_values=torch.tensor([0.0, 1, math.inf, 3]),
                                               alibi_key_values=torch.arange(4.0)), ("alibi_query_values", "inf")),
        PyCase(s, "q_pos kwarg with nan",
               lambda: PosencAttentionMethod(posenc.build("alibi", num_heads=2), is_causal_masking=True)(
                   q, q, q, None, q_pos=nan4[None], kv_pos=nan4[None]), ("q_pos", "nan")),
        PyCase(s, "PosencAttentionMethod = posenc.attend (alibi, float64)", _smithy_equals_attend, right=lambda r: r),
    ]


__all__ = ["hf_cases", "smithy_cases"]
