// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 02 extends 01 by splitting the keys of a grid too small for the GPU (seed, decode) into
// num_splits ranges, each run by its own CTA, which writes an fp32 partial output and its LSE; a
// second kernel merges them by their LSEs. Inside a CTA, KW key warps share a row's keys, merged
// the same way. Second idea, for decode: GQA packing, a warp row of HPW > 1 query heads of one kv
// head, so that 01's lane groups read each K and V row once for all of them.
// What every stage computes: docs/contract.md. Why this stage: notebooks_md/02_kv_split.md.
#include <algorithm>
#include <cmath>

#include "device.h"
#include "dtype.cuh"
#include "params.h"
#include "stage.h"
#include "warp.cuh"

namespace attn {
namespace {

constexpr const char* kStageName = "02_kv_split";
constexpr int kMinSm = 80;
constexpr int kBr = 8;           // warp rows per CTA without key warps, as in 01
constexpr int kBc = kWarp;       // keys per step of the online softmax
constexpr int kKeyWarps = 4;     // key warps per warp row, when a CTA has them
constexpr int kMaxSplits = 128;  // cap: beyond this the merge costs more than the parallelism buys

// Where the CTAs of one (batch, kv head, query block) put their partial results.
struct SplitArgs {
  int num_splits = 1;            // key ranges per (batch, kv head, query block)
  int64_t keys_per_split = 0;    // a multiple of Bc
  float* o_partial = nullptr;    // [num_splits][B*Hq*Sq][D] fp32, normalised within the split
  float* lse_partial = nullptr;  // [num_splits][B*Hq*Sq], -inf where the split saw no key
  int64_t q_blocks = 0;          // query blocks per (batch, kv head)
};

// 01's loop: one warp, HPW query heads of one query position (GQA packing: HPW > 1 heads of a GQA
// group read each K and V row once for all of them), over the tiles kw, kw + KW, ... of its keys
// [kv_begin, kv_end) of k and v ([Sk][D], row strides in p). Lanes work in groups of G = D/8 that
// read one K or V row together, 16 bytes each, so that a load instruction moves KPI = 32/G whole
// rows, coalesced. Lane (g, c) = (lane / G, lane % G) keeps elements [8c, 8c + 8) of each head's q
// and forms partial dot products with the same elements of its rows; transpose_sum (warp.cuh)
// finishes G of them at once and leaves each lane the score of one key (key (ch*R + c/HPW)*KPI + g
// of the tile, head c % HPW). P goes through shared memory to P.V. Leaves each head's O,
// normalised, in smem_o and its LSE (natural log) in smem_lse.
template <typename T, int D, int HPW, int KW>
__device__ __forceinline__ void attend_row(const AttnParams& p, const T* q, const T* k, const T* v,
                                           int64_t kv_begin, int64_t kv_end, int kw, int lane,
                                           float (&smem_p)[kBc][HPW], float (&smem_o)[HPW][D],
                                           float (&smem_lse)[HPW]) {
  constexpr int G = D / 8;        // lanes per K or V row
  constexpr int KPI = kWarp / G;  // rows per load instruction: 2 (D = 128) or 4 (D = 64)
  constexpr int R = G / HPW;      // loads per chunk of G partial sums
  static_assert(R >= 1 && R * HPW == G, "HPW divides D/8");
  const int c = lane % G, g = lane / G;

  float qr[HPW][8];  // this lane's slice of each head's query, times the scale
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    load_as_float<8>(q + hh * p.q_head_stride + 8 * c, qr[hh]);
#pragma unroll
    for (int e = 0; e < 8; ++e) qr[hh][e] *= p.scale;
  }

