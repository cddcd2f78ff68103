// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 02 (this file): split the keys across CTAs, then merge.
// Stage 01 launches one CTA per (query block, head, batch): 16 CTAs for the seed shape and B*Hq
// for decode, on a GPU with room for hundreds. This stage adds one idea: each (batch, kv head,
// query block) is cut along the keys into num_splits contiguous ranges, each run by its own CTA,
// which writes an fp32 partial output and its LSE to the workspace; a second kernel merges the
// partials with log-sum-exp weights. num_splits is chosen from the SM count, the occupancy and the
// CTAs the grid has without splitting. The rows of a CTA are (query position, head) pairs of one
// kv head, so in decode the query heads of a GQA group share every K and V row they read, read
// coalesced by lane groups, and four warps split that row's keys once more inside the CTA (as they
// do for any grid too small for the GPU: the seed shape runs as one launch).
//
// Figures (H200, results/h200/, commit 1f7b790): seed 4.67 us (2.21x over 01); decode_b1_sk131072
// 3815 GB/s, decode_b8_sk32768 3923 GB/s (92% and 90% of cuDNN in the same run).
// Why: notebooks_md/02_kv_split.md.
#include <algorithm>
#include <cmath>

#include "device.h"
#include "dtype.cuh"
#include "params.h"
#include "stage.h"

namespace attn {
namespace {

constexpr const char* kStageName = "02_kv_split";
constexpr int kMinSm = 80;
constexpr int kWarp = 32;
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;     // ln(2): LSE back to natural log
constexpr int kBc = kWarp;       // keys per step of the online softmax: one per lane
constexpr int kMaxSplits = 128;  // cap: beyond this the merge costs more than the parallelism buys

// Where the CTAs of one (batch, kv head, query block) put their partial results.
struct SplitArgs {
  int num_splits = 1;          // key ranges per (batch, kv head, query block)
  int64_t keys_per_split = 0;  // a multiple of Bc
  float* o_partial = nullptr;  // [num_splits][B*Hq*Sq][D] fp32, normalised within the split
  float* lse_partial = nullptr;  // [num_splits][B*Hq*Sq], -inf where the split saw no key
};

// Sum over the 32 lanes; every lane receives the total (butterfly exchange).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

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
template <int E>
__device__ __forceinline__ void load_floats(const float* src, float (&dst)[E]) {
  if constexpr (E == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x, dst[1] = v.y;
  }
}

// Sum of N values over the N lanes of a lane group (lanes that differ only in lane % N, N a power
// of two), each value summed once: at every step a lane keeps half of its values, sends the other
// half to the partner lane that keeps those, and adds what it receives. After log2(N) steps and
// N - 1 shuffles (a butterfly per value would take N log2(N)), lane c of the group holds the
// group's sum of value c. One step per instantiation (Half = N/2, N/4, ..., 1), so that every
// loop has a constant trip count and v stays in registers.
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

// The keys of one GQA-packed warp row (HPW > 1 heads, decode), read by lane groups. Decode reads
// every K and V byte once, so the loads must be coalesced: G = D/8 lanes read one row together,
// 16 bytes each, and one load instruction moves KPI = 32/G whole rows. Lane c of a group keeps
// q[h0 + hh][8c, 8c + 8) of each head in registers (pre-scaled) and forms its piece of every dot
// product; R = G/HPW loads give R * HPW = G partial sums, and one transpose_sum finishes all of
// them, leaving lane (g = lane / G, c) the score of tile key (ch*R + c/HPW)*KPI + g for head
// c % HPW after chunk ch. A lane thus holds one head's scores: the softmax of head hh reduces over
// the lanes with lane % HPW == hh, and P reaches the P.V loop (same lane groups over V) through
// shared memory. The warp takes tiles kw, kw + KW, ... and leaves its unnormalised O, m and l in
// its shared-memory slots for the merge of the key warps.
template <typename T, int D, int HPW, int KW>
__device__ __forceinline__ void attend_gqa_row(const AttnParams& p, const T* q, const T* k, const T* v,
                                               int64_t kv_begin, int64_t kv_end, int kw, int lane,
                                               float (&smem_o)[HPW][D], float (&smem_p)[kBc][HPW],
                                               float (&smem_ml)[HPW][2]) {
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

  float m_lane = -INFINITY, l_lane = 0.0f;  // head c % HPW: running max, this lane's part of the sum
  float acc[HPW][8] = {};                   // O of every head over elements [8c, 8c + 8), keys of group g
  for (int64_t kv_tile = kv_begin + kw * kBc; kv_tile < kv_end; kv_tile += KW * kBc) {
    // Scores. A key past kv_end reads the last visible row and is masked to -inf.
    float s[HPW];
#pragma unroll
    for (int ch = 0; ch < HPW; ++ch) {
      float part[G];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t j = kv_tile + (ch * R + r) * KPI + g;
        float k8[8];
        load_as_float<8>(k + min(j, kv_end - 1) * p.k_seq_stride + 8 * c, k8);
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

    // Online softmax of head c % HPW: the maximum over its lanes, P into shared memory.
    float tile_max = s[0];
#pragma unroll
    for (int ch = 1; ch < HPW; ++ch) tile_max = fmaxf(tile_max, s[ch]);
#pragma unroll
    for (int offset = HPW; offset < kWarp; offset *= 2)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
    const float m_new = fmaxf(m_lane, tile_max);  // finite: the tile has a visible key
    const float alpha = exp2f(m_lane - m_new);     // 0 on the first tile (m = -inf)
    __syncwarp();                                  // every lane has read the previous tile's P
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

    // P.V with the same lane groups: lane (g, c) takes keys g, g + KPI, ... of the tile.
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      const float a = __shfl_sync(0xffffffffu, alpha, hh);  // lane hh holds head hh
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[hh][e] *= a;
    }
#pragma unroll
    for (int t = 0; t < G; ++t) {
      const int jj = t * KPI + g;
      float v8[8];
      load_as_float<8>(v + min(kv_tile + jj, kv_end - 1) * p.v_seq_stride + 8 * c, v8);
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) {
        const float p_j = smem_p[jj][hh];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[hh][e] = fmaf(p_j, v8[e], acc[hh][e]);
      }
    }
  }

