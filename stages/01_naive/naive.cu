// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 01 (this file): FlashAttention's algorithm in its most direct form.
// One CTA per (query block of Br rows, head, batch); one warp per query row. The warp streams
// over the row's visible keys Bc = 32 at a time with an online softmax in fp32, so the Sq x Sk
// score matrix never exists in memory. No shared memory, no tensor cores: every K and V row is
// read from global memory (through L1/L2) by every warp that needs it.
//
// Figures (H200, results/h200/, commit ec2d653): seed 55.6 us (FA2 5.16 us: 0.09x);
// prefill_d128_s4096 2.30 TFLOP/s (FA2 334); decode_b1_sk131072 4.8 GB/s (copy 4241).
// Why: notebooks_md/01_naive.md.
#include <cmath>

#include "dtype.cuh"
#include "params.h"
#include "stage.h"

namespace attn {
namespace {

constexpr const char* kStageName = "01_naive";
constexpr int kMinSm = 80;
constexpr int kWarp = 32;
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;     // ln(2): LSE back to natural log
constexpr int kBr = 8;      // query rows per CTA = warps per CTA
constexpr int kBc = kWarp;  // keys per step of the online softmax: one per lane

// Sum over the 32 lanes; every lane receives the total (butterfly exchange).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// N rows' partial sums, spread over groups of N consecutive lanes (partial[r] is this lane's
// part of row r), reduced so that lane c of each group ends with the whole sum of row c.
// Each step halves the rows a lane keeps and sends the other half to its partner: N - 1
// shuffles for N rows, instead of N * log2(N) for N separate butterflies.
template <int N>
__device__ __forceinline__ float reduce_transposed(float (&partial)[N], int lane) {
#pragma unroll
  for (int w = N / 2; w >= 1; w /= 2) {
    const bool upper = lane & w;
#pragma unroll
    for (int r = 0; r < w; ++r) {
      const float send = upper ? partial[r] : partial[r + w];
      const float keep = upper ? partial[r + w] : partial[r];
      partial[r] = keep + __shfl_xor_sync(0xffffffffu, send, w);
    }
  }
  return partial[0];
}

// Maximum over the 32 lanes; every lane receives it.
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// grid (ceil(Sq/Br), Hq, B), block Br warps. K is read by whole rows: the L = D/8 lanes of a
// lane group load one row in 16-byte pieces (lane c of the group: elements [8c, 8c + 8)), so a
// warp-wide load covers 32/L complete rows; after the reduction lane l holds one key's score.
// For P.V, lane l owns elements [l*E, l*E + E) of the head dimension, E = D/32, so a warp reads
// each V row as one coalesced 128- or 256-byte access.
template <typename T, int D>
__global__ void __launch_bounds__(kBr * kWarp) naive_attention_kernel(const AttnParams p) {
  constexpr int E = D / kWarp;
  constexpr int kLanesPerRow = D / 8;                 // L: 8 (D=64) or 16 (D=128)
  constexpr int kRowsPerLoad = kWarp / kLanesPerRow;  // 4 or 2 K rows per warp-wide load
  // The warp index, broadcast from lane 0 so the compiler knows it is the same in every lane:
  // then the row, its key range and the early return below are warp-uniform, and the shuffles
  // compile to plain SHFL instead of a WARPSYNC.COLLECTIVE emulation for divergent warps.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / kWarp), 0);
  const int lane = threadIdx.x % kWarp;
  const int chunk = lane % kLanesPerRow, sub_row = lane / kLanesPerRow;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBr + warp;  // this warp's query row
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= p.sq) return;  // the last query block may be partial; no barrier follows
  const int64_t h_kv = h / (p.hq / p.hkv);  // grouped-query attention: heads share K/V

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_seq_stride + h * p.q_head_stride;  // [D]
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;  // [Sk][D], row stride k_seq_stride
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;  // [Sk][D], row stride v_seq_stride
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride + h * p.o_head_stride;  // [D]

  // 1. This lane's 8 elements of the query row (the same piece of every K row it loads), fp32.
  float q8[8];
  load_as_float<8>(q + chunk * 8, q8);

  // 2. Keys this row may see: all of them, or with the bottom-right causal mask the first
  //    i + (Sk - Sq) + 1 (none when that is <= 0: the row is empty).
  const int64_t n_keys = p.causal ? min(p.sk, max(int64_t{0}, i + p.sk - p.sq + 1)) : p.sk;

