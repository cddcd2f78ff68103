// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 03 (this file): one wave of CTAs that pull work.
// Stage 02 launches one CTA per work item (batch, kv head, query block, split) and a second
// kernel for the merge. This stage adds one idea: launch only as many CTAs as fit on the GPU at
// once (SMs x resident CTAs per SM, from the occupancy calculator); CTA c starts on item c, then
// takes the next item from a queue (an atomic counter), causal query blocks longest first so the
// short ones fill the gaps at the end. The merge is fused: the CTA that finishes the last split
// of a query block (a per-block arrival counter) merges its partials, so one launch does
// everything. The counters live in the workspace and every launch leaves them zero, so a launch
// (or a CUDA graph node) needs no memset before it.
//
// Figures (H200, results/h200/, commit 1f7b790): seed 4.71 us (FA2 5.45 in the same run);
// decode_b1_sk131072 3575 GB/s (0.94x of 02); prefill_d128_s4096_causal 6.10 TFLOP/s (0.99x of 02).
// Why: notebooks_md/03_persistent.md.
#include <algorithm>
#include <cmath>

#include "device.h"
#include "dtype.cuh"
#include "params.h"
#include "stage.h"

namespace attn {
namespace {

constexpr const char* kStageName = "03_persistent";
constexpr int kMinSm = 80;
constexpr int kWarp = 32;
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;     // ln(2): LSE back to natural log
constexpr int kBc = kWarp;       // keys per step of the online softmax: one per lane
constexpr int kMaxSplits = 128;  // cap: beyond this the merge costs more than the parallelism buys
constexpr int kMaxCtasPerSm = 32;  // the hardware's limit of resident CTAs per SM (sm_80, sm_90)

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

// One work item's rows (called by every warp of the CTA). GQA packing: a warp handles one
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
template <typename T, int D, int Br, int HPW, int KW>
__device__ __forceinline__ void attend_rows(const AttnParams& p, const SplitArgs& split, int64_t b, int64_t h_kv,
                                            int64_t q_block, int split_idx, int warp, int lane,
                                            float (&smem_q)[Br * KW][HPW][D],
                                            float (&smem_p)[HPW > 1 ? KW : 1][HPW > 1 ? kBc : 1][HPW],
                                            float (&smem_ml)[Br * KW][HPW][2]) {
  static_assert(HPW == 1 || Br == 1, "grouped heads: one warp row per CTA");
  constexpr int E = D / kWarp;
  const int kw = warp % KW;                   // this warp's share of the keys
  const int64_t chunks = p.hq / p.hkv / HPW;  // warp rows per query position
  const int64_t r = q_block * Br + warp / KW;  // this warp's row: (query position, chunk of heads)
  // The last query block may be partial. Without key warps its extra warps return at once (only
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

// Resident CTAs per SM, the bound given to the compiler. 4-warp CTAs of GQA packing: 3 with 4
// heads per warp (up to 168 registers; at 02's bound of 4 the persistent loop's extra live values
// spill, and decode_b1_sk131072 ran at 3438 against 3559 GB/s, development run), 4 with 2, 2 with
// 8. 8-warp CTAs without grouping (Br = 8), where 02 runs 5 or 6 CTAs of 36-46 registers and 03's
// loop needs more: 4 CTAs (64 registers) at D = 128, 3 (80) at D = 64, from development runs of
// 3 and 4: prefill_d128_s4096 6.04 against 5.87 TFLOP/s, prefill_d64_s4096 5.30 against 5.42; 5
// CTAs (48 registers) spill and ran prefill_d128_s4096 at 5.0. 6 for the key-warp CTAs (Br = 2),
// as 02 gets, for small problems where every CTA counts.
constexpr int min_ctas_per_sm(int hpw, int kw, int d) {
  return hpw == 1 ? (kw > 1 ? 6 : d == 128 ? 4 : 3) : hpw == 4 ? 3 : hpw == 8 ? 2 : 4;
}

template <typename T, int D, int Br, int HPW, int KW>
__global__ void __launch_bounds__(Br * KW * kWarp, min_ctas_per_sm(HPW, KW, D)) persistent_kernel(const AttnParams p, const SplitArgs split) {
  // Each warp's query row, fp32 (HPW = 1); with key warps, then its unnormalised output.
  __shared__ __align__(16) float smem_q[Br * KW][HPW][D];
  __shared__ __align__(16) float smem_p[HPW > 1 ? KW : 1][HPW > 1 ? kBc : 1][HPW];  // HPW > 1: each warp's P tile
  __shared__ float smem_ml[Br * KW][HPW][2];  // each warp's m and l, for the merge of the key warps
  __shared__ unsigned s_item;
  __shared__ bool s_last;
  // The warp index, broadcast from lane 0 so the compiler knows it is the same in every lane:
  // then the row, its key range and the early return below are warp-uniform, and the shuffles
  // compile to plain SHFL instead of a WARPSYNC.COLLECTIVE emulation for divergent warps.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / kWarp), 0);
  const int lane = threadIdx.x % kWarp;
  // Items and their parts in 32 bits (make_launch keeps the items under 2^31): a 64-bit division
  // by a runtime value is a software routine of tens of instructions, and each item takes six.
  const unsigned n_splits = split.num_splits, n_hkv = static_cast<unsigned>(p.hkv), n_b = static_cast<unsigned>(p.b);
  const unsigned n_q = static_cast<unsigned>(split.q_blocks);
  const unsigned n_items = n_q * n_hkv * n_b * n_splits;
  // With fewer items than resident CTAs the grid has one CTA per item and no queue is needed.
  const bool queue = gridDim.x < n_items;
  for (unsigned item = blockIdx.x; item < n_items;) {
    // 0. Ask for the next item now: the atomic's round trip overlaps this item's work.
    unsigned next = n_items;
    if (queue && threadIdx.x == 0) next = gridDim.x + static_cast<unsigned>(atomicAdd(split.next_item, 1ull));

    // 1. Decode the item: splits fastest (a query block's splits run close together, and its
    //    merge soon after). Without a mask, query blocks next, then kv heads and batches: the
    //    CTAs running at once work on a few heads and share their K and V tiles in L2. Causal,
    //    query blocks last, the longest first (with the bottom-right mask, later query blocks
    //    see more keys), so that the short ones fill the gaps at the end.
    const int split_idx = static_cast<int>(item % n_splits);
    unsigned rest = item / n_splits;
    // The same decode in two spellings, for nvcc's register allocation (13.0): with branches
    // the 40-register key-warp kernel spills (seed 4.92 against 4.68 us), with selects the
    // 8-row kernel does (sweep_bh128 117.4 against 115.3 us; development runs).
    int64_t h_kv, b, q_rank;
    if constexpr (KW > 1) {
      const unsigned radix0 = p.causal ? n_hkv : n_q, radix1 = p.causal ? n_b : n_hkv;
      const unsigned x0 = rest % radix0, x1 = rest / radix0 % radix1, x2 = rest / radix0 / radix1;
      h_kv = p.causal ? x0 : x1, b = p.causal ? x1 : x2, q_rank = p.causal ? x2 : x0;
    } else if (p.causal) {
      h_kv = rest % n_hkv, rest /= n_hkv;
      b = rest % n_b, q_rank = rest / n_b;
    } else {
      q_rank = rest % n_q, rest /= n_q;
      h_kv = rest % n_hkv, b = rest / n_hkv;
    }
    const int64_t q_block = p.causal ? split.q_blocks - 1 - q_rank : q_rank;
    attend_rows<T, D, Br, HPW, KW>(p, split, b, h_kv, q_block, split_idx, warp, lane, smem_q, smem_p, smem_ml);

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
      const int64_t chunks = p.hq / p.hkv / HPW;
      const int64_t r = q_block * Br + warp / KW;
      if (s_last && r < p.sq * chunks) {
        __threadfence();  // order the partial reads after the other CTAs' arrivals
        const int64_t i = r / chunks, h0 = (h_kv * chunks + r % chunks) * HPW;
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh)  // the key warps of a row share out its heads
          if (hh % KW == warp % KW) merge_row<T, D>(p, split, b, h0 + hh, i, lane);
      }
    }
    if (!queue) break;

    // 3. The next item (the first gridDim.x were handed out by blockIdx). The first barrier
    //    publishes thread 0's fetch; the second keeps it from publishing the following one
    //    (overwriting s_item) before every warp has read it, and keeps any warp from rewriting
    //    its smem_q before the whole CTA has finished the previous item.
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

template <int Br, int HPW, int KW>
Kernel select_kernel(const AttnParams& p) {
  if (p.dtype == DType::f16)
    return p.d == 64 ? persistent_kernel<__half, 64, Br, HPW, KW> : persistent_kernel<__half, 128, Br, HPW, KW>;
  return p.d == 64 ? persistent_kernel<__nv_bfloat16, 64, Br, HPW, KW> : persistent_kernel<__nv_bfloat16, 128, Br, HPW, KW>;
}

// Heads per warp: the largest of 8, 4, 2, 1 that divides the GQA group. With grouping, one warp
// row per CTA and kKeyWarps warps on its keys, so that decode's few warp rows still spread over
// many CTAs and many warps. Without it (HPW = 1), a CTA of 8 warp rows as in stage 01, or, when
// key_warps is asked for (make_launch: a problem too small for the GPU), 2 rows of kKeyWarps warps
// each: the same 8 warps per CTA, 4 times the CTAs, and a row's keys covered 4 tiles at a time.
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

// How many key ranges: none unless the grid would leave the GPU part-empty; then as many as fit
// in one wave of the persistent CTAs, capped by kMaxSplits and by the number of key tiles. Not
// stage 02's best wave efficiency over several waves: a persistent CTA pays for every item it
// takes (the fence and arrival of the fused merge, the queue, its first loads), and with equal
// items the CTAs reach those steps together, so the GPU waits for each round of them. One item
// per CTA pays once, and needs no queue.
int choose_num_splits(int64_t ctas_without_split, int64_t slots, int64_t kv_tiles) {
  if (ctas_without_split * 10 >= slots * 8) return 1;  // >= 80% of one wave: splitting buys little
  const int64_t max_splits = std::min<int64_t>(kMaxSplits, kv_tiles);
  return static_cast<int>(std::max<int64_t>(1, std::min(max_splits, slots / ctas_without_split)));
}

// Everything launch() decides for a problem.
struct Launch {
  int br = 8;              // warp rows per CTA
  int hpw = 1;             // query heads per warp (GQA packing)
  int kw = 1;              // warps per warp row, each on a share of the keys
  int64_t q_blocks = 0;    // ceil(Sq * group / HPW / Br)
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
  auto configure = [&](bool key_warps, Launch* c) -> Status {
    c->kernel = select_kernel(p, key_warps, &c->br, &c->hpw, &c->kw);
    const int64_t packed_rows = p.sq * (p.hq / p.hkv / c->hpw);  // warp rows per (batch, kv head)
    c->q_blocks = (packed_rows + c->br - 1) / c->br;
    ATTN_TRY(resident_ctas_per_sm(reinterpret_cast<const void*>(c->kernel), c->br * c->kw * kWarp, 0, &c->ctas_per_sm));
    c->ctas_per_sm = std::min(c->ctas_per_sm, kMaxCtasPerSm);  // the workspace's arrival counters assume it
    c->slots = static_cast<int64_t>(c->ctas_per_sm) * device->sm_count;
    return Status::Ok();
  };
  // GQA packing has one CTA shape. Without it (HPW = 1), 8 rows per CTA or key warps, whichever
  // is expected to finish first. With items of equal length, the time is the number of rounds
  // of items, ceil(items / slots), times one round: keys / KW per warp, for the warps an SM runs
  // at once. Key warps must win by 15%, for their merge in shared memory. Development runs:
  // sweep_bh32 (1.29 rounds of 8-row items, 2.6 of key-warp items) 35.6 us with key warps
  // against 43.5; sweep_bh128 (the model gives key warps 8%) 126.5 against 115.7.
  Launch l;
  ATTN_TRY(configure(true, &l));
  if (l.hpw == 1) {
    Launch rows8;
    ATTN_TRY(configure(false, &rows8));
    auto round_cost = [&](const Launch& c) {
      const int64_t items = c.q_blocks * p.hkv * p.b, rounds = (items + c.slots - 1) / c.slots;
      return static_cast<double>(rounds) * static_cast<double>(p.sk) / c.kw * c.ctas_per_sm * c.br * c.kw;
    };
    if (round_cost(l) >= 0.85 * round_cost(rows8)) l = rows8;
  }
  const int64_t kv_tiles = (p.sk + kBc - 1) / kBc;
  const int splits = choose_num_splits(l.q_blocks * p.hkv * p.b, l.slots, std::max<int64_t>(1, kv_tiles / l.kw));
  // Whole tiles per split; recount so that no split is empty by construction.
  l.split.keys_per_split = (kv_tiles + splits - 1) / splits * kBc;
  l.split.num_splits = static_cast<int>((p.sk + l.split.keys_per_split - 1) / l.split.keys_per_split);
  l.split.q_blocks = l.q_blocks;
  l.items = l.q_blocks * p.hkv * p.b * l.split.num_splits;
  constexpr int64_t kMaxItems = int64_t{1} << 31;  // the kernel counts items in 32 bits
  if (l.items >= kMaxItems)
    return Status::Error("work items (" + std::to_string(l.items) + ") exceed stage 03's limit 2^31");
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
  out->block = dim3(l.br * l.kw * kWarp);
  out->dynamic_smem_bytes = 0;
  out->kernel = reinterpret_cast<const void*>(l.kernel);
  out->notes = "persistent: " + std::to_string(l.ctas) + " CTAs over " + std::to_string(l.items) + " work items" +
               (p.causal ? " (longest first)" : "") + ", num_splits=" + std::to_string(l.split.num_splits) + " (" + std::to_string(l.q_blocks * p.hkv * p.b) +
               " CTAs unsplit, " + std::to_string(l.slots) + " resident slots = " + std::to_string(l.ctas_per_sm) +
               "/SM), " + std::to_string(l.split.keys_per_split) + " keys per split, Br=" + std::to_string(l.br) +
               " warp rows of " + std::to_string(l.hpw) + " heads (GQA group " + std::to_string(p.hq / p.hkv) +
               ") x " + std::to_string(l.kw) + " key warps, Bc=" + std::to_string(kBc) +
               (l.split.num_splits > 1 ? ", merge fused" : "");
  return Status::Ok();
}

Status launch(const AttnParams& p, const Workspace& ws, cudaStream_t stream) {
  ATTN_TRY(validate_launch(p, kStageName, kMinSm, ws, 0));  // parameters and GPU, before the plan
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
  l.kernel<<<static_cast<unsigned>(l.ctas), l.br * l.kw * kWarp, 0, stream>>>(kp, split);
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_03_persistent() {
  StageInfo s;
  s.name = kStageName;
  s.description = "one wave of persistent CTAs pulling work items from a queue, longest first; merge fused";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  s.bench_max_seq = 4096;  // prefill is still CUDA-core work: ~95 ms a launch at S=4096
  return s;
}

}  // namespace attn
