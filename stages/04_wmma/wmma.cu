// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 04 (this file): the two matrix products on tensor cores.
// Stages 01-03 compute every score and every P.V term with fp32 FMAs on the CUDA cores, each
// warp reading K and V for itself. This stage adds one idea: S = Q.K^T and O += P.V run on
// tensor cores through nvcuda::wmma (16x16x16 fragments, fp16/bf16 in, fp32 accumulate). A CTA
// of 8 warps takes 128 query rows, 16 per warp (16 warps and 256 rows at D = 128); for a grid
// under one wave, a CTA of 4 key warps takes 16 rows, each warp a quarter of every tile's keys
// (as 03's key warps), merged at the end.
// Q, K and V tiles are staged in shared memory as slabs of 16 columns (see Slabs), shared by
// all the warps of a large CTA; a key warp loads and reads only its own keys of each tile. Scores, the online softmax, P and O stay in each warp's registers (accumulator
// fragments), in the layout checked before the first launch. Scheduling (persistent CTAs, split-KV,
// fused merge) is 03's.
//
// Figures (H200, results/h200/, commit 1f7b790): prefill_d128_s4096 153.4 TFLOP/s (24.9x over 03;
// 0.46x of FA2's 335.2 in the same run; 102.2% of the 150 target, met; 146.8 with 2 CTAs of 8 warps
// at a542ccf), causal 141.1; seed 4.91 us (03: 4.71); decode_b1_sk131072 3982 GB/s (1.11x of 03).
// Why: notebooks_md/04_wmma.md.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include <mma.h>
#include <type_traits>

#include "buffer.h"
#include "device.h"
#include "dtype.cuh"
#include "params.h"
#include "stage.h"