  // Finish the sums (l over a head's lanes, O over the KPI key groups) and publish them: lane hh
  // holds head hh's m and l; the lanes of group 0 hold O.
#pragma unroll
  for (int offset = HPW; offset < kWarp; offset *= 2) l_lane += __shfl_xor_sync(0xffffffffu, l_lane, offset);
#pragma unroll
  for (int offset = G; offset < kWarp; offset *= 2)
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[hh][e] += __shfl_xor_sync(0xffffffffu, acc[hh][e], offset);
  if (g == 0)
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh)
#pragma unroll
      for (int e = 0; e < 8; ++e) smem_o[hh][8 * c + e] = acc[hh][e];
  if (lane < HPW) smem_ml[lane][0] = m_lane, smem_ml[lane][1] = l_lane;
}

// grid (q_blocks * num_splits, Hkv, B), block Br * KW warps. GQA packing: a warp handles one
// query position i for HPW consecutive query heads of kv head h_kv (HPW divides the group size
// Hq/Hkv), so each K and V row it loads serves all HPW heads. A CTA holds Br such warp rows, and
// KW warps per row ("key warps") split the CTA's keys once more, tile by tile: the split of this
// stage inside the CTA, for grids too small to fill the GPU, merged in shared memory by the same
// LSE rule as the merge kernel below. Without grouping (HPW = 1) each warp runs stage 01's loop:
// lane l takes key kv_tile + l of the tile and computes its whole dot product with q (read from
// shared memory, where every lane sees all of it); for P.V, lane l owns elements [l*E, l*E + E)
// of the head dimension, E = D/32, so a warp reads each V row as one coalesced 128- or 256-byte
// access. With grouping (decode: a kv head has one warp row, Br = 1) the warp reads K and V in
// lane groups (attend_gqa_row above).
//
// Resident CTAs per SM asked of the compiler (the register bound): for decode's 4-warp CTAs, 4
// with 2 or 4 heads per warp (up to 128 registers), 2 with 8 (their 64 registers of q and 64 of O
// would spill). 4 CTAs of 4 heads per warp read decode_b8_sk32768 at 3656 GB/s, 3 CTAs (the
// compiler's own choice, 134 registers) at 2822 (development run): the 4th CTA's loads in flight
// are worth more than the loads each warp issues ahead. For HPW = 1, 0: no bound, the compiler's
// own choice (36-46 registers; a bound of 1 lets it take 150, one of 5 makes it spill).
constexpr int min_ctas_per_sm(int hpw) { return hpw == 1 ? 0 : hpw == 8 ? 2 : 4; }

