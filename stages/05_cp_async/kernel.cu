// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 05 extends 04 with loads that overlap compute: K and V tiles come by cp.async into a ring
// of two shared-memory stages, tile j+1 in flight while tile j is computed. No second CTA per SM
// hides loads now: at D = 128 the 8-warp CTA runs alone, unbounded, Q's fragments in registers.
// What every stage computes: docs/contract.md. Why this stage: notebooks_md/05_cp_async.md.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include <cuda/atomic>
#include <mma.h>

#include "device.h"
#include "dtype.cuh"
#include "fragment.cuh"
#include "params.h"
#include "stage.h"
#include "warp.cuh"

namespace attn {
namespace {

constexpr const char* kStageName = "05_cp_async";
constexpr int kMinSm = 80;
constexpr int kBc = 64;          // keys per K/V tile: one step of the online softmax
constexpr int kKeyWarps = 4;     // key warps per warp row, when a CTA has them
constexpr int kMaxSplits = 128;  // cap: beyond this the merge costs more than the parallelism buys
constexpr int kMinTilesPerSplit = 4;  // a split must pay for its Q block and its share of the merge
constexpr int kPad = 8;   // elements of padding per 16-bit row: 16 bytes, 4 banks
constexpr int kPadF = 4;  // the same 16 bytes for fp32 rows
constexpr int kStages = 2;  // K/V tiles in flight: the one computed and the next
namespace wmma = nvcuda::wmma;

// Where the CTAs of one (batch, kv head, query block) put their partial results.
struct SplitArgs {
  int num_splits = 1;            // key ranges per (batch, kv head, query block)
  int64_t keys_per_split = 0;    // a multiple of Bc
  float* o_partial = nullptr;    // [num_splits][B*Hq*Sq][D] fp32, normalised within the split
  float* lse_partial = nullptr;  // [num_splits][B*Hq*Sq], -inf where the split saw no key
  int64_t q_blocks = 0;          // query blocks per (batch, kv head)
  unsigned long long* next_item = nullptr;  // items taken from the queue (0 between launches)
  unsigned* exited = nullptr;    // CTAs that found the queue empty (0 between launches)
  int* arrivals = nullptr;       // [B][Hkv][q_blocks] splits finished (0 between launches)
};

constexpr int large_warps(int) { return 8; }  // the large CTA: 16 rows and a tile's keys a warp

// Shared memory of a CTA of Warps warps, KW of them on each 16-row block. Rows are padded by 16
// bytes, so the 8 rows one phase of a fragment load (ldmatrix) reads start in 8 different groups
// of 4 banks; rows of D elements (a multiple of 128 bytes) would all start in the same 4 banks.
template <typename T, int D, int Warps, int KW>
struct Smem {
  static constexpr int kRows = 16 * Warps / KW;  // packed query rows of the CTA
  T q[kRows][D + kPad];                          // [rows][D]: the CTA's query rows
  union {
    struct {
      T k[kStages][kBc][D + kPad];   // [stage][Bc][D]: the ring of K tiles
      T v[kStages][kBc][D + kPad];   // [stage][Bc][D]: the ring of V tiles
    } kv;
    float o[KW][kRows][D + kPadF];  // [KW][rows][D]: each key warp's output rows, after the tiles
  };
  float row_lse[KW][kRows];         // [KW][rows]: their LSEs
};

// 04's load_tile by cp.async (nothing waits); a null src_row(r) zero-fills row r from any_valid.
template <int Threads, typename T, int D, int Rows, typename RowFn>
__device__ __forceinline__ void load_tile_async(T (&tile)[Rows][D + kPad], const T* any_valid,
                                                RowFn src_row) {
  constexpr int kChunks = D / 8, kRowStep = Threads / kChunks;  // 16-byte pieces per row
  static_assert(Threads % kChunks == 0 && Rows % kRowStep == 0, "the same pieces per thread");
  const int piece = threadIdx.x % kChunks;
#pragma unroll
  for (int r = threadIdx.x / kChunks; r < Rows; r += kRowStep) {
    const T* src = src_row(r);
    cp_async16(&tile[r][piece * 8], (src != nullptr ? src : any_valid) + piece * 8,
               src != nullptr ? 16 : 0);
  }
}

// The same for a K or V tile: row r at src + r * stride, rows from valid on zero-filled. A whole
// tile (all but a block's last) steps one pointer and tests no row: the tile loop issues these.
template <int Threads, typename T, int D, int Rows>
__device__ __forceinline__ void load_rows_async(T (&tile)[Rows][D + kPad], const T* src,
                                                int64_t stride, int64_t valid) {
  constexpr int kChunks = D / 8, kRowStep = Threads / kChunks;
  const int piece = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
  auto copy_rows = [&](auto whole) {
    const T* row = src + r0 * stride + piece * 8;
#pragma unroll
    for (int j = 0; j < Rows / kRowStep; ++j, row += kRowStep * stride) {
      const bool in = decltype(whole)::value || r0 + j * kRowStep < valid;
      cp_async16(&tile[r0 + j * kRowStep][piece * 8], in ? row : src + piece * 8, in ? 16 : 0);
    }
  };
  valid >= Rows ? copy_rows(std::true_type{}) : copy_rows(std::false_type{});
}

// The merge of n parts of one output row, part s normalised over its own keys, with its LSE at
// lse[s * lse_stride] and its O at o + s * o_stride. With m = max_s LSE_s (-inf counted as 0, so
// that an all-empty row stays finite) and w_s = exp(LSE_s - m): O = sum_s w_s O_s / sum_s w_s and
// LSE = m + log sum_s w_s, summed in part order (bit-identical run to run). Lane l takes elements
// [l E, l E + E) of O. Returns the LSE.
// From 03 on, other SMs wrote the parts during this launch: they are read through L2 (ld.cg).
template <int E>
__device__ __forceinline__ float merge_parts(const float* lse, int64_t lse_stride, const float* o,
                                             int64_t o_stride, int n, int lane, float (&o_row)[E]) {
  float m = -INFINITY;
  for (int s = lane; s < n; s += kWarp) m = fmaxf(m, __ldcg(lse + s * lse_stride));
  m = warp_max(m);
  const float shift = m == -INFINITY ? 0.0f : m;
  float sum_w = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_row[e] = 0.0f;
#pragma unroll 8  // eight parts' loads in flight, not one round trip per part
  for (int s = 0; s < n; ++s) {
    const float w = expf(__ldcg(lse + s * lse_stride) - shift);  // 0 for a part that saw no key
    float part[E];
    load_floats_cg<E>(o + s * o_stride + lane * E, part);
    sum_w += w;
#pragma unroll
    for (int e = 0; e < E; ++e) o_row[e] += w * part[e];
  }
  const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_row[e] *= inv;
  return sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
}

// Resident CTAs per SM asked of the compiler: none at D = 128 (1 large CTA per SM); at D = 64,
// where a tile holds half the products and hides less of a load, 2 large and 4 small.
constexpr int min_ctas_per_sm(int warps, int d) { return d != 64 ? 0 : warps == kKeyWarps ? 4 : 2; }

// One work item: the CTA's packed rows of kv head h_kv (row r: position r / group, head h_kv group
// + r % group), keys of split split_idx. Warp w: rows [16 rw, 16 rw + 16), rw = w / KW; key warp
// kw = w % KW takes keys [kw Bc/KW, (kw + 1) Bc/KW) of every tile; the parts are merged at the end.
template <typename T, int D, int Warps, int KW>
__device__ __forceinline__ void attend_block(const AttnParams& p, const SplitArgs& split, int64_t b,
                                             int64_t h_kv, int64_t q_block, int split_idx,
                                             int warp, int lane, Smem<T, D, Warps, KW>& sm) {
  constexpr int E = D / kWarp, kRowsPerWarpRow = 16, kRows = 16 * Warps / KW;
  constexpr int kThreads = Warps * kWarp, kKeyFrags = kBc / 16 / KW;  // 16-key fragments per warp
  const int rw = warp / KW, kw = warp % KW;  // this warp's 16 rows and its share of the keys
  const int key0 = kw * (kBc / KW);          // its first key in a tile
  const FragMap map{lane};
  // Packed rows in 32 bits (make_launch keeps them under 2^31): 64-bit division is a long routine.
  const unsigned group = static_cast<unsigned>(p.hq) / static_cast<unsigned>(p.hkv);
  const unsigned rows = static_cast<unsigned>(p.sq) * group;  // packed rows per (batch, kv head)
  const unsigned row0 = static_cast<unsigned>(q_block) * kRows;
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  // Keys a row may see in this split (bottom-right causal: the first i + Sk - Sq + 1); the block
  // needs keys up to its last row's end (with the mask, the longest).
  auto row_end = [&](unsigned r) {
    const int64_t i = r / group;
    const int64_t n_keys = p.causal ? min(p.sk, max(int64_t{0}, i + p.sk - p.sq + 1)) : p.sk;
    return min(n_keys, (split_idx + 1) * split.keys_per_split);
  };
  const int64_t kv_begin = split_idx * split.keys_per_split;
  const int64_t block_end = row_end(min(row0 + kRows, rows) - 1);
  // Tiles ending by the first row's last key (the fewest, with the mask) need no mask test.
  const int64_t unmasked_end = kv_begin + max(int64_t{0}, row_end(row0) - kv_begin) / kBc * kBc;
  // A row's result: the answer when there is one split, else this split's part for the merge.
  const int64_t n_rows = p.b * p.hq * p.sq;
  auto store_row = [&](unsigned i, int64_t h, const float (&o_row)[E], float lse) {
    const int64_t row = (b * p.hq + h) * p.sq + i;  // canonical row: LSE's and partials' index
    if (split.num_splits == 1) {
      T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride
             + h * p.o_head_stride;  // [D]
      store_from_float<E>(o + lane * E, o_row);
      if (p.lse != nullptr && lane == 0) p.lse[row] = lse;
    } else {
      store_floats<E>(split.o_partial + (split_idx * n_rows + row) * D + lane * E, o_row);
      if (lane == 0) split.lse_partial[split_idx * n_rows + row] = lse;
    }
  };
  // Per thread: the running max m of its two rows' raw scores, its part of their sums l; padding
  // rows take every key (finite, never stored). A negative scale flips Q: P is one FFMA + EX2.
  int64_t end[2];
  float m[2], l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const unsigned r = row0 + rw * 16 + map.row(h);
    end[h] = r < rows ? row_end(r) : block_end;
    m[h] = -INFINITY, l[h] = 0.0f;
  }
  auto q_row = [&](int r) -> const T* {  // row r of the Q block, null past the last
    if (row0 + r >= rows) return nullptr;
    const unsigned i = (row0 + r) / group;
    const unsigned h = static_cast<unsigned>(h_kv) * group + (row0 + r) % group;
    return q + i * p.q_seq_stride + h * p.q_head_stride;
  };

