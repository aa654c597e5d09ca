#!/usr/bin/env bash
# The GPU checks, as one script for a device session (results go to $OUT, or ./gpu-out):
#   1. every kernel path on CUDA against the float64 reference, forward and backward (flex
#      included), for the proving encodings and every relative encoding under every mask;
#   2. the plan each encoding gets on CUDA (path, reason, chunk rows);
#   3. `posenc bench attention` in bf16 at T=4096 and T=16384 with the heavy encodings, whose
#      peak-memory column shows whether any T x T tensor is allocated (a [1, 8, 16384, 16384]
#      bf16 tensor alone would be 4 GiB).
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
