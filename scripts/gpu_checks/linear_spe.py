"""Linear attention and SPE on the device in float32 against float64 on the same device.

SPE draws its noise on the device (the same values in both precisions, drawn in float32), so the
reference runs there too. Causal, padded and packed masks; the 2D SPE on a 15 x 20 grid.
"""

from __future__ import annotations

import torch
from _common import DEVICE, check, finish

import posenc
from posenc.seq import ConvSPE, SineSPE
from posenc.vision import ConvSPE2d

torch.manual_seed(0)
T = 300
seg = (torch.arange(T, device=DEVICE) // 70)[None].expand(2, -1)
masks = {"none": None, "causal": posenc.AttentionMask(causal=True),
         "padded": posenc.AttentionMask(causal=True, key_valid=torch.arange(T, device=DEVICE)[None].expand(2, -1) < 250),
         "packed": posenc.AttentionMask.packed(seg)}
grid = torch.stack((torch.arange(T) // 20, torch.arange(T) % 20), -1)[None].to(DEVICE)


def one(name, enc, fm, mask):
    pos = grid if name == "conv_spe2d" else torch.arange(T, device=DEVICE)[None]
    q, k, v = (torch.randn(2, 4, T, 16, dtype=torch.float64, device=DEVICE) for _ in range(3))
    e = None if enc is None else enc.to(DEVICE).eval()
    ref = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=None if e is None else e.double(), mask=mask,
                        feature_map=fm.to(DEVICE).double())
    got = posenc.attend(q.float(), k.float(), v.float(), q_pos=pos, kv_pos=pos,
                        encoding=None if e is None else e.float(), mask=mask, feature_map=fm.float())
    err = (got.double() - ref).abs().max().item()
    assert err < 1e-3, f"max |fp32 - fp64| = {err:.2e}"


for name, enc in [("none", None), ("sine_spe", SineSPE(4, 16, num_realizations=32)),
                  ("conv_spe", ConvSPE(4, 16, num_realizations=32)), ("conv_spe2d", ConvSPE2d(4, 16, num_realizations=32))]:
    for fm in (posenc.EluFeatureMap(), posenc.FavorFeatureMap(32 if enc is not None else 16, seed=0)):
        for mname, mask in masks.items():
            if name == "conv_spe2d" and mname != "none":
                continue
            check(f"{name} {fm.name} {mname}: float32 == float64 on {DEVICE.type}",
                  lambda name=name, enc=enc, fm=fm, mask=mask: one(name, enc, fm, mask))
finish()
