"""Issue 47's encodings on the device, in bfloat16 and float32 against float64 on the same device:
M-RoPE (sections and interleaved, positions from mrope_position_ids), proportional RoPE, Llama 4's NoPE
temperature and DINOv3's RoPE, through posenc.attend on each kernel path (causal, padded, packed), and
an iRoPE CausalLM whose cached greedy generate equals its uncached one.
"""

from __future__ import annotations

import torch
from _common import DEVICE, SMALL, check, finish

import posenc
from posenc.seq import CausalLM, irope_schedule, mrope_position_ids
from posenc.vision import grid_positions

torch.manual_seed(0)
T = 64 if SMALL else 1024
H, D = 4, 64
TOL = {torch.bfloat16: 5e-2, torch.float32: 1e-4}
seg = (torch.arange(T, device=DEVICE) // (T // 4))[None].expand(2, -1)
MASKS = {"causal": posenc.AttentionMask(causal=True),
         "padded": posenc.AttentionMask(causal=True, key_valid=torch.arange(T, device=DEVICE)[None].expand(2, -1)
                                        < T - 7),
         "packed": posenc.AttentionMask.packed(seg, causal=True)}
BACKENDS = ("auto", "sdpa", "dense", "math") + (("flex",) if DEVICE.type == "cuda" else ())


def mrope_positions() -> torch.Tensor:
    n_img = 4 * 6  # a (1, 8, 12) grid merged 2 x 2
    types = torch.tensor([[0] * 10 + [1] * n_img + [0] * (T - 10 - n_img)] * 2)
    return mrope_position_ids(types, image_grids=[[1, 8, 12]] * 2, spatial_merge_size=2).positions.to(DEVICE)


ENCODINGS = {  # name -> (encoding, positions)
    "mrope sections": (posenc.build("mrope", head_dim=D), mrope_positions()),
    "mrope interleaved": (posenc.build("mrope", head_dim=D, layout="interleaved"), mrope_positions()),
    "rope_proportional": (posenc.build("rope_proportional", head_dim=D, partial_rotary_factor=0.25, base=1e6),
                          torch.arange(T, device=DEVICE)[None]),
    "nope_temperature": (posenc.build("nope_temperature", floor_scale=16.0), torch.arange(T, device=DEVICE)[None]),
}


def one(enc, pos, mask, dtype, backend):
    q, k, v = (torch.randn(2, H, T, D, dtype=torch.float64, device=DEVICE) for _ in range(3))
    enc = enc.to(DEVICE)
    ref = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend="math")
    got = posenc.attend(q.to(dtype), k.to(dtype), v.to(dtype), q_pos=pos, kv_pos=pos, encoding=enc, mask=mask,
                        backend=backend)
    err = (got.double() - ref).abs().max().item()
    assert err < TOL[dtype], f"max |{dtype} - float64| = {err:.2e}"


for name, (enc, pos) in ENCODINGS.items():
    for mname, mask in MASKS.items():
        for dtype in (torch.bfloat16, torch.float32):
            for backend in BACKENDS:
                check(f"{name} {mname} {dtype} {backend}: == float64 on {DEVICE.type}",
                      lambda enc=enc, pos=pos, mask=mask, dtype=dtype, backend=backend: one(enc, pos, mask, dtype,
                                                                                             backend))


def dinov3(dtype):
    rows, cols, prefix = (6, 8, 5) if SMALL else (32, 32, 5)
    enc = posenc.build("rope2d_dinov3", head_dim=D, num_prefix_tokens=prefix).to(DEVICE)
    pos = grid_positions(rows, cols, num_prefix_tokens=prefix, device=DEVICE)
    n = prefix + rows * cols
    q, k, v = (torch.randn(2, H, n, D, dtype=torch.float64, device=DEVICE) for _ in range(3))
    ref = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, backend="math")
    got = posenc.attend(q.to(dtype), k.to(dtype), v.to(dtype), q_pos=pos, kv_pos=pos, encoding=enc)
    err = (got.double() - ref).abs().max().item()
    assert err < TOL[dtype], f"max |{dtype} - float64| = {err:.2e}"


for dtype in (torch.bfloat16, torch.float32):
    check(f"rope2d_dinov3 {dtype}: == float64 on {DEVICE.type}", lambda dtype=dtype: dinov3(dtype))


def irope_generate():
    torch.manual_seed(0)
    model = CausalLM(256, dim=128, depth=4, num_heads=4, encoding="rope_llama3", max_len=T,
                     encoding_options={"factor": 8.0, "original_max_len": 16, "pairing": "interleaved"},
                     layer_schedule=irope_schedule(2, floor_scale=8.0)).to(DEVICE).eval()
    prompt = torch.randint(0, 256, (2, 8), device=DEVICE)
    cached = model.generate(prompt, 24, greedy=True, use_cache=True)
    full = model.generate(prompt, 24, greedy=True, use_cache=False)
    assert torch.equal(cached, full), "cached greedy decoding differs from the uncached one"


check(f"iRoPE CausalLM: cached greedy generate == uncached on {DEVICE.type}", irope_generate)
finish()