  // Start the Q block (cp.async group 0) and the first K/V tile (group 1, ring stage 0; tile t
  // goes to stage t % 2). Wait for Q alone; load Q's fragments while the tile lands.
  load_tile_async<kThreads, T, D, kRows>(sm.q, k, q_row);
  cp_async_commit();
  auto issue_tile = [&](int64_t kv_tile, int stage) {  // rows past block_end are zero-filled
    load_rows_async<kThreads, T, D, kBc>(sm.kv.k[stage], k + kv_tile * p.k_seq_stride,
                                         p.k_seq_stride, block_end - kv_tile);
    load_rows_async<kThreads, T, D, kBc>(sm.kv.v[stage], v + kv_tile * p.v_seq_stride,
                                         p.v_seq_stride, block_end - kv_tile);
  };
  if (kv_begin < block_end) issue_tile(kv_begin, 0);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  // Warp-uniform: past its last row's end a tile's products would change nothing (the mask).
  const int64_t warp_end = row_end(min(row0 + rw * 16 + 15, rows - 1));
  FragA<T> q_frag[D / 16];
  FragAcc o_frag[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
    load_fragment(q_frag[d], &sm.q[rw * 16][d * 16], D + kPad);
    wmma::fill_fragment(o_frag[d], 0.0f);
    if (p.scale < 0.0f)
#pragma unroll
      for (int e = 0; e < q_frag[d].num_elements; ++e)
        q_frag[d].x[e] = from_bits<T>(to_bits(q_frag[d].x[e]) ^ 0x8000u);
  }
  const float scale = fabsf(p.scale);  // log2 units (the launch folded in log2(e))
  // One step of the online softmax over keys [kv_tile, kv_tile + Bc), from ring stage stage;
  // Masked says whether the tile reaches past some row's last key.
  auto attend_tile = [&](int64_t kv_tile, int stage, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    // 1. Put tile t+1 in flight (after the last tile, an empty group), wait for all but that
    //    group: tile t has landed. The barrier makes every thread's copies visible to all warps.
    if (kv_tile + kBc < block_end) issue_tile(kv_tile + kBc, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (kv_tile + key0 < warp_end) {
      // 2. S = Q.K^T for this warp's 16 rows and keys, in kKeyFrags accumulator fragments.
      FragAcc s_frag[kKeyFrags];
#pragma unroll
      for (int n = 0; n < kKeyFrags; ++n) {
        wmma::fill_fragment(s_frag[n], 0.0f);
        if (kMasked && kv_tile + key0 + n * 16 >= warp_end) continue;  // all masked below
#pragma unroll
        for (int d = 0; d < D / 16; ++d) {
          FragBt<T> kt_frag;
          load_fragment(kt_frag, &sm.kv.k[stage][key0 + n * 16][d * 16], D + kPad);
          wmma::mma_sync(s_frag[n], q_frag[d], kt_frag, s_frag[n]);
        }
      }
      // 3. Online softmax of the tile, in registers. Masked scores are -inf; m_safe keeps a row
      //    with no key yet at exp2(-inf - 0) = 0 instead of the NaN of -inf - (-inf).
      int limit[2];  // keys of the tile each row may see
#pragma unroll
      for (int h = 0; h < 2; ++h)
        limit[h] = static_cast<int>(max(int64_t{0}, min(end[h] - kv_tile, int64_t{kBc})));
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeyFrags; ++n)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (kMasked && key0 + n * 16 + map.col(e) >= limit[half_of(e)])
            s_frag[n].x[e] = -INFINITY;
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
          s_frag[n].x[e] = fast_exp2(fmaf(s_frag[n].x[e], scale, neg_m_scaled[half_of(e)]));  // P
          l[half_of(e)] += s_frag[n].x[e];
        }
      // 4. Rescale O by alpha (skipped when no row of the warp found a larger max), then O += P.V;
      //    P's A fragments come straight from the S accumulators, rounded (see FragMap).
      if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
        for (int d = 0; d < D / 16; ++d)
#pragma unroll
          for (int e = 0; e < 8; ++e) o_frag[d].x[e] *= alpha[half_of(e)];
#pragma unroll
      for (int kk = 0; kk < kKeyFrags; ++kk) {
        if (kMasked && kv_tile + key0 + kk * 16 >= warp_end) continue;  // P = 0
        FragA<T> p_frag;
#pragma unroll
        for (int e = 0; e < p_frag.num_elements; ++e)
          p_frag.x[e] = from_float<T>(s_frag[kk].x[e % 8]);
#pragma unroll
        for (int d = 0; d < D / 16; ++d) {
          FragB<T> v_frag;
          load_fragment(v_frag, &sm.kv.v[stage][key0 + kk * 16][d * 16], D + kPad);
          wmma::mma_sync(o_frag[d], p_frag, v_frag, o_frag[d]);
        }
      }
    }
    __syncthreads();  // the next iteration's copies overwrite this stage
  };
  int64_t kv_tile = kv_begin;
  int stage = 0;
  for (; kv_tile < unmasked_end; kv_tile += kBc, stage ^= 1)
    attend_tile(kv_tile, stage, std::false_type{});
  for (; kv_tile < block_end; kv_tile += kBc, stage ^= 1)
    attend_tile(kv_tile, stage, std::true_type{});
  cp_async_wait<0>();  // no copy may still be landing when shared memory is reused
  __syncthreads();

