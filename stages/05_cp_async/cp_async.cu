// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 05 (this file): loads that overlap compute.
// Stage 04 loads each K/V tile with ordinary loads, waits at a barrier, then computes: a CTA
// idles through every tile's memory latency (04 runs 2 CTAs of 8 warps per SM at D = 64, so that
// one computes while the other waits, and 16 warps at D = 128, to keep a whole tile's loads in
// flight), and its unpadded tiles (16-column slabs, 32-byte rows) leave a 2-way bank
// conflict in every fragment load. This stage adds one idea: K and V tiles are fetched with
// cp.async into a ring of two shared-memory stages, so tile j+1 is in flight while tile j is
// computed; and tiles are plain rows padded by 16 bytes, so the 8 rows a fragment load reads
// at once start in 8 different bank groups. With the loads overlapped, a CTA no longer waits at
// its barriers, and Q's fragments go back into registers (no bound on registers, 1 CTA of 8
// warps per SM at D = 128); development runs, prefill_d128_s4096: 2127 us so, 2268 us with
// 04's arrangement of that time (Q read from shared memory, 2 CTAs of 8 warps per SM).
//
// Figures (H200, results/h200/, commit 1f7b790): prefill_d128_s4096 272.9 TFLOP/s (1.78x over 04,
// 0.81x of FA2's 335.2 in the same run), causal 254.5 (0.90x of FA2); seed 4.48 us (FA2 5.45,
// cuDNN 5.51); decode_b1_sk131072 4011 GB/s (1.12x FA2, 0.97x cuDNN). At D = 64 the 8-warp CTA
// is built for 2 per SM on grids with more CTAs than SMs (commit 63acca8, min_ctas_per_sm): on an
// H100 (results/h100/) prefill_d64_s4096 2584 -> 2272 us before/after, 0.77x of FA2 in the same run
// (2409 against 1845 us). Why: notebooks_md/05_cp_async.md.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include <cuda_pipeline_primitives.h>
#include <mma.h>
#include <type_traits>

#include "buffer.h"
#include "device.h"
#include "dtype.cuh"
#include "params.h"
#include "stage.h"

namespace attn {
namespace {

constexpr const char* kStageName = "05_cp_async";
constexpr int kMinSm = 80;
constexpr int kWarp = 32;
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;     // ln(2): LSE back to natural log
constexpr int kBc = 64;          // keys per K/V tile (per step of the online softmax)
// 64 in every CTA. Stage 04 gives its key-warp CTA at D = 64 tiles of 128 keys, to save a dependent
// round trip to memory on small problems; here the ring overlaps the second tile's loads with the
// first tile's work instead (development run with 128-key tiles: seed 5.46 -> 5.40 us, sweep_bh32
// 7.26 -> 7.38, for twice the ring's shared memory).
// Two shapes of CTA. Large: 8 warps, each owning one 16-row WMMA row block of Br = 128 packed
// query rows, and every key of each tile. Small, as 03 does for a grid under one wave: 4 "key
// warps" on one row block (Br = 16), each taking a quarter of every tile's keys; their partial
// results are merged in shared memory at the end of the item. A small problem (or decode, with
// Sq * group rows per kv head) then gets 8 times the CTAs, and each tile a quarter of the time.
// make_launch says which a problem gets.
constexpr int kWarpsLarge = 8, kWarpsSmall = 4;
constexpr int kKeyWarpsSmall = 4;  // warps of a small CTA, all on the same rows
constexpr int kStages = 2;       // K/V tiles in flight: the one computed and the next
constexpr int kPad = 8;          // elements of padding per 16-bit row: 16 bytes, so row r+1 starts 4 banks after row r
constexpr int kPadF = 4;         // the same 16 bytes for fp32 rows
namespace wmma = nvcuda::wmma;
constexpr int kMaxSplits = 128;  // cap: beyond this the merge costs more than the parallelism buys
constexpr int kMaxCtasPerSm = 32;  // the hardware's limit of resident CTAs per SM (sm_80, sm_90)
constexpr int kMinTilesPerSplit = 4;  // a split must pay for its Q block load and its share of the merge

// Where the CTAs of one (batch, kv head, query block) put their partial results.
struct SplitArgs {
  int num_splits = 1;          // key ranges per (batch, kv head, query block)
  int64_t keys_per_split = 0;  // a multiple of Bc
  float* o_partial = nullptr;  // [num_splits][B*Hq*Sq][D] fp32, normalised within the split
  float* lse_partial = nullptr;  // [num_splits][B*Hq*Sq], -inf where the split saw no key
  int64_t q_blocks = 0;        // query blocks per (batch, kv head)
  unsigned long long* next_item = nullptr;  // items taken from the queue (zero between launches)
  unsigned* exited = nullptr;  // CTAs that found the queue empty (zero between launches)
  int* arrivals = nullptr;     // [B][Hkv][q_blocks] splits finished (zero between launches)
};

// Maximum over the 32 lanes; every lane receives it.
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// E consecutive fp32 values in one 8- or 16-byte access.
template <int E>
__device__ __forceinline__ void store_floats(float* dst, const float (&src)[E]) {
  static_assert(E == 2 || E == 4, "D = 64 or 128");
  if constexpr (E == 4) *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  else *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
}
// The same through L2 only (ld.global.cg): for data other SMs wrote during this launch.
template <int E>
__device__ __forceinline__ void load_floats_cg(const float* src, float (&dst)[E]) {
  if constexpr (E == 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(src));
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(src));
    dst[0] = v.x, dst[1] = v.y;
  }
}

// Shared memory of one CTA of Warps warps, KW of them on each row block. Every row is padded by
// 16 bytes (kPad, kPadF).
template <typename T, int D, int Warps, int KW>
struct Smem {
  static constexpr int kBr = 16 * Warps / KW;
  T q[kBr][D + kPad];                // [Br][D]: the CTA's packed query rows
  union {
    struct {
      T k[kStages][kBc][D + kPad];   // [stage][Bc][D]: the ring of K tiles
      T v[kStages][kBc][D + kPad];   // [stage][Bc][D]: the ring of V tiles
    } kv;
    float o[KW][kBr][D + kPadF];     // [KW][Br][D]: each key warp's output block, staged for the store (after the last tile)
  };
  float row_lse[KW][kBr];            // per key warp and row: the LSE, for the store
};
// The budget the occupancy calculator and the device limit are checked against (D = 128 is the
// largest): large CTA 34 (Q) + 68 (K/V ring; later the fp32 O block) KB + 512 B = 102.5 KB;
// small CTA 4.25 + 68 KB + 256 B = 72.5 KB.
static_assert(sizeof(Smem<__nv_bfloat16, 128, kWarpsLarge, 1>) == 104960, "shared-memory budget of stage 05 (D=128)");
static_assert(sizeof(Smem<__nv_bfloat16, 128, kWarpsSmall, kKeyWarpsSmall>) == 74240, "shared-memory budget of stage 05 (D=128, key warps)");
static_assert(sizeof(Smem<__nv_bfloat16, 128, kWarpsLarge, 1>) <= 227 * 1024, "exceeds the 227 KB a Hopper CTA may use");

