#!/usr/bin/env bash
# Nsight Compute counters that explain the tensor-core stages: one launch of each stage's main
# kernel on a shape (default prefill_d128_s4096), matched by name (04 and 05 also launch a small
# layout-check kernel once per process). Clocks are left as they are (--clock-control none).
# Usage: tools/ncu_stages.sh [shape] [stage...]      (default stages: 03_persistent 04_wmma 05_cp_async 06_warp_specialized 07_overlap)
set -uo pipefail
shape=${1:-prefill_d128_s4096}; shift || true
stages=${*:-03_persistent 04_wmma 05_cp_async 06_warp_specialized 07_overlap}
metrics=(
  gpu__time_duration.sum
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  sm__warps_active.avg.pct_of_peak_sustained_active
  sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
  dram__throughput.avg.pct_of_peak_sustained_elapsed
  lts__t_sectors.avg.pct_of_peak_sustained_elapsed
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
  l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
  smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
  smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
  smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
  smsp__issue_active.avg.pct_of_peak_sustained_active
)
list=$(IFS=,; echo "${metrics[*]}")
for stage in $stages; do
  echo "== $stage on $shape"
  ncu --clock-control none -k regex:'^(attention|warp_specialized|overlap)_kernel' --launch-skip 3 --launch-count 1 --metrics "$list" \
      "build/stages/$stage/$stage" --shape "$shape" --no-check 2>&1 | grep -E "^\s+(gpu__|sm__|smsp__|dram__|lts__|l1tex__)|==PROF==|rror"
done
