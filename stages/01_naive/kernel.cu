// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 01: FlashAttention's algorithm in its most direct form. One CTA per (query block of Br
// rows, head, batch), one warp per query row; the warp streams over the row's keys Bc = 32 at a
// time, one key per lane, with an online softmax in fp32, so the Sq x Sk scores never exist. No
// shared-memory tiles, no tensor cores: each warp reads its K and V rows from global memory.
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
constexpr int kBc = kWarp;  // keys per step of the online softmax: one per lane

// One warp, one query row q, over its keys [0, kv_end) of k and v ([Sk][D] each, row strides
// in p). For the scores, lane l takes key kv_tile + l of the tile and computes its whole dot
// product with q (from shared memory, where every lane sees all of it). For P.V, lane l owns
// elements [l*E, l*E + E) of the head dimension, E = D/32, so a warp reads each V row as one
// coalesced 128- or 256-byte access. Leaves the running max m (log2 units), the sum l and the
// unnormalised o_acc.
template <typename T, int D>
__device__ __forceinline__ void attend_row(const AttnParams& p, const T* q, const T* k, const T* v,
                                           int64_t kv_end, int lane, float (&smem_q)[D],
                                           float& m, float& l, float (&o_acc)[D / kWarp]) {
  constexpr int E = D / kWarp;
  // 1. The query row, fp32, in shared memory: each lane needs all of it for its key's score.
  float q_frag[E];
  load_as_float<E>(q + lane * E, q_frag);
#pragma unroll
  for (int e = 0; e < E; ++e) smem_q[lane * E + e] = q_frag[e];
  __syncwarp();

  // 2. Online softmax over tiles of Bc = 32 keys. m is the running maximum of the scores seen so
  //    far, l the running sum of exp(score - m) (kept per lane for the lane's own keys, summed
  //    at the end), o_acc the running sum of exp(score - m) * V. When a tile raises the maximum
  //    from m to m_new, everything accumulated so far was scaled by exp(-m) and must be rescaled
  //    by exp(m - m_new): the result is exactly the softmax over all keys seen, and no exp()
  //    argument is ever positive, so nothing overflows.
  float l_lane = 0.0f;
  m = -INFINITY;
  for (int64_t kv_tile = 0; kv_tile < kv_end; kv_tile += kBc) {
    // 2a. Lane l scores key j = kv_tile + l: its K row in 16-byte loads, two independent partial
    //     sums. A lane past kv_end reads the last visible key (in bounds) and is masked to -inf.
    const int64_t j = kv_tile + lane;
    const T* k_row = k + min(j, kv_end - 1) * p.k_seq_stride;  // [D]
    float partial[2] = {};
#pragma unroll
    for (int d0 = 0; d0 < D; d0 += 8) {
      float k8[8];
      load_as_float<8>(k_row + d0, k8);
#pragma unroll
      for (int e = 0; e < 8; ++e) partial[e % 2] += smem_q[d0 + e] * k8[e];
    }

    // 2b. New running maximum (finite: the tile has a visible key); P for this lane's key.
    const float s = j < kv_end ? (partial[0] + partial[1]) * p.scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));
    const float alpha = exp2f(m - m_new);   // 0 on the first tile (m = -inf)
    const float p_lane = exp2f(s - m_new);  // 0 when masked
    l_lane = l_lane * alpha + p_lane;
#pragma unroll
    for (int e = 0; e < E; ++e) o_acc[e] *= alpha;
    m = m_new;

    // 2c. P.V, key by key: p_j comes from the lane that scored key j. Masked keys have p_j = 0
    //     and read a visible row (in bounds).
#pragma unroll
    for (int jj = 0; jj < kBc; ++jj) {
      float v_frag[E];
      load_as_float<E>(v + min(kv_tile + jj, kv_end - 1) * p.v_seq_stride + lane * E, v_frag);
      const float p_j = __shfl_sync(kFullMask, p_lane, jj);
#pragma unroll
      for (int e = 0; e < E; ++e) o_acc[e] += p_j * v_frag[e];
    }
  }
  l = warp_sum(l_lane);
}

// grid (ceil(Sq/Br), Hq, B), block Br warps: warp w takes query row blockIdx.x * Br + w.
template <typename T, int D>
__global__ void __launch_bounds__(kBr * kWarp) attention_kernel(const AttnParams p) {
  constexpr int E = D / kWarp;
  __shared__ __align__(16) float smem_q[kBr][D];  // [Br][D]: each warp's query row, fp32
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
  float m, l, o_acc[E] = {};
  attend_row<T, D>(p, q, k, v, n_keys, lane, smem_q[warp], m, l, o_acc);

  // Normalise and store. An empty row (causal, Sq > Sk) has l = 0: O = 0 and LSE = -inf.
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_acc[e] *= inv_l;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride + h * p.o_head_stride;
  store_from_float<E>(o + lane * E, o_acc);
  const float lse = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
  if (p.lse != nullptr && lane == 0) p.lse[(b * p.hq + h) * p.sq + i] = lse;
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
               " keys per step (one per lane)";
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