// A 16x16 fragment of a shared-memory tile (ldm elements between rows). For fp16, nvcc turns
// load_matrix_sync into ldmatrix (one instruction per fragment); for bf16 it emits generic 32-bit
// loads plus MOVM transposes, several times the instructions (nvcc 13.0, sm_90). A fragment only
// moves 16-bit elements, so bf16 tiles are loaded through an fp16 fragment and the bits copied
// over: the same registers, by ldmatrix (checked before the first launch, see
// check_fragment_map_kernel).
template <typename Use, typename Layout, typename T>
__device__ __forceinline__ void load_fragment(wmma::fragment<Use, 16, 16, 16, T, Layout>& frag, const T* tile, unsigned ldm) {
  if constexpr (std::is_same_v<T, __half>) {
    wmma::load_matrix_sync(frag, tile, ldm);
  } else {
    wmma::fragment<Use, 16, 16, 16, __half, Layout> as_half;
    wmma::load_matrix_sync(as_half, reinterpret_cast<const __half*>(tile), ldm);
#pragma unroll
    for (int e = 0; e < frag.num_elements; ++e) frag.x[e] = from_bits<T>(to_bits(as_half.x[e]));
  }
}

// Whether load_fragment gives the registers load_matrix_sync gives, for a tile in shared memory.
template <typename Use, typename Layout, typename T>
__device__ bool load_fragment_is_exact(const T* tile) {
  wmma::fragment<Use, 16, 16, 16, T, Layout> native, loaded;
  wmma::load_matrix_sync(native, tile, 16);
  load_fragment(loaded, tile, 16);
  bool same = true;
#pragma unroll
  for (int e = 0; e < native.num_elements; ++e) same = same && to_bits(native.x[e]) == to_bits(loaded.x[e]);
  return same;
}

// Where this thread's elements sit in a 16x16 accumulator fragment. WMMA leaves the layout
// unspecified; this kernel is written for the layout of mma.sync's m16n8k16 (PTX ISA), which WMMA
// compiles to on sm_80 and sm_90, and the stage checks it before its first launch
// (check_fragment_layout): lane l holds 8 elements in two rows, l/4 and l/4 + 8, shared with the
// other 3 lanes of its quad (so a row's max and sum are 2 shuffles away); element e sits in row
// l/4 + 8 * ((e >> 1) & 1), column 2 * (l % 4) + (e & 1) + 8 * (e >> 2). And element e of a
// matrix_a fragment holds what element e % 8 of the accumulator holds (so P goes from the S
// accumulator to the A operand of P.V in registers). Computed from the lane, the map holds no
// registers of its own.
__device__ __forceinline__ int half_of(int e) { return (e >> 1) & 1; }  // which of the two rows
struct FragMap {
  int lane;
  __device__ __forceinline__ int row(int h) const { return lane / 4 + 8 * h; }  // h = half_of(e)
  __device__ __forceinline__ int col(int e) const { return 2 * (lane % 4) + (e & 1) + 8 * (e >> 2); }
};

// Check the map by loading a 16x16 matrix whose entries are their own index (16 * row + col),
// exact in fp32, fp16 and bf16, and check load_fragment against load_matrix_sync for the three
// operand fragments. One warp of one CTA runs it, once per process, device and element type,
// before the first launch (see check_fragment_layout). Checked at the start of every CTA, as
// until commit d04d177, it cost seed 0.53 us of 7.04 in 04 and 0.8 of 6.3 in 05 (two barriers
// before the first load; development runs).
template <typename T>
__global__ void check_fragment_map_kernel(int* verdict) {
  __shared__ __align__(32) float ids_f32[16 * 16];
  __shared__ __align__(32) T ids_t[16 * 16];
  for (int c = threadIdx.x; c < 16 * 16; c += kWarp) ids_f32[c] = static_cast<float>(c), ids_t[c] = from_float<T>(static_cast<float>(c));
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
  wmma::load_matrix_sync(acc, ids_f32, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(a, ids_t, 16);
  static_assert(decltype(acc)::num_elements == 8, "an fp32 16x16 accumulator holds 8 elements per thread");
  const FragMap map{static_cast<int>(threadIdx.x)};
  bool ok = load_fragment_is_exact<wmma::matrix_a, wmma::row_major>(ids_t) &&
            load_fragment_is_exact<wmma::matrix_b, wmma::col_major>(ids_t) &&
            load_fragment_is_exact<wmma::matrix_b, wmma::row_major>(ids_t);
#pragma unroll
  for (int e = 0; e < 8; ++e) ok = ok && static_cast<int>(acc.x[e]) == 16 * map.row(half_of(e)) + map.col(e);
#pragma unroll
  for (int e = 0; e < a.num_elements; ++e) ok = ok && to_float(a.x[e]) == acc.x[e % 8];
  ok = __all_sync(0xffffffffu, ok);
  if (threadIdx.x == 0) *verdict = ok ? 1 : 0;
}

// 2^x in one MUFU.EX2 instruction (PTX ex2.approx.ftz: 2 ulp, results below 2^-126 flushed to
// 0, ex2(-inf) = 0). exp2f adds a range test and two multiplies to keep such tiny results exact,
// which a probability that small does not need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Maximum over the 4 lanes of a quad, which share a fragment row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
// Sum over the 4 lanes of a quad.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// cp.async of 16 bytes, src_bytes of them read from global memory (the rest zero-filled), in
// PTX: __pipeline_memcpy_async, which 05 used before, emits .cg for 16 bytes, through L2 only.
// Two cache policies:
// - copy16 (.ca) allocates the lines in L1 as well, where the other CTAs of the SM find the
//   tiles they share (several query blocks of a head read the same K and V). Against .cg,
//   development runs: prefill_d128_s4096 2150 -> 2060 us, prefill_d64_s4096 2761 -> 2559,
//   sweep_bh64 10.17 -> 9.12.
// - copy16_stream (.cg.L2::128B) goes through L2 only and has L2 fetch each 128-byte line whole
//   on a miss: for tiles that one CTA alone reads (decode). Against .ca: decode_b8_sk131072
//   1018 -> 991 us, decode_b1_sk131072 140.0 -> 137.0, decode_b1_sk4096 15.0 -> 14.25 (.cg
//   without the hint: 1018, 140.7, 14.25; ncu: .cg makes 1.5 times the L2 sector reads of
//   .ca for the same DRAM bytes, 201M against 134M, 16-byte requests for which the hint
//   fetches the rest of the line ahead).
__device__ __forceinline__ void copy16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void copy16_stream(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(src_bytes)
               : "memory");
}