namespace attn {
namespace {

constexpr const char* kStageName = "04_wmma";
constexpr int kMinSm = 80;
constexpr int kWarp = 32;
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;     // ln(2): LSE back to natural log
// Keys per K/V tile (per step of the online softmax): 64, or 128 in the key-warp CTA at D = 64.
// There a 128-key tile costs load_kv_batch the registers a 64-key tile costs at D = 128 (4 per
// 16 bytes in flight), and a small problem needs half the tiles: seed's 128 keys are one tile,
// one dependent round trip to memory instead of two. Development runs: seed 6.49 -> 6.00 us,
// sweep_bh4 6.64 -> 6.13, sweep_bh32 8.84 -> 8.33 (the decode shapes, at D = 128, unchanged).
constexpr int tile_keys(int d, int key_warps) { return key_warps > 1 && d == 64 ? 128 : 64; }
// Two shapes of CTA. Large: 8 warps at D = 64, 16 at D = 128, each owning one 16-row WMMA row
// block of Br = 128 or 256 packed query rows, and every key of each tile (see min_ctas_per_sm for
// why 16 at D = 128). Small, as 03 does for a grid under one wave: 4 "key warps" on one row block
// (Br = 16), each taking a quarter of every tile's keys; their partial results are merged in
// shared memory at the end of the item. A small problem (or decode, with Sq * group rows per kv
// head) then gets 8 or 16 times the CTAs, and each tile a quarter of the time. make_launch says
// which a problem gets.
constexpr int kWarpsSmall = 4;
constexpr int large_warps(int d) { return d == 128 ? 16 : 8; }
constexpr int kKeyWarpsSmall = 4;  // warps of a small CTA, all on the same rows
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

// A Q, K or V tile in shared memory, kept as D/16 slabs of 16 columns: element (r, c) at
// [c / 16][r][c % 16]. A 16x16 fragment is then 16 rows of 32 bytes (ldm = 16), and the 8 rows
// one ldmatrix phase reads span 256 bytes: 2 rows per bank, a 2-way bank conflict. Rows of D
// elements (ldm = D, a multiple of 128 bytes) would put all 8 rows in the same 4 banks, 8-way.
// WMMA takes one row stride per fragment, so no unpadded layout does better than 2-way; stage
// 05 pads the rows and gets none. Each slab has one spare row at its end (32 bytes), so that row
// r of slab s starts 32 s bytes further along the banks than row r of slab 0: the 8 pieces of
// 16 bytes that make up one 128-byte line of a row (64 columns, 4 slabs) then sit in 8 distinct
// bank groups, and 8 lanes can store a whole line at once without a conflict (see PieceMap).
template <typename T, int Rows, int D>
using Slabs = T[D / 16][Rows + 1][16];

// Shared memory of one CTA of Warps warps, KW of them on each row block: Q, K and V as slabs.
template <typename T, int D, int Warps, int KW>
struct Smem {
  static constexpr int kBr = 16 * Warps / KW;
  static constexpr int kBc = tile_keys(D, KW);
  Slabs<T, kBr, D> q;       // [Br][D]: the CTA's packed query rows
  union {
    struct {
      Slabs<T, kBc, D> k;   // [Bc][D]: the K tile
      Slabs<T, kBc, D> v;   // [Bc][D]: the V tile
    } kv;
    float o[KW][kBr][D];    // [KW][Br][D]: each key warp's output block, staged for the store (after the last tile)
  };
  float row_lse[KW][kBr];   // per key warp and row: the LSE, for the store
};
// The budget the occupancy calculator and the device limit are checked against (D = 128 is the
// largest; each slab's spare row adds 32 bytes): large CTA 64.25 (Q, 256 rows) + 128 (K, V:
// 32.5; later the fp32 O block: 128) KB + 1 KB = 193.25 KB, one per SM; at D = 64, 16.125 + 32 +
// 0.5 = 48.625 KB; small CTA 4.25 + 32.5 (K, V; the 4 key warps' O blocks take 32) KB + 256 B =
// 37 KB, at D = 64 2.125 + 32.25 (128-key K, V tiles) KB + 256 B = 34.625 KB. Scores and
// probabilities never touch shared memory: they stay in accumulator fragments.
static_assert(sizeof(Smem<__nv_bfloat16, 128, large_warps(128), 1>) == 197888, "shared-memory budget of stage 04 (D=128)");
static_assert(sizeof(Smem<__nv_bfloat16, 64, large_warps(64), 1>) == 49792, "shared-memory budget of stage 04 (D=64)");
static_assert(sizeof(Smem<__nv_bfloat16, 128, kWarpsSmall, kKeyWarpsSmall>) == 37888, "shared-memory budget of stage 04 (D=128, key warps)");
static_assert(sizeof(Smem<__nv_bfloat16, 64, kWarpsSmall, kKeyWarpsSmall>) == 35456, "shared-memory budget of stage 04 (D=64, key warps)");
static_assert(sizeof(Smem<__nv_bfloat16, 128, large_warps(128), 1>) <= 227 * 1024, "exceeds the 227 KB a Hopper CTA may use");

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

// Which 16 bytes of a tile a thread copies: each warp instruction moves a block of 4 rows x 64
// columns, that is four whole 128-byte lines of global memory (coalesced), with no bank conflict
// on the store. Two ways to hand out the pieces:
// - Lines (K and V, see kv_lines): 8 consecutive lanes take one line (lane l: row l >> 3,
//   columns 8 * (l & 7)). L1 serves a 16-byte load of a warp 8 lanes at a time, one wavefront
//   per line those 8 lanes touch: 4 wavefronts per warp load. The 8 lanes store into the 4
//   slabs of that line, conflict-free thanks to the slabs' spare rows.
// - Rows (lane l: row (l >> 1) & 3, columns 16 * (l >> 3) + 8 * (l & 1)): 8 consecutive lanes
//   take 32 bytes of each of the 4 rows, 16 wavefronts per warp load, 4 times the L1 work.
//   Every tile was loaded so until the key-warp CTA got lines (notebook: "Loads by lines"); in
//   decode, where loading is nearly all the work, L1's data pipeline was then 87% busy (ncu:
//   16.0 wavefronts per global load request, against 4.0 for 03).
// Warps take the D/64 lines of a row in turn, then the next 4 rows.
template <int Threads, int D, bool Lines>
struct PieceMap {
  static constexpr int kLines = D / 64;                         // 128-byte lines per row (16-bit types)
  static constexpr int kRowStep = 4 * (Threads / 32) / kLines;  // rows between a thread's pieces
  static_assert((Threads / 32) % kLines == 0, "the warps share out the lines of a row evenly");
  int row, col;  // this thread's first row, and the first of its 8 columns
  __device__ __forceinline__ PieceMap() {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    row = 4 * (warp / kLines) + (Lines ? lane >> 3 : (lane >> 1) & 3);
    col = 64 * (warp % kLines) + (Lines ? 8 * (lane & 7) : 16 * (lane >> 3) + 8 * (lane & 1));
  }
};
// The large CTA's K and V pieces go by lines at D = 64. At D = 128 its 16-warp kernel spills 116
// bytes per thread with them instead of 92 (ptxas; the map is the only change) and ran
// prefill_d128_s4096 3% slower (3717 against 3604 us), so it keeps rows, as does Q, loaded once
// per work item. At D = 64 lines took prefill_d64_s4096 from 3835 to 3442 us (development runs).
constexpr bool kv_lines(int d) { return d == 64; }

// Copy rows of D elements into a shared-memory tile, 16 bytes per thread per step (PieceMap);
// row r comes from src_row(r), or is zero when that returns null (past the end: zeros keep P.V
// finite). With negate, every element's sign bit is flipped on the way (exact). The loop unrolls
// into a few instructions per 16 bytes, with no division.
template <int Threads, typename T, int D, int Rows, typename RowFn>
__device__ __forceinline__ void load_tile(Slabs<T, Rows, D>& tile, RowFn src_row, bool negate) {
  using Map = PieceMap<Threads, D, false>;
  static_assert(Rows % Map::kRowStep == 0, "every thread copies the same pieces");
  const Map m;
#pragma unroll
  for (int r = m.row; r < Rows; r += Map::kRowStep) {
    const T* src = src_row(r);
    Pack<8> value{};
    if (src != nullptr) value = load_pack<8>(src + m.col);
    if (negate)
#pragma unroll
      for (int e = 0; e < 8; ++e) value.bits[e] ^= 0x8000u;
    *reinterpret_cast<Pack<8>*>(&tile[m.col / 16][r][m.col % 16]) = value;
  }
}

// Copy rows [0, valid) of a block's last K or V tile when it is partial (valid < Rows) from
// src + r * stride into a shared-memory tile and zero the rest, with load_tile's thread-to-piece
// map and one pointer step per row. Whole tiles go through load_kv_batch below.
template <int Threads, typename T, int D, int Rows>
__device__ __forceinline__ void load_rows(Slabs<T, Rows, D>& tile, const T* src, int64_t stride, int64_t valid) {
  using Map = PieceMap<Threads, D, kv_lines(D)>;
  constexpr int kRowStep = Map::kRowStep;
  const Map m;
  T* dst = &tile[m.col / 16][m.row][m.col % 16];
  const T* row = src + m.row * stride + m.col;
#pragma unroll
  for (int j = 0; j < Rows / kRowStep; ++j, row += kRowStep * stride) {
    Pack<8> value{};
    if (m.row + j * kRowStep < valid) value = load_pack<8>(row);
    *reinterpret_cast<Pack<8>*>(dst + j * kRowStep * 16) = value;
  }
}

// Copy a whole K tile and V tile (rows from k + r * k_stride and v + r * v_stride) with
// load_rows's map, all loads issued before the first store so that they are in flight together;
// each waits in 4 registers per 16 bytes (why the large CTA has 16 warps at D = 128: see min_ctas_per_sm).
template <int Threads, typename T, int D, int Rows>
__device__ __forceinline__ void load_kv_batch(Slabs<T, Rows, D>& k_tile, Slabs<T, Rows, D>& v_tile, const T* k,
                                              int64_t k_stride, const T* v, int64_t v_stride) {
  using Map = PieceMap<Threads, D, kv_lines(D)>;
  constexpr int kRowStep = Map::kRowStep, kSteps = Rows / kRowStep;
  const Map m;
  const T* k_row = k + m.row * k_stride + m.col;
  const T* v_row = v + m.row * v_stride + m.col;
  Pack<8> k_piece[kSteps], v_piece[kSteps];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) k_piece[j] = load_pack<8>(k_row + j * kRowStep * k_stride);
#pragma unroll
  for (int j = 0; j < kSteps; ++j) v_piece[j] = load_pack<8>(v_row + j * kRowStep * v_stride);
  T* k_dst = &k_tile[m.col / 16][m.row][m.col % 16];
  T* v_dst = &v_tile[m.col / 16][m.row][m.col % 16];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) *reinterpret_cast<Pack<8>*>(k_dst + j * kRowStep * 16) = k_piece[j];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) *reinterpret_cast<Pack<8>*>(v_dst + j * kRowStep * 16) = v_piece[j];
}