template <typename T, int D, int Br, int HPW, int KW>
__global__ void __launch_bounds__(Br * KW * kWarp, min_ctas_per_sm(HPW)) kv_split_kernel(const AttnParams p, const SplitArgs split) {
  static_assert(HPW == 1 || Br == 1, "grouped heads: one warp row per CTA");
  constexpr int E = D / kWarp;
  // Each warp's query row, fp32 (HPW = 1); with key warps, then its unnormalised output.
  __shared__ __align__(16) float smem_q[Br * KW][HPW][D];
  __shared__ __align__(16) float smem_p[HPW > 1 ? KW : 1][HPW > 1 ? kBc : 1][HPW];  // HPW > 1: each warp's P tile
  __shared__ float smem_ml[Br * KW][HPW][2];  // each warp's m and l, for the merge of the key warps
  // The warp index, broadcast from lane 0 so the compiler knows it is the same in every lane:
  // then the row, its key range and the early return below are warp-uniform, and the shuffles
  // compile to plain SHFL instead of a WARPSYNC.COLLECTIVE emulation for divergent warps.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / kWarp), 0);
  const int lane = threadIdx.x % kWarp;
  const int kw = warp % KW;                   // this warp's share of the keys
  const int64_t chunks = p.hq / p.hkv / HPW;  // warp rows per query position
  const int64_t q_block = blockIdx.x / split.num_splits;
  const int split_idx = static_cast<int>(blockIdx.x % split.num_splits);
  const int64_t r = q_block * Br + warp / KW;  // this warp's row: (query position, chunk of heads)
  const int64_t h_kv = blockIdx.y, b = blockIdx.z;
  // The last query block may be partial. Without key warps its extra warps leave at once (only
  // __syncwarp() follows); with them they take part in the merge's barrier, see no keys, and
  // store nothing (they read a valid row's q).
  const bool row_valid = r < p.sq * chunks;
  if (KW == 1 && !row_valid) return;
  const int64_t r_read = row_valid ? r : p.sq * chunks - 1;
  const int64_t i = r_read / chunks, h0 = (h_kv * chunks + r_read % chunks) * HPW;  // query position, first head

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_seq_stride + h0 * p.q_head_stride;  // head h0
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;  // [Sk][D], row stride k_seq_stride
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;  // [Sk][D], row stride v_seq_stride

  // 1. Keys this row may see: all of them, or with the bottom-right causal mask the first
  //    i + (Sk - Sq) + 1 (none when that is <= 0: the row is empty). This CTA takes the part of
  //    them inside its split [kv_begin, kv_end), which may be empty; its key warp kw takes the
  //    tiles kw, kw + KW, ... of that part.
  const int64_t n_keys = p.causal ? min(p.sk, max(int64_t{0}, i + p.sk - p.sq + 1)) : p.sk;
  const int64_t kv_begin = split_idx * split.keys_per_split;
  const int64_t kv_end = row_valid ? min(n_keys, kv_begin + split.keys_per_split) : kv_begin;

  float m[HPW], l[HPW], o_acc[HPW][E] = {};
  if constexpr (HPW > 1) {
    attend_gqa_row<T, D, HPW, KW>(p, q, k, v, kv_begin, kv_end, kw, lane, smem_q[warp], smem_p[kw], smem_ml[warp]);
  } else {
    // 2. The query row, fp32, in shared memory: each lane needs all of it.
    float q_frag[E];
    load_as_float<E>(q + lane * E, q_frag);
#pragma unroll
    for (int e = 0; e < E; ++e) smem_q[warp][0][lane * E + e] = q_frag[e];
    __syncwarp();

    // 3. Online softmax over tiles of Bc = 32 keys (see stage 01).
    float l_lane = 0.0f;
    m[0] = -INFINITY;
    for (int64_t kv_tile = kv_begin + kw * kBc; kv_tile < kv_end; kv_tile += KW * kBc) {
      // 3a. Lane l scores key j = kv_tile + l: its K row is loaded in 16-byte pieces. A lane
      //     past kv_end reads the last visible key and is masked to -inf.
      const int64_t j = kv_tile + lane;
      const T* k_row = k + min(j, kv_end - 1) * p.k_seq_stride;  // [D]
      float partial[2] = {};
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += 8) {
        float k8[8];
        load_as_float<8>(k_row + d0, k8);
#pragma unroll
        for (int e = 0; e < 8; ++e) partial[e % 2] += smem_q[warp][0][d0 + e] * k8[e];
      }

      // 3b. New running maximum; P for this lane's key.
      const float s = j < kv_end ? (partial[0] + partial[1]) * p.scale : -INFINITY;
      const float m_new = fmaxf(m[0], warp_max(s));  // finite: the tile has a visible key
      const float alpha = exp2f(m[0] - m_new);        // 0 on the first tile (m = -inf)
      const float p_lane = exp2f(s - m_new);          // 0 when masked
      l_lane = l_lane * alpha + p_lane;
#pragma unroll
      for (int e = 0; e < E; ++e) o_acc[0][e] *= alpha;
      m[0] = m_new;

      // 3c. P.V, key by key: p_j comes from the lane that scored key j. Masked keys have
      //     p_j = 0 and read a visible row (in bounds).
#pragma unroll
      for (int jj = 0; jj < kBc; ++jj) {
        float v_frag[E];
        load_as_float<E>(v + min(kv_tile + jj, kv_end - 1) * p.v_seq_stride + lane * E, v_frag);
        const float p_j = __shfl_sync(0xffffffffu, p_lane, jj);
#pragma unroll
        for (int e = 0; e < E; ++e) o_acc[0][e] += p_j * v_frag[e];
      }
    }
    l[0] = warp_sum(l_lane);
    if constexpr (KW > 1) {  // publish for the merge, over this warp's q (read for the last time)
      __syncwarp();
#pragma unroll
      for (int e = 0; e < E; ++e) smem_q[warp][0][lane * E + e] = o_acc[0][e];
      if (lane == 0) smem_ml[warp][0][0] = m[0], smem_ml[warp][0][1] = l[0];
    }
  }

  // 3d. Merge the key warps of each row: warp kw takes head hh for hh % KW == kw. With
  //     M = max_w m_w and c_w = 2^(m_w - M) (0 for a warp that saw no key): l = sum_w c_w l_w,
  //     O = sum_w c_w O_w, read from the row's warps' slots.
  if constexpr (KW > 1 || HPW > 1) {
    __syncthreads();
    const int row_warp0 = warp - kw;
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      if (hh % KW != kw) continue;
      float m_all = -INFINITY;
#pragma unroll
      for (int w = 0; w < KW; ++w) m_all = fmaxf(m_all, smem_ml[row_warp0 + w][hh][0]);
      const float m_safe = m_all == -INFINITY ? 0.0f : m_all;
      float l_all = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) o_acc[hh][e] = 0.0f;