// Start copying rows of D elements into a shared-memory tile with cp.async, 16 bytes per thread
// per step; row r comes from src_row(r), or is zero-filled when that returns null (past the end:
// zeros keep P.V finite). Nothing waits here: the caller commits and later waits.
// Thread t copies piece t % (D/8) of rows t / (D/8), + kRowStep, ...: the loop unrolls into a
// few instructions per 16 bytes, with no division.
template <int Threads, typename T, int D, int Rows, int Ld, typename RowFn>
__device__ __forceinline__ void load_tile_async(T (&tile)[Rows][Ld], const T* any_valid, RowFn src_row) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  constexpr int kRowStep = Threads / kChunks;
  static_assert(Threads % kChunks == 0 && Rows % kRowStep == 0, "every thread copies the same pieces");
  const int piece = threadIdx.x % kChunks;
#pragma unroll
  for (int r = threadIdx.x / kChunks; r < Rows; r += kRowStep) {
    const T* src = src_row(r);
    // Zero-fill reads no source bytes, but the address is kept valid all the same.
    copy16(&tile[r][piece * 8], (src != nullptr ? src : any_valid) + piece * 8, src != nullptr ? 16 : 0);
  }
}

// Start copying rows [0, valid) of a K or V tile from src + r * stride into a shared-memory tile
// and zero-fill the rest, with load_tile_async's thread-to-piece map and one pointer step per row.
// Every tile but a block's last is whole, and takes the branch without a test per row.
template <int Threads, typename T, int D, int Rows, int Ld>
__device__ __forceinline__ void load_rows_async(T (&tile)[Rows][Ld], const T* any_valid, const T* src, int64_t stride,
                                                int64_t valid) {
  constexpr int kChunks = D / 8;
  constexpr int kRowStep = Threads / kChunks;
  const int piece = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
  const T* row = src + r0 * stride + piece * 8;
  if (valid >= Rows) {
#pragma unroll
    for (int j = 0; j < Rows / kRowStep; ++j, row += kRowStep * stride)
      copy16(&tile[r0 + j * kRowStep][piece * 8], row, 16);
  } else {
#pragma unroll
    for (int j = 0; j < Rows / kRowStep; ++j, row += kRowStep * stride) {
      const bool in = r0 + j * kRowStep < valid;
      copy16(&tile[r0 + j * kRowStep][piece * 8], in ? row : any_valid, in ? 16 : 0);
    }
  }
}

// The same for rows [row0, row0 + WarpRows) of the tile, by one warp (a key warp's own keys: no
// other warp reads them): lane l copies piece l % (D/8) of rows row0 + l / (D/8), + 32 / (D/8), ...
// With stream, through L2 only (copy16_stream).
template <typename T, int D, int WarpRows, int Rows, int Ld>
__device__ __forceinline__ void load_warp_rows_async(T (&tile)[Rows][Ld], int row0, const T* any_valid, const T* src,
                                                     int64_t stride, int64_t valid, int lane, bool stream) {
  auto copy = [stream](void* dst, const void* from, int src_bytes) {
    if (stream) copy16_stream(dst, from, src_bytes);
    else copy16(dst, from, src_bytes);
  };
  constexpr int kChunks = D / 8;
  constexpr int kRowStep = kWarp / kChunks;
  static_assert(WarpRows % kRowStep == 0, "every lane copies the same pieces");
  const int piece = lane % kChunks, r0 = row0 + lane / kChunks;
  const T* row = src + r0 * stride + piece * 8;
  if (valid >= row0 + WarpRows) {
#pragma unroll
    for (int j = 0; j < WarpRows / kRowStep; ++j, row += kRowStep * stride)
      copy(&tile[r0 + j * kRowStep][piece * 8], row, 16);
  } else {
#pragma unroll
    for (int j = 0; j < WarpRows / kRowStep; ++j, row += kRowStep * stride) {
      const bool in = r0 + j * kRowStep < valid;
      copy(&tile[r0 + j * kRowStep][piece * 8], in ? row : any_valid, in ? 16 : 0);
    }
  }
}

