/// @file warp.cuh
/// @brief Device helpers no stage is about: warp and quad reductions, a fast exp2, fp32 vector
///        loads and stores, and the PTX of a 16-byte asynchronous copy.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace attn {

/// Threads per warp.
constexpr int kWarp = 32;
/// Every lane of a warp, for the *_sync intrinsics.
constexpr unsigned kFullMask = 0xffffffffu;
/// log2(e): scores are kept in log2 units, exp(x) = exp2(x * log2(e)) (exp2 is one instruction).
constexpr float kLog2e = 1.4426950408889634f;
/// ln(2): a log2-unit LSE back to the natural log.
constexpr float kLn2 = 0.6931471805599453f;

/// Sum over the 32 lanes; every lane receives the total (butterfly exchange).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// Maximum over the 32 lanes; every lane receives it.
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

/// Maximum over the 4 lanes of a quad (lanes 4q .. 4q + 3).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/// Sum over the 4 lanes of a quad.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// Sum of N values over the N lanes of a lane group (lanes that differ only in lane % N, N a power
/// of two), each value summed once: at every step a lane keeps half of its values, sends the other
/// half to the partner lane that keeps those, and adds what it receives. After log2(N) steps and
/// N - 1 shuffles (a butterfly per value would take N log2(N)), lane c of the group holds the
/// group's sum of value c. Call it with Half = N/2; one step per instantiation, so that every loop
/// has a constant trip count and @p v stays in registers.
template <int Half, int N>
__device__ __forceinline__ float transpose_sum(float (&v)[N], int lane) {
  // upper ? v[x + Half] : v[x] as a bit blend: written with ?: the compiler selects between the
  // two addresses and moves v to local memory.
  const unsigned upper = (lane & Half) != 0 ? ~0u : 0u;
#pragma unroll
  for (int x = 0; x < Half; ++x) {
    const unsigned lo = __float_as_uint(v[x]), hi = __float_as_uint(v[x + Half]);
    const float keep = __uint_as_float((hi & upper) | (lo & ~upper));
    const float send = __uint_as_float((lo & upper) | (hi & ~upper));
    v[x] = keep + __shfl_xor_sync(0xffffffffu, send, Half);
  }
  if constexpr (Half > 1) return transpose_sum<Half / 2>(v, lane);
  else return v[0];
}

/// 2^x in one MUFU.EX2 instruction (PTX ex2.approx.ftz: 2 ulp, results below 2^-126 flushed to 0,
/// ex2(-inf) = 0). exp2f adds a range test and two multiplies to keep such tiny results exact,
/// which a probability that small does not need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Store E = 2 or 4 consecutive fp32 values in one 8- or 16-byte access.
template <int E>
__device__ __forceinline__ void store_floats(float* dst, const float (&src)[E]) {
  static_assert(E == 2 || E == 4, "D = 64 or 128");
  if constexpr (E == 4) *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  else *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
}

/// Load E = 2 or 4 consecutive fp32 values in one 8- or 16-byte access.
template <int E>
__device__ __forceinline__ void load_floats(const float* src, float (&dst)[E]) {
  static_assert(E == 2 || E == 4, "D = 64 or 128");
  if constexpr (E == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x, dst[1] = v.y;
  }
}

/// load_floats through L2 only (ld.global.cg): for data that other SMs wrote during this launch,
/// which a stale L1 line must not serve.
template <int E>
__device__ __forceinline__ void load_floats_cg(const float* src, float (&dst)[E]) {
  static_assert(E == 2 || E == 4, "D = 64 or 128");
  if constexpr (E == 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(src));
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(src));
    dst[0] = v.x, dst[1] = v.y;
  }
}

/// Start an asynchronous copy of 16 bytes from global to shared memory (cp.async, sm_80+), of
/// which @p src_bytes (0 or 16) are read and the rest zero-filled. `.ca` also allocates the lines
/// in L1, where other CTAs on the SM that read the same tile find them. Nothing waits here: see
/// cp_async_commit() and cp_async_wait().
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(src_bytes)
               : "memory");
}

/// Close the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

/// Wait until at most @p Pending of this thread's committed groups are still in flight. The
/// copies are then visible to this thread; a barrier makes them visible to the others (and keeps
/// the compiler from moving shared-memory reads above it).
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending));
}

}  // namespace attn