  // Normalise (l: the quad's sum; an empty row has l = 0: O = 0, LSE = -inf) into shared memory,
  // over the freed K/V ring, a slot per key warp; the lane holding column 0 writes the LSEs.
  float inv_l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(l[h]);
    inv_l[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const float lse = l[h] > 0.0f ? (m[h] * scale + log2f(l[h])) * kLn2 : -INFINITY;
    if (map.col(0) == 0) sm.row_lse[kw][rw * 16 + map.row(h)] = lse;
  }
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
#pragma unroll
    for (int e = 0; e < 8; ++e) o_frag[d].x[e] *= inv_l[half_of(e)];
    wmma::store_matrix_sync(&sm.o[kw][rw * 16][d * 16], o_frag[d], D + kPadF, wmma::mem_row_major);
  }
  // A warp stores rows it computed; with key warps, rows hold parts from every warp of the CTA.
  KW == 1 ? __syncwarp() : __syncthreads();

  // Merge the key warps' parts of each row by their LSEs, as splits are merged, and store it.
  // Warp (rw, kw) merges rows kw, kw + KW, ... of its warp row (KW = 1: copies), then stores.
  constexpr int kRowsPerWarp = (kRowsPerWarpRow + KW - 1) / KW;
  float o_row[kRowsPerWarp][E], lse[kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) {
    const int rr = rw * kRowsPerWarpRow + kw + KW * t;
    float lse_w[KW], m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < KW; ++w) lse_w[w] = sm.row_lse[w][rr], m_all = fmaxf(m_all, lse_w[w]);
    const float shift = m_all == -INFINITY ? 0.0f : m_all;
    float sum_w = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) o_row[t][e] = 0.0f;