// One work item: the CTA's Br packed rows of kv head h_kv (row r = query position r / group of
// query head h_kv * group + r % group, so a GQA group shares every K and V tile), over the keys
// of split split_idx. Warp w computes rows [16 rw, 16 rw + 16), rw = w / KW, and key warp
// kw = w % KW of them takes keys [kw Bc/KW, (kw + 1) Bc/KW) of every tile; map says where this
// thread's fragment elements sit.
template <typename T, int D, int Warps, int KW>
__device__ __forceinline__ void attend_block(const AttnParams& p, const SplitArgs& split, int64_t b, int64_t h_kv,
                                             int64_t q_block, int split_idx, int warp, int lane,
                                             const FragMap& map, Smem<T, D, Warps, KW>& sm) {
  constexpr int kBr = 16 * Warps / KW, kThreads = Warps * kWarp;
  constexpr int kKeyFrags = kBc / 16 / KW;  // 16-key fragments of a tile per warp
  static_assert(kKeyFrags >= 1, "a key warp takes at least one fragment of keys");
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
  using FragKt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;  // K^T: K rows are its columns
  using FragV = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
  using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  const int rw = warp / KW, kw = warp % KW;  // this warp's row block and share of the keys
  const int key0 = kw * (kBc / KW);          // its first key in a tile
  // Packed rows in 32 bits (make_launch keeps them under 2^31): a 64-bit division by a runtime
  // value is a software routine of tens of instructions, and Q's rows, each row's key range and
  // the store take one per row.
  const unsigned group = static_cast<unsigned>(p.hq) / static_cast<unsigned>(p.hkv);
  const unsigned rows = static_cast<unsigned>(p.sq) * group;  // packed rows of this (batch, kv head)
  const unsigned row0 = static_cast<unsigned>(q_block) * kBr;
  const T* q_base = static_cast<const T*>(p.q) + b * p.q_batch_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;  // [Sk][D], row stride k_seq_stride
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;  // [Sk][D], row stride v_seq_stride

  // 1. Keys: this split's range, cut by the causal mask of each row; the block needs keys up to
  //    the end of its last row (with the bottom-right mask, the longest).
  auto row_end = [&](unsigned r) {
    const int64_t i = r / group;
    const int64_t n_keys = p.causal ? min(p.sk, max(int64_t{0}, i + p.sk - p.sq + 1)) : p.sk;
    return min(n_keys, (split_idx + 1) * split.keys_per_split);
  };
  const int64_t kv_begin = split_idx * split.keys_per_split;
  const int64_t block_end = row_end(min(row0 + kBr, rows) - 1);
  // Tiles that end by the first row's last key need no mask (with the bottom-right causal mask
  // the first row sees the fewest keys); only the tiles after them test each score.
  const int64_t unmasked_end = kv_begin + max(int64_t{0}, row_end(row0) - kv_begin) / kBc * kBc;
  // Each thread keeps the running max m of its two rows' raw scores Q.K^T (the same in the 4
  // lanes of a quad) and its own part of their sums l (summed over the quad at the end). A
  // negative scale is moved onto Q (flipping a sign bit is exact), so that max(scale * s) =
  // scale * max(s) and each probability is one FFMA and one EX2: exp2(s * scale - m * scale). Padding rows past the last
  // take every key of the block: their zeros stay finite and are never stored.
  int64_t end[2];
  float m[2], l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const unsigned r = row0 + rw * 16 + map.row(h);
    end[h] = r < rows ? row_end(r) : block_end;
    m[h] = -INFINITY, l[h] = 0.0f;
  }

  // 2. Start the Q block (zeros past the last row; cp.async group 0) and the first K/V tile
  //    (group 1) on their way. Tile t goes to ring stage t % 2 (zeros past block_end). Wait for
  //    Q alone, then load this warp's Q fragments while the tile is still landing.
  load_tile_async<kThreads, T, D, kBr>(sm.q, k, [&](int r) -> const T* {
    if (row0 + r >= rows) return nullptr;
    const unsigned i = (row0 + r) / group, h = static_cast<unsigned>(h_kv) * group + (row0 + r) % group;
    return q_base + i * p.q_seq_stride + h * p.q_head_stride;
  });
  __pipeline_commit();
  // A key warp reads only its own keys of a tile: it copies them itself (and waits for no other
  // warp). With one query block per (batch, kv head), as in decode, each tile is read by this CTA
  // alone: it streams through L2 only (see copy16_stream).
  const bool stream = split.q_blocks == 1;
  auto issue_tile = [&](int64_t kv_tile, int stage) {
    if constexpr (KW > 1) {
      load_warp_rows_async<T, D, kBc / KW>(sm.kv.k[stage], key0, k, k + kv_tile * p.k_seq_stride, p.k_seq_stride, block_end - kv_tile, lane, stream);
      load_warp_rows_async<T, D, kBc / KW>(sm.kv.v[stage], key0, k, v + kv_tile * p.v_seq_stride, p.v_seq_stride, block_end - kv_tile, lane, stream);
    } else {
      load_rows_async<kThreads, T, D, kBc>(sm.kv.k[stage], k, k + kv_tile * p.k_seq_stride, p.k_seq_stride, block_end - kv_tile);
      load_rows_async<kThreads, T, D, kBc>(sm.kv.v[stage], k, v + kv_tile * p.v_seq_stride, p.v_seq_stride, block_end - kv_tile);
    }
  };
  if (kv_begin < block_end) issue_tile(kv_begin, 0);
  __pipeline_commit();
  __pipeline_wait_prior(1);
  __syncthreads();
  const bool warp_active = row0 + rw * 16 < rows;  // warp-uniform: skip blocks of padding rows
  FragA q_frag[D / 16];
  FragAcc o_frag[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
    load_fragment(q_frag[d], &sm.q[rw * 16][d * 16], D + kPad);
    wmma::fill_fragment(o_frag[d], 0.0f);
    if (p.scale < 0.0f)
#pragma unroll
      for (int e = 0; e < q_frag[d].num_elements; ++e) q_frag[d].x[e] = from_bits<T>(to_bits(q_frag[d].x[e]) ^ 0x8000u);
  }
  const float scale = fabsf(p.scale);  // log2 units (the launch folded in log2(e))

  // One step of the online softmax over keys [kv_tile, kv_tile + Bc), from ring stage stage;
  // Masked says whether the tile reaches past some row's last key.
  auto attend_tile = [&](int64_t kv_tile, int stage, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    // 3. Put tile t+1 in flight (an empty group after the last tile keeps the count uniform),
    //    then wait for everything but that newest group: tile t has landed. The barrier makes
    //    every thread's copies visible to all warps.
    if (kv_tile + kBc < block_end) issue_tile(kv_tile + kBc, stage ^ 1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    if constexpr (KW > 1) __syncwarp();
    else __syncthreads();

    if (warp_active) {
      // 4. S = Q.K^T for this warp's 16 rows and its keys: kKeyFrags accumulator fragments of
      //    16 keys, kept in registers.
      FragAcc s_frag[kKeyFrags];
#pragma unroll
      for (int n = 0; n < kKeyFrags; ++n) {
        wmma::fill_fragment(s_frag[n], 0.0f);
#pragma unroll
        for (int d = 0; d < D / 16; ++d) {
          FragKt kt_frag;
          load_fragment(kt_frag, &sm.kv.k[stage][key0 + n * 16][d * 16], D + kPad);
          wmma::mma_sync(s_frag[n], q_frag[d], kt_frag, s_frag[n]);
        }
      }

      // 5. Online softmax of the tile, in registers. Masked scores are -inf; m_safe keeps a row
      //    with no key yet at exp2(-inf - 0) = 0 instead of the NaN of -inf - (-inf).
      int limit[2];  // keys of the tile each row may see
#pragma unroll
      for (int h = 0; h < 2; ++h) limit[h] = static_cast<int>(max(int64_t{0}, min(end[h] - kv_tile, int64_t{kBc})));
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeyFrags; ++n)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (kMasked && key0 + n * 16 + map.col(e) >= limit[half_of(e)]) s_frag[n].x[e] = -INFINITY;
          tile_max[half_of(e)] = fmaxf(tile_max[half_of(e)], s_frag[n].x[e]);
        }
      float alpha[2], neg_m_scaled[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m[h], quad_max(tile_max[h]));
        const float m_safe = m_new == -INFINITY ? 0.0f : m_new;
        alpha[h] = fast_exp2((m[h] - m_safe) * scale);
        neg_m_scaled[h] = -m_safe * scale;
        m[h] = m_new;
        l[h] *= alpha[h];
      }
#pragma unroll
      for (int n = 0; n < kKeyFrags; ++n)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          s_frag[n].x[e] = fast_exp2(fmaf(s_frag[n].x[e], scale, neg_m_scaled[half_of(e)]));  // now P
          l[half_of(e)] += s_frag[n].x[e];
        }

      // 6. Rescale O by each row's alpha (not needed when no row of the warp found a larger max:
      //    alpha = 1, as in most tiles once a row has seen many keys), then O += P.V on tensor
      //    cores. P's A fragments come straight from the S accumulators, rounded to the input type
      //    (see FragMap).
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
        for (int d = 0; d < D / 16; ++d)
#pragma unroll
          for (int e = 0; e < 8; ++e) o_frag[d].x[e] *= alpha[half_of(e)];
