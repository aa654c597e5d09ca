"""The plan each default encoding gets on the device: kernel path, reason, chunk rows."""

from __future__ import annotations

import torch
from _common import DEVICE, SMALL

import posenc
from posenc.cli.bench.attention import DEFAULT_ENCODINGS

T = 256 if SMALL else 4096
dims = posenc.ModelDims(dim=512, num_heads=8, max_len=T)
dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
x = torch.randn(1, T, 512, device=DEVICE, dtype=dtype)
for name in [n for n in DEFAULT_ENCODINGS if n != "none"]:
    enc = posenc.build(name, dims=dims)
    attn = posenc.MultiheadAttention(512, 8, encoding=None if not (enc.hooks - {posenc.Hook.INPUT}) else enc)
    attn = attn.to(DEVICE, dtype)
    print(f"{name:16s}", attn.plan(x, mask=posenc.AttentionMask(causal=True)), flush=True)
