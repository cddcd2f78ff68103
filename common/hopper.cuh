/// @file hopper.cuh
/// @brief Device wrappers for Hopper's asynchronous machinery (sm_90a): mbarriers and TMA loads
///        through CCCL's cuda::ptx, and the PTX CCCL does not wrap: wgmma (fence, commit, wait,
///        the shared-memory descriptor and its move to uniform registers; m64n128k16 with A from
///        shared memory, accumulating or write-only; m64n64k16 and m64n128k16 with A from
///        registers), stmatrix, named barriers and setmaxnreg. Only compiled for sm_90a (the
///        feature macro below); a stage that includes it guards its kernel body the same way.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include <cuda/ptx>

namespace attn {
namespace hopper {

/// The 32-bit shared-memory address of @p ptr (what PTX's .shared operands take).
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---------------------------------------------------------------------------------------------
// mbarriers. A barrier completes a phase when its expected arrivals have arrived and, for a TMA
// copy, when the bytes announced with arrive_expect_tx have landed; waiters name the parity of
// the phase they wait for (0, 1, 0, ...).

/// Initialise @p bar for @p count arrivals per phase (one thread, before any use).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  cuda::ptx::mbarrier_init(bar, count);
}

/// Make barrier initialisation visible to the async proxy (TMA) and the other threads; follow it
/// with a CTA barrier.
__device__ __forceinline__ void fence_barrier_init() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

/// Arrive once on @p bar and announce @p bytes that TMA copies will bring in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                       cuda::ptx::space_shared, bar, bytes);
}

/// Arrive once on @p bar (release: this thread's earlier reads and writes happen before).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  (void)cuda::ptx::mbarrier_arrive(bar);
}

/// Wait until the phase of parity @p parity of @p bar has completed (acquire). On a fresh barrier
/// parity 1 counts as completed, so a producer's first wait on an "empty" barrier passes.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}
/// The same, for a thread that may wait long and shares its scheduler with busy warps (a
/// producer waiting for a free slot): between tests it sleeps about 64 ns, so that its polling
/// does not take issue slots from them.
__device__ __forceinline__ void mbarrier_wait_backoff(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_test_wait_parity(bar, parity)) __nanosleep(64);
}

// ---------------------------------------------------------------------------------------------
// TMA: a box of a tensor map copied into shared memory, completion counted on an mbarrier in
// bytes. Coordinates are element indices, innermost first; elements outside the tensor arrive as
// zeros (and still count towards the bytes).

/// Copy the box at @p coords of the 4-D tensor map @p map into @p dst, completing on @p bar.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, int c0, int c1, int c2,
                                            int c3, uint64_t* bar) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map,
                                  coords, bar);
}

/// Copy the box at @p coords of the 5-D tensor map @p map into @p dst, completing on @p bar.
__device__ __forceinline__ void tma_load_5d(void* dst, const void* map, int c0, int c1, int c2,
                                            int c3, int c4, uint64_t* bar) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map,
                                  coords, bar);
}

/// Copy @p src, a box in shared memory, to the box at @p coords of the 5-D tensor map @p map (the
/// layout of tma_load_5d; elements outside the tensor are not written). The copy joins this
/// thread's open bulk group: close it with tma_store_commit(). Threads that wrote @p src must
/// call fence_proxy_async_shared() first, then synchronise with the issuing thread.
__device__ __forceinline__ void tma_store_5d(const void* map, const void* src, int c0, int c1,
                                             int c2, int c3, int c4) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords,
                                  src);
}

/// Close this thread's group of TMA stores issued since the last commit.
__device__ __forceinline__ void tma_store_commit() { cuda::ptx::cp_async_bulk_commit_group(); }

/// Wait until this thread's TMA stores have read their shared memory (it may then be rewritten;
/// the global writes may still be in flight).
__device__ __forceinline__ void tma_store_wait_read() {
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}