// Copy rows [row0, row0 + Rows) of a K tile and of a V tile, by one warp (a key warp's own keys:
// no other warp reads them), by lines (see PieceMap): each warp instruction moves 4 rows x 64
// columns. All of a lane's loads are issued before its first store, as in load_kv_batch: the
// same 4 registers per 16 bytes. Rows from valid on (a block's partial last tile) are zeros.
template <typename T, int D, int TileRows, int Rows, bool kPartial>
__device__ __forceinline__ void load_kv_warp(Slabs<T, TileRows, D>& k_tile, Slabs<T, TileRows, D>& v_tile, int row0,
                                             const T* k, int64_t k_stride, const T* v, int64_t v_stride, int64_t valid,
                                             int lane) {
  constexpr int kLines = D / 64, kSteps = Rows / 4 * kLines;
  const int r = row0 + (lane >> 3), c = 8 * (lane & 7);
  Pack<8> k_piece[kSteps], v_piece[kSteps];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    const int row = r + 4 * (j / kLines), col = 64 * (j % kLines) + c;
    k_piece[j] = Pack<8>{};
    if (!kPartial || row < valid) k_piece[j] = load_pack<8>(k + row * k_stride + col);
  }
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    const int row = r + 4 * (j / kLines), col = 64 * (j % kLines) + c;
    v_piece[j] = Pack<8>{};
    if (!kPartial || row < valid) v_piece[j] = load_pack<8>(v + row * v_stride + col);
  }
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    const int row = r + 4 * (j / kLines), col = 64 * (j % kLines) + c;
    *reinterpret_cast<Pack<8>*>(&k_tile[col / 16][row][col % 16]) = k_piece[j];
    *reinterpret_cast<Pack<8>*>(&v_tile[col / 16][row][col % 16]) = v_piece[j];
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
  constexpr int kBc = tile_keys(D, KW);
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
  // negative scale is moved onto Q as it is stored (flipping a sign bit is exact), so that
  // max(scale * s) = scale * max(s) and each probability is one FFMA and one EX2:
  // exp2(s * scale - m * scale). Padding rows past the last take every key of the block: their
  // zeros stay finite and are never stored.
  int64_t end[2];
  float m[2], l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const unsigned r = row0 + rw * 16 + map.row(h);
    end[h] = r < rows ? row_end(r) : block_end;
    m[h] = -INFINITY, l[h] = 0.0f;
  }

  // 2. The Q block (zeros past the last row). No barrier yet: the first tile's barrier covers it,
  //    so Q's loads and the first K/V tile's are in flight together.
  load_tile<kThreads, T, D, kBr>(sm.q, [&](int r) -> const T* {
    if (row0 + r >= rows) return nullptr;
    const unsigned i = (row0 + r) / group, h = static_cast<unsigned>(h_kv) * group + (row0 + r) % group;
    return q_base + i * p.q_seq_stride + h * p.q_head_stride;
  }, p.scale < 0.0f);
  const bool warp_active = row0 + rw * 16 < rows;  // warp-uniform: skip blocks of padding rows
  FragAcc o_frag[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) wmma::fill_fragment(o_frag[d], 0.0f);
  const float scale = fabsf(p.scale);  // log2 units (the launch folded in log2(e))

  // One step of the online softmax over keys [kv_tile, kv_tile + Bc); Masked says whether the
  // tile reaches past some row's last key.
  auto attend_tile = [&](int64_t kv_tile, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    // 3. K and V tiles (zeros past block_end). A thread's K and V loads of a tile go in one
    //    batch, in flight together; development runs: prefill_d64_s4096 3706 us batched, 4054
    //    not. A key warp reads only its own keys of the tile: it loads them itself and waits
    //    for no other warp (but for Q, stored by every thread, before its first tile). Against
    //    the whole CTA loading the tile between two barriers (development runs):
    //    decode_b1_sk131072 179.9 -> 168.2 us, decode_b8_sk32768 346.4 -> 322.5.
    if constexpr (KW > 1) {
      const T* k_tile = k + kv_tile * p.k_seq_stride;
      const T* v_tile = v + kv_tile * p.v_seq_stride;
      if (block_end - kv_tile >= kBc)
        load_kv_warp<T, D, kBc, kBc / KW, false>(sm.kv.k, sm.kv.v, key0, k_tile, p.k_seq_stride, v_tile, p.v_seq_stride, kBc, lane);
      else
        load_kv_warp<T, D, kBc, kBc / KW, true>(sm.kv.k, sm.kv.v, key0, k_tile, p.k_seq_stride, v_tile, p.v_seq_stride,
                                                block_end - kv_tile, lane);
      if (kv_tile == kv_begin) __syncthreads();
      else __syncwarp();
    } else {
      if (block_end - kv_tile >= kBc) {
        load_kv_batch<kThreads, T, D, kBc>(sm.kv.k, sm.kv.v, k + kv_tile * p.k_seq_stride, p.k_seq_stride,
                                           v + kv_tile * p.v_seq_stride, p.v_seq_stride);
      } else {
        load_rows<kThreads, T, D, kBc>(sm.kv.k, k + kv_tile * p.k_seq_stride, p.k_seq_stride, block_end - kv_tile);
        load_rows<kThreads, T, D, kBc>(sm.kv.v, v + kv_tile * p.v_seq_stride, p.v_seq_stride, block_end - kv_tile);
      }
      __syncthreads();
    }

    if (warp_active) {
      // 4. S = Q.K^T for this warp's 16 rows and its keys: kKeyFrags accumulator fragments of 16
      //    keys, kept in registers. Q's fragments are read from shared memory, one per 16
      //    columns of D, each used for all the warp's key fragments (see min_ctas_per_sm for
      //    why not kept in registers).
      FragAcc s_frag[kKeyFrags];
#pragma unroll
      for (int n = 0; n < kKeyFrags; ++n) wmma::fill_fragment(s_frag[n], 0.0f);
#pragma unroll
      for (int d = 0; d < D / 16; ++d) {
        FragA q_frag;
        load_fragment(q_frag, &sm.q[d][rw * 16][0], 16);
#pragma unroll
        for (int n = 0; n < kKeyFrags; ++n) {
          FragKt kt_frag;
          load_fragment(kt_frag, &sm.kv.k[d][key0 + n * 16][0], 16);
          wmma::mma_sync(s_frag[n], q_frag, kt_frag, s_frag[n]);
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
          load_fragment(v_frag, &sm.kv.v[d][key0 + kk * 16][0], 16);
          wmma::mma_sync(o_frag[d], p_frag, v_frag, o_frag[d]);
        }
      }
    }
    // The next tile overwrites K and V: the CTA's warps read all of it, a key warp only its keys.
    if constexpr (KW > 1) __syncwarp();
    else __syncthreads();
  };
  int64_t kv_tile = kv_begin;
  for (; kv_tile < unmasked_end; kv_tile += kBc) attend_tile(kv_tile, std::false_type{});
  for (; kv_tile < block_end; kv_tile += kBc) attend_tile(kv_tile, std::true_type{});
  if constexpr (KW > 1) __syncthreads();  // the O blocks below overlay every key warp's K and V

  // 7. Normalise: l is the quad's sum; O /= l; LSE = m + log l. An empty row has l = 0: O = 0,
  //    LSE = -inf. Stage the block in shared memory (over the K/V tiles, which the barrier
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
    wmma::store_matrix_sync(&sm.o[kw][rw * 16][d * 16], o_frag[d], D, wmma::mem_row_major);
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