#pragma unroll
    for (int w = 0; w < KW; ++w) {
      const float weight = KW == 1 ? 1.0f : expf(lse_w[w] - shift);  // 0: a warp with no key
      sum_w += weight;
#pragma unroll
      for (int e = 0; e < E; ++e) o_row[t][e] += weight * sm.o[w][rr][lane * E + e];
    }
    const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) o_row[t][e] *= inv;
    lse[t] = KW == 1 ? lse_w[0] : sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
  }
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) {
    const unsigned r = row0 + rw * kRowsPerWarpRow + kw + KW * t;
    if (kw + KW * t >= kRowsPerWarpRow || r >= rows) break;  // past the last row (and the rest)
    store_row(r / group, h_kv * group + r % group, o_row[t], lse[t]);
  }
}

// grid (q_blocks * num_splits, Hkv, B), one CTA per work item: splits fastest, then query
// blocks, kv heads and batches, the order in which the GPU starts them. With the queue, as many
// CTAs as fit, each looping over items.
template <typename T, int D, int Warps, int KW, bool kQueue, bool kMerge>
__global__ void __launch_bounds__(Warps * kWarp, min_ctas_per_sm(Warps, D))
    attention_kernel(const AttnParams p, const SplitArgs split) {
  constexpr int kRows = 16 * Warps / KW, kRowsPerWarpRow = 16, kRowsPerWarp = 16 / KW;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem<T, D, Warps, KW>& sm = *reinterpret_cast<Smem<T, D, Warps, KW>*>(smem_raw);
  __shared__ unsigned s_item, s_last;  // the next item; whether this CTA merges its block
  // The warp index, broadcast from lane 0 so that the compiler knows it is warp-uniform (see 01).
  const int warp = __shfl_sync(kFullMask, static_cast<int>(threadIdx.x / kWarp), 0);
  const int lane = threadIdx.x % kWarp;
  // As in 01, the grid's y and z are the head and the batch: a division by a run-time value
  // is tens of instructions, and here all of them come before the first load.
  const unsigned n_splits = split.num_splits;
  // The queue's items in 32 bits (make_launch keeps them under 2^31), for the same reason.
  const unsigned n_hkv = static_cast<unsigned>(p.hkv), n_b = static_cast<unsigned>(p.b);
  const unsigned n_q = static_cast<unsigned>(split.q_blocks), n_items = n_q * n_hkv * n_b;
  unsigned item = blockIdx.x;  // a CTA has at least one item: the grid is at most the items
  do {
    // 0. Ask for the next item now: the atomic's round trip overlaps this item's work.
    const unsigned next = kQueue && threadIdx.x == 0
                              ? gridDim.x + static_cast<unsigned>(atomicAdd(split.next_item, 1ull))
                              : n_items;
    // 1. Decode the item: without the queue, from 02's grid. The queue's items (causal, one
    //    split) take kv heads fastest, then batches, then query blocks, the longest (latest) first.
    // blockIdx.x % 1 under the queue: a constant 0 there lets the compiler specialise the key
    // loop of the queue's build, which then spills at D = 64.
    const int split_idx = static_cast<int>(blockIdx.x % n_splits);
    const int64_t h_kv = kQueue ? item % n_hkv : blockIdx.y;
    const int64_t b = kQueue ? item / n_hkv % n_b : blockIdx.z;
    const int64_t q_block = kQueue ? n_q - 1 - item / n_hkv / n_b : blockIdx.x / n_splits;
    attend_block<T, D, Warps, KW>(p, split, b, h_kv, q_block, split_idx, warp, lane, sm);
    // 2. Fused merge: the CTA whose arrival completes the block's count (a release and acquire at
    //    GPU scope between two barriers: the partials come first) merges it, resets the count.
    if (kMerge && split.num_splits > 1) {  // compiled only into the builds of launches that split
      __syncthreads();
      if (threadIdx.x == 0) {
        cuda::atomic_ref<int, cuda::thread_scope_device> arrival(
            split.arrivals[(b * p.hkv + h_kv) * split.q_blocks + q_block]);
        s_last = arrival.fetch_add(1, cuda::memory_order_acq_rel) == split.num_splits - 1;
        if (s_last) arrival.store(0, cuda::memory_order_relaxed);
      }
      __syncthreads();
      if (s_last) {
        const unsigned group = static_cast<unsigned>(p.hq / p.hkv);
        const unsigned rows = static_cast<unsigned>(p.sq) * group;
        const int rw = warp / KW, kw = warp % KW;  // each warp merges the rows it stored
#pragma unroll
        for (int t = 0; t < kRowsPerWarp; ++t) {
          const unsigned r = static_cast<unsigned>(q_block) * kRows + rw * kRowsPerWarpRow
                             + kw + KW * t;
          if (kw + KW * t >= kRowsPerWarpRow || r >= rows) break;
          const int64_t h = h_kv * group + r % group, i = r / group;
          const int64_t n_rows = p.b * p.hq * p.sq, row = (b * p.hq + h) * p.sq + i;
          float o_row[D / kWarp];
          const float lse = merge_parts(split.lse_partial + row, n_rows, split.o_partial + row * D,
                                        n_rows * D, split.num_splits, lane, o_row);
          store_output<T>(p, b, h, i, lane, o_row, lse);
        }
      }
    }
    if (!kQueue) break;
    // 3. The next item: a barrier publishes the fetch, a second guards s_item and shared memory.
    if (threadIdx.x == 0) s_item = next;
    __syncthreads();
    item = s_item;
    __syncthreads();
  } while (item < n_items);
  // 4. The last CTA to find the queue empty resets it: every other CTA has made its last fetch.
  if (kQueue && threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(split.exited, 1u) == gridDim.x - 1) *split.next_item = 0, *split.exited = 0;
  }
}

