#!/usr/bin/env bash
# Each part of `posenc demo`, quiet and with one busy process beside it, for each candidate thread
# count (posenc.common.threads); prints a table and writes it, with every run's output, to
# $OUT (default ./threads-out). Run it on a machine with nothing else going on.
#
#   scripts/threads_under_load.sh
#   CANDIDATES="default 1 2 0" PARTS="seq graph" STEPS=500 REPEATS=2 scripts/threads_under_load.sh
#
# Candidates: "default" runs without --threads (the policy: one thread fewer than the cores, unless
# OMP_NUM_THREADS is set), a number N runs with --threads N, and 0 is torch's own default (a thread
# per core: what every command did before the policy, except the demo's time-series part, which ran
# on one thread). The busy process is `yes > /dev/null` pinned to core 0 with taskset (unpinned where
# taskset is missing), started before the run and stopped after it. Each part runs once untimed
# first (warm file cache), then quiet and busy alternate for each candidate, so a drift of the
# machine touches both columns. Columns: the median wall seconds of the part's `posenc demo` run
# (start-up and data included, as a user waits for it) over REPEATS runs, busy / quiet, and whether
# the busy run printed the same scores as the quiet one. The target of issue 50: busy / quiet at
# most 2 for the chosen default, and its quiet time no worse than the "0" row's.
set -euo pipefail
cd "$(dirname "$0")/.."
posenc="${POSENC:-.venv/bin/posenc}"
python="${PYTHON:-.venv/bin/python}"
parts="${PARTS:-seq vision graph timeseries}"
candidates="${CANDIDATES:-default 1 0}"
steps="${STEPS:-500}"
repeats="${REPEATS:-1}"
out="${OUT:-threads-out}"
mkdir -p "$out"
unset OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS  # the policy's own default, not the shell's

busy_pid=""
stop_busy() {
  if [[ -n "$busy_pid" ]]; then
    kill "$busy_pid" 2>/dev/null || true
    wait "$busy_pid" 2>/dev/null || true
    busy_pid=""
  fi
}
trap stop_busy EXIT
start_busy() {
  if command -v taskset >/dev/null; then
    taskset -c 0 yes >/dev/null &
  else
    yes >/dev/null &
  fi
  busy_pid=$!
  sleep 1  # let the scheduler settle the busy process on its core
}

# run_part PART CANDIDATE LOG: one `posenc demo` run of PART; prints its wall seconds
run_part() {
  local part=$1 candidate=$2 log=$3 flags=()
  [[ "$candidate" != default ]] && flags=(--threads "$candidate")
  local t0 t1
  t0=$(date +%s.%N)
  "$posenc" demo --parts "$part" --steps "$steps" --no-progress "${flags[@]}" >"$log" 2>&1
  t1=$(date +%s.%N)
  echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}'
}

# the scores a run printed, without its times ("seq: rope trained in 12.3 s; bits_per_byte@64 2.1, ...")
scores() { sed -n 's/^ *\([a-z]*\): \(.*\) trained in [0-9.]* s\(.*\)$/\1 \2\3/p' "$1"; }

median() { sort -n | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

{
  echo "threads under load: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) usable cores, posenc default $("$python" -c \
    'from posenc.common.threads import default_threads; print(default_threads())') thread(s), --steps $steps," \
    "$repeats run(s) each, load average before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); busy process: yes > /dev/null" \
    "$(command -v taskset >/dev/null && echo 'pinned to core 0' || echo 'unpinned (no taskset)')"
} | tee "$out/threads_under_load.txt"

rows=()
for part in $parts; do
  run_part "$part" default "$out/$part-warmup.log" >/dev/null
  for candidate in $candidates; do
    quiet=() busy=() same=yes
    for ((r = 1; r <= repeats; r++)); do
      quiet+=("$(run_part "$part" "$candidate" "$out/$part-$candidate-quiet-$r.log")")
      start_busy
      busy+=("$(run_part "$part" "$candidate" "$out/$part-$candidate-busy-$r.log")")
      stop_busy
      if [[ "$(scores "$out/$part-$candidate-quiet-$r.log")" != "$(scores "$out/$part-$candidate-busy-$r.log")" ]]; then
        same=no
      fi
    done
    q=$(printf '%s\n' "${quiet[@]}" | median)
    b=$(printf '%s\n' "${busy[@]}" | median)
    ratio=$(awk -v b="$b" -v q="$q" 'BEGIN {printf "%.2f", (q > 0 ? b / q : 0)}')
    rows+=("$part|$candidate|$q|$b|$ratio|$same")
    echo "  $part, threads $candidate: quiet ${quiet[*]} s, busy ${busy[*]} s" >&2
  done
done

{
  printf '\n%-11s %-8s %9s %9s %11s %12s\n' part threads "quiet s" "busy s" "busy/quiet" "same scores"
  for row in "${rows[@]}"; do
    IFS='|' read -r part candidate q b ratio same <<<"$row"
    printf '%-11s %-8s %9s %9s %11s %12s\n' "$part" "$candidate" "$q" "$b" "$ratio" "$same"
  done
} | tee -a "$out/threads_under_load.txt"