  // Online softmax over tiles of Bc = 32 keys. m is the running maximum of the scores seen so far,
  // l the running sum of exp(score - m) (kept per lane for the lane's own keys, summed at the end),
  // acc the running sum of exp(score - m) * V. When a tile raises the maximum from m to m_new,
  // everything accumulated so far was scaled by exp(-m) and must be rescaled by exp(m - m_new): the
  // result is exactly the softmax over all keys seen, and no exp() argument is ever positive, so
  // nothing overflows.
  float m_lane = -INFINITY, l_lane = 0.0f;  // head c % HPW: running max, this lane's part of l
  float acc[HPW][8] = {};  // O of every head over elements [8c, 8c + 8), keys of group g
  for (int64_t kv_tile = kv_begin + kw * kBc; kv_tile < kv_end; kv_tile += KW * kBc) {
    // Scores. A key past kv_end reads the last visible row and is masked to -inf. CTAs without
    // key warps clamp in 32 bits, within the tile (a shorter loop in their 64 registers); the
    // others keep 01's 64-bit clamp, which holds fewer registers.
    const T* k_tile = k + kv_tile * p.k_seq_stride;
    const T* v_tile = v + kv_tile * p.v_seq_stride;
    const int last = static_cast<int>(min(int64_t{kBc - 1}, kv_end - 1 - kv_tile));
    float s[HPW];
#pragma unroll
    for (int ch = 0; ch < HPW; ++ch) {
      float part[G];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t j = kv_tile + (ch * R + r) * KPI + g;
        const T* k_row = KW == 1 ? k_tile + min((ch * R + r) * KPI + g, last) * p.k_seq_stride
                                 : k + min(j, kv_end - 1) * p.k_seq_stride;
        float k8[8];
        load_as_float<8>(k_row + 8 * c, k8);
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(qr[hh][e], k8[e], dot);
          part[r * HPW + hh] = dot;
        }
      }
      s[ch] = transpose_sum<G / 2>(part, c);
      if (kv_tile + (ch * R + c / HPW) * KPI + g >= kv_end) s[ch] = -INFINITY;
    }

    // The new running maximum of head c % HPW over its lanes (finite: the tile has a visible
    // key); P into shared memory.
    float tile_max = s[0];
#pragma unroll
    for (int ch = 1; ch < HPW; ++ch) tile_max = fmaxf(tile_max, s[ch]);
#pragma unroll
    for (int offset = HPW; offset < kWarp; offset *= 2)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, offset));
    const float m_new = fmaxf(m_lane, tile_max);
    const float alpha = exp2f(m_lane - m_new);  // 0 on the first tile (m = -inf)
    __syncwarp();                               // every lane has read the previous tile's P
    float p_sum = 0.0f;
#pragma unroll
    for (int ch = 0; ch < HPW; ++ch) {
      const float p_j = exp2f(s[ch] - m_new);  // 0 when masked
      smem_p[(ch * R + c / HPW) * KPI + g][c % HPW] = p_j;
      p_sum += p_j;
    }
    l_lane = l_lane * alpha + p_sum;
    m_lane = m_new;
    __syncwarp();

    // P.V with the same lane groups: lane (g, c) takes keys g, g + KPI, ... of the tile. Masked
    // keys have P = 0 and read a visible row (in bounds).
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      const float a = __shfl_sync(kFullMask, alpha, hh);  // lane hh holds head hh
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[hh][e] *= a;
    }
#pragma unroll
    for (int t = 0; t < G; ++t) {
      const int jj = t * KPI + g;
      float v8[8];
      const T* v_row = KW == 1 ? v_tile + min(jj, last) * p.v_seq_stride
                               : v + min(kv_tile + jj, kv_end - 1) * p.v_seq_stride;
      load_as_float<8>(v_row + 8 * c, v8);
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) {
        const float p_j = smem_p[jj][hh];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[hh][e] = fmaf(p_j, v8[e], acc[hh][e]);
      }
    }
  }

  // Finish the sums (l over a head's lanes, O over the KPI key groups), normalise and publish:
  // lane hh holds head hh's m and l. An empty row or split has l = 0: O = 0 and LSE = -inf.
#pragma unroll
  for (int offset = HPW; offset < kWarp; offset *= 2)
    l_lane += __shfl_xor_sync(kFullMask, l_lane, offset);