// Resident CTAs per SM, the bound given to the compiler: 16 warps per SM for the large CTA, at
// 128 registers, and 3 small CTAs (168 registers: a small CTA's warp holds the same O block, and
// its K/V loads wait in 64 more; with 4, at 128 registers, nvcc issues them in smaller batches).
// At 128 registers Q's fragments are read from shared memory in every tile instead of held in
// 64 registers. Unbounded, nvcc takes 203-205 registers at D = 128 and 1 CTA of 8 warps fits an
// SM; development runs, prefill_d128_s4096: 128 TFLOP/s with Q in registers that way, 147 with 2
// CTAs of 8 warps (100 bytes of spill stores). At D = 64 the large CTA has 8 warps, 2 per SM. At
// D = 128 it has 16 warps, 1 per SM: a thread then copies 4 of a tile's 16-byte pieces, not 8,
// and all of them fit in flight at once (with 8 warps, batching K and V added spills and nothing
// else: 3760 against 3745 us). Development runs, prefill_d128_s4096: 3605 and 3616 us with 16
// warps, 3730 and 3734 with 2 CTAs of 8; 3699 and 3706 with 16 warps loading K, then V; 4433 to
// 4505 with 3 or 4 CTAs of 4 warps (each tile shared by fewer warps). Causal it loses 1.7% (1966
// against 1933 us: 256-row blocks are coarser work items); at D = 64, 3.8% (3895 against 3752).
constexpr int min_ctas_per_sm(int warps) { return warps == 16 ? 1 : warps == 8 ? 2 : 3; }

