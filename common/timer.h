/// @file timer.h
/// @brief GPU time of a launch: CUDA events around many back-to-back launches, median of samples.
#pragma once

#include <functional>

#include <cuda_runtime_api.h>

#include "status.h"

namespace attn {

/// How to time.
struct TimingOptions {
  bool graph = false;         ///< capture the launches of a sample into a CUDA graph (latency-bound shapes)
  int warmup = 3;             ///< untimed launches first (module load, caches, clocks)
  double sample_ms = 2.0;     ///< aim for samples at least this long (sets launches per sample)
  int min_samples = 10;       ///< never fewer samples
  int max_samples = 100;      ///< never more samples
  double budget_ms = 1000.0;  ///< stop adding samples after this much timed GPU time
};

/// The result: per-launch times.
struct Timing {
  double median_us = 0;         ///< median over samples of (sample time / launches per sample)
  double min_us = 0;            ///< fastest sample, per launch
  double max_us = 0;            ///< slowest sample, per launch
  int samples = 0;              ///< samples taken
  int launches_per_sample = 0;  ///< back-to-back launches inside each sample
};

/// One launch into @p stream; @p index counts launches so the caller can rotate input sets.
using LaunchCallback = std::function<Status(int index, cudaStream_t stream)>;

/// Time @p launch on @p stream (which must not be the legacy default stream when
/// options.graph is set). The first launch error stops the timing and is returned.
Status time_launches(const LaunchCallback& launch, cudaStream_t stream, const TimingOptions& options, Timing* out);

}  // namespace attn