#pragma unroll
  for (int offset = G; offset < kWarp; offset *= 2)
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[hh][e] += __shfl_xor_sync(kFullMask, acc[hh][e], offset);
  float inv_l[HPW];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    const float l_h = __shfl_sync(kFullMask, l_lane, hh);
    inv_l[hh] = l_h > 0.0f ? 1.0f / l_h : 0.0f;
  }
  if (g == 0)
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh)
#pragma unroll
      for (int e = 0; e < 8; ++e) smem_o[hh][8 * c + e] = acc[hh][e] * inv_l[hh];
  if (lane < HPW) smem_lse[lane] = l_lane > 0.0f ? (m_lane + log2f(l_lane)) * kLn2 : -INFINITY;
}

// The merge of n parts of one output row, part s normalised over its own keys, with its LSE at
// lse[s * lse_stride] and its O at o + s * o_stride. With m = max_s LSE_s (-inf counted as 0, so
// that an all-empty row stays finite) and w_s = exp(LSE_s - m): O = sum_s w_s O_s / sum_s w_s and
// LSE = m + log sum_s w_s, summed in part order (bit-identical run to run). Lane l takes elements
// [l E, l E + E) of O. Returns the LSE.
template <int E>
__device__ __forceinline__ float merge_parts(const float* lse, int64_t lse_stride, const float* o,
                                             int64_t o_stride, int n, int lane, float (&o_row)[E]) {
  float m = -INFINITY;
  for (int s = lane; s < n; s += kWarp) m = fmaxf(m, lse[s * lse_stride]);
  m = warp_max(m);
  const float shift = m == -INFINITY ? 0.0f : m;
  float sum_w = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_row[e] = 0.0f;
#pragma unroll 8  // eight parts' loads in flight, not one round trip per part
  for (int s = 0; s < n; ++s) {
    const float w = expf(lse[s * lse_stride] - shift);  // 0 for a part that saw no key
    float part[E];
    load_floats<E>(o + s * o_stride + lane * E, part);
    sum_w += w;
#pragma unroll
    for (int e = 0; e < E; ++e) o_row[e] += w * part[e];
  }
  const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_row[e] *= inv;
  return sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
}

// Resident CTAs per SM asked of the compiler (the register bound): with GQA packing 4 (2 or 4
// heads per warp: a 4th CTA's loads in flight are worth more registers) or 2 (8 heads: q and O
// alone take 128 registers); 8 warp rows, 4 (a grid of 4 CTAs an SM fits one wave); key warps
// without packing, none (the compiler's own choice).
constexpr int min_ctas_per_sm(int hpw, int kw, int) {
  return hpw == 1 ? (kw > 1 ? 0 : 4) : hpw == 8 ? 2 : 4;
}

// Shared memory of a CTA of Br warp rows of HPW heads, KW key warps each.
template <int D, int Br, int HPW, int KW>
struct Smem {
  static constexpr int kRows = Br * HPW;  // packed query rows of the CTA
  float p[Br * KW][kBc][HPW];             // [warps][Bc][HPW]: each warp's P tile
  float o[KW][kRows][D];                  // [KW][rows][D]: each key warp's output rows
  float row_lse[KW][kRows];               // [KW][rows]: their LSEs
};