using Kernel = void (*)(AttnParams, SplitArgs);

template <typename T, int D, bool kQueue, bool kMerge>
Kernel select_kernel(bool key_warps) {
  return key_warps ? attention_kernel<T, D, kKeyWarps, kKeyWarps, kQueue, kMerge>
                   : attention_kernel<T, D, large_warps(D), 1, kQueue, kMerge>;
}
template <bool kQueue, bool kMerge>
Kernel select_kernel(const AttnParams& p, bool key_warps) {
  if (p.dtype == DType::f16)
    return p.d == 64 ? select_kernel<__half, 64, kQueue, kMerge>(key_warps)
                     : select_kernel<__half, 128, kQueue, kMerge>(key_warps);
  return p.d == 64 ? select_kernel<__nv_bfloat16, 64, kQueue, kMerge>(key_warps)
                   : select_kernel<__nv_bfloat16, 128, kQueue, kMerge>(key_warps);
}

template <int D>
size_t smem_bytes(bool key_warps) {  // dynamic shared memory per CTA, for either element type
  return key_warps ? sizeof(Smem<__half, D, kKeyWarps, kKeyWarps>)
                   : sizeof(Smem<__half, D, large_warps(D), 1>);
}

// How many key ranges: none unless the grid leaves an SM without a CTA; then the count with
// the most CTAs in one wave (an item's fixed costs are paid once per CTA), up to max_splits.
int choose_num_splits(int64_t ctas_without_split, int64_t slots, int64_t max_splits, int sms) {
  if (ctas_without_split >= sms) return 1;  // every SM has a CTA: splitting buys little
  max_splits = std::min<int64_t>(kMaxSplits, max_splits);
  return static_cast<int>(std::max<int64_t>(1, std::min(max_splits, slots / ctas_without_split)));
}

