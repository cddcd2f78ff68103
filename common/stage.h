/// @file stage.h
/// @brief What a stage exports: its launch, its launch plan, its workspace, its description.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "params.h"
#include "status.h"

namespace attn {

/// The launch a stage would make for a problem: for reports and for its own launch().
struct LaunchPlan {
  dim3 grid;                      ///< CTAs
  dim3 block;                     ///< threads per CTA
  size_t dynamic_smem_bytes = 0;  ///< dynamic shared memory per CTA
  const void* kernel = nullptr;   ///< the __global__ function (for its attributes and occupancy)
  std::string notes;              ///< stage-specific choices worth printing (e.g. num_splits)
};

/// A stage as the registry, the runner, the tests and the benchmarks see it.
struct StageInfo {
  const char* name = "";         ///< directory name, e.g. "01_naive"; benchmark prefix
  const char* description = "";  ///< the one idea this stage adds, one line
  int min_sm = 80;               ///< compute capability x10 the stage needs
  /// Validate @p p (nothing launched on error), then run the stage on @p stream.
  Status (*launch)(const AttnParams& p, const Workspace& ws, cudaStream_t stream) = nullptr;
  /// The launch configuration launch() would use for @p p (which must be valid).
  Status (*plan)(const AttnParams& p, LaunchPlan* out) = nullptr;
  /// Scratch bytes launch() needs for @p p; null when the stage needs none.
  size_t (*workspace_bytes)(const AttnParams& p) = nullptr;
  /// The default benchmark run skips prefill shapes longer than this (0: no limit), so a slow
  /// stage does not take minutes; `attn_bench --attn_all_shapes` runs them anyway.
  int64_t bench_max_seq = 0;
};

/// Workspace bytes @p stage needs for @p p (0 when it needs none).
size_t workspace_bytes(const StageInfo& stage, const AttnParams& p);

/// A plan with the kernel's compiled resources and the occupancy it reaches on the device.
struct LaunchReport {
  LaunchPlan plan;          ///< the stage's plan
  int registers = 0;        ///< registers per thread
  size_t static_smem_bytes = 0;  ///< static shared memory per CTA
  int64_t ctas = 0;         ///< grid size
  int ctas_per_sm = 0;      ///< resident CTAs per SM (occupancy calculator)
  int sm_count = 0;         ///< SMs on the device
  double waves = 0;         ///< ctas / (ctas_per_sm * sm_count)
};

/// Fill @p out for @p stage on @p p, on the current device.
Status describe_launch(const StageInfo& stage, const AttnParams& p, LaunchReport* out);

/// "grid (16,1,1) x block (256,1,1) = 16 CTAs, 8/SM, 0.02 waves on 132 SMs, smem 0 B, 40 regs".
std::string describe(const LaunchReport& r);

}  // namespace attn
