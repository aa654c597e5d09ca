"""The round of 2026-12 on the device: torch drop-in masks, NaN padding, video ViT, GPSLayer, peg1d."""

from __future__ import annotations

import math

import torch
from _common import DEVICE, check, finish
from torch import nn

import posenc

autocast_dtype = torch.bfloat16


def torch_mha():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(64, 4, batch_first=True).to(DEVICE, torch.float64)
    ours = posenc.TorchMultiheadAttention.from_torch(ref, encoding=None).to(DEVICE, torch.float64)
    x = torch.randn(2, 50, 64, device=DEVICE, dtype=torch.float64)
    for mask in (torch.randn(50, 50, device=DEVICE, dtype=torch.float64), torch.rand(50, 50, device=DEVICE) < 0.3):
        a, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
        b, _ = ours(x, x, x, attn_mask=mask, need_weights=False)
        assert torch.allclose(a, b, atol=1e-9), (a - b).abs().max().item()


def nan_padding():
    backends = ("sdpa", "dense", "flex", "math") if DEVICE.type == "cuda" else ("sdpa", "dense", "math")
    for backend in backends:
        enc = None if backend == "sdpa" else posenc.build("alibi", num_heads=4, symmetric=True).to(DEVICE)
        q, k, v = (torch.randn(2, 4, 64, 16, device=DEVICE) for _ in range(3))
        valid = torch.arange(64, device=DEVICE)[None].expand(2, -1) < 48
        k[:, :, 48:] = math.nan
        v[:, :, 48:] = math.nan
        pos = torch.arange(64, device=DEVICE)[None]
        out = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(key_valid=valid),
                            backend=backend)
        assert torch.isfinite(out).all(), backend


def video():
    from posenc.vision import ViT
    for enc in ("sincos3d", "axial3d", "rope3d"):
        m = ViT(img_size=32, patch_size=8, in_chans=1, num_classes=4, dim=64, depth=2, num_heads=4, encoding=enc,
                num_frames=8).to(DEVICE)
        with torch.autocast(DEVICE.type, autocast_dtype):
            m(torch.randn(2, 1, 8, 32, 32, device=DEVICE)).float().sum().backward()


def gps_layer():
    from torch_geometric.data import Batch
    from torch_geometric.nn import GINConv

    from posenc.graph import (  # first: PyG without its import warning
        GPSLayer,
        ShortestPathBias,
        node_positions,
    )
    from posenc.graph.datasets import csl_dataset
    spd = ShortestPathBias(4, max_distance=10)
    layer = GPSLayer(16, GINConv(nn.Linear(16, 16)), 4, encoding=spd).to(DEVICE)
    batch = Batch.from_data_list(csl_dataset(1)).to(DEVICE)
    h = torch.randn(batch.num_nodes, 16, device=DEVICE)
    layer(h, batch.edge_index, batch.batch, positions=node_positions(batch, spd)).sum().backward()


def peg1d_cache():
    from posenc.seq import CausalLM
    m = CausalLM(256, 64, 2, 4, encoding="peg1d", max_len=64).to(DEVICE).eval()
    prompt = torch.randint(0, 256, (2, 8), device=DEVICE)
    full = m.generate(prompt, 8, greedy=True)
    assert full.shape == (2, 16)


check("TorchMultiheadAttention == nn.MultiheadAttention (float and bool masks)", torch_mha)
check("NaN in padded keys/values never reaches a real row (sdpa, dense, flex, math)", nan_padding)
check("video ViT with sincos3d/axial3d/rope3d, bf16 autocast forward+backward", video)
check("GPSLayer with the shortest-path bias, forward+backward", gps_layer)
check("CausalLM with peg1d: cached greedy generation", peg1d_cache)
finish()