#pragma unroll
      for (int kk = 0; kk < kKeyFrags; ++kk) {
        FragA p_frag;
#pragma unroll
        for (int e = 0; e < p_frag.num_elements; ++e) p_frag.x[e] = from_float<T>(s_frag[kk].x[e % 8]);
#pragma unroll
        for (int d = 0; d < D / 16; ++d) {
          FragV v_frag;
          load_fragment(v_frag, &sm.kv.v[stage][key0 + kk * 16][d * 16], D + kPad);
          wmma::mma_sync(o_frag[d], p_frag, v_frag, o_frag[d]);
        }
      }
    }
    // The next iteration's prefetch overwrites this stage.
    if constexpr (KW > 1) __syncwarp();
    else __syncthreads();
  };
  int64_t kv_tile = kv_begin;
  int stage = 0;
  for (; kv_tile < unmasked_end; kv_tile += kBc, stage ^= 1) attend_tile(kv_tile, stage, std::false_type{});
  for (; kv_tile < block_end; kv_tile += kBc, stage ^= 1) attend_tile(kv_tile, stage, std::true_type{});
  __pipeline_wait_prior(0);  // no copy may still be landing when shared memory is reused
  __syncthreads();

  // 7. Normalise: l is the quad's sum; O /= l; LSE = m + log l. An empty row has l = 0: O = 0,
  //    LSE = -inf. Stage the block in shared memory (over the K/V ring, which the barrier
  //    above freed), each key warp in its own slot; the lane holding column 0 of its rows
  //    writes their LSE.
  float inv_l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(l[h]);
    inv_l[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    if (map.col(0) == 0) sm.row_lse[kw][rw * 16 + map.row(h)] = l[h] > 0.0f ? (m[h] * scale + log2f(l[h])) * kLn2 : -INFINITY;
  }
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
#pragma unroll
    for (int e = 0; e < 8; ++e) o_frag[d].x[e] *= inv_l[half_of(e)];
    wmma::store_matrix_sync(&sm.o[kw][rw * 16][d * 16], o_frag[d], D + kPadF, wmma::mem_row_major);
  }
  // A warp stores rows it computed; with key warps, rows hold parts from every warp of the block.
  if constexpr (KW == 1) __syncwarp();
  else __syncthreads();

  // 8. Store. With M the largest of the KW key warps' LSEs of a row, its output is
  //    O = sum_w exp(LSE_w - M) O_w / sum_w exp(LSE_w - M) and LSE = M + log of that sum, the merge
  //    of the splits (see merge_row). The answer when there is one split, else this split's part.
  constexpr int E = D / kWarp, kRowsPerWarp = 16 / KW;
  const int64_t n_rows = p.b * p.hq * p.sq;
  auto store_row = [&](unsigned i, int64_t h, const float (&o_row)[E], float lse) {
    const int64_t row = (b * p.hq + h) * p.sq + i;  // canonical row: LSE index, partials' row
    if (split.num_splits == 1) {
      T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride + h * p.o_head_stride;  // [D]
      store_from_float<E>(o + lane * E, o_row);
      if (p.lse != nullptr && lane == 0) p.lse[row] = lse;
    } else {
      store_floats<E>(split.o_partial + (split_idx * n_rows + row) * D + lane * E, o_row);
      if (lane == 0) split.lse_partial[split_idx * n_rows + row] = lse;
    }
  };
  if constexpr (KW == 1) {
    // One warp per row block: warp rw stores rows [16 rw, 16 rw + 16), unrolled so that their
    // loads overlap. The first row's query position i and head come from one division, the next
    // rows' by counting.
    const int rr0 = rw * 16;
    unsigned i = (row0 + rr0) / group, hg = (row0 + rr0) % group;  // head h = h_kv * group + hg
#pragma unroll
    for (int t = 0; t < 16; ++t, hg = hg + 1 == group ? 0 : hg + 1, i += hg == 0) {
      if (row0 + rr0 + t >= rows) continue;  // past the last row (so are the rest)
      float o_row[E];
#pragma unroll
      for (int e = 0; e < E; ++e) o_row[e] = sm.o[0][rr0 + t][lane * E + e];
      store_row(i, h_kv * group + hg, o_row, sm.row_lse[0][rr0 + t]);
    }
  } else {
    // Key warps: warp (rw, kw) merges and stores rows 16 rw + kw + KW t, t < 16/KW. The key warps
    // take turns, so that a block with fewer than 16 rows (decode: Hq/Hkv of them) still spreads
    // them over its warps. All the warp's rows are read and merged first, with no branch in
    // between, so that their shared-memory loads and exponentials overlap (rows past the last hold
    // finite padding and are never stored); then they are stored, a 32-bit division each for
    // their query position and head.
    float o_row[kRowsPerWarp][E], lse[kRowsPerWarp];
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; ++t) {
      const int rr = rw * 16 + kw + KW * t;
      float lse_w[KW], m_all = -INFINITY;
#pragma unroll
      for (int w = 0; w < KW; ++w) lse_w[w] = sm.row_lse[w][rr], m_all = fmaxf(m_all, lse_w[w]);
      const float shift = m_all == -INFINITY ? 0.0f : m_all;
      float sum_w = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) o_row[t][e] = 0.0f;
#pragma unroll
      for (int w = 0; w < KW; ++w) {
        const float weight = expf(lse_w[w] - shift);  // 0 for a warp that saw no key
        sum_w += weight;
#pragma unroll
        for (int e = 0; e < E; ++e) o_row[t][e] += weight * sm.o[w][rr][lane * E + e];
      }
      const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) o_row[t][e] *= inv;
      lse[t] = sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
    }
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; ++t) {
      const unsigned r = row0 + rw * 16 + kw + KW * t;
      if (r >= rows) break;  // past the last row (so are the rest)
      store_row(r / group, h_kv * group + r % group, o_row[t], lse[t]);
    }
  }
}

// The merge of one output row, by one warp. Split s holds O_s (normalised over its keys) and LSE_s.
// With m = max_s LSE_s (-inf counted as 0 for the shift, so an all-empty row stays finite) and
// w_s = exp(LSE_s - m):  O = sum_s w_s O_s / sum_s w_s,  LSE = m + log sum_s w_s.
// Summing the splits in index order keeps the result bit-identical run to run. The partials were
// written by other SMs in this launch: they are read through L2 (__ldcg), never a stale L1 line.
template <typename T, int D>
__device__ __forceinline__ void merge_row(const AttnParams& p, const SplitArgs& split, int64_t b, int64_t h, int64_t i,
                                          int lane) {
  constexpr int E = D / kWarp;
  const int64_t n_rows = p.b * p.hq * p.sq;
  const int64_t row = (b * p.hq + h) * p.sq + i;  // canonical row: LSE index, partials' row

  float m = -INFINITY;
  for (int s = lane; s < split.num_splits; s += kWarp) m = fmaxf(m, __ldcg(split.lse_partial + s * n_rows + row));
  m = warp_max(m);
  const float shift = m == -INFINITY ? 0.0f : m;

  float sum_w = 0.0f, o_acc[E] = {};
#pragma unroll 8  // eight splits' loads in flight, not one L2 round trip per split
  for (int s = 0; s < split.num_splits; ++s) {
    const float w = expf(__ldcg(split.lse_partial + s * n_rows + row) - shift);  // 0 for an empty split
    float part[E];
    load_floats_cg<E>(split.o_partial + (s * n_rows + row) * D + lane * E, part);
    sum_w += w;
#pragma unroll
    for (int e = 0; e < E; ++e) o_acc[e] += w * part[e];
  }
  const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_acc[e] *= inv;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride + h * p.o_head_stride;  // [D]
  store_from_float<E>(o + lane * E, o_acc);
  if (p.lse != nullptr && lane == 0) p.lse[row] = sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
}

