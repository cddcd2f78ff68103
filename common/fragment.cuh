/// @file fragment.cuh
/// @brief WMMA fragment helpers the tensor-core stages share: a bf16 fragment load through
///        ldmatrix, and where a thread's elements sit in a 16x16 accumulator.
#pragma once

#include <type_traits>

#include <mma.h>

#include "dtype.cuh"

namespace attn {

/// The A operand of a 16x16x16 product (Q, or P), row-major.
template <typename T>
using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major>;
/// The B operand read as the transpose of a row-major tile (K^T: K's rows are its columns).
template <typename T>
using FragBt = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::col_major>;
/// The B operand read from a row-major tile (V).
template <typename T>
using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major>;
/// A 16x16 fp32 accumulator (S, or O).
using FragAcc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

/// Load a 16x16 fragment of a shared-memory tile (@p ldm elements between rows). For fp16, nvcc
/// turns load_matrix_sync into ldmatrix (one instruction per fragment); for bf16 it emits 32-bit
/// loads plus MOVM transposes, several times the instructions (nvcc 13.0, sm_90). A fragment
/// only moves 16-bit elements, so bf16 tiles are loaded through an fp16 fragment and the bits
/// copied over: the same registers, by ldmatrix.
template <typename Use, typename Layout, typename T>
__device__ __forceinline__ void load_fragment(nvcuda::wmma::fragment<Use, 16, 16, 16, T, Layout>& frag,
                                              const T* tile, unsigned ldm) {
  if constexpr (std::is_same_v<T, __half>) {
    nvcuda::wmma::load_matrix_sync(frag, tile, ldm);
  } else {
    nvcuda::wmma::fragment<Use, 16, 16, 16, __half, Layout> as_half;
    nvcuda::wmma::load_matrix_sync(as_half, reinterpret_cast<const __half*>(tile), ldm);
#pragma unroll
    for (int e = 0; e < frag.num_elements; ++e) frag.x[e] = from_bits<T>(to_bits(as_half.x[e]));
  }
}

/// Which of its two rows element @p e of a 16x16 fp32 accumulator fragment sits in (see FragMap).
__device__ __forceinline__ int half_of(int e) { return (e >> 1) & 1; }

/// Where this thread's elements sit in a 16x16 fp32 accumulator fragment. WMMA leaves the layout
/// unspecified; the stages are written for the layout of mma.sync's m16n8k16 (PTX ISA), which WMMA
/// compiles to on sm_80 and sm_90 (the GPU tests would fail on any other): lane l holds 8
/// elements in two rows, l/4 and l/4 + 8, shared with the other 3 lanes of its quad (so a row's
/// max and sum are 2 shuffles away); element e sits in row l/4 + 8 * half_of(e), column
/// 2 * (l % 4) + (e & 1) + 8 * (e >> 2). Element e of a row-major matrix_a fragment holds what
/// element e % 8 of the accumulator holds, so P goes from the S accumulator to the A operand of
/// P.V in registers. Computed from the lane, the map holds no registers of its own.
struct FragMap {
  int lane;  ///< this thread's lane
  /// Row of the elements of half @p h (0 or 1).
  __device__ __forceinline__ int row(int h) const { return lane / 4 + 8 * h; }
  /// Column of element @p e.
  __device__ __forceinline__ int col(int e) const { return 2 * (lane % 4) + (e & 1) + 8 * (e >> 2); }
};

}  // namespace attn