#pragma unroll
      for (int w = 0; w < KW; ++w) {
        const float cw = exp2f(smem_ml[row_warp0 + w][hh][0] - m_safe);
        l_all += cw * smem_ml[row_warp0 + w][hh][1];
#pragma unroll
        for (int e = 0; e < E; ++e) o_acc[hh][e] += cw * smem_q[row_warp0 + w][hh][lane * E + e];
      }
      m[hh] = m_all, l[hh] = l_all;
    }
  }
  if (!row_valid) return;

  // 4. Normalise. An empty row or split has l = 0: O = 0 and LSE = -inf.
  const int64_t n_rows = p.b * p.hq * p.sq;
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    if (hh % KW != kw) continue;  // another key warp holds this head's merged result
    const float inv_l = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) o_acc[hh][e] *= inv_l;
    const float lse = l[hh] > 0.0f ? (m[hh] + log2f(l[hh])) * kLn2 : -INFINITY;
    const int64_t h = h0 + hh;
    const int64_t row = (b * p.hq + h) * p.sq + i;  // canonical row: LSE index, partials' row

    // 5. One split: this is the answer. Several: write this split's part for the merge.
    if (split.num_splits == 1) {
      T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride + h * p.o_head_stride;  // [D]
      store_from_float<E>(o + lane * E, o_acc[hh]);
      if (p.lse != nullptr && lane == 0) p.lse[row] = lse;
    } else {
      store_floats<E>(split.o_partial + (split_idx * n_rows + row) * D + lane * E, o_acc[hh]);
      if (lane == 0) split.lse_partial[split_idx * n_rows + row] = lse;
    }
  }
}