// grid = min(work items, resident CTAs), block Warps warps, KW of them on each row block. Each
// CTA loops over work items.
template <typename T, int D, int Warps, int KW>
__global__ void __launch_bounds__(Warps * kWarp, min_ctas_per_sm(Warps)) wmma_kernel(const AttnParams p, const SplitArgs split) {
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

template <typename T>
Kernel select_kernel(const AttnParams& p, bool small) {
  constexpr int kLarge64 = large_warps(64), kLarge128 = large_warps(128);
  if (small) return p.d == 64 ? wmma_kernel<T, 64, kWarpsSmall, kKeyWarpsSmall> : wmma_kernel<T, 128, kWarpsSmall, kKeyWarpsSmall>;
  return p.d == 64 ? wmma_kernel<T, 64, kLarge64, 1> : wmma_kernel<T, 128, kLarge128, 1>;
}
Kernel select_kernel(const AttnParams& p, bool small) {
  return p.dtype == DType::f16 ? select_kernel<__half>(p, small) : select_kernel<__nv_bfloat16>(p, small);
}

// Dynamic shared memory of the kernel for p (the element type does not change it).
size_t smem_bytes(const AttnParams& p, bool small) {
  if (small) return p.d == 64 ? sizeof(Smem<__half, 64, kWarpsSmall, kKeyWarpsSmall>) : sizeof(Smem<__half, 128, kWarpsSmall, kKeyWarpsSmall>);
  return p.d == 64 ? sizeof(Smem<__half, 64, large_warps(64), 1>) : sizeof(Smem<__half, 128, large_warps(128), 1>);
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
  int warps = 0;            // warps per CTA
  int key_warps = 1;        // warps on each row block, each on a share of every tile's keys
  int br = 0;               // packed query rows per CTA: 16 * warps / key_warps
  int bc = 0;               // keys per K/V tile: tile_keys(D, key_warps)
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
                         ") must be under stage 04's limit 2^31");
  auto configure = [&](bool small, Launch* c) -> Status {
    const int warps = small ? kWarpsSmall : large_warps(static_cast<int>(p.d));
    c->warps = warps;
    c->key_warps = small ? kKeyWarpsSmall : 1;
    c->br = 16 * warps / c->key_warps;
    c->kernel = select_kernel(p, small);
    c->smem = smem_bytes(p, small);
    if (c->smem > device->smem_per_block_optin) {
      return Status::Error("stage 04_wmma needs " + std::to_string(c->smem) + " bytes of shared memory per CTA, the device allows " +
                           std::to_string(device->smem_per_block_optin));
    }
    c->q_blocks = (packed_rows + c->br - 1) / c->br;
    ATTN_TRY(resident_ctas_per_sm(reinterpret_cast<const void*>(c->kernel), warps * kWarp, c->smem, &c->ctas_per_sm));
    c->ctas_per_sm = std::min(c->ctas_per_sm, kMaxCtasPerSm);  // the workspace's arrival counters assume it
    c->slots = static_cast<int64_t>(c->ctas_per_sm) * device->sm_count;
    return Status::Ok();
  };
  Launch large, small;
  ATTN_TRY(configure(false, &large));
  ATTN_TRY(configure(true, &small));
  // The large CTA when its grid fills most of one wave (80%, as for splitting); else the small one
  // when its grid fits in one wave; else the large one (a few long items, not two rounds of short).
  const int64_t unsplit_large = large.q_blocks * p.hkv * p.b, unsplit_small = small.q_blocks * p.hkv * p.b;
  const bool use_large = unsplit_large * 10 >= large.slots * 8 || unsplit_small > small.slots;
  Launch l = use_large ? large : small;
  l.bc = tile_keys(static_cast<int>(p.d), l.key_warps);
  const int64_t kv_tiles = (p.sk + l.bc - 1) / l.bc;
  // At most one item per resident CTA: more splits would add items' fixed costs (a Q block load,
  // a partial output to write and merge) without adding parallelism.
  const int64_t unsplit = l.q_blocks * p.hkv * p.b;
  const int splits = choose_num_splits(unsplit, l.slots, std::max<int64_t>(1, std::min(kv_tiles / kMinTilesPerSplit, l.slots / unsplit)));
  // Whole tiles per split; recount so that no split is empty by construction.
  l.split.keys_per_split = (kv_tiles + splits - 1) / splits * l.bc;
  l.split.num_splits = static_cast<int>((p.sk + l.split.keys_per_split - 1) / l.split.keys_per_split);
  l.split.q_blocks = l.q_blocks;
  l.items = l.q_blocks * p.hkv * p.b * l.split.num_splits;
  constexpr int64_t kMaxItems = int64_t{1} << 31;  // the kernel counts items in 32 bits
  if (l.items >= kMaxItems)
    return Status::Error("work items (" + std::to_string(l.items) + ") exceed stage 04's limit 2^31");
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
               " key warps, Bc=" + std::to_string(l.bc) +
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

StageInfo stage_04_wmma() {
  StageInfo s;
  s.name = kStageName;
  s.description = "Q.K^T and P.V on tensor cores (nvcuda::wmma), Q/K/V tiles in shared memory";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  return s;
}

}  // namespace attn
