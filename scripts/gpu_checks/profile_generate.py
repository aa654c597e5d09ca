"""Where a posenc CausalLM's prefill and cached decoding spend their time on the device, beside
HF's Llama of the same size: on the first H200 run posenc's RoPE prefilled 2048 tokens in 72 ms
against x-transformers' 10 ms and decoded at 0.4-0.6x HF's tokens/s, which its op count (139
kernels a step against HF's 135, no host syncs on the CPU) does not explain. Prints the wall time
of each and the profiler's top ops (self CPU, and device time) of posenc's."""

from __future__ import annotations

import time

import torch
from _common import DEVICE, SMALL
from torch.profiler import ProfilerActivity, profile

import posenc
from posenc.seq import CausalLM

T = 128 if SMALL else 2048
dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, n: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n * 1e3


torch.manual_seed(0)
model = CausalLM(256, 256, 4, 4, encoding="rope", max_len=T + 64).to(DEVICE, dtype).eval()
prompt = torch.randint(0, 256, (1, T), device=DEVICE)
token = prompt[:, :1]
with torch.no_grad():
    def prefill():
        cache = posenc.KVCache(4)
        model(prompt, cache=cache)
        return cache

    for _ in range(3):
        cache = prefill()
    prefill_ms = timed(prefill, 5)
    cache = prefill()
    for _ in range(8):
        model(token, cache=cache)
    step_ms = timed(lambda: model(token, cache=cache), 32)
    print(f"posenc rope: prefill {T} tokens {prefill_ms:.2f} ms, decode step {step_ms:.2f} ms")

    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=T + 64)
    cfg._attn_implementation = "sdpa"
    hf = LlamaForCausalLM(cfg).to(DEVICE, dtype).eval()

    def hf_prefill():
        return hf(prompt, past_key_values=DynamicCache(config=cfg), use_cache=True).past_key_values

    for _ in range(3):
        hf_prefill()
    hf_prefill_ms = timed(hf_prefill, 5)
    pkv = hf_prefill()
    for _ in range(8):
        hf(token, past_key_values=pkv, use_cache=True)
    hf_step_ms = timed(lambda: hf(token, past_key_values=pkv, use_cache=True), 32)
    print(f"HF llama:    prefill {T} tokens {hf_prefill_ms:.2f} ms, decode step {hf_step_ms:.2f} ms")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.type == "cuda" else [])
    with profile(activities=activities) as prof:
        cache = prefill()
        for _ in range(8):
            model(token, cache=cache)
        sync()
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=25))
    if DEVICE.type == "cuda":
        print(table.table(sort_by="self_cuda_time_total", row_limit=15))
