"""Hostile input to the Hugging Face bridge: each misuse is one clear line naming what is wrong,
never a stray exception from deep inside, and a swapped checkpoint never loads as something else.

Tiny random models built from configs in code; the load tests write checkpoints to tmp_path and
load them in fresh processes where the order of imports matters."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from posenc.integrations import transformers as posenc_hf  # noqa: E402
from posenc.seq import rope_from_hf_config  # noqa: E402

VOCAB = 61


def _llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         eos_token_id=VOCAB - 1, bos_token_id=1)
    return LlamaForCausalLM(config).to(torch.float64).eval()


def _one_line(info) -> str:
    message = str(info.value)
    assert "\n" not in message, message
    return message


# --- the attention function and the mask reader --------------------------------------------------


def test_a_3d_query_is_one_line_naming_the_shape():
    model = posenc_hf.swap_position_encoding(_llama(), "alibi")
    attn = model.model.layers[0].self_attn
    k = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"query must be \[batch, heads, tokens, head_dim\] \(4D, as transformers "
                                         r"passes it\); got \(4, 3, 8\)") as info:
        posenc_hf.posenc_attention(attn, torch.randn(4, 3, 8), k, k, None)
    _one_line(info)
    with pytest.raises(ValueError, match=r"key must be \[batch, heads, tokens, head_dim\]"):
        posenc_hf.posenc_attention(attn, torch.randn(1, 4, 3, 8), k[0], k, None)
    with pytest.raises(ValueError, match="value must be"):
        posenc_hf.posenc_attention(attn, torch.randn(1, 4, 3, 8), k, "v", None)
    with pytest.raises(ValueError, match="must share batch and head_dim"):
        posenc_hf.posenc_attention(attn, torch.randn(1, 4, 3, 6), k, k, None)


@pytest.mark.parametrize("dtype", ["float32", torch.long, None])
def test_a_mask_dtype_that_is_no_floating_torch_dtype_is_one_line(dtype):
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    with pytest.raises(TypeError, match=re.escape("dtype must be a floating torch.dtype (torch.float32, ...) for the "
                                                  f"additive bias; got {dtype!r}")) as info:
        posenc_hf.hf_mask_to_posenc(mask, causal=True, batch=1, q_len=3, kv_len=3, dtype=dtype)
    _one_line(info)


# --- rope configs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [
    {"head_dim": 8, "max_position_embeddings": 64, "rope_scaling": "linear"},
    SimpleNamespace(head_dim=8, max_position_embeddings=64, rope_scaling="yarn", rope_parameters=None),
    {"head_dim": 8, "max_position_embeddings": 64, "rope_parameters": ["linear", 2.0]},
])
def test_a_rope_dict_that_is_no_dict_is_one_line(config):
    with pytest.raises(TypeError, match=r"(rope_scaling|rope_parameters) must be a dict of rope fields "
                                        r"\(rope_type, rope_theta, factor, ...\) or null; got") as info:
        rope_from_hf_config(config)
    _one_line(info)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn"},
    {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 2.0},
    {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
    {"rope_type": "dynamic", "factor": 2.0},
])
def test_a_zero_max_position_embeddings_is_one_line_not_a_zero_division(rope):
    config = {"head_dim": 8, "max_position_embeddings": 0, "rope_parameters": {"rope_theta": 10000.0, **rope}}
    with pytest.raises(ValueError, match="max_position_embeddings must be a positive int; got 0") as info:
        rope_from_hf_config(config)
    assert f"rope_type {rope['rope_type']!r}" in _one_line(info)


# --- loading a swapped checkpoint ---------------------------------------------------------------


def _saved(tmp_path, encoding="alibi"):
    model = posenc_hf.swap_position_encoding(_llama(), encoding)
    model.save_pretrained(tmp_path)
    return model


def test_a_record_naming_an_encoding_of_another_modality_is_refused_on_load(tmp_path):
    _saved(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["posenc"]["encoding"] = "rope2d_axial"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.posenc\['encoding'\] 'rope2d_axial' is a vision encoding") as info:
        LlamaForCausalLM.from_pretrained(tmp_path)
    _one_line(info)
    config["posenc"]["encoding"] = 7
    path.write_text(json.dumps(config))
    with pytest.raises(TypeError, match=r"config.posenc\['encoding'\] must be a registered sequence encoding name"):
        LlamaForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("encoding, bad", [("fire", float("nan")), ("t5", float("inf")), ("alibi", float("nan"))])
def test_non_finite_weights_of_a_swapped_model_are_refused_on_load(tmp_path, encoding, bad):
    safetensors = pytest.importorskip("safetensors.torch")
    _saved(tmp_path, encoding)
    file = tmp_path / "model.safetensors"
    weights = safetensors.load_file(file)
    own = sorted(name for name in weights if ".position_encoding." in name)
    name = own[0] if own else "model.layers.1.self_attn.q_proj.weight"  # ALiBi keeps no weights: the model's own
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = bad
    safetensors.save_file(weights, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"hold 1 non-finite value\(s\) \(NaN or inf\) in {name}; refusing") as info:
        LlamaForCausalLM.from_pretrained(tmp_path)
    _one_line(info)


_LOAD = textwrap.dedent("""
    import sys, torch
    {imports}
    from transformers import LlamaForCausalLM
    try:
        model = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float64).eval()
    except Exception as exc:
        print("REFUSED", type(exc).__name__, exc)
        raise SystemExit(0)
    ids = torch.tensor([[5, 9, 2, 7, 3]])
    with torch.no_grad():
        torch.save(model(ids).logits, sys.argv[2])
    print("LOADED", model.config._attn_implementation, type(model.model.rotary_emb).__name__)
""")


def _load_in_a_fresh_process(tmp_path, imports: str) -> str:
    code = _LOAD.format(imports=imports)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(tmp_path / "logits.pt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_a_swapped_checkpoint_loaded_without_register_is_refused_in_one_line_saying_to_call_it(tmp_path):
    _saved(tmp_path)
    for imports in ("", "import posenc.integrations.transformers"):  # imported but not registered: refused too
        line = _load_in_a_fresh_process(tmp_path, imports)
        assert line.startswith("REFUSED ValueError"), line
        assert "call posenc.integrations.transformers.register() before loading" in line, line


@pytest.mark.parametrize("imports", [
    "from posenc.integrations.transformers import register\nregister()\nimport transformers",
    "import transformers\nfrom posenc.integrations.transformers import register\nregister()",
])
def test_a_swapped_checkpoint_loads_as_the_swapped_model_in_either_import_order(tmp_path, imports):
    model = _saved(tmp_path)
    line = _load_in_a_fresh_process(tmp_path, imports)
    assert line == "LOADED posenc NoRotary", line
    with torch.no_grad():
        want = model(torch.tensor([[5, 9, 2, 7, 3]])).logits
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), want, atol=1e-12, rtol=0)


def test_the_saved_config_names_the_guard_and_the_swap_survives_a_second_save(tmp_path):
    posenc_hf.register()
    model = _saved(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attn_implementation"] == posenc_hf.LOAD_GUARD
    assert saved["posenc"] == {"format": 1, "encoding": "alibi", "options": {}}
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert loaded.config._attn_implementation == "posenc"
    loaded.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["attn_implementation"] == posenc_hf.LOAD_GUARD and again["posenc"] == saved["posenc"]
    assert copy.deepcopy(loaded).config.posenc == saved["posenc"]
    del model
