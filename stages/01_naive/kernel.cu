// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 01: FlashAttention's algorithm in its most direct form. One CTA per (query block of Br
// rows, head, batch), one warp per query row; the warp streams over the row's keys Bc = 32 at a
// time with an online softmax in fp32, so the Sq x Sk scores never exist. Lanes read K and V rows
// in groups of D/8, 16 bytes each (coalesced), straight from global memory: no shared-memory
// tiles, no tensor cores.
// What every stage computes: docs/contract.md. Why this stage: notebooks_md/01_naive.md.
#include <cmath>

#include "dtype.cuh"
#include "params.h"
#include "stage.h"
#include "warp.cuh"

namespace attn {
namespace {

constexpr const char* kStageName = "01_naive";
constexpr int kMinSm = 80;
constexpr int kBr = 8;      // query rows per CTA = warps per CTA
constexpr int kBc = kWarp;  // keys per step of the online softmax

// One warp, HPW query heads of one query position (here HPW = 1; stage 02 packs several heads of a
// GQA group into one warp, which then reads each K and V row once for all of them), over the keys
// [0, kv_end) of k and v ([Sk][D] each, row strides in p). Lanes work in groups of G = D/8 that
// read one K or V row together, 16 bytes each, so that a load instruction moves KPI = 32/G whole
// rows, coalesced. Lane (g, c) = (lane / G, lane % G) keeps elements [8c, 8c + 8) of each head's q
// and forms partial dot products with the same elements of its rows; transpose_sum (warp.cuh)
// finishes G of them at once and leaves each lane the score of one key (key (ch*R + c/HPW)*KPI + g
// of the tile, head c % HPW). P goes through shared memory to P.V. Leaves each head's O,
// normalised, in smem_o and its LSE (natural log) in smem_lse.
template <typename T, int D, int HPW>
__device__ __forceinline__ void attend_row(const AttnParams& p, const T* q, const T* k, const T* v,
                                           int64_t kv_end, int lane, float (&smem_p)[kBc][HPW],
                                           float (&smem_o)[HPW][D], float (&smem_lse)[HPW]) {
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
  for (int64_t kv_tile = 0; kv_tile < kv_end; kv_tile += kBc) {
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
      load_as_float<8>(v + min(kv_tile + jj, kv_end - 1) * p.v_seq_stride + 8 * c, v8);
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

// grid (ceil(Sq/Br), Hq, B), block Br warps: warp w takes query row blockIdx.x * Br + w.
template <typename T, int D>
__global__ void __launch_bounds__(kBr * kWarp) attention_kernel(const AttnParams p) {
  constexpr int E = D / kWarp;
  __shared__ __align__(16) float smem_p[kBr][kBc][1];  // [Br][Bc]: each warp's P tile
  __shared__ __align__(16) float smem_o[kBr][1][D];    // [Br][D]: each warp's output row
  __shared__ float smem_lse[kBr][1];                   // [Br]: its LSE
  // The warp index, broadcast from lane 0 so the compiler knows it is the same in every lane:
  // then the row, its key range and the early return below are warp-uniform, and the shuffles
  // compile to plain SHFL instead of a WARPSYNC.COLLECTIVE emulation for divergent warps.
  const int warp = __shfl_sync(kFullMask, static_cast<int>(threadIdx.x / kWarp), 0);
  const int lane = threadIdx.x % kWarp;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBr + warp;  // this warp's query row
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= p.sq) return;  // the last query block may be partial; only __syncwarp() follows
  const int64_t h_kv = h / (p.hq / p.hkv);  // grouped-query attention: heads share K and V

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_seq_stride
               + h * p.q_head_stride;  // [D]
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  // Keys this row may see: all of them, or with the bottom-right causal mask the first
  // i + (Sk - Sq) + 1 (none when that is <= 0: the row is empty).
  const int64_t n_keys = p.causal ? min(p.sk, max(int64_t{0}, i + p.sk - p.sq + 1)) : p.sk;
  attend_row<T, D, 1>(p, q, k, v, n_keys, lane, smem_p[warp], smem_o[warp], smem_lse[warp]);
  __syncwarp();

  float o_row[E];  // lane l stores elements [l E, l E + E), E = D/32
  load_floats<E>(&smem_o[warp][0][lane * E], o_row);
  store_output<T>(p, b, h, i, lane, o_row, smem_lse[warp][0]);
}

using Kernel = void (*)(AttnParams);

Kernel select_kernel(const AttnParams& p) {
  if (p.dtype == DType::f16)
    return p.d == 64 ? attention_kernel<__half, 64> : attention_kernel<__half, 128>;
  return p.d == 64 ? attention_kernel<__nv_bfloat16, 64> : attention_kernel<__nv_bfloat16, 128>;
}

Status plan(const AttnParams& p, LaunchPlan* out) {
  constexpr int64_t kMaxGridYZ = 65535;
  if (p.hq > kMaxGridYZ)
    return Status::Error("Hq (" + std::to_string(p.hq) + ") exceeds stage 01's grid limit 65535");
  if (p.b > kMaxGridYZ)
    return Status::Error("B (" + std::to_string(p.b) + ") exceeds stage 01's grid limit 65535");
  out->grid = dim3(static_cast<unsigned>((p.sq + kBr - 1) / kBr), static_cast<unsigned>(p.hq),
                   static_cast<unsigned>(p.b));
  out->block = dim3(kBr * kWarp);
  out->dynamic_smem_bytes = 0;
  out->kernel = reinterpret_cast<const void*>(select_kernel(p));
  out->notes = "Br=" + std::to_string(kBr) + " rows (one warp each), Bc=" + std::to_string(kBc) +
               " keys per step, " + std::to_string(p.d / 8) + " lanes per K/V row";
  return Status::Ok();
}

Status launch(const AttnParams& p, const Workspace& ws, cudaStream_t stream) {
  ATTN_TRY(validate_launch(p, kStageName, kMinSm, ws, 0));
  LaunchPlan lp;
  ATTN_TRY(plan(p, &lp));
  AttnParams kp = p;
  // Scores in log2 units: exp(x) = exp2(x * log2(e)), and exp2f is one MUFU.EX2 instruction.
  kp.scale = effective_scale(p) * kLog2e;
  select_kernel(p)<<<lp.grid, lp.block, 0, stream>>>(kp);
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_01_naive() {
  StageInfo s;
  s.name = kStageName;
  s.description = "one warp per query row, online softmax in fp32, K/V straight from global memory";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.bench_max_seq = 4096;  // ~0.1 s a launch at S=4096; longer prefill only with --attn_all_shapes
  return s;
}

}  // namespace attn