// Resident CTAs per SM, the bound given to the compiler: 0, no bound (as if omitted; ptxas takes
// what it needs, see the file header), except at D = 64:
// - The small CTA declares 3. Unbounded, ptxas gives it 128 registers (4 CTAs per SM); declaring
//   3 it takes 137-139 and schedules a tile's fragment loads and products differently.
//   Development run (medians of 3): seed 4.63 -> 4.48 us, sweep_bh16 4.96 -> 4.80, sweep_bh64
//   8.11 -> 7.96 (its 512 items no longer fit the small CTA's 396 slots, and the large CTA takes
//   them). The same bound at D = 128 (168 registers instead of 202, 3 CTAs per SM instead of 2)
//   lost on decode: decode_b1_sk32768 42.1 -> 46.2 us. Stage 04's small CTA at D = 64 gains the
//   same way from more registers (seed 4.91 -> 4.77 us at 159), but there they cost its fourth
//   CTA per SM, and sweep_bh64 went from 9.96 to 12.56 us, so 04 keeps 123.
// - The large CTA comes in two builds ("paired" says which). Paired, it declares 2, as stage 04's
//   8-warp CTA does: 128 registers (56 bytes spilled), 2 CTAs per SM, so that one CTA computes
//   while the other waits at a barrier; at D = 64 a tile holds half the products of a D = 128
//   tile, and one tile of lookahead hides less of a load. Unbounded (167 registers, 1 CTA per SM)
//   for grids with no second CTA for an SM. Development run (medians of 2, us; unbounded ->
//   paired): prefill_d64_s4096 2559 -> 2330, prefill_d64_s512 447 -> 370, prefill_d64_s512_causal
//   354 -> 280, prefill_d64_s16384 9798 -> 8840, sweep_bh256 16.16 -> 12.56; but sweep_bh64
//   7.93 -> 8.53 and sweep_bh128 8.53 -> 9.11 (64 and 128 CTAs, one per SM either way).
constexpr int min_ctas_per_sm(int warps, int d, bool paired) {
  return d != 64 ? 0 : warps == kWarpsSmall ? 3 : paired ? 2 : 0;
}

// grid = min(work items, resident CTAs), block Warps warps, KW of them on each row block. Each
// CTA loops over work items.
template <typename T, int D, int Warps, int KW, bool Paired>
__global__ void __launch_bounds__(Warps * kWarp, min_ctas_per_sm(Warps, D, Paired)) cp_async_kernel(const AttnParams p, const SplitArgs split) {
  constexpr int kBr = 16 * Warps / KW;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem<T, D, Warps, KW>& sm = *reinterpret_cast<Smem<T, D, Warps, KW>*>(smem_raw);
  __shared__ unsigned s_item;
  __shared__ bool s_last;
  // The warp index, broadcast from lane 0 so the compiler knows it is the same in every lane.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / kWarp), 0);
  const int lane = threadIdx.x % kWarp;

  // 0. Where this thread's fragment elements sit (see FragMap; checked before the first launch).
  const FragMap map{lane};

  // Items and their parts in 32 bits (make_launch keeps the items under 2^31): a 64-bit division
  // by a runtime value is a software routine of tens of instructions, and each item takes six.
  const unsigned n_splits = split.num_splits, n_hkv = static_cast<unsigned>(p.hkv), n_b = static_cast<unsigned>(p.b);
  const unsigned n_items = static_cast<unsigned>(split.q_blocks) * n_hkv * n_b * n_splits;
  // With fewer items than resident CTAs the grid has one CTA per item and no queue is needed.
  const bool queue = gridDim.x < n_items;
  for (unsigned item = blockIdx.x; item < n_items;) {
    // 0. Ask for the next item now: the atomic's round trip overlaps this item's work.
    unsigned next = n_items;
    if (queue && threadIdx.x == 0) next = gridDim.x + static_cast<unsigned>(atomicAdd(split.next_item, 1ull));

    // 1. Decode the item: splits fastest (a query block's splits run close together, and its
    //    merge soon after), then kv heads and batches; query blocks last, the longest first when
    //    causal (with the bottom-right mask, later query blocks see more keys). Stage 03 takes
    //    query blocks before heads when there is no mask (its CUDA-core warps read K and V
    //    through L2 and gain 2-3%). Here it gained nothing and its extra code moved nvcc's
    //    register allocation: 04 took 3763 against 3742 us on prefill_d128_s4096 and 191
    //    against 180 us on decode_b1_sk131072 (development runs), so heads come first.
    const int split_idx = static_cast<int>(item % n_splits);
    unsigned rest = item / n_splits;
    const int64_t h_kv = rest % n_hkv;
    rest /= n_hkv;
    const int64_t b = rest % n_b;
    const int64_t q_rank = rest / n_b;
    const int64_t q_block = p.causal ? split.q_blocks - 1 - q_rank : q_rank;
    attend_block<T, D, Warps, KW>(p, split, b, h_kv, q_block, split_idx, warp, lane, map, sm);

    // 2. Fused merge. Every thread makes its partials visible device-wide, then thread 0 counts
    //    this split in; the CTA that brings the count to num_splits merges the query block and
    //    sets the count back to zero for the next launch (no other CTA touches it in this one).
    if (split.num_splits > 1) {
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        int* arrival = split.arrivals + (b * p.hkv + h_kv) * split.q_blocks + q_block;
        s_last = atomicAdd(arrival, 1) == split.num_splits - 1;
        if (s_last) *arrival = 0;
      }
      __syncthreads();
      if (s_last) {
        __threadfence();  // order the partial reads after the other CTAs' arrivals
        const unsigned group = static_cast<unsigned>(p.hq) / static_cast<unsigned>(p.hkv), rows = static_cast<unsigned>(p.sq) * group;
        for (unsigned r = static_cast<unsigned>(q_block) * kBr + warp; r < (q_block + 1) * kBr && r < rows; r += Warps)
          merge_row<T, D>(p, split, b, h_kv * group + r % group, r / group, lane);
      }
    }
    if (!queue) break;

    // 3. The next item (the first gridDim.x were handed out by blockIdx). The first barrier
    //    publishes thread 0's fetch; the second keeps it from publishing the following one
    //    (overwriting s_item) before every warp has read it, and keeps the next item's tiles
    //    from overwriting shared memory the previous item still reads.
    if (threadIdx.x == 0) s_item = next;

    __syncthreads();
    item = s_item;
    __syncthreads();
  }
  // 4. The last CTA to find the queue empty resets it: every other CTA has made its last fetch.
  if (queue && threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(split.exited, 1u) == gridDim.x - 1) *split.next_item = 0, *split.exited = 0;
  }
}