// The merge: one CTA of kCombineWarps warps per output row. Split s holds O_s (normalised over its
// keys) and LSE_s. With m = max_s LSE_s (-inf counted as 0 for the shift, so an all-empty row stays
// finite) and w_s = exp(LSE_s - m):  O = sum_s w_s O_s / sum_s w_s,  LSE = m + log sum_s w_s.
// Warp w sums the splits w, w + kCombineWarps, ...; warp 0 then adds the warps' sums in warp
// order. The order is fixed, so the result is bit-identical run to run, and the warps keep
// kCombineWarps times more loads in flight than one warp walking all the splits: with one warp
// per row, 132 splits of decode_b1_sk131072 took 190 us against 153 with 66 (development run).
constexpr int kCombineWarps = 8;

template <typename T, int D>
__global__ void __launch_bounds__(kCombineWarps * kWarp) combine_kernel(const AttnParams p, const SplitArgs split) {
  constexpr int E = D / kWarp;
  __shared__ float smem_m[kCombineWarps], smem_w[kCombineWarps];
  __shared__ __align__(16) float smem_o[kCombineWarps][D];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t n_rows = p.b * p.hq * p.sq;
  const int64_t row = blockIdx.x;
  const int64_t i = row % p.sq, h = (row / p.sq) % p.hq, b = row / (p.sq * p.hq);

  float m = -INFINITY;
  for (int s = threadIdx.x; s < split.num_splits; s += blockDim.x) m = fmaxf(m, split.lse_partial[s * n_rows + row]);
  m = warp_max(m);
  if (lane == 0) smem_m[warp] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) m = fmaxf(m, smem_m[w]);
  const float shift = m == -INFINITY ? 0.0f : m;

  float sum_w = 0.0f, o_acc[E] = {};
#pragma unroll 4  // four of this warp's splits in flight at once
  for (int s = warp; s < split.num_splits; s += kCombineWarps) {
    const float w = expf(split.lse_partial[s * n_rows + row] - shift);  // 0 for an empty split
    float part[E];
    load_floats<E>(split.o_partial + (s * n_rows + row) * D + lane * E, part);
    sum_w += w;
#pragma unroll
    for (int e = 0; e < E; ++e) o_acc[e] += w * part[e];
  }
  store_floats<E>(&smem_o[warp][lane * E], o_acc);
  if (lane == 0) smem_w[warp] = sum_w;
  __syncthreads();
  if (warp != 0) return;
  sum_w = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_acc[e] = 0.0f;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) {
    sum_w += smem_w[w];
#pragma unroll
    for (int e = 0; e < E; ++e) o_acc[e] += smem_o[w][lane * E + e];
  }
  const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_acc[e] *= inv;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride + h * p.o_head_stride;  // [D]
  store_from_float<E>(o + lane * E, o_acc);
  if (p.lse != nullptr && lane == 0) p.lse[row] = sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
}

using Kernel = void (*)(AttnParams, SplitArgs);

template <int Br, int HPW, int KW>
Kernel select_kernel(const AttnParams& p) {
  if (p.dtype == DType::f16)
    return p.d == 64 ? kv_split_kernel<__half, 64, Br, HPW, KW> : kv_split_kernel<__half, 128, Br, HPW, KW>;
  return p.d == 64 ? kv_split_kernel<__nv_bfloat16, 64, Br, HPW, KW> : kv_split_kernel<__nv_bfloat16, 128, Br, HPW, KW>;
}

