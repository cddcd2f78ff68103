#include "stage.h"

#include <cstdio>

#include "device.h"

namespace attn {

size_t workspace_bytes(const StageInfo& stage, const AttnParams& p) {
  return stage.workspace_bytes ? stage.workspace_bytes(p) : 0;
}

Status describe_launch(const StageInfo& stage, const AttnParams& p, LaunchReport* out) {
  ATTN_TRY(validate_params(p));
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  LaunchReport r;
  ATTN_TRY(stage.plan(p, &r.plan));
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, r.plan.kernel);
  if (err != cudaSuccess) return Status::Error(std::string("cudaFuncGetAttributes: ") + cudaGetErrorString(err));
  const int threads = static_cast<int>(r.plan.block.x * r.plan.block.y * r.plan.block.z);
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.ctas_per_sm, r.plan.kernel, threads,
                                                      r.plan.dynamic_smem_bytes);
  if (err != cudaSuccess) return Status::Error(std::string("occupancy: ") + cudaGetErrorString(err));
  r.registers = attr.numRegs;
  r.static_smem_bytes = attr.sharedSizeBytes;
  r.ctas = static_cast<int64_t>(r.plan.grid.x) * r.plan.grid.y * r.plan.grid.z;
  r.sm_count = device->sm_count;
  r.waves = r.ctas_per_sm > 0 ? static_cast<double>(r.ctas) / (static_cast<double>(r.ctas_per_sm) * r.sm_count) : 0;
  *out = r;
  return Status::Ok();
}

std::string describe(const LaunchReport& r) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "grid (%u,%u,%u) x block (%u,%u,%u) = %lld CTAs, %d CTAs/SM resident, %.2f waves on %d SMs, "
                "smem %zu B static + %zu B dynamic, %d registers/thread",
                r.plan.grid.x, r.plan.grid.y, r.plan.grid.z, r.plan.block.x, r.plan.block.y, r.plan.block.z,
                static_cast<long long>(r.ctas), r.ctas_per_sm, r.waves, r.sm_count, r.static_smem_bytes,
                r.plan.dynamic_smem_bytes, r.registers);
  std::string s = buf;
  if (!r.plan.notes.empty()) s += "; " + r.plan.notes;
  return s;
}

}  // namespace attn