  // 3. Online softmax over tiles of Bc = 32 keys. m is the running maximum of the scores seen so
  //    far, l the running sum of exp(score - m) (kept per lane for the lane's own keys, summed
  //    at the end), o_acc the running sum of exp(score - m) * V. When a tile raises the maximum
  //    from m to m_new, everything accumulated so far was scaled by exp(-m) and must be rescaled
  //    by exp(m - m_new): the result is exactly the softmax over all keys seen, and no exp()
  //    argument is ever positive, so nothing overflows.
  float m = -INFINITY, l_lane = 0.0f;
  float o_acc[E] = {};
  for (int64_t kv_tile = 0; kv_tile < n_keys; kv_tile += kBc) {
    // 3a. Scores. Load r brings keys kv_tile + r*32/L + (lane / L); each lane multiplies its 8
    //     elements. The transposed reduction then leaves lane l with the score of key
    //     j = kv_tile + (l % L) * 32/L + l / L. Keys past n_keys re-read the last visible key
    //     (always in bounds) and are masked to -inf.
    Pack<8> k_tile[kLanesPerRow];  // all of the tile's loads issued before any is used
#pragma unroll
    for (int r = 0; r < kLanesPerRow; ++r) {
      k_tile[r] = load_pack<8>(k + min(kv_tile + r * kRowsPerLoad + sub_row, n_keys - 1) * p.k_seq_stride + chunk * 8);
    }
    // A fence for the compiler's scheduler: without it, ptxas interleaves each load with the
    // FMAs of an earlier one to save registers, and in-order issue then stalls on the first load
    // with only ~3 in flight. After it, all L loads are in flight before the first is waited on.
    __syncwarp();
    float partial[kLanesPerRow];
#pragma unroll
    for (int r = 0; r < kLanesPerRow; ++r) {
      float k8[8];
      unpack_to_float<T>(k_tile[r], k8);
      partial[r] = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) partial[r] += q8[e] * k8[e];
    }
    const float dot = reduce_transposed<kLanesPerRow>(partial, lane);
    const int64_t j = kv_tile + chunk * kRowsPerLoad + sub_row;  // the key this lane scored
    const float s = j < n_keys ? dot * p.scale : -INFINITY;

    // 3b. New running maximum; the tile has at least one visible key, so m_new is finite.
    const float m_new = fmaxf(m, warp_max(s));
    const float alpha = exp2f(m - m_new);  // 0 on the first tile (m = -inf)
    const float p_lane = exp2f(s - m_new);  // this lane's key; 0 when masked
    l_lane = l_lane * alpha + p_lane;
#pragma unroll
    for (int e = 0; e < E; ++e) o_acc[e] *= alpha;

    // 3c. P.V, key by key: p_j comes from the lane that scored key kv_tile + jj; every lane adds
    //     p_j times its slice of V row j. Masked keys have p_j = 0 and read a visible row.
    constexpr int kVRows = kBc / 2;  // V rows loaded together (two batches per tile)
#pragma unroll
    for (int half = 0; half < kBc; half += kVRows) {
      Pack<E> v_tile[kVRows];
#pragma unroll
      for (int jj = 0; jj < kVRows; ++jj) {
        v_tile[jj] = load_pack<E>(v + min(kv_tile + half + jj, n_keys - 1) * p.v_seq_stride + lane * E);
      }
      __syncwarp();  // the same scheduling fence as for K
#pragma unroll
      for (int jj = half; jj < half + kVRows; ++jj) {
        const float p_j = __shfl_sync(0xffffffffu, p_lane, (jj % kRowsPerLoad) * kLanesPerRow + jj / kRowsPerLoad);
        float v_frag[E];
        unpack_to_float<T>(v_tile[jj - half], v_frag);
#pragma unroll
        for (int e = 0; e < E; ++e) o_acc[e] += p_j * v_frag[e];
      }
    }
    m = m_new;
  }

  // 4. Normalise and store. An empty row (causal, Sq > Sk) has l = 0: O = 0 and LSE = -inf.
  const float l = warp_sum(l_lane);
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) o_acc[e] *= inv_l;
  store_from_float<E>(o + lane * E, o_acc);
  if (p.lse != nullptr && lane == 0) {
    p.lse[(b * p.hq + h) * p.sq + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
  }
}

using Kernel = void (*)(AttnParams);

Kernel select_kernel(const AttnParams& p) {
  if (p.dtype == DType::f16) return p.d == 64 ? naive_attention_kernel<__half, 64> : naive_attention_kernel<__half, 128>;
  return p.d == 64 ? naive_attention_kernel<__nv_bfloat16, 64> : naive_attention_kernel<__nv_bfloat16, 128>;
}

Status plan(const AttnParams& p, LaunchPlan* out) {
  constexpr int64_t kMaxGridYZ = 65535;
  if (p.hq > kMaxGridYZ) return Status::Error("Hq (" + std::to_string(p.hq) + ") exceeds stage 01's grid limit 65535");
  if (p.b > kMaxGridYZ) return Status::Error("B (" + std::to_string(p.b) + ") exceeds stage 01's grid limit 65535");
  out->grid = dim3(static_cast<unsigned>((p.sq + kBr - 1) / kBr), static_cast<unsigned>(p.hq),
                   static_cast<unsigned>(p.b));
  out->block = dim3(kBr * kWarp);
  out->dynamic_smem_bytes = 0;
  out->kernel = reinterpret_cast<const void*>(select_kernel(p));
  out->notes = "Br=" + std::to_string(kBr) + " rows (one warp each), Bc=" + std::to_string(kBc) + " keys per step (one per lane)";
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