// Heads per warp: the largest of 8, 4, 2, 1 that divides the GQA group. With grouping, one warp
// row per CTA and kKeyWarps warps on its keys, so that decode's few warp rows still spread over
// many CTAs and many warps. Without it (HPW = 1), a CTA of 8 warp rows as in stage 01, or, when
// key_warps is asked for (a grid too small for the GPU), 2 rows of kKeyWarps warps each: the same
// 8 warps per CTA, 4 times the CTAs, and a row's keys covered 4 tiles at a time.
constexpr int kKeyWarps = 4;
Kernel select_kernel(const AttnParams& p, bool key_warps, int* br, int* hpw, int* kw) {
  const int64_t group = p.hq / p.hkv;
  *hpw = group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  *br = *hpw > 1 ? 1 : key_warps ? 8 / kKeyWarps : 8;
  *kw = *hpw > 1 || key_warps ? kKeyWarps : 1;
  switch (*hpw) {
    case 8: return select_kernel<1, 8, kKeyWarps>(p);
    case 4: return select_kernel<1, 4, kKeyWarps>(p);
    case 2: return select_kernel<1, 2, kKeyWarps>(p);
    default: return key_warps ? select_kernel<8 / kKeyWarps, 1, kKeyWarps>(p) : select_kernel<8, 1, 1>(p);
  }
}

Kernel select_combine(const AttnParams& p) {
  if (p.dtype == DType::f16) return p.d == 64 ? combine_kernel<__half, 64> : combine_kernel<__half, 128>;
  return p.d == 64 ? combine_kernel<__nv_bfloat16, 64> : combine_kernel<__nv_bfloat16, 128>;
}

// How many key ranges: none unless the grid would leave the GPU part-empty; then the count with
// the best wave efficiency (busy slots / all slots over the waves it takes), the smallest such
// count when several tie, capped by kMaxSplits and by the number of key tiles.
int choose_num_splits(int64_t ctas_without_split, int64_t slots, int64_t kv_tiles) {
  if (ctas_without_split * 10 >= slots * 8) return 1;  // >= 80% of one wave: splitting buys little
  const int64_t max_splits = std::min<int64_t>(kMaxSplits, kv_tiles);
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
  int br = 8;              // warp rows per CTA
  int hpw = 1;             // query heads per warp (GQA packing)
  int kw = 1;              // warps per warp row, each on a share of the keys
  int64_t q_blocks = 0;    // ceil(Sq * group / HPW / Br)
  int ctas_per_sm = 0;     // resident CTAs per SM of the main kernel
  int64_t slots = 0;       // ctas_per_sm * SMs
  SplitArgs split;         // num_splits and keys_per_split (pointers filled at launch)
  Kernel kernel = nullptr;
};

Status make_launch(const AttnParams& p, Launch* out) {
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  Launch l;
  int64_t packed_rows = 0;  // warp rows per (batch, kv head)
  for (bool key_warps : {false, true}) {  // key warps only when the grid without them is too small
    l.kernel = select_kernel(p, key_warps, &l.br, &l.hpw, &l.kw);
    packed_rows = p.sq * (p.hq / p.hkv / l.hpw);
    l.q_blocks = (packed_rows + l.br - 1) / l.br;
    ATTN_TRY(resident_ctas_per_sm(reinterpret_cast<const void*>(l.kernel), l.br * l.kw * kWarp, 0, &l.ctas_per_sm));
    l.slots = static_cast<int64_t>(l.ctas_per_sm) * device->sm_count;
    if (l.kw > 1 || l.q_blocks * p.hkv * p.b * 10 >= l.slots * 8) break;  // >= 80% of a wave
  }
  const int64_t kv_tiles = (p.sk + kBc - 1) / kBc;
  const int splits = choose_num_splits(l.q_blocks * p.hkv * p.b, l.slots, std::max<int64_t>(1, kv_tiles / l.kw));
  // Whole tiles per split; recount so that no split is empty by construction.
  l.split.keys_per_split = (kv_tiles + splits - 1) / splits * kBc;
  l.split.num_splits = static_cast<int>((p.sk + l.split.keys_per_split - 1) / l.split.keys_per_split);
  constexpr int64_t kMaxGridX = 2147483647, kMaxGridYZ = 65535;
  if (l.q_blocks * l.split.num_splits > kMaxGridX)
    return Status::Error("Sq*Hq/Hkv (" + std::to_string(packed_rows) + ") exceeds stage 02's grid limit");
  if (p.hkv > kMaxGridYZ) return Status::Error("Hkv (" + std::to_string(p.hkv) + ") exceeds stage 02's grid limit 65535");
  if (p.b > kMaxGridYZ) return Status::Error("B (" + std::to_string(p.b) + ") exceeds stage 02's grid limit 65535");
  *out = l;
  return Status::Ok();
}

