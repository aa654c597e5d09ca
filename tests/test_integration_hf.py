"""posenc inside Hugging Face transformers models (posenc.integrations.transformers).

Tiny random models built from configs in code (no downloads). The reference is Hugging Face's own
``sdpa`` and ``eager`` attention; the identity swap (the model's own encoding expressed in posenc)
must give the same forward, gradients, padded batches and greedy cached generation in float64.
Hugging Face computes RoPE angles in float32 even in a float64 model (``position_ids.float() *
inv_freq.float()``) while posenc computes them in float64; the tight comparisons give the
reference float64 angles (:class:`Float64Rotary`), and one test compares with the untouched model
at float32-angle accuracy.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from posenc.integrations import transformers as posenc_hf  # noqa: E402

VOCAB = 61
ROPE_KINDS = ("llama", "qwen2", "mistral")
TIGHT = dict(atol=1e-10, rtol=0)
# Hugging Face's eager path takes the softmax in float32 whatever the model's dtype
# (``softmax(..., dtype=torch.float32).to(query.dtype)``): float32 accuracy against it. In a float64
# model its padding mask (float64 ``finfo.min``) becomes ``-inf`` in that float32 softmax, so a padded
# query row is NaN and the NaN reaches the real tokens through the next layer's values: eager with
# padding is compared in float32.
EAGER = dict(atol=2e-5, rtol=0)


class Float64Rotary(nn.Module):
    """A Llama-family rotary embedding (default rope type) with float64 angles."""

    def __init__(self, config) -> None:
        super().__init__()
        self.base = float(config.rope_parameters["rope_theta"])
        self.dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def forward(self, x, position_ids):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _config(kind: str, **extra):
    if kind in ROPE_KINDS:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[kind]
        args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=VOCAB - 1,
                    bos_token_id=1)
        if kind == "mistral":
            args["sliding_window"] = 5
        return cls(**{**args, **extra})
    if kind == "gpt2":
        return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0,
                          eos_token_id=VOCAB - 1, bos_token_id=1, **extra)
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                      max_position_embeddings=64, pad_token_id=0, **extra)


_CLASSES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "mistral": MistralForCausalLM,
            "gpt2": GPT2LMHeadModel, "bert": BertForMaskedLM}


def _reference(kind: str, implementation: str = "sdpa", *, seed: int = 0, float64_rope: bool = True, **extra):
    torch.manual_seed(seed)
    model = _CLASSES[kind](_config(kind, **extra)).to(torch.float64).eval()
    model.set_attn_implementation(implementation)
    if kind in ROPE_KINDS and float64_rope:
        model.model.rotary_emb = Float64Rotary(model.config)
    return model


def _swapped(reference, encoding: str = "identity", options=None):
    return posenc_hf.swap_position_encoding(copy.deepcopy(reference), encoding, options=options)


def _batch(kind: str, padded: bool, length: int = 9):
    torch.manual_seed(3)
    ids = torch.randint(2, VOCAB - 1, (3, length))
    mask = torch.ones(3, length, dtype=torch.long)
    if padded:
        if kind == "bert":  # right padding
            mask[0, -4:] = 0
            mask[2, -1:] = 0
        else:  # left padding, as for generation
            mask[0, :4] = 0
            mask[2, :1] = 0
        ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def _output(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "gpt2", "bert"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("padded", [False, True])
def test_identity_swap_equals_hf_attention_forward(kind, implementation, padded):
    reference = _reference(kind, implementation)
    model = _swapped(_reference(kind))
    if implementation == "eager" and padded:
        reference, model = reference.float(), model.float()
    assert model.config._attn_implementation == "posenc"
    ids, mask = _batch(kind, padded)
    with torch.no_grad():
        want, got = _output(reference, ids, mask), _output(model, ids, mask)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], **(TIGHT if implementation == "sdpa" else EAGER))


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert"])
def test_identity_swap_gradients_equal_hf(kind):
    reference = _reference(kind, "sdpa")
    model = _swapped(_reference(kind))
    ids, mask = _batch(kind, padded=True)
    weight = torch.randn(*ids.shape, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    grads = []
    for m in (reference, model):
        m.zero_grad()
        ((m(input_ids=ids, attention_mask=mask).logits * weight)[mask.bool()]).sum().backward()
        grads.append({name: p.grad for name, p in m.named_parameters() if p.grad is not None})
    renamed = {"transformer.wpe.weight": "transformer.wpe.encoding.table",
               "bert.embeddings.position_embeddings.weight": "bert.embeddings.position_embeddings.encoding.table"}
    want = {renamed.get(name, name): g for name, g in grads[0].items()}
    assert set(want) == set(grads[1])
    for name, g in want.items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-9, rtol=1e-7, msg=name)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_identity_swap_generates_the_same_greedy_tokens_with_the_cache(kind, implementation):
    reference = _reference(kind, implementation)
    model = _swapped(_reference(kind))
    if implementation == "eager":  # see EAGER
        reference, model = reference.float(), model.float()
    ids, mask = _batch(kind, padded=True, length=6)
    args = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    want = reference.generate(ids, **args)
    got = model.generate(ids, **args)
    assert torch.equal(got, want)
    assert torch.equal(model.generate(ids, use_cache=False, **args), got)


def test_identity_swap_follows_the_untouched_hf_rope_and_its_scaling():
    """Against Hugging Face's own rotary module (float32 angles): llama3 scaling from the config."""
    rope = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    reference = _reference("llama", float64_rope=False, rope_parameters=rope)
    model = posenc_hf.swap_position_encoding(copy.deepcopy(reference), "identity")
    ids = torch.randint(2, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = reference(ids).logits, model(ids).logits
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    enc = model.model.layers[0].self_attn.position_encoding
    hf_inv_freq = reference.model.rotary_emb.inv_freq.to(torch.float64)
    torch.testing.assert_close(enc.inv_freq, hf_inv_freq, atol=0, rtol=1e-6)


def test_posenc_attention_without_a_swap_is_a_drop_in_for_sdpa():
    posenc_hf.register()
    reference = _reference("llama", float64_rope=False)
    model = copy.deepcopy(reference)
    model.set_attn_implementation("posenc")
    ids, mask = _batch("llama", padded=True)
    with torch.no_grad():
        torch.testing.assert_close(_output(model, ids, mask)[mask.bool()], _output(reference, ids, mask)[mask.bool()],
                                   **TIGHT)


def test_packed_position_ids_give_one_block_per_document():
    reference = _reference("llama")
    model = _swapped(reference)
    ids = torch.randint(2, VOCAB, (1, 7), generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        alone = model(input_ids=ids[:, 3:], use_cache=False).logits
        want = reference(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(packed[:, 3:], alone, **TIGHT)
    torch.testing.assert_close(packed, want, **TIGHT)


def _alibi_slopes(heads: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float64)


def test_alibi_in_llama_scores_equal_the_formula():
    model = _swapped(_reference("llama"), "alibi")
    attn = model.model.layers[1].self_attn
    seen = {}
    handle = attn.register_forward_pre_hook(lambda m, a, k: seen.update(h=k["hidden_states"]), with_kwargs=True)
    ids = torch.randint(2, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    handle.remove()
    h = seen["h"]
    q = attn.q_proj(h).view(2, 7, 4, 8).transpose(1, 2)
    k = attn.k_proj(h).view(2, 7, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    i = torch.arange(7)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + _alibi_slopes(4).view(1, 4, 1, 1) * (i[None, :] - i[:, None])
    scores = scores.masked_fill(i[None, :] > i[:, None], float("-inf"))
    torch.testing.assert_close(out.attentions[1], scores.softmax(-1), **TIGHT)


@pytest.mark.parametrize("encoding", ["alibi", "fire", "kerple", "t5", "rope", "learned"])
def test_a_swapped_model_generates_with_the_cache_as_without(encoding):
    model = _swapped(_reference("llama", seed=4), encoding)
    ids, mask = _batch("llama", padded=True, length=5)
    args = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **args), model.generate(ids, use_cache=False, **args))


def test_a_swapped_model_trains():
    torch.manual_seed(0)
    model = posenc_hf.swap_position_encoding(LlamaForCausalLM(_config("llama")), "fire")
    model.train()
    ids = torch.arange(2, 18).repeat(4, 2)  # a pattern to learn: the next id
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    fire = model.model.layers[0].self_attn.position_encoding
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in fire.parameters())


def test_attention_dropout_takes_effect_in_training_only():
    model = _swapped(_reference("llama", attention_dropout=0.5))
    ids, mask = _batch("llama", padded=False)
    with torch.no_grad():
        evaluated = _output(model, ids, mask)
        model.train()
        torch.manual_seed(0)
        dropped = _output(model, ids, mask)
        torch.manual_seed(0)
        again = _output(model, ids, mask)
    assert not torch.allclose(dropped, evaluated, atol=1e-3)
    assert torch.equal(dropped, again)


@pytest.mark.parametrize("kind, encoding", [("llama", "identity"), ("llama", "fire"), ("qwen2", "t5"),
                                            ("gpt2", "identity"), ("gpt2", "rope"), ("bert", "t5"),
                                            ("bert", "identity"), ("llama", "sinusoidal")])
def test_save_pretrained_and_from_pretrained_round_trip_the_swap(tmp_path, kind, encoding):
    posenc_hf.register()
    model = _swapped(_reference(kind, float64_rope=False), encoding)
    for p in model.parameters():  # move every weight off its init, so a re-initialised one would show
        p.data.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert loaded.config._attn_implementation == "posenc"
    assert posenc_hf.swapped_encoding(loaded) == {"format": 1, "encoding": encoding, "options": {}}
    ids, mask = _batch(kind, padded=True)
    with torch.no_grad():
        torch.testing.assert_close(_output(loaded, ids, mask), _output(model, ids, mask), atol=1e-12, rtol=0)


def test_hf_masks_read_back_as_posenc_masks():
    b, t = 2, 5
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    valid = torch.tensor([[False, True, True, True, True], [True] * 5])
    mask, bias = posenc_hf.hf_mask_to_posenc((causal & valid[:, None, :])[:, None], causal=True, batch=b, q_len=t,
                                             kv_len=t, dtype=torch.float32)
    assert bias is None and mask.causal and torch.equal(mask.key_valid, valid)
    mask, bias = posenc_hf.hf_mask_to_posenc(valid[:, None, None, :], causal=False, batch=b, q_len=t, kv_len=t,
                                             dtype=torch.float32)
    assert bias is None and not mask.causal and torch.equal(mask.key_valid, valid)
    odd = causal.clone()
    odd[3, 1] = False  # not causal-with-padding: an additive bias over the causal mask
    mask, bias = posenc_hf.hf_mask_to_posenc(odd[None, None], causal=True, batch=b, q_len=t, kv_len=t,
                                             dtype=torch.float64)
    assert mask.causal and mask.key_valid is None
    assert bias[0, 0, 3, 1] == torch.finfo(torch.float64).min and bias[0, 0, 3, 0] == 0
    additive = torch.randn(1, 1, t, t)
    mask, bias = posenc_hf.hf_mask_to_posenc(additive, causal=False, batch=b, q_len=t, kv_len=t, dtype=torch.float32)
    assert mask is None and torch.equal(bias, additive)
    with pytest.raises(ValueError, match=r"attention mask must be \[batch=2"):
        posenc_hf.hf_mask_to_posenc(torch.ones(3, 1, t, t, dtype=torch.bool), causal=True, batch=b, q_len=t, kv_len=t,
                                    dtype=torch.float32)
    with pytest.raises(TypeError, match="bool or float"):
        posenc_hf.hf_mask_to_posenc(torch.ones(1, 1, t, t, dtype=torch.long), causal=True, batch=b, q_len=t, kv_len=t,
                                    dtype=torch.float32)
    with pytest.raises(TypeError, match="as a tensor"):
        posenc_hf.hf_mask_to_posenc([[1]], causal=True, batch=b, q_len=t, kv_len=t, dtype=torch.float32)


# --- hostile input ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(_config("llama"))


@pytest.mark.parametrize("encoding, options, error, match", [
    ("nosuch", None, ValueError, "unknown encoding 'nosuch'"),
    (3, None, TypeError, "encoding must be a registered sequence encoding name"),
    ("rope2d_axial", None, ValueError, "is a vision encoding"),
    ("sine_spe", None, ValueError, "linear attention only"),
    ("peg1d", None, ValueError, "sits between blocks"),
    ("alibi", {"nosuch": 1}, ValueError, "unknown argument"),
    ("alibi", [1], TypeError, "options must be a mapping"),
    ("alibi", {1: 2}, TypeError, "options keys must be argument names"),
    ("t5", {"num_buckets": float("nan")}, ValueError, r"options\['num_buckets'\] must be one of the plain JSON values"),
    ("fire", {"mlp_width": torch.tensor(3)}, ValueError, r"options\['mlp_width'\] must be one of the plain JSON values"),
    ("identity", {"base": 10.0}, ValueError, "takes no options"),
    ("alibi", {"num_heads": 3}, ValueError, "num_heads comes from the model's config"),
    ("rope", {"head_dim": 4}, ValueError, "head_dim comes from the model's config"),
])
def test_bad_arguments_are_refused_with_one_line(llama, encoding, options, error, match):
    model = copy.deepcopy(llama)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=match):
        posenc_hf.swap_position_encoding(model, encoding, options=options)
    assert getattr(model.config, "posenc", None) is None and model.config._attn_implementation != "posenc"
    assert not isinstance(model.model.rotary_emb, posenc_hf.NoRotary)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_unsupported_models_and_illegal_pairs_are_refused(llama):
    with pytest.raises(TypeError, match="PreTrainedModel"):
        posenc_hf.swap_position_encoding(nn.Linear(2, 2), "alibi")
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                                             ffn_dim=16, num_attention_heads=2,
                                                             max_position_embeddings=32))
    with pytest.raises(ValueError, match=r"supports model types llama, qwen2, mistral, .*, gpt2, bert; got OPTForCausalLM"):
        posenc_hf.swap_position_encoding(opt, "alibi")
    bert = BertForMaskedLM(_config("bert"))
    for name in ("alibi", "fire", "kerple", "xpos", "cope"):
        with pytest.raises(ValueError, match="causal attention only; bert attends bidirectionally"):
            posenc_hf.swap_position_encoding(copy.deepcopy(bert), name)
    posenc_hf.swap_position_encoding(copy.deepcopy(bert), "alibi", options={"symmetric": True})  # legal
    swapped = posenc_hf.swap_position_encoding(copy.deepcopy(llama), "alibi")
    with pytest.raises(ValueError, match="already carries a posenc swap"):
        posenc_hf.swap_position_encoding(swapped, "fire")


