/// @file dtype.cuh
/// @brief Device helpers every stage shares: fp16/bf16 <-> fp32 and vector loads of a row slice.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "params.h"

namespace attn {

/// An element as fp32.
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
/// An element as fp32.
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// fp32 rounded to the element type T (round to nearest even).
template <typename T> __device__ __forceinline__ T from_float(float x);
/// fp32 rounded to fp16.
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
/// fp32 rounded to bf16.
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// The 16 bits of an element, and back (no type punning through pointers).
__device__ __forceinline__ uint16_t to_bits(__half x) { return __half_as_ushort(x); }
/// The 16 bits of an element.
__device__ __forceinline__ uint16_t to_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
/// An element from its 16 bits.
template <typename T> __device__ __forceinline__ T from_bits(uint16_t bits);
/// An fp16 element from its 16 bits.
template <> __device__ __forceinline__ __half from_bits<__half>(uint16_t bits) { return __ushort_as_half(bits); }
/// A bf16 element from its 16 bits.
template <> __device__ __forceinline__ __nv_bfloat16 from_bits<__nv_bfloat16>(uint16_t bits) {
  return __ushort_as_bfloat16(bits);
}

/// Raw storage for N 16-bit elements, so that one load or store moves all of them
/// (N = 2: 4 bytes, 4: 8 bytes, 8: 16 bytes).
template <int N> struct alignas(2 * N) Pack {
  uint16_t bits[N];  ///< the elements' bit patterns, in order
};

/// Load N consecutive elements starting at @p src (aligned to 2*N bytes) in one access, still packed.
template <int N, typename T>
__device__ __forceinline__ Pack<N> load_pack(const T* src) {
  return *reinterpret_cast<const Pack<N>*>(src);
}

/// The N elements of a pack of T, as fp32.
template <typename T, int N>
__device__ __forceinline__ void unpack_to_float(const Pack<N>& pack, float (&dst)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) dst[e] = to_float(from_bits<T>(pack.bits[e]));
}

/// Load N consecutive elements starting at @p src (aligned to 2*N bytes) as fp32.
template <int N, typename T>
__device__ __forceinline__ void load_as_float(const T* src, float (&dst)[N]) {
  unpack_to_float<T>(load_pack<N>(src), dst);
}

/// Round N fp32 values to T and store them at @p dst (aligned to 2*N bytes), written as one pack;
/// nvcc may still emit one 16-bit store per element (it does in 01-05's epilogues).
template <int N, typename T>
__device__ __forceinline__ void store_from_float(T* dst, const float (&src)[N]) {
  Pack<N> pack;
#pragma unroll
  for (int e = 0; e < N; ++e) pack.bits[e] = to_bits(from_float<T>(src[e]));
  *reinterpret_cast<Pack<N>*>(dst) = pack;
}

/// Store row @p i of head @p h, batch @p b of the output: lane l of a warp holds O's elements
/// [l E, l E + E) in @p o_row (rounded to T); lane 0 stores the row's LSE when p.lse is set.
template <typename T, int E>
__device__ __forceinline__ void store_output(const AttnParams& p, int64_t b, int64_t h, int64_t i,
                                             int lane, const float (&o_row)[E], float lse) {
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride + h * p.o_head_stride;
  store_from_float<E>(o + lane * E, o_row);
  if (p.lse != nullptr && lane == 0) p.lse[(b * p.hq + h) * p.sq + i] = lse;
}

}  // namespace attn
