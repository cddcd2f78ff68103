#include "timer.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace attn {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  return Status::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Events and graph objects released on every path out of time_launches().
struct Resources {
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Resources() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

}  // namespace

Status time_launches(const LaunchCallback& launch, cudaStream_t stream, const TimingOptions& options, Timing* out) {
  Resources r;
  ATTN_TRY(cuda_status(cudaEventCreate(&r.start), "cudaEventCreate"));
  ATTN_TRY(cuda_status(cudaEventCreate(&r.stop), "cudaEventCreate"));
  int index = 0;

  // Warm up, then time one launch to choose how many go into a sample.
  for (int w = 0; w < options.warmup; ++w) ATTN_TRY(launch(index++, stream));
  ATTN_TRY(cuda_status(cudaEventRecord(r.start, stream), "cudaEventRecord"));
  ATTN_TRY(launch(index++, stream));
  ATTN_TRY(cuda_status(cudaEventRecord(r.stop, stream), "cudaEventRecord"));
  ATTN_TRY(cuda_status(cudaEventSynchronize(r.stop), "warm-up launch"));
  float single_ms = 0;
  ATTN_TRY(cuda_status(cudaEventElapsedTime(&single_ms, r.start, r.stop), "cudaEventElapsedTime"));
  const int per_sample =
      static_cast<int>(std::clamp(std::ceil(options.sample_ms / std::max(single_ms, 1e-4f)), 1.0, 1000.0));

  if (options.graph) {
    // One graph holds a whole sample, so the CPU's launch cost is paid once per sample.
    ATTN_TRY(cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture"));
    Status captured = Status::Ok();
    for (int n = 0; n < per_sample && captured.ok(); ++n) captured = launch(index++, stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &r.graph);
    ATTN_TRY(captured);
    ATTN_TRY(cuda_status(end, "cudaStreamEndCapture"));
    ATTN_TRY(cuda_status(cudaGraphInstantiate(&r.exec, r.graph, 0), "cudaGraphInstantiate"));
    ATTN_TRY(cuda_status(cudaGraphLaunch(r.exec, stream), "cudaGraphLaunch (warm-up)"));
  }

  std::vector<double> per_launch_ms;
  double spent_ms = 0;
  while (static_cast<int>(per_launch_ms.size()) < options.max_samples &&
         (static_cast<int>(per_launch_ms.size()) < options.min_samples || spent_ms < options.budget_ms)) {
    ATTN_TRY(cuda_status(cudaEventRecord(r.start, stream), "cudaEventRecord"));
    if (options.graph) {
      ATTN_TRY(cuda_status(cudaGraphLaunch(r.exec, stream), "cudaGraphLaunch"));
    } else {
      for (int n = 0; n < per_sample; ++n) ATTN_TRY(launch(index++, stream));
    }
    ATTN_TRY(cuda_status(cudaEventRecord(r.stop, stream), "cudaEventRecord"));
    ATTN_TRY(cuda_status(cudaEventSynchronize(r.stop), "timed launches"));
    float ms = 0;
    ATTN_TRY(cuda_status(cudaEventElapsedTime(&ms, r.start, r.stop), "cudaEventElapsedTime"));
    spent_ms += ms;
    per_launch_ms.push_back(ms / per_sample);
  }

  std::sort(per_launch_ms.begin(), per_launch_ms.end());
  const size_t n = per_launch_ms.size();
  const double median = n % 2 ? per_launch_ms[n / 2] : 0.5 * (per_launch_ms[n / 2 - 1] + per_launch_ms[n / 2]);
  out->median_us = median * 1e3;
  out->min_us = per_launch_ms.front() * 1e3;
  out->max_us = per_launch_ms.back() * 1e3;
  out->samples = static_cast<int>(n);
  out->launches_per_sample = per_sample;
  return Status::Ok();
}

}  // namespace attn
