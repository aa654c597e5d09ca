#!/usr/bin/env bash
# The GPU checks, as one script for a device session. Results go to $OUT (or ./gpu-out): one file
# per section, packed at the end into results.tgz, and summary.txt, a line per section with its
# exit status and seconds.
#
#   correctness (run side by side; each line PASS or FAIL with the reason):
#     cuda_tests       every kernel path on CUDA against the float64 reference, forward and backward
#                      (flex included), for the proving encodings and every relative encoding under
#                      every mask (tests/test_kernel_paths.py -k cuda), the 2D relative bias on flex, and
#                      FoX's score_mod over its cumulative sums (tests/test_seq_fox.py -k cuda)
#     plans            the plan each encoding gets on CUDA (path, reason, chunk rows)
#     linear_spe       linear attention and SPE in float32 against float64, causal, padded, packed
#     round_2026_12    torch drop-in masks, NaN padding, video ViT, GPSLayer, peg1d
#     generation       cached greedy generation == recomputed, every causal encoding
#     bridges          the Hugging Face bridge in bf16, the identity swap, the AttentionSmithy method
#     autocast_backward  the backward inside bf16 autocast == after it (posenc.common.amp)
#   speed, one at a time afterwards (nothing else on the GPU), the issue's benches first:
#     bench_attention  bf16 at T=4096 and 16384 with the heavy encodings; the peak-memory column shows
#                      whether any T x T tensor is allocated ([1, 8, 16384, 16384] bf16 alone is 4 GiB)
#     bench_linear     linear attention and SPE from T=4096 to 16384
#     generate_bf16    `posenc bench generate` in bf16 with the HF Llama and x-transformers
#     profile_generate RoPE prefill and decode against HF's Llama, wall times and the profiler's top ops
#     models_bf16      `posenc bench models` in bf16 autocast, eager; models_bf16_compiled: the LM pair compiled
#
# Each section has a time cap and the whole run a budget (GPU_CHECKS_BUDGET_S, default 540 s), so
# one slow section cannot cost the rest; a section left without time is listed as SKIP.
# --dry-run runs every section on the CPU at small sizes: a broken check shows here, not on the device.
# Packages the device image lacks (x-transformers, attention-smithy and their needs) are carried as
# wheels in .whl/ (pip download --no-deps ... -d .whl) and installed into /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
dev=cuda
small=0
if [[ "${1:-}" == "--dry-run" ]]; then dev=cpu; small=1; fi
export POSENC_CHECK_DEVICE=$dev POSENC_CHECK_SMALL=$small
py="${PYTHON:-python3}"
if [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1 && [[ $dev == cuda ]]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$out/wheels.txt" 2>&1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:$PWD/scripts/gpu_checks:${PYTHONPATH:-}"
deadline=$(( $(date +%s) + ${GPU_CHECKS_BUDGET_S:-540} ))
: >"$out/summary.txt"

# section NAME CAP_SECONDS COMMAND...: run with the smaller of its cap and the time left
section() {
  local name=$1 cap=$2
  shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < 15 )); then echo "SKIP $name: no time left" | tee -a "$out/summary.txt"; return; fi
  (( cap > left )) && cap=$left
  local t0
  t0=$(date +%s)
  timeout -k 5 "$cap" "$@" >"$out/$name.txt" 2>"$out/$name.err"
  local rc=$?
  local verdict=ok
  (( rc == 124 || rc == 137 )) && verdict="TIMEOUT after ${cap}s"
  (( rc != 0 && rc != 124 && rc != 137 )) && verdict=FAILED
  echo "$name rc=$rc $verdict $(( $(date +%s) - t0 ))s" | tee -a "$out/summary.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$py" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)"; } | tee "$out/gpu.txt"

# Correctness: the tests in one process group (xdist spreads the flex compiles over the cores), the
# check scripts one after another beside them.
if [[ $dev == cuda ]]; then
  # -v: a line per test as it ends, so a run cut off by the cap still names what passed and failed
  # (606 tests, most of them a flex compile: 240 s on 8 workers reached 11% on the first run)
  section cuda_tests 240 "$py" -m pytest -v --tb=line -p no:cacheprovider -n 12 --timeout 120 \
    tests/test_kernel_paths.py tests/test_vision_encodings.py tests/test_seq_fox.py tests/test_decoding_state.py \
    -k "cuda" &
  tests_pid=$!
fi
checks=(plans linear_spe round_2026_12 generation bridges autocast_backward issue47)
for check in "${checks[@]}"; do
  section "$check" 120 "$py" "scripts/gpu_checks/$check.py"
done
[[ $dev == cuda ]] && wait "$tests_pid"
for check in "${checks[@]}"; do grep -h "^FAIL" "$out/$check.txt" 2>/dev/null; done | tee "$out/failures.txt"
[[ $dev == cuda ]] && grep -E "(FAILED|ERROR) tests/|passed|failed" "$out/cuda_tests.txt" | tail -n 80 | tee -a "$out/failures.txt"

# Speed: one bench at a time.
if (( small )); then
  lens=128,256; lin=128,256; ctx=64; bat=1; dtype=float32; reps=1
else
  lens=4096,16384; lin=4096,16384; ctx=512,2048; bat=1,8; dtype=bfloat16; reps=3
fi
# the issue's rows (RoPE against the peers, the score biases against RoPE); all twenty encodings
# took more than 120 s on the first run, most of it compiling
section generate_bf16 150 "$py" -m posenc.cli bench generate --device "$dev" --dtype "$dtype" --contexts "$ctx" \
  --batches "$bat" --repeats 2 --no-progress --out "$out/generate" \
  --encodings rope,alibi,t5,kerple,fire,deberta,transformer_xl,cope,cape,fox
section profile_generate 60 "$py" scripts/gpu_checks/profile_generate.py
section models_bf16 90 "$py" -m posenc.cli bench models --device "$dev" --dtype "$dtype" --models lm,vit,gps \
  --repeats "$reps" --no-compile --no-progress --out "$out/models"
section bench_attention 120 "$py" -m posenc.cli bench attention --device "$dev" --dtype "$dtype" --seq-lens "$lens" \
  --batch 1 --no-peers --no-progress --repeats "$reps" --long-repeats 2 --warmup 1 --plans \
  --encodings none,rope,alibi,t5,fire,fox,erpe,shaw,transformer_xl,erpe_vector,deberta,cape,cope \
  --json "$out/bench_attention.json"
section models_bf16_compiled 120 "$py" -m posenc.cli bench models --device "$dev" --dtype "$dtype" --models lm \
  --repeats "$reps" --no-progress --out "$out/models_compiled"
section bench_linear 60 "$py" -m posenc.cli bench attention --device "$dev" --dtype "$dtype" --seq-lens "$lin" \
  --batch 4 --no-peers --no-progress --repeats "$reps" --long-repeats 2 --warmup 1 --plans --encodings none \
  --linear-encodings none,sine_spe,conv_spe --json "$out/bench_linear.json"
cat "$out/summary.txt"
# The device tool brings back a few files only: everything in one archive beside the summary.
archive=$(mktemp --suffix .tgz)
tar czf "$archive" -C "$out" . && find "$out" -mindepth 1 ! -name summary.txt -delete && mv "$archive" "$out/results.tgz"