def test_a_swapped_model_refuses_another_attention_implementation(llama):
    model = posenc_hf.swap_position_encoding(copy.deepcopy(llama), "alibi")
    model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="runs only with attn_implementation='posenc'; got 'sdpa'"):
        model(torch.ones(1, 3, dtype=torch.long))


def test_the_attention_function_refuses_what_it_cannot_honour(llama):
    model = posenc_hf.swap_position_encoding(copy.deepcopy(llama), "alibi")
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 3, 8)
    k = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="does not support softcap"):
        posenc_hf.posenc_attention(attn, q, k, k, None, softcap=30.0)
    with pytest.raises(ValueError, match=r"position_ids must be \[batch=1 or 1, 3\]"):
        posenc_hf.posenc_attention(attn, q, k, k, None, position_ids=torch.arange(4)[None])
    with pytest.raises(ValueError, match=r"3D position_ids must be M-RoPE's \[3 \(t, h, w\) or 4"):
        posenc_hf.posenc_attention(attn, q, k, k, None, position_ids=torch.zeros(2, 1, 3, dtype=torch.long))
    out, weights = posenc_hf.posenc_attention(attn, q, k, k, None, scaling=0.5)
    assert out.shape == (1, 3, 4, 8) and weights is None


def test_a_saved_record_is_checked_when_loaded(tmp_path, llama):
    posenc_hf.register()
    model = posenc_hf.swap_position_encoding(copy.deepcopy(llama), "alibi")
    model.config.posenc = {"format": 99, "encoding": "alibi", "options": {}}
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="format 99; this posenc reads format 1"):
        LlamaForCausalLM.from_pretrained(tmp_path)


def test_register_is_idempotent():
    posenc_hf.register()
    post_init = transformers.PreTrainedModel.post_init
    posenc_hf.register()
    assert transformers.PreTrainedModel.post_init is post_init and posenc_hf.is_registered()
    assert transformers.AttentionInterface()["posenc"] is posenc_hf.posenc_attention


def test_a_missing_transformers_is_one_line_naming_the_extra():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "try:\n    import posenc.integrations.transformers\n"
            "except ImportError as e:\n    print(type(e).__name__, e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "MissingExtra" in done.stdout and "posenc[hf]" in done.stdout, done.stdout + done.stderr


def test_the_readme_recipe_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## Use posenc inside a Hugging Face model", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    namespace: dict = {}
    exec(compile(blocks[0], "README.md (Hugging Face)", "exec"), namespace)
    assert namespace["out"].shape == (2, 12)