struct Launch {
  int warps = 0;           // warps per CTA
  int kw = 1;              // key warps per 16-row block
  int rows = 0;            // packed query rows per CTA
  size_t smem = 0;         // dynamic shared memory per CTA
  int ctas_per_sm = 0;     // resident CTAs per SM
  int64_t slots = 0;       // ctas_per_sm * SMs
  SplitArgs split;         // num_splits, keys_per_split, q_blocks (pointers filled at launch)
  int64_t items = 0;       // work items: q_blocks * Hkv * B * num_splits
  dim3 grid;               // 02's (q_blocks * num_splits, Hkv, B); with the queue, slots CTAs
  size_t counters = 0;     // next_item, exited, arrivals[< SMs]: the workspace's first bytes
  Kernel kernel = nullptr;
};

Status make_launch(const AttnParams& p, Launch* out) {
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  auto configure = [&](bool key_warps, bool queue, bool merge, Launch* c) -> Status {
    c->warps = key_warps ? kKeyWarps : large_warps(static_cast<int>(p.d));
    c->kw = key_warps ? kKeyWarps : 1;
    c->rows = 16 * c->warps / c->kw;
    c->kernel = (queue ? select_kernel<true, false> : merge ? select_kernel<false, true>
                       : select_kernel<false, false>)(p, key_warps);
    c->smem = p.d == 64 ? smem_bytes<64>(key_warps) : smem_bytes<128>(key_warps);
    if (c->smem > device->smem_per_block_optin)
      return Status::Error(std::string(kStageName) + " needs " + std::to_string(c->smem) +
                           " bytes of shared memory per CTA, the device allows " +
                           std::to_string(device->smem_per_block_optin));
    c->split.q_blocks = (p.sq * (p.hq / p.hkv) + c->rows - 1) / c->rows;
    ATTN_TRY(resident_ctas_per_sm(reinterpret_cast<const void*>(c->kernel), c->warps * kWarp,
                                  c->smem, &c->ctas_per_sm));
    c->slots = static_cast<int64_t>(c->ctas_per_sm) * device->sm_count;
    return Status::Ok();
  };
  // The large CTA; when it leaves an SM without a CTA, the small CTA of 4 key warps on 16 rows
  // (8x or 16x the CTAs), if all of them fit on the GPU at once.
  Launch l;
  ATTN_TRY(configure(false, false, true, &l));
  if (l.split.q_blocks * p.hkv * p.b < device->sm_count) {
    Launch key_warps;
    ATTN_TRY(configure(true, false, true, &key_warps));
    if (key_warps.split.q_blocks * p.hkv * p.b <= key_warps.slots) l = key_warps;
  }
  // At most kv_tiles / kMinTilesPerSplit splits, of whole tiles, recounted: none is empty.
  const int64_t kv_tiles = (p.sk + kBc - 1) / kBc, unsplit = l.split.q_blocks * p.hkv * p.b;
  const int splits = choose_num_splits(
      unsplit, l.slots, std::max<int64_t>(1, kv_tiles / kMinTilesPerSplit), device->sm_count);
  l.split.keys_per_split = (kv_tiles + splits - 1) / splits * kBc;
  l.split.num_splits = static_cast<int>((p.sk - 1) / l.split.keys_per_split + 1);
  l.items = unsplit * l.split.num_splits;
  constexpr int64_t kMax32 = int64_t{1} << 31;  // the kernel counts items and rows in 32 bits
  if (l.items >= kMax32 || p.sq * p.hq >= kMax32)
    return Status::Error(std::string(kStageName) + ": work items (" + std::to_string(l.items) +
                         ") and Sq * Hq (" + std::to_string(p.sq * p.hq) + ") must be under 2^31");
  if (p.hkv > 65535 || p.b > 65535)
    return Status::Error(std::string(kStageName) + ": Hkv (" + std::to_string(p.hkv) + ") and B (" +
                         std::to_string(p.b) + ") must be at most 65535 (the grid's y and z)");
  l.grid = dim3(static_cast<unsigned>(l.split.q_blocks * l.split.num_splits),
                static_cast<unsigned>(p.hkv), static_cast<unsigned>(p.b));
  const bool queue = l.items > l.slots && p.causal;  // never with splits: they fit one wave
  if (queue || l.items == unsplit) ATTN_TRY(configure(l.kw > 1, queue, false, &l));
  if (queue) l.grid = dim3(static_cast<unsigned>(l.slots));  // even items: the GPU's own queue
  l.counters = (12 + 4 * static_cast<size_t>(device->sm_count) + 255) / 256 * 256;  // any shape
  *out = l;
  return Status::Ok();
}

