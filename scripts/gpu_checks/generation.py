"""Cached decoding on the device: for every causal encoding that takes a KV cache, greedy generation
with the cache equals generation that recomputes the whole prefix, and on CUDA through each
encoding's own kernel path (flex for the score biases)."""

from __future__ import annotations

import torch
from _common import DEVICE, check, finish

from posenc.cli.bench.generate import causal_encodings
from posenc.seq import CausalLM


def cached_equals_recomputed(name: str) -> None:
    torch.manual_seed(0)
    model = CausalLM(256, 64, 2, 4, encoding=name, max_len=128).to(DEVICE).eval()
    prompt = torch.randint(0, 256, (2, 24), device=DEVICE)
    cached = model.generate(prompt, 16, greedy=True, use_cache=True)
    plain = model.generate(prompt, 16, greedy=True, use_cache=False)
    assert torch.equal(cached, plain), f"{(cached != plain).sum().item()} of {plain[:, 24:].numel()} tokens differ"


decodable, _ = causal_encodings()
for name in decodable:
    check(f"{name}: cached greedy generation == recomputed on {DEVICE.type}", lambda name=name: cached_equals_recomputed(name))
finish()