// One work item: the CTA's packed query rows of kv head h_kv (row r: query position r / group,
// head h_kv * group + r % group) over the keys of split split_idx. A warp row is a position and
// HPW heads; its KW key warps share the tiles and leave normalised rows and LSEs to be merged.
template <typename T, int D, int Br, int HPW, int KW>
__device__ __forceinline__ void attend_block(const AttnParams& p, const SplitArgs& split, int64_t b,
                                             int64_t h_kv, int64_t q_block, int split_idx,
                                             int warp, int lane, Smem<D, Br, HPW, KW>& sm) {
  constexpr int E = D / kWarp, kRowsPerWarpRow = HPW, kRows = Br * HPW;
  const int rw = warp / KW, kw = warp % KW;  // this warp's row and its share of the keys
  // Packed rows in 32 bits (make_launch keeps them under 2^31): a 64-bit division by a runtime
  // value is a software routine of tens of instructions.
  const unsigned group = static_cast<unsigned>(p.hq / p.hkv);
  const unsigned rows = static_cast<unsigned>(p.sq) * group;  // packed rows per (batch, kv head)
  const unsigned row0 = static_cast<unsigned>(q_block) * kRows;
  // The last query block may be partial. Without key warps its extra warps leave at once (only
  // __syncwarp() follows); with them they read a valid row's q, see no keys, and store nothing.
  const bool row_valid = row0 + rw * HPW < rows;
  if (KW == 1 && !row_valid) return;
  const unsigned r = row_valid ? row0 + rw * HPW : rows - HPW;  // this warp row's first row
  const int64_t i = r / group, h0 = h_kv * group + r % group;  // its query position, first head
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_seq_stride
               + h0 * p.q_head_stride;  // [HPW][D], head stride q_head_stride
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  // Keys this row may see: all of them, or with the bottom-right causal mask the first
  // i + (Sk - Sq) + 1 (none when that is <= 0: the row is empty); this CTA takes those in its
  // split, [kv_begin, kv_end), which may be empty. CTAs without key warps never split: their
  // kv_begin is 0 at compile time, as in 01.
  const int64_t n_keys = p.causal ? min(p.sk, max(int64_t{0}, i + p.sk - p.sq + 1)) : p.sk;
  const int64_t kv_begin = KW == 1 ? 0 : split_idx * split.keys_per_split;
  const int64_t kv_end = row_valid ? min(n_keys, kv_begin + split.keys_per_split) : kv_begin;
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
  attend_row<T, D, HPW, KW>(p, q, k, v, kv_begin, kv_end, kw, lane, sm.p[warp],
                            *reinterpret_cast<float(*)[HPW][D]>(sm.o[kw][rw * HPW]),
                            *reinterpret_cast<float(*)[HPW]>(&sm.row_lse[kw][rw * HPW]));
  // A warp stores rows it computed; with key warps, rows hold parts from every warp of the CTA.
  KW == 1 ? __syncwarp() : __syncthreads();

  // Merge the key warps' parts of each row by their LSEs, as splits are merged, and store it.
  // Warp (rw, kw) merges rows kw, kw + KW, ... of its warp row (KW = 1: copies), then stores.
  constexpr int kRowsPerWarp = (kRowsPerWarpRow + KW - 1) / KW;
  float o_row[kRowsPerWarp][E], lse[kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) {
    if (kw + KW * t >= kRowsPerWarpRow) break;  // a warp row with fewer rows than key warps
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

// The merge: one CTA of kCombineWarps warps per output row. Warp w merges splits w, w + 8, ...
// (8 times the loads in flight of one warp), then warp 0 merges the warps' results.
constexpr int kCombineWarps = 8;

template <typename T, int D>
__global__ void __launch_bounds__(kCombineWarps * kWarp)
    combine_kernel(const AttnParams p, const SplitArgs split) {
  constexpr int E = D / kWarp;
  __shared__ float smem_lse[kCombineWarps];
  __shared__ __align__(16) float smem_o[kCombineWarps][D];  // [warps][D]: each warp's merge
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t n_rows = p.b * p.hq * p.sq, row = blockIdx.x;
  const int64_t i = row % p.sq, h = (row / p.sq) % p.hq, b = row / (p.sq * p.hq);
  const int n = (split.num_splits - warp + kCombineWarps - 1) / kCombineWarps;  // its splits
  float o_row[E];
  const float lse = merge_parts<E>(split.lse_partial + warp * n_rows + row, kCombineWarps * n_rows,
                                   split.o_partial + (warp * n_rows + row) * D,
                                   kCombineWarps * n_rows * D, n, lane, o_row);
  store_floats<E>(&smem_o[warp][lane * E], o_row);
  if (lane == 0) smem_lse[warp] = lse;
  __syncthreads();
  if (warp != 0) return;
  const float lse_row = merge_parts<E>(smem_lse, 1, &smem_o[0][0], D, kCombineWarps, lane, o_row);
  store_output<T>(p, b, h, i, lane, o_row, lse_row);
}

// grid (q_blocks * num_splits, Hkv, B), one CTA per work item: splits fastest, then query
// blocks, kv heads and batches, the order in which the GPU starts them.
template <typename T, int D, int Br, int HPW, int KW>
__global__ void __launch_bounds__(Br * KW * kWarp, min_ctas_per_sm(HPW, KW, D))
    attention_kernel(const AttnParams p, const SplitArgs split) {
  __shared__ __align__(16) Smem<D, Br, HPW, KW> sm;
  // The warp index, broadcast from lane 0 so that the compiler knows it is warp-uniform (see 01).
  const int warp = __shfl_sync(kFullMask, static_cast<int>(threadIdx.x / kWarp), 0);
  const int lane = threadIdx.x % kWarp;
  // As in 01, the grid's y and z are the head and the batch: a division by a run-time value
  // is tens of instructions, and here all of them come before the first load.
  const unsigned n_splits = split.num_splits;
  const int split_idx = static_cast<int>(blockIdx.x % n_splits);
  const int64_t q_block = blockIdx.x / n_splits, h_kv = blockIdx.y, b = blockIdx.z;
  attend_block<T, D, Br, HPW, KW>(p, split, b, h_kv, q_block, split_idx, warp, lane, sm);
}

using Kernel = void (*)(AttnParams, SplitArgs);

template <typename T, int D>
Kernel select_kernel(int hpw, bool key_warps) {
  switch (hpw) {
    case 8: return attention_kernel<T, D, 1, 8, kKeyWarps>;
    case 4: return attention_kernel<T, D, 1, 4, kKeyWarps>;
    case 2: return attention_kernel<T, D, 1, 2, kKeyWarps>;
    default:
      return key_warps ? attention_kernel<T, D, kBr / kKeyWarps, 1, kKeyWarps>
                       : attention_kernel<T, D, kBr, 1, 1>;
  }
}

// Heads per warp row: the largest of 8, 4, 2, 1 that divides the GQA group. With grouping, one
// warp row of kKeyWarps warps per CTA, so that decode's few rows still spread over many CTAs.
// Without it, 8 warp rows of one warp as in 01, or (key_warps) 2 rows of 4 warps: 4x the CTAs.
Kernel select_kernel(const AttnParams& p, bool key_warps, int* br, int* hpw, int* kw) {
  const int64_t group = p.hq / p.hkv;
  *hpw = group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  *br = *hpw > 1 ? 1 : key_warps ? kBr / kKeyWarps : kBr;
  *kw = *hpw > 1 || key_warps ? kKeyWarps : 1;
  if (p.dtype == DType::f16)
    return p.d == 64 ? select_kernel<__half, 64>(*hpw, key_warps)
                     : select_kernel<__half, 128>(*hpw, key_warps);
  return p.d == 64 ? select_kernel<__nv_bfloat16, 64>(*hpw, key_warps)
                   : select_kernel<__nv_bfloat16, 128>(*hpw, key_warps);
}

Kernel select_combine(const AttnParams& p) {
  if (p.dtype == DType::f16)
    return p.d == 64 ? combine_kernel<__half, 64> : combine_kernel<__half, 128>;
  return p.d == 64 ? combine_kernel<__nv_bfloat16, 64> : combine_kernel<__nv_bfloat16, 128>;
}

// How many key ranges: none unless the grid leaves an SM without a CTA; then the count with
// the best wave efficiency (busy slots / all slots over its waves), the smallest on a tie.
int choose_num_splits(int64_t ctas_without_split, int64_t slots, int64_t max_splits, int sms) {
  if (ctas_without_split >= sms) return 1;  // every SM has a CTA: splitting buys little
  max_splits = std::min<int64_t>(kMaxSplits, max_splits);
  int best = 1;
  double best_efficiency = 0;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t ctas = ctas_without_split * s, waves = (ctas + slots - 1) / slots;
    const double efficiency = static_cast<double>(ctas) / static_cast<double>(waves * slots);
    if (efficiency > best_efficiency + 1e-9)
      best = static_cast<int>(s), best_efficiency = efficiency;
  }
  return best;
}

struct Launch {
  int br = kBr;            // warp rows per CTA
  int hpw = 1;             // query heads per warp row (GQA packing)
  int kw = 1;              // key warps per warp row
  int ctas_per_sm = 0;     // resident CTAs per SM
  int64_t slots = 0;       // ctas_per_sm * SMs
  SplitArgs split;         // num_splits, keys_per_split, q_blocks (pointers filled at launch)
  int64_t items = 0;       // work items: q_blocks * Hkv * B * num_splits
  dim3 grid;               // (q_blocks * num_splits, Hkv, B)
  Kernel kernel = nullptr;
};

Status make_launch(const AttnParams& p, Launch* out) {
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  auto configure = [&](bool key_warps, Launch* c) -> Status {
    c->kernel = select_kernel(p, key_warps, &c->br, &c->hpw, &c->kw);
    c->split.q_blocks = (p.sq * (p.hq / p.hkv) + c->br * c->hpw - 1) / (c->br * c->hpw);
    ATTN_TRY(resident_ctas_per_sm(reinterpret_cast<const void*>(c->kernel), c->br * c->kw * kWarp,
                                  0, &c->ctas_per_sm));
    c->slots = static_cast<int64_t>(c->ctas_per_sm) * device->sm_count;
    return Status::Ok();
  };
  // Without GQA packing, 8 rows per CTA as in 01; when those leave an SM without a CTA, 2 rows of
  // 4 key warps (4x the CTAs), if all of them fit on the GPU at once.
  Launch l;
  ATTN_TRY(configure(false, &l));
  if (l.hpw == 1 && l.split.q_blocks * p.hkv * p.b < device->sm_count) {
    Launch key_warps;
    ATTN_TRY(configure(true, &key_warps));
    if (key_warps.split.q_blocks * p.hkv * p.b <= key_warps.slots) l = key_warps;
  }
  // At most kv_tiles / KW splits (a tile for every key warp), of whole tiles, recounted so that
  // no split is empty by construction. Only CTAs with key warps split: a grid of 8-row CTAs that
  // small has taken key warps above, unless they did not fit in one wave.
  const int64_t kv_tiles = (p.sk + kBc - 1) / kBc, unsplit = l.split.q_blocks * p.hkv * p.b;
  const int64_t max_splits = l.kw > 1 ? std::max<int64_t>(1, kv_tiles / l.kw) : 1;
  const int splits = choose_num_splits(unsplit, l.slots, max_splits, device->sm_count);
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
  *out = l;
  return Status::Ok();
}

// Workspace: every split's partial O ([num_splits][B*Hq*Sq][D] fp32), then their LSEs
// ([num_splits][B*Hq*Sq]); none without a split.
size_t layout_bytes(const AttnParams& p, const Launch& l) {
  const int64_t parts = l.split.num_splits > 1 ? l.split.num_splits * p.b * p.hq * p.sq : 0;
  return static_cast<size_t>(parts * (p.d + 1)) * sizeof(float);
}

size_t workspace_bytes(const AttnParams& p) {
  Launch l;
  return make_launch(p, &l).ok() ? layout_bytes(p, l) : 0;
}

Status plan(const AttnParams& p, LaunchPlan* out) {
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  out->grid = l.grid;
  out->block = dim3(l.br * l.kw * kWarp);
  out->dynamic_smem_bytes = 0;
  out->kernel = reinterpret_cast<const void*>(l.kernel);
  out->notes = std::to_string(l.items) + " CTAs, " + std::to_string(l.split.num_splits) +
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
  split.o_partial = reinterpret_cast<float*>(base);
  split.lse_partial = split.o_partial + split.num_splits * p.b * p.hq * p.sq * p.d;
  l.kernel<<<l.grid, l.br * l.kw * kWarp, 0, stream>>>(kp, split);
  if (split.num_splits > 1)  // the merge: a CTA per output row
    select_combine(p)<<<unsigned(p.b * p.hq * p.sq), kCombineWarps * kWarp, 0, stream>>>(kp, split);
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_02_kv_split() {
  StageInfo s;
  s.name = kStageName;
  s.description = "split the keys across CTAs and warps, merge by LSE; GQA packing for decode";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  s.bench_max_seq = 4096;  // still CUDA cores: ~90 ms a launch at S = 4096
  return s;
}

}  // namespace attn