// Workspace: every split's partial O ([num_splits][B*Hq*Sq][D] fp32), then their LSEs
// ([num_splits][B*Hq*Sq]); none without a split.
size_t layout_bytes(const AttnParams& p, const Launch& l) {
  const int64_t parts = l.split.num_splits > 1 ? l.split.num_splits * p.b * p.hq * p.sq : 0;
  return l.counters + static_cast<size_t>(parts * (p.d + 1)) * sizeof(float);
}

size_t workspace_bytes(const AttnParams& p) {
  Launch l;
  return make_launch(p, &l).ok() ? layout_bytes(p, l) : 0;
}

Status plan(const AttnParams& p, LaunchPlan* out) {
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  out->grid = l.grid;
  out->block = dim3(l.warps * kWarp);
  out->dynamic_smem_bytes = l.smem;
  out->kernel = reinterpret_cast<const void*>(l.kernel);
  const int64_t ctas = int64_t{l.grid.x} * l.grid.y * l.grid.z;
  out->notes = std::to_string(ctas) + " CTAs, " + std::to_string(l.split.num_splits) +
               " splits, " + std::to_string(l.kw) + " key warps";
  return Status::Ok();
}

Status launch(const AttnParams& p, const Workspace& ws, cudaStream_t stream) {
  ATTN_TRY(validate_launch(p, kStageName, kMinSm, ws, 0));  // parameters and GPU, before the plan
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  ATTN_TRY(check_workspace(kStageName, ws, layout_bytes(p, l)));
  AttnParams kp = p;
  // Scores in log2 units: exp(x) = exp2(x * log2(e)), and exp2f is one MUFU.EX2 instruction.
  kp.scale = effective_scale(p) * kLog2e;
  char* base = static_cast<char*>(ws.ptr);
  SplitArgs split = l.split;
  split.o_partial = reinterpret_cast<float*>(base + l.counters);
  split.lse_partial = split.o_partial + split.num_splits * p.b * p.hq * p.sq * p.d;
  split.next_item = reinterpret_cast<unsigned long long*>(base);
  split.exited = reinterpret_cast<unsigned*>(base + sizeof(unsigned long long));
  split.arrivals = reinterpret_cast<int*>(base + sizeof(unsigned long long) + sizeof(unsigned));
  l.kernel<<<l.grid, l.warps * kWarp, l.smem, stream>>>(kp, split);
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_05_cp_async() {
  StageInfo s;
  s.name = kStageName;
  s.description = "K/V tiles fetched with cp.async into a two-stage ring, overlapping compute";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  return s;
}

}  // namespace attn