// Partials of every split: O (D floats per row) and LSE (one float per row).
size_t workspace_bytes_for(const AttnParams& p, const Launch& l) {
  if (l.split.num_splits == 1) return 0;
  const size_t rows = static_cast<size_t>(p.b * p.hq * p.sq);
  return static_cast<size_t>(l.split.num_splits) * rows * (static_cast<size_t>(p.d) + 1) * sizeof(float);
}

size_t workspace_bytes(const AttnParams& p) {
  Launch l;
  return make_launch(p, &l).ok() ? workspace_bytes_for(p, l) : 0;
}

Status plan(const AttnParams& p, LaunchPlan* out) {
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  out->grid = dim3(static_cast<unsigned>(l.q_blocks * l.split.num_splits), static_cast<unsigned>(p.hkv),
                   static_cast<unsigned>(p.b));
  out->block = dim3(l.br * l.kw * kWarp);
  out->dynamic_smem_bytes = 0;
  out->kernel = reinterpret_cast<const void*>(l.kernel);
  out->notes = "num_splits=" + std::to_string(l.split.num_splits) + " (" + std::to_string(l.q_blocks * p.hkv * p.b) +
               " CTAs unsplit, " + std::to_string(l.slots) + " resident slots = " + std::to_string(l.ctas_per_sm) +
               "/SM), " + std::to_string(l.split.keys_per_split) + " keys per split, Br=" + std::to_string(l.br) +
               " warp rows of " + std::to_string(l.hpw) + " heads (GQA group " + std::to_string(p.hq / p.hkv) +
               ") x " + std::to_string(l.kw) + " key warps, Bc=" + std::to_string(kBc) +
               (l.split.num_splits > 1 ? ", + merge kernel" : "");
  return Status::Ok();
}

Status launch(const AttnParams& p, const Workspace& ws, cudaStream_t stream) {
  ATTN_TRY(validate_launch(p, kStageName, kMinSm, ws, 0));  // parameters and GPU, before the plan
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  ATTN_TRY(check_workspace(kStageName, ws, workspace_bytes_for(p, l)));
  AttnParams kp = p;
  // Scores in log2 units: exp(x) = exp2(x * log2(e)), and exp2f is one MUFU.EX2 instruction.
  kp.scale = effective_scale(p) * kLog2e;
  SplitArgs split = l.split;
  if (split.num_splits > 1) {
    const size_t rows = static_cast<size_t>(p.b * p.hq * p.sq);
    split.o_partial = static_cast<float*>(ws.ptr);
    split.lse_partial = split.o_partial + static_cast<size_t>(split.num_splits) * rows * p.d;
  }
  const dim3 grid(static_cast<unsigned>(l.q_blocks * split.num_splits), static_cast<unsigned>(p.hkv),
                  static_cast<unsigned>(p.b));
  l.kernel<<<grid, l.br * l.kw * kWarp, 0, stream>>>(kp, split);
  if (split.num_splits > 1) {
    const int64_t rows = p.b * p.hq * p.sq;
    select_combine(p)<<<static_cast<unsigned>(rows), kCombineWarps * kWarp, 0, stream>>>(kp, split);
  }
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_02_kv_split() {
  StageInfo s;
  s.name = kStageName;
  s.description = "split the keys across CTAs when the grid is too small, merge the partials by LSE; GQA packing";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  s.bench_max_seq = 4096;  // prefill is still CUDA-core work: ~90 ms a launch at S=4096
  return s;
}

}  // namespace attn