/// Wait until this thread's TMA stores are complete (before the CTA exits).
__device__ __forceinline__ void tma_store_wait() {
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

/// Order this thread's earlier shared-memory writes before later async-proxy (TMA) reads of them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

/// Store four 8x8 matrices of 16-bit elements to shared memory, one instruction for the warp:
/// lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes), and its register
/// j holds elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix j: the layout of an
/// 8x8 block of a wgmma accumulator, packed in pairs.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

/// Start fetching the tensor map at @p map (a __grid_constant__ parameter) into the cache TMA
/// reads it from, so that the first copy does not wait for it.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------------------------------------
// setmaxnreg: a warpgroup gives registers back to the SM's pool (dec) or takes them (inc). Every
// warp of the warpgroup executes the same one; counts are multiples of 8 in [24, 256]; the kernel
// needs __launch_bounds__(threads, 1) or ptxas ignores them (warning C7508).

/// Lower this warpgroup's registers per thread to N.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
/// Raise this warpgroup's registers per thread to N (waits until the pool has them).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// A barrier over @p threads threads (a multiple of 32) that use the named barrier @p id (1-15;
/// 0 is __syncthreads'), so that a subset of the CTA's warps can synchronise.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Arrive at the named barrier @p id of @p threads threads without waiting (bar.arrive): the
/// counterpart of other warps' named_barrier_sync on the same id and count.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// A named barrier (as named_barrier_sync) that also ORs @p pred over its threads: each returns
/// true if any of them passed true (bar.red.or), so that they can take a branch together.
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbarrier.cta.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// ---------------------------------------------------------------------------------------------
// wgmma: a warpgroup (4 warps, 128 threads) multiplies a 64 x 16 tile of A by a 16 x N tile of B
// into 64 x N fp32 accumulators spread over its threads. The products run asynchronously:
//   wgmma_fence()  before the first wgmma that reads registers written since (accumulators, A);
//   wgmma_commit() closes a group of issued wgmmas; wgmma_wait<n>() waits until at most n groups
//   are still running. Accumulators must not be touched between issue and wait (ptxas would
//   serialise the products and say so in warnings C7514/C7515).
// Accumulator layout (m64nN, fp32): thread t of the warpgroup holds d[4j + e] at row
// 16 (t / 32) + (t % 32) / 4 + 8 ((e >> 1) & 1), column 8 j + 2 (t % 4) + (e & 1).
// A-fragment layout (registers, m64k16, 16-bit): a[q] holds the pair at row
// 16 (t / 32) + (t % 32) / 4 + 8 (q & 1), columns 8 (q >> 1) + 2 (t % 4) + {0, 1}: the same
// places as accumulator elements 4 j + 2 (q & 1) + {0, 1} for j = q >> 1, so that an S
// accumulator becomes the A operand of the next product without moving between threads.

/// Order this thread's earlier register writes before the wgmmas issued next.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
/// Close the group of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Wait until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/// Descriptor of a tile in shared memory laid out with the 128-byte swizzle (the layout TMA writes
/// with CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes in atoms of 8 rows (1024 bytes, aligned to
/// 1024). Fields in 16-byte units. K-major operands (Q, K): @p lbo_bytes is unused (16), @p
/// sbo_bytes = 1024 (from one 8-row group to the next); a step of 16 elements along K inside
/// the atom adds 32 bytes to the address. N-major operands (V): @p lbo_bytes is the distance
/// between 64-column blocks, @p sbo_bytes = 1024 (from one 8-row group of K to the next).
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t addr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32 | uint64_t{1} << 62;
}

/// The descriptor @p desc moved @p bytes further in shared memory. The address field (bits 0-13,
/// in 16-byte units) holds any shared-memory address and the fields above it stay the same, so
/// the move is one 32-bit add of a constant to the low word: the products' loops advance one
/// descriptor instead of encoding one per step, and every descriptor shares one high word.
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t bytes) {
  const uint32_t low = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | low;
}

/// @p desc with its low word broadcast from lane 0 (all lanes hold the same descriptor): the
/// compiler then knows the descriptor is warp-uniform and keeps it, and every advance() of it,
/// in uniform registers, which wgmma reads directly. Without the broadcast a descriptor built from
/// a loop counter lives in ordinary registers and each wgmma waits for R2UR copies of it.
__device__ __forceinline__ uint64_t uniform(uint64_t desc) {
  const uint32_t low = __shfl_sync(0xffffffffu, static_cast<uint32_t>(desc), 0);
  return (desc & 0xFFFFFFFF00000000ull) | low;
}

/// Two fp32 values rounded to T and packed into one 32-bit register (low half first).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The accumulator operands of m64nNk16 (this thread's N/2 fp32 values), for the asm blocks below:
// read and written ("+f"), or, for a product whose old accumulators must not be read, written only
// ("=f"). ATTN_WGMMA_ACC8(M, i) is the eight values from d[i] on, in mode M ("+" or "=").
#define ATTN_WGMMA_ACC8(M, i)                                                                      \
  M "f"(d[i]), M "f"(d[i + 1]), M "f"(d[i + 2]), M "f"(d[i + 3]), M "f"(d[i + 4]),                 \
      M "f"(d[i + 5]), M "f"(d[i + 6]), M "f"(d[i + 7])
#define ATTN_WGMMA_D64                                                                             \
  ATTN_WGMMA_ACC8("+", 0), ATTN_WGMMA_ACC8("+", 8), ATTN_WGMMA_ACC8("+", 16),                      \
      ATTN_WGMMA_ACC8("+", 24)
