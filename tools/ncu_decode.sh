#!/usr/bin/env bash
# Nsight Compute counters that explain the decode path of stages 02-07: one launch of each
# stage's main kernel per shape (the merge kernel of 02 is not counted). Clocks as they are.
# Usage: tools/ncu_decode.sh [shape...]   (default: decode_b8_sk32768 decode_b1_sk131072)
set -uo pipefail
shapes=${*:-decode_b8_sk32768 decode_b1_sk131072}
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
for stage in 02_kv_split 03_persistent 04_wmma 05_cp_async 06_warp_specialized 07_overlap; do
  for shape in $shapes; do
    echo "== $stage $shape"
    ncu --clock-control none -k regex:'^(attention|warp_specialized|overlap)_kernel' --launch-skip 3 --launch-count 1 --metrics "$metrics" \
        "build/stages/$stage/$stage" --shape "$shape" --no-check 2>&1 | grep -E "^\s+(gpu__|sm__|smsp__|dram__|l1tex__|launch__)|rror"
  done
done
