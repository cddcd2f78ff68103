#!/usr/bin/env bash
# Nsight Compute counters of stage 07 and of cuDNN's fused attention (PyTorch SDPA) side by side on
# prefill_d128_s4096 (B 4, H 16, S 4096, D 128, bf16, BSHD), one launch each, clocks as they are:
# the launch shape, the instruction mix per pipe and the stall reasons per issued instruction.
# Usage: tools/ncu_vs_cudnn.sh [stage]      (default 07_overlap; needs build/ and PyTorch)
set -uo pipefail
stage=${1:-07_overlap}
metrics=(
  launch__grid_size launch__block_size launch__registers_per_thread
  launch__shared_mem_per_block_dynamic gpu__time_duration.sum sm__cycles_elapsed.avg.per_second
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  smsp__issue_active.avg.pct_of_peak_sustained_active smsp__inst_executed.sum
  sm__inst_executed_pipe_xu.sum sm__inst_executed_pipe_fma.sum sm__inst_executed_pipe_alu.sum
  smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
  smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
  smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
  smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
  smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio
  smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio
)
list=$(IFS=,; echo "${metrics[*]}")
filter='^\s+(gpu__|sm__|smsp__|launch__)|==PROF==|rror|\(\d+, \d+, \d+\)x'
echo "== $stage on prefill_d128_s4096"
ncu --clock-control none -k regex:'^(attention|warp_specialized|overlap)_kernel' --launch-skip 3 \
    --launch-count 1 --metrics "$list" "build/stages/$stage/$stage" --shape prefill_d128_s4096 \
    --no-check 2>&1 | grep -P "$filter"
echo "== sdpa_cudnn on prefill_d128_s4096"
script=$(mktemp --suffix=.py)
trap 'rm -f "$script"' EXIT
cat > "$script" <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn(4, 4096, 16, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
           for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # only this launch is profiled (--profile-from-start off)
    F.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
PY
ncu --clock-control none --profile-from-start off --metrics "$list" python3 "$script" 2>&1 |
  grep -P "$filter"
