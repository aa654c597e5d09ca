#!/usr/bin/env bash
# The GPU checks, as one script for a device session (results go to $OUT, or ./gpu-out):
#   1. every kernel path on CUDA against the float64 reference, forward and backward (flex
#      included), for the proving encodings and every relative encoding under every mask;
#   2. the plan each encoding gets on CUDA (path, reason, chunk rows);
#   3. `posenc bench attention` in bf16 at T=4096 and T=16384 with the heavy encodings, whose
#      peak-memory column shows whether any T x T tensor is allocated (a [1, 8, 16384, 16384]
#      bf16 tensor alone would be 4 GiB);
#   4. linear attention and SPE (sine_spe, conv_spe, conv_spe2d) on CUDA against float64 on the
#      CPU with the same noise, causal, padded and packed, and their growth from T=4096 to 16384.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps -e . >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -x tests/test_kernel_paths.py -k cuda 2>&1 | tail -n 40 | tee "$out/cuda_tests.txt"
python3 - <<'PY' 2>&1 | tee "$out/plans.txt"
import torch, posenc
from posenc.bench.attention import DEFAULT_ENCODINGS
dims = posenc.ModelDims(dim=512, num_heads=8, max_len=4096)
x = torch.randn(1, 4096, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for name in [n for n in DEFAULT_ENCODINGS if n != "none"]:
    enc = posenc.build(name, dims=dims)
    attn = posenc.MultiheadAttention(512, 8, encoding=None if not (enc.hooks - {posenc.Hook.INPUT}) else enc)
    attn = attn.to("cuda", torch.bfloat16)
    print(f"{name:16s}", attn.plan(x, mask=posenc.AttentionMask(causal=True)))
PY
for t in 4096 16384; do
  python3 -m posenc.cli bench attention --device cuda --dtype bfloat16 --seq-len "$t" --batch 1 --no-peers --no-progress \
    --repeats 3 --warmup 1 --plans \
    --encodings none,rope,alibi,t5,fire,erpe,shaw,transformer_xl,erpe_vector,deberta,cape,cope \
    --json "$out/bench_cuda_T$t.json" 2>&1 | tee "$out/bench_cuda_T$t.txt"
done
python3 - <<'PY' 2>&1 | tee "$out/linear_cuda.txt"
# float32 on CUDA against float64 on CUDA: SPE draws its noise on the device (the same values in
# both precisions, drawn in float32), so the reference must run there too.
import torch, posenc
from posenc.seq import ConvSPE, SineSPE
from posenc.vision import ConvSPE2d
torch.manual_seed(0)
dev = torch.device("cuda")
seg = (torch.arange(300, device=dev) // 70)[None].expand(2, -1)
masks = {"none": None, "causal": posenc.AttentionMask(causal=True),
         "padded": posenc.AttentionMask(causal=True, key_valid=torch.arange(300, device=dev)[None].expand(2, -1) < 250),
         "packed": posenc.AttentionMask.packed(seg)}
grid = torch.stack((torch.arange(300) // 20, torch.arange(300) % 20), -1)[None].to(dev)
for name, enc in [("none", None), ("sine_spe", SineSPE(4, 16, num_realizations=32)),
                  ("conv_spe", ConvSPE(4, 16, num_realizations=32)), ("conv_spe2d", ConvSPE2d(4, 16, num_realizations=32))]:
    for fm in (posenc.EluFeatureMap(), posenc.FavorFeatureMap(32 if enc is not None else 16, seed=0)):
        for mname, mask in masks.items():
            if name == "conv_spe2d" and mname != "none":
                continue
            pos = grid if name == "conv_spe2d" else torch.arange(300, device=dev)[None]
            q, k, v = (torch.randn(2, 4, 300, 16, dtype=torch.float64, device=dev) for _ in range(3))
            e = None if enc is None else enc.to(dev).eval()
            ref = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=None if e is None else e.double(), mask=mask,
                                feature_map=fm.to(dev).double())
            got = posenc.attend(q.float(), k.float(), v.float(), q_pos=pos, kv_pos=pos,
                                encoding=None if e is None else e.float(), mask=mask, feature_map=fm.float())
            err = (got.double() - ref).abs().max().item()
            print(f"{name:10s} {fm.name:6s} {mname:7s} max |fp32 - fp64| on cuda = {err:.2e}", "ok" if err < 1e-3 else "FAIL")
PY
python3 -m posenc.cli bench attention --device cuda --dtype bfloat16 --seq-lens 4096,16384 --batch 4 --no-peers --no-progress \
  --repeats 3 --warmup 1 --plans --encodings none --linear-encodings none,sine_spe,conv_spe \
  --json "$out/bench_cuda_linear.json" 2>&1 | tee "$out/bench_cuda_linear.txt"