#define ATTN_WGMMA_D128_AS(M)                                                                      \
  ATTN_WGMMA_ACC8(M, 0), ATTN_WGMMA_ACC8(M, 8), ATTN_WGMMA_ACC8(M, 16), ATTN_WGMMA_ACC8(M, 24),    \
      ATTN_WGMMA_ACC8(M, 32), ATTN_WGMMA_ACC8(M, 40), ATTN_WGMMA_ACC8(M, 48),                      \
      ATTN_WGMMA_ACC8(M, 56)
#define ATTN_WGMMA_D128 ATTN_WGMMA_D128_AS("+")
#define ATTN_WGMMA_D128_OUT ATTN_WGMMA_D128_AS("=")

// The 64 accumulator registers of an m64n128k16 wgmma in its PTX text: %0 to %63, in braces.
#define ATTN_WGMMA_REGS64                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                        \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// wgmma m64n64k16 with A from registers and B from shared memory, transposed; TY is the element
// type's PTX name.
#define ATTN_WGMMA_RS_N64(TY)                                                             \
  asm volatile(                                                                           \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                        \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                             \
      " "                                                                                 \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                       \
      : ATTN_WGMMA_D64                                                                    \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

// wgmma m64n128k16 with A and B from shared memory; TY is the element type's PTX name.
#define ATTN_WGMMA_SS_N128(TY)                                                            \
  asm volatile(                                                                           \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                        \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                            \
      " "                                                                                 \
      ATTN_WGMMA_REGS64 ", "                                                              \
      "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                     \
      : ATTN_WGMMA_D128                                                                   \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))
// wgmma m64n128k16 with A and B from shared memory and d output only (scale-d 0): the first step
// of a product, which must not read d's old contents (they may be another operand, e.g. P).
#define ATTN_WGMMA_SS_N128_FIRST(TY)                                                      \
  asm volatile(                                                                           \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                            \
      " "                                                                                 \
      ATTN_WGMMA_REGS64 ", "                                                              \
      "%64, %65, 0, 1, 1, 0, 0;\n"                                                        \
      : ATTN_WGMMA_D128_OUT                                                               \
      : "l"(desc_a), "l"(desc_b))
// wgmma m64n128k16 with A from registers and B from shared memory, transposed.
#define ATTN_WGMMA_RS_N128(TY)                                                            \
  asm volatile(                                                                           \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                        \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                            \
      " "                                                                                 \
      ATTN_WGMMA_REGS64 ", "                                                              \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                       \
      : ATTN_WGMMA_D128                                                                   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

/// d[64][64] = A[64][16] . B[16][64] + (scale_d ? d : 0). A in registers (four pairs of 16-bit
/// elements in the A-fragment layout), B in shared memory N-major (its 16 rows hold 64
/// contiguous elements each: V as stored), so the instruction transposes it (imm-trans-b = 1).
template <typename T>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4],
                                             uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<T, __half>)
    ATTN_WGMMA_RS_N64("f16");
  else
    ATTN_WGMMA_RS_N64("bf16");
}

/// d[64][128] = A[64][16] . B[16][128] + (scale_d ? d : 0). A and B in shared memory, both
/// K-major (descriptors); d: this thread's 64 fp32 accumulators in the accumulator layout.
template <typename T>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                              int scale_d) {
  if constexpr (std::is_same_v<T, __half>)
    ATTN_WGMMA_SS_N128("f16");
  else
    ATTN_WGMMA_SS_N128("bf16");
}

/// d[64][128] = A[64][16] . B[16][128], A and B as for wgmma_ss_n128; d is written, never read
/// (its registers may hold another operand until this product is issued).
template <typename T>
__device__ __forceinline__ void wgmma_ss_n128_first(float (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b) {
  if constexpr (std::is_same_v<T, __half>)
    ATTN_WGMMA_SS_N128_FIRST("f16");
  else
    ATTN_WGMMA_SS_N128_FIRST("bf16");
}

/// d[64][128] = A[64][16] . B[16][128] + (scale_d ? d : 0). A in registers (four pairs of 16-bit
/// elements in the A-fragment layout), B in shared memory N-major (its 16 rows hold 128
/// contiguous elements each: V as stored), so the instruction transposes it (imm-trans-b = 1).
template <typename T>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4],
                                              uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<T, __half>)
    ATTN_WGMMA_RS_N128("f16");
  else
    ATTN_WGMMA_RS_N128("bf16");
}

#undef ATTN_WGMMA_RS_N64
#undef ATTN_WGMMA_SS_N128
#undef ATTN_WGMMA_SS_N128_FIRST
#undef ATTN_WGMMA_RS_N128
#undef ATTN_WGMMA_D64
#undef ATTN_WGMMA_D128
#undef ATTN_WGMMA_D128_OUT
#undef ATTN_WGMMA_D128_AS
#undef ATTN_WGMMA_ACC8
#undef ATTN_WGMMA_REGS64

}  // namespace hopper
}  // namespace attn

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
