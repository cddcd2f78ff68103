/// @file trace.cuh
/// @brief A measured timeline: clock64() stamps at the phases of CTA 0's first work item, taken by
///        thread 0 of each consumer warpgroup, in a build with -DATTN_TRACE (tools/trace_run.sh).
///        Without it, ATTN_STAMP is nothing and trace::dump does nothing. One launch (the first,
///        or the n-th with ATTN_TRACE_LAUNCH=n) prints its stamps to stderr as
///        `trace <stage> <warpgroup> <tile> <event> <cycles>`;
///        tools/trace_plot.py turns them into the phases each stage names.
#pragma once

#include <cuda_runtime.h>

#ifdef ATTN_TRACE
#include <cstdio>
#include <cstdlib>

namespace attn::trace {

constexpr int kGroups = 4, kTiles = 32, kEvents = 8;
static __device__ long long g_stamp[kGroups][kTiles][kEvents];

/// Record event @p e of tile @p t for consumer warpgroup @p g, if @p first (the CTA's first item).
__device__ __forceinline__ void stamp(bool first, int g, int t, int e) {
  if (first && blockIdx.x == 0 && threadIdx.x % 128 == 0 && g < kGroups && t < kTiles)
    g_stamp[g][t][e] = clock64();
}

/// Print the stamps of the process's n-th launch into @p stream, n from the environment's
/// ATTN_TRACE_LAUNCH (default 1, the first and coldest; a later one shows a warm launch). Other
/// launches print nothing. A launch inside a CUDA graph capture does not count (its stamps come
/// later).
inline void dump(const char* stage, cudaStream_t stream) {
  static int count = 0;
  static const int at = [] {
    const char* env = std::getenv("ATTN_TRACE_LAUNCH");
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 1;
  }();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
      capture != cudaStreamCaptureStatusNone)
    return;
  if (++count != at) return;
  static long long h[kGroups][kTiles][kEvents];
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpyFromSymbol(h, g_stamp, sizeof h) != cudaSuccess)
    return;
  for (int g = 0; g < kGroups; ++g)
    for (int t = 0; t < kTiles; ++t)
      for (int e = 0; e < kEvents; ++e)
        if (h[g][t][e] != 0)
          std::fprintf(stderr, "trace %s %d %d %d %lld\n", stage, g, t, e, h[g][t][e]);
}

}  // namespace attn::trace
/// Stamp event @p e of tile @p t for consumer warpgroup @p g, on the CTA's first item (@p first).
#define ATTN_STAMP(first, g, t, e) ::attn::trace::stamp(first, g, t, e)
#else
namespace attn::trace {
/// Without -DATTN_TRACE: nothing to print.
inline void dump(const char*, cudaStream_t) {}
}  // namespace attn::trace
/// Without -DATTN_TRACE: no stamp.
#define ATTN_STAMP(first, g, t, e) ((void)0)
#endif
