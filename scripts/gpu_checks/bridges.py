"""The bridges on the device: a Hugging Face Llama with ALiBi in bf16 (forward+backward, cached
generation equal to uncached), the identity swap against HF's sdpa, and the AttentionSmithy method
against its StandardAttentionMethod."""

from __future__ import annotations

import copy

import torch
from _common import DEVICE, check, finish

dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg)


def hf_alibi():
    from posenc.integrations.transformers import register, swap_position_encoding
    register()
    model = swap_position_encoding(tiny_llama(), "alibi").to(DEVICE, dtype)
    ids = torch.randint(0, 256, (2, 64), device=DEVICE)
    model(input_ids=ids, labels=ids).loss.backward()
    model.eval()
    with torch.no_grad():
        cached = model.generate(ids[:, :8], max_new_tokens=8, do_sample=False, pad_token_id=0)
        plain = model.generate(ids[:, :8], max_new_tokens=8, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(cached, plain), (cached != plain).sum().item()


def hf_static_cache():
    """A padded batch into a static cache (issue 49): posenc's attention with and without a swap
    generates what sdpa / the uncached model generates, in bf16."""
    from posenc.integrations.transformers import register, swap_position_encoding
    register()
    ids = torch.randint(1, 256, (2, 12), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    ids = ids.masked_fill(mask == 0, 0)
    args = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        sdpa = tiny_llama().to(DEVICE, dtype).eval()
        posenc_attention = copy.deepcopy(sdpa)
        posenc_attention.set_attn_implementation("posenc")
        want = sdpa.generate(ids, cache_implementation="static", max_cache_len=32, **args)
        got = posenc_attention.generate(ids, cache_implementation="static", max_cache_len=32, **args)
        assert torch.equal(got, want), (got != want).sum().item()
        swapped = swap_position_encoding(tiny_llama(), "alibi").to(DEVICE, dtype).eval()
        cached = swapped.generate(ids, cache_implementation="static", max_cache_len=32, **args)
        plain = swapped.generate(ids, use_cache=False, **args)
        assert torch.equal(cached, plain), (cached != plain).sum().item()


def hf_identity():
    from posenc.integrations.transformers import register, swap_position_encoding
    register()
    ref = tiny_llama().to(DEVICE).eval()
    ours = swap_position_encoding(copy.deepcopy(ref), "identity").eval()
    ids = torch.randint(0, 256, (2, 48), device=DEVICE)
    with torch.no_grad():
        err = (ours(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max().item()
    assert err < 1e-4, err


def smithy_method():
    from attention_smithy.attention import StandardAttentionMethod
    from attention_smithy.components import MultiheadAttention
    from attention_smithy.numeric_embeddings import NumericEmbeddingManager

    from posenc.integrations.attention_smithy import PosencAttentionMethod, strategies
    torch.manual_seed(0)
    manager = NumericEmbeddingManager(strategies("alibi", num_heads=8, options={"symmetric": True})).to(DEVICE)
    ref = MultiheadAttention(256, 8, StandardAttentionMethod(0.0, False)).to(DEVICE)
    ours = copy.deepcopy(ref)
    ours.attention_method = PosencAttentionMethod()
    x = torch.randn(2, 128, 256, device=DEVICE)
    a, _ = ref(x, x, x, manager, padding_and_loss_attention_mask=None)
    b, _ = ours(x, x, x, manager, padding_and_loss_attention_mask=None)
    assert (a - b).abs().max().item() < 1e-4, (a - b).abs().max().item()


check(f"HF Llama with ALiBi, {dtype} on {DEVICE.type}: forward+backward, cached generation == uncached", hf_alibi)
check(f"HF Llama static cache, {dtype} on {DEVICE.type}: posenc == sdpa, swapped cached == uncached", hf_static_cache)
check(f"HF Llama identity swap == HF sdpa on {DEVICE.type} (float32)", hf_identity)
check(f"AttentionSmithy: PosencAttentionMethod == StandardAttentionMethod with ALiBi on {DEVICE.type}", smithy_method)
finish()