using Kernel = void (*)(AttnParams, SplitArgs);

// The paired build exists for the large CTA at D = 64 only (min_ctas_per_sm).
template <typename T, int D>
Kernel select_kernel(int warps, bool paired) {
  if (warps == kWarpsSmall) return cp_async_kernel<T, D, kWarpsSmall, kKeyWarpsSmall, false>;
  if constexpr (D == 64)
    if (paired) return cp_async_kernel<T, D, kWarpsLarge, 1, true>;
  return cp_async_kernel<T, D, kWarpsLarge, 1, false>;
}
Kernel select_kernel(const AttnParams& p, int warps, bool paired) {
  if (p.dtype == DType::f16) return p.d == 64 ? select_kernel<__half, 64>(warps, paired) : select_kernel<__half, 128>(warps, paired);
  return p.d == 64 ? select_kernel<__nv_bfloat16, 64>(warps, paired) : select_kernel<__nv_bfloat16, 128>(warps, paired);
}

// Dynamic shared memory of the kernel for p (the element type does not change it).
size_t smem_bytes(const AttnParams& p, int warps) {
  if (warps == kWarpsLarge) return p.d == 64 ? sizeof(Smem<__half, 64, kWarpsLarge, 1>) : sizeof(Smem<__half, 128, kWarpsLarge, 1>);
  return p.d == 64 ? sizeof(Smem<__half, 64, kWarpsSmall, kKeyWarpsSmall>) : sizeof(Smem<__half, 128, kWarpsSmall, kKeyWarpsSmall>);
}

// How many key ranges: none unless the grid would leave the GPU part-empty; then the count with
// the best wave efficiency (busy slots / all slots over the waves it takes), the smallest such
// count when several tie, capped by kMaxSplits and by max_splits.
int choose_num_splits(int64_t ctas_without_split, int64_t slots, int64_t max_splits_for_keys) {
  if (ctas_without_split * 10 >= slots * 8) return 1;  // >= 80% of one wave: splitting buys little
  const int64_t max_splits = std::min<int64_t>(kMaxSplits, max_splits_for_keys);
  int best = 1;
  double best_efficiency = 0;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t ctas = ctas_without_split * s;
    const int64_t waves = (ctas + slots - 1) / slots;
    const double efficiency = static_cast<double>(ctas) / static_cast<double>(waves * slots);
    if (efficiency > best_efficiency + 1e-9) best = static_cast<int>(s), best_efficiency = efficiency;
  }
  return best;
}

// Everything launch() decides for a problem.
struct Launch {
  int warps = kWarpsLarge;  // warps per CTA
  int key_warps = 1;        // warps on each row block, each on a share of every tile's keys
  int br = 0;               // packed query rows per CTA: 16 * warps / key_warps
  size_t smem = 0;         // dynamic shared memory per CTA
  int64_t q_blocks = 0;    // ceil(Sq * group / Br)
  int ctas_per_sm = 0;     // resident CTAs per SM of the main kernel
  int64_t slots = 0;       // ctas_per_sm * SMs
  SplitArgs split;         // num_splits, keys_per_split, q_blocks (pointers filled at launch)
  int64_t items = 0;       // work items: q_blocks * Hkv * B * num_splits
  int64_t ctas = 0;        // persistent CTAs: min(items, slots)
  int sm_count = 0;        // SMs of the device (sizes the counters in the workspace)
  Kernel kernel = nullptr;
};

Status make_launch(const AttnParams& p, Launch* out) {
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  const int64_t packed_rows = p.sq * (p.hq / p.hkv);  // (query position, head) rows per (batch, kv head)
  constexpr int64_t kMax32 = int64_t{1} << 31;  // the kernel counts heads and packed rows in 32 bits
  if (p.hq >= kMax32 || packed_rows >= kMax32)
    return Status::Error("Hq (" + std::to_string(p.hq) + ") and Sq * Hq / Hkv (" + std::to_string(packed_rows) +
                         ") must be under stage 05's limit 2^31");
  auto configure = [&](int warps, bool paired, Launch* c) -> Status {
    c->warps = warps;
    c->key_warps = warps == kWarpsLarge ? 1 : kKeyWarpsSmall;
    c->br = 16 * warps / c->key_warps;
    c->kernel = select_kernel(p, warps, paired);
    c->smem = smem_bytes(p, warps);
    if (c->smem > device->smem_per_block_optin) {
      return Status::Error("stage 05_cp_async needs " + std::to_string(c->smem) + " bytes of shared memory per CTA, the device allows " +
                           std::to_string(device->smem_per_block_optin));
    }
    c->q_blocks = (packed_rows + c->br - 1) / c->br;
    ATTN_TRY(resident_ctas_per_sm(reinterpret_cast<const void*>(c->kernel), warps * kWarp, c->smem, &c->ctas_per_sm));
    c->ctas_per_sm = std::min(c->ctas_per_sm, kMaxCtasPerSm);  // the workspace's arrival counters assume it
    c->slots = static_cast<int64_t>(c->ctas_per_sm) * device->sm_count;
    return Status::Ok();
  };
  // The large CTA's paired build (D = 64) when its grid has more CTAs than the GPU has SMs, so
  // that a second CTA per SM has work; with at most one per SM the unbounded build's registers
  // make each CTA faster (min_ctas_per_sm).
  const bool paired = (packed_rows + 16 * kWarpsLarge - 1) / (16 * kWarpsLarge) * p.hkv * p.b > device->sm_count;
  Launch large, small;
  ATTN_TRY(configure(kWarpsLarge, paired, &large));
  ATTN_TRY(configure(kWarpsSmall, false, &small));
  // The large CTA when its grid fills most of one wave (80%, as for splitting); else the small one
  // when its grid fits in one wave; else the large one (a few long items, not two rounds of short).
  const int64_t unsplit_large = large.q_blocks * p.hkv * p.b, unsplit_small = small.q_blocks * p.hkv * p.b;
  const bool use_large = unsplit_large * 10 >= large.slots * 8 || unsplit_small > small.slots;
  Launch l = use_large ? large : small;
  const int64_t kv_tiles = (p.sk + kBc - 1) / kBc;
  // At most one item per resident CTA: more splits would add items' fixed costs (a Q block load,
  // a partial output to write and merge) without adding parallelism.
  const int64_t unsplit = l.q_blocks * p.hkv * p.b;
  const int splits = choose_num_splits(unsplit, l.slots, std::max<int64_t>(1, std::min(kv_tiles / kMinTilesPerSplit, l.slots / unsplit)));
  // Whole tiles per split; recount so that no split is empty by construction.
  l.split.keys_per_split = (kv_tiles + splits - 1) / splits * kBc;
  l.split.num_splits = static_cast<int>((p.sk + l.split.keys_per_split - 1) / l.split.keys_per_split);
  l.split.q_blocks = l.q_blocks;
  l.items = l.q_blocks * p.hkv * p.b * l.split.num_splits;
  constexpr int64_t kMaxItems = int64_t{1} << 31;  // the kernel counts items in 32 bits
  if (l.items >= kMaxItems)
    return Status::Error("work items (" + std::to_string(l.items) + ") exceed stage 05's limit 2^31");
  l.ctas = std::min(l.items, l.slots);
  l.sm_count = device->sm_count;
  *out = l;
  return Status::Ok();
}

