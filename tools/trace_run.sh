#!/usr/bin/env bash
# A measured timeline of stages 06 and 07 (common/trace.cuh), in one call on a GPU machine: build
# both with -DATTN_TRACE into build-trace/, run each once on a shape, print the mean cycles of each
# phase and draw the first tiles into $OUT/trace.png (the stamps themselves: $OUT/trace.txt).
# Usage: OUT=... tools/trace_run.sh [shape]   (default prefill_d128_s4096)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
shape=${1:-prefill_d128_s4096}
cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCH=OFF -DCMAKE_CUDA_FLAGS=-DATTN_TRACE >/dev/null &&
  cmake --build build-trace --target attn_stage_06_warp_specialized_main attn_stage_07_overlap_main -j"$(nproc)" |
  grep -E "error" ; : > "$OUT/trace.txt"
for st in 06_warp_specialized 07_overlap; do
  build-trace/stages/$st/$st --shape "$shape" --no-check 2>>"$OUT/trace.txt" | grep -E "^time"
done
python3 tools/trace_plot.py "$OUT/trace.txt" --png "$OUT/trace.png"
