#!/usr/bin/env bash
# One call on a GPU machine: build, test, sanitize, run and benchmark, logs and JSON under $OUT
# (default out/, which git ignores). The commit measured is the build's own (ATTN_COMMIT, when set,
# overrides it, e.g. for a copy of the files without .git).
# Usage: tools/gpu_run.sh STEP...   steps, in the order given:
#   build      configure (preset default) and build with all cores
#   test       full ctest (test_gpu must run, not skip)
#   sanitize   compute-sanitizer memcheck + racecheck on the reduced GPU set
#   runner     the main job on the seed shape and on the default shape
#   bench      attn_bench -> $OUT/bench.json (extra flags in $BENCH_FLAGS)
#   peers      tools/peers.py -> $OUT/peers.json (with $PYTHON, default python3)
#   ncu        Nsight Compute counters of stages 03-07 on prefill_d128_s4096 -> $OUT/ncu.log
#   ncu_decode Nsight Compute counters of stages 02-07 on two decode shapes -> $OUT/ncu_decode.log
# Every step runs even if an earlier one failed; the summary at the end says which failed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$repo/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$repo"
commit=${ATTN_COMMIT:-$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)}
declare -A result
run_step() {  # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  result[$name]="rc=$rc $((SECONDS - t0))s"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
for step in "$@"; do
  case $step in
    build) run_step build bash -c "cmake --preset default >/dev/null && cmake --build build -j\$(nproc)" ;;
    test) run_step test ctest --test-dir build --output-on-failure ;;
    sanitize) run_step sanitize tools/sanitize.sh build/tests/test_gpu ;;
    runner) run_step runner bash -c "build/bench/attn_runner --shape seed && build/bench/attn_runner" ;;
    bench) run_step bench build/bench/attn_bench --benchmark_out="$OUT/bench.json" ${BENCH_FLAGS:-} ;;
    peers) run_step peers bash -c "build/bench/attn_runner --shapes-json > '$OUT/shapes.json' && \
             PYTHONUNBUFFERED=1 ${PYTHON:-python3} tools/peers.py --shapes '$OUT/shapes.json' --out '$OUT/peers.json' ${PEERS_FLAGS:-}" ;;
    ncu) run_step ncu tools/ncu_stages.sh ;;
    ncu_decode) run_step ncu_decode tools/ncu_decode.sh ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
echo "=== summary (commit $commit)"
for step in "$@"; do echo "$step: ${result[$step]:-not run}"; done
