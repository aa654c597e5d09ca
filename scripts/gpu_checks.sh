#!/usr/bin/env bash
# The GPU checks of the foundation issue, as one script for a device session:
#   every kernel path on CUDA (flex forward + backward) against the float64 reference, then
#   `posenc bench attention` in bf16 at T=4096 and T=16384. Results go to $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps -e . >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q tests/test_kernel_paths.py -k cuda 2>&1 | tail -n 30 | tee "$out/cuda_tests.txt"
for t in 4096 16384; do
  python3 -m posenc.cli bench attention --device cuda --dtype bfloat16 --seq-len "$t" --no-peers --no-progress \
    --encodings none,rope,alibi,sinusoidal --json "$out/bench_cuda_T$t.json" 2>&1 | tee "$out/bench_cuda_T$t.txt"
done