// Workspace: [counters][o_partial][lse_partial], each part 256-byte aligned. The counters come
// first and take the same bytes for every problem on a device, so the zeros one launch leaves
// are where the next launch, of any shape, reads its counters: next_item, exited, then one
// arrival count per query block. Only a grid under one wave is split (choose_num_splits), so a
// split launch has fewer query blocks than resident slots: at most kMaxCtasPerSm per SM.
struct WorkspaceLayout {
  size_t o_partial = 0, lse_partial = 0, total = 0;  // byte offsets; the counters are at 0
};

WorkspaceLayout layout_for(const AttnParams& p, const Launch& l) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t rows = static_cast<size_t>(p.b * p.hq * p.sq);
  const size_t splits = l.split.num_splits > 1 ? static_cast<size_t>(l.split.num_splits) : 0;
  WorkspaceLayout w;
  w.o_partial = align(sizeof(unsigned long long) + sizeof(unsigned) +
                      static_cast<size_t>(kMaxCtasPerSm) * static_cast<size_t>(l.sm_count) * sizeof(int));
  w.lse_partial = w.o_partial + align(splits * rows * static_cast<size_t>(p.d) * sizeof(float));
  w.total = w.lse_partial + align(splits * rows * sizeof(float));
  return w;
}

size_t workspace_bytes(const AttnParams& p) {
  Launch l;
  if (!make_launch(p, &l).ok()) return 0;
  return layout_for(p, l).total;
}

Status plan(const AttnParams& p, LaunchPlan* out) {
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  out->grid = dim3(static_cast<unsigned>(l.ctas));
  out->block = dim3(l.warps * kWarp);
  out->dynamic_smem_bytes = l.smem;
  out->kernel = reinterpret_cast<const void*>(l.kernel);
  out->notes = "persistent: " + std::to_string(l.ctas) + " CTAs over " + std::to_string(l.items) + " work items" +
               (p.causal ? " (longest first)" : "") + ", num_splits=" + std::to_string(l.split.num_splits) + " (" + std::to_string(l.q_blocks * p.hkv * p.b) +
               " CTAs unsplit, " + std::to_string(l.slots) + " resident slots = " + std::to_string(l.ctas_per_sm) +
               "/SM), " + std::to_string(l.split.keys_per_split) + " keys per split, Br=" + std::to_string(l.br) +
               " packed rows (GQA group " + std::to_string(p.hq / p.hkv) + ") x " + std::to_string(l.key_warps) +
               " key warps, Bc=" + std::to_string(kBc) +
               (l.split.num_splits > 1 ? ", merge fused" : "");
  return Status::Ok();
}

// Whether the fragment layout FragMap assumes holds for p's element type on the current device:
// check_fragment_map_kernel runs once per process, device and type, the first time a launch
// needs it, and its verdict is kept. Not inside a stream capture: it reads the verdict back.
Status check_fragment_layout(const AttnParams& p, cudaStream_t stream) {
  auto failed = [](cudaError_t err, const char* what) {
    (void)cudaGetLastError();
    return Status::Error(std::string("stage ") + kStageName + ": " + what + ": " + cudaGetErrorString(err));
  };
  static std::mutex mutex;
  static std::map<std::pair<int, int>, bool> verdicts;  // (device, dtype) -> layout as assumed
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return failed(err, "cudaGetDevice");
  const std::pair<int, int> key{device, static_cast<int>(p.dtype)};
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = verdicts.find(key);
  if (it == verdicts.end()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (const cudaError_t err = cudaStreamIsCapturing(stream, &capture); err != cudaSuccess) return failed(err, "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone)
      return Status::Error(std::string("stage ") + kStageName +
                           ": the first launch on a device checks the WMMA fragment layout and reads the result back, "
                           "which a stream capture does not allow; launch once before capturing");
    DeviceBuffer verdict;
    ATTN_TRY(verdict.allocate(sizeof(int)));
    if (p.dtype == DType::f16) check_fragment_map_kernel<__half><<<1, kWarp>>>(verdict.as<int>());
    else check_fragment_map_kernel<__nv_bfloat16><<<1, kWarp>>>(verdict.as<int>());
    ATTN_TRY(check_launch(kStageName));
    int host = 0;
    if (const cudaError_t err = cudaMemcpy(&host, verdict.get(), sizeof(int), cudaMemcpyDeviceToHost); err != cudaSuccess)
      return failed(err, "layout check kernel");
    it = verdicts.emplace(key, host == 1).first;
  }
  if (!it->second)
    return Status::Error(std::string("stage ") + kStageName +
                         ": the WMMA fragment layout on this GPU is not the one the kernel is written for (mma.sync m16n8k16)");
  return Status::Ok();
}

Status launch(const AttnParams& p, const Workspace& ws, cudaStream_t stream) {
  ATTN_TRY(validate_launch(p, kStageName, kMinSm, ws, 0));  // parameters and GPU, before the plan
  ATTN_TRY(check_fragment_layout(p, stream));
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  const WorkspaceLayout w = layout_for(p, l);
  ATTN_TRY(check_workspace(kStageName, ws, w.total));
  AttnParams kp = p;
  // Scores in log2 units: exp(x) = exp2(x * log2(e)), and exp2f is one MUFU.EX2 instruction.
  kp.scale = effective_scale(p) * kLog2e;
  char* base = static_cast<char*>(ws.ptr);
  SplitArgs split = l.split;
  split.o_partial = reinterpret_cast<float*>(base + w.o_partial);
  split.lse_partial = reinterpret_cast<float*>(base + w.lse_partial);
  split.next_item = reinterpret_cast<unsigned long long*>(base);
  split.exited = reinterpret_cast<unsigned*>(base + sizeof(unsigned long long));
  split.arrivals = reinterpret_cast<int*>(base + sizeof(unsigned long long) + sizeof(unsigned));
  l.kernel<<<static_cast<unsigned>(l.ctas), l.warps * kWarp, l.smem, stream>>>(kp, split);
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_05_cp_async() {
  StageInfo s;
  s.name = kStageName;
  s.description = "K/V tiles fetched with cp.async into a two-stage ring, overlapping compute; rows padded";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  return s;
}

}  // namespace attn
