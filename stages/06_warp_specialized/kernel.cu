// Fast attention, one idea at a time:
//   01 naive -> 02 kv_split -> 03 persistent -> 04 wmma -> 05 cp_async -> 06 warp_specialized
//
// Stage 06 extends 05 by Hopper's way of feeding the tensor cores (sm_90a): TMA copies Q, K and V
// tiles into 128-byte-swizzled shared memory, wgmma computes S = Q.K^T and O += P.V, and one
// producer warp fills a ring of K/V slots (full/empty mbarriers) for consumer warpgroups of 64
// query rows, to which setmaxnreg gives the registers:
//   producer:  wait for a free Q slot, copy Q; per tile: wait for a free slot, copy K, then V
//   consumers: wait for Q; per tile: wait for K, S = Q.K^T, free K, online softmax (a lazy
//              maximum, kLazy), wait for V, O += P.V, free V; then normalise and store O
// Kept from 02-05: key splits merged by LSE, packed GQA rows, persistent CTAs.
// Why: notebooks_md/06_warp_specialized.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda/atomic>

#include "device.h"
#include "dtype.cuh"
#include "fastdiv.h"
#include "hopper.cuh"
#include "params.h"
#include "stage.h"
#include "tma.h"
#include "trace.cuh"
#include "warp.cuh"

namespace attn {
namespace {

constexpr const char* kStageName = "06_warp_specialized";
constexpr int kMinSm = 90;
constexpr int kWarpGroup = 128;  // wgmma's unit: 4 warps
constexpr int kCols = 64;        // elements per 128-byte swizzled row: the width of a TMA box
constexpr int kRowBytes = kCols * 2;
constexpr int kSmemLimit = 227 * 1024;  // shared memory a Hopper CTA may use
constexpr int kMaxSplits = 128;    // beyond this the merge costs more than the parallelism buys
constexpr int kMaxCtasPerSm = 32;  // sizes the arrival counters (hardware limit of resident CTAs)
constexpr int kMinTilesPerSplit = 4;  // a split must pay for its Q copy and its share of the merge

// The CTA for head dimension D: Consumers warpgroups of 64 query rows each after the producer's
// warpgroup, Bc keys per K/V tile. While a consumer warpgroup computes its softmax it leaves the
// tensor cores to the others: more consumers keep them busier, as far as the registers allow
// (S and O of a thread, Bc/2 + D/2; P is packed into S's registers). setmaxnreg leaves the
// producer warpgroup 32 or 40 registers a thread and gives the rest of the launch's pool
// (65536 / threads each, rounded down to 8) to the consumers. Q has two slots, so that the next
// item's Q lands while this item's last tiles are computed; the K/V ring has as many slots as fit
// beside them (up to 4).
template <int D, int C>
struct Tile {
  static constexpr int kConsumers = C;
  static constexpr int kThreads = (1 + kConsumers) * kWarpGroup;
  static constexpr int kBr = 64 * kConsumers;  // packed query rows per work item
  static constexpr int kBc = 128;              // keys per K/V tile
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : 40;
  static constexpr int kConsumerRegs =
      std::min(240, (65536 / kThreads / 8 * 8 * kThreads - kProducerRegs * kWarpGroup) /
                        (kConsumers * kWarpGroup) / 8 * 8);
  static constexpr int kQBytes = kBr * D * 2, kTileBytes = kBc * D * 2;
  static constexpr int kStages = std::min(4, (kSmemLimit - 2 * kQBytes - 2048) / (2 * kTileBytes));
  static_assert(kStages >= 2, "two K/V slots at least");
  static_assert(kConsumerRegs >= 152 && kConsumerRegs <= 256, "consumer registers");
};
// The large CTA, for grids of at least most of a wave: three consumer warpgroups at D = 64, two at
// D = 128 (where S, P and O take more registers). The small one, one consumer warpgroup, for
// small problems and decode: twice (D = 64: three times) the CTAs, and a deeper K/V ring.
template <int D>
constexpr int kLargeConsumers = D == 64 ? 3 : 2;

// Shared memory. Every tile is stored as D/64 column blocks of 128-byte rows in TMA's 128-byte
// swizzle (the 16-byte piece c of row r sits at piece c ^ (r % 8)), each block 1024-byte aligned:
// the layout wgmma's descriptors name.
template <int D, int C>
struct Smem {
  static constexpr int kChunks = D / kCols, kStages = Tile<D, C>::kStages, kBr = Tile<D, C>::kBr,
                       kBc = Tile<D, C>::kBc;
  alignas(1024) unsigned char q[2][kChunks][kBr * kRowBytes];        // [slot][D/64][Br][64]
  alignas(1024) unsigned char k[kStages][kChunks][kBc * kRowBytes];  // [slot][D/64][Bc][64]
  alignas(1024) unsigned char v[kStages][kChunks][kBc * kRowBytes];  // [slot][D/64][Bc][64]
  uint64_t q_full[2], q_empty[2];  // Q landed / every consumer warp done reading it
  uint64_t k_full[kStages];        // K tile landed in the slot
  uint64_t v_full[kStages];        // V tile landed in the slot
  uint64_t k_empty[kStages];       // every consumer warp done reading the slot's K (after S)
  uint64_t v_empty[kStages];       // ... and its V (after P.V)
  int last_split;                  // this CTA brought its query block's last split (it merges)
};

// The three tensor maps, passed by value as one __grid_constant__ parameter (TMA reads them from
// the parameter space).
struct Maps {
  CUtensorMap q, k, v;
};

// What the kernel needs beyond AttnParams: the work decomposition and the split buffers.
struct Work {
  int num_splits = 1;            // key ranges per (batch, packed head, query block)
  unsigned kv_tiles = 0;         // Bc-key tiles of Sk, dealt to the splits as evenly as can be
  int q_blocks = 0;              // query blocks of Br packed rows per (batch, packed head)
  int log2_pack = 0;             // 2^log2_pack query heads of one kv head share a row block
  unsigned n_items = 0;          // B * (Hq >> log2_pack) * q_blocks * num_splits
  // Divisions by num_splits, q_blocks, Hq >> log2_pack and Hq / Hkv, by multiplication: an item's
  // decoding sits between two items of every warpgroup (common/fastdiv.h).
  FastDiv by_splits, by_q_blocks, by_heads, by_group;
  float* o_partial = nullptr;    // [num_splits][B*Hq*Sq][D] fp32, normalised within the split
  float* lse_partial = nullptr;  // [num_splits][B*Hq*Sq], -inf where the split saw no key
  int* arrivals = nullptr;  // [B][Hq >> log2_pack][q_blocks] splits done (zero between launches)
};

// One work item: query block q_block of packed head hs of batch b, over the keys of one split.
// Packed row r of (b, hs) is query position r >> log2_pack of head (hs << log2_pack) + r % 2^..,
// so the heads of a GQA group share each K/V tile. kv_begin and n_tiles are the tiles the block
// needs: from the split's first key to the last key its last row may see.
struct Item {
  int64_t b = 0, hs = 0;
  int kv_begin = 0, split_end = 0;  // keys in 32 bits (make_launch keeps Sk under 2^31)
  int q_block = 0, split = 0, n_tiles = 0;
  unsigned row0 = 0;  // first packed row
};

// Keys row i may see within the split ending at split_end (bottom-right causal mask).
// In 32 bits, as every key and row count of the kernel: a 64-bit min or max is three instructions.
__host__ __device__ __forceinline__ int row_end(const AttnParams& p, int i, int split_end) {
  const int sk = static_cast<int>(p.sk), sq = static_cast<int>(p.sq);
  const int visible = p.causal ? min(sk, max(0, i + sk - sq + 1)) : sk;
  return min(visible, split_end);
}

// Items in 32 bits (make_launch keeps them under 2^31). Splits fastest (a block's splits run
// close together, and its merge soon after), then query blocks, so that the CTAs running at one
// time share the K/V of a few heads in L2; the longest block first when causal.
template <int D, int C>
__device__ __forceinline__ Item decode_item(const AttnParams& p, const Work& w, unsigned item) {
  constexpr int kBr = Tile<D, C>::kBr, kBc = Tile<D, C>::kBc;
  Item it;
  const unsigned block = w.by_splits.div(item), head = w.by_q_blocks.div(block);
  const unsigned b = w.by_heads.div(head), n_hs = static_cast<unsigned>(p.hq) >> w.log2_pack;
  it.split = static_cast<int>(item - block * static_cast<unsigned>(w.num_splits));
  const int q_rank = static_cast<int>(block - head * static_cast<unsigned>(w.q_blocks));
  it.hs = head - b * n_hs;
  it.b = b;
  it.q_block = p.causal ? w.q_blocks - 1 - q_rank : q_rank;
  it.row0 = static_cast<unsigned>(it.q_block) * kBr;
  const unsigned rows = static_cast<unsigned>(p.sq) << w.log2_pack;
  // Split s takes tiles [s T / S, (s + 1) T / S) of the T tiles: the splits differ by a tile at
  // most (equal splits of whole tiles would leave the last one short, or fewer splits than S).
  it.kv_begin = static_cast<int>(w.by_splits.div(it.split * w.kv_tiles)) * kBc;
  const int next_begin = static_cast<int>(w.by_splits.div((it.split + 1) * w.kv_tiles)) * kBc;
  it.split_end = min(static_cast<int>(p.sk), next_begin);
  const int i_last = static_cast<int>((min(it.row0 + kBr, rows) - 1) >> w.log2_pack);
  const int block_end = row_end(p, i_last, it.split_end);
  it.n_tiles = block_end > it.kv_begin ? (block_end - it.kv_begin + kBc - 1) / kBc : 0;
  return it;
}

// The CTA's item of a round: round r holds items [r G, r G + G) of the list, G = gridDim.x, and
// the rounds alternate their direction over the CTAs. A head's query blocks come in a repeating
// pattern of lengths (causal: longest first); taken in the same direction every round, a grid
// that is a multiple of the pattern's period gives each CTA the same block every round (the
// longest to some, the shortest to others); zig-zag, a CTA's long item in one round is followed
// by a short one in the next, whatever the period.
[[maybe_unused]]  // in the sm_90a code only
__device__ __forceinline__ unsigned item_of_round(unsigned round) {
  return round * gridDim.x + ((round & 1) != 0 ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace hopper;

// The producer: one thread of warpgroup 0 issues every TMA copy of this CTA's items. Q of an item
// waits until the consumers have read the previous item's Q; each K/V tile waits for its slot.
template <int D, int C>
__device__ __forceinline__ void produce(const Maps& maps, const AttnParams& p, const Work& w,
                                        Smem<D, C>& sm) {
  constexpr int kChunks = D / kCols, kStages = Tile<D, C>::kStages, kBc = Tile<D, C>::kBc;
  constexpr uint32_t kQBytes = Tile<D, C>::kQBytes,
                     kTileBytes = Tile<D, C>::kTileBytes;  // whole boxes, zeros included
  uint32_t q_uses = 0, kv_uses = 0;
  for (unsigned round = 0, item = item_of_round(0); item < w.n_items;
       item = item_of_round(++round)) {
    const Item it = decode_item<D, C>(p, w, item);
    if (it.n_tiles == 0) continue;
    const int b = static_cast<int>(it.b);
    const int h_kv = static_cast<int>(w.by_group.div(static_cast<unsigned>(it.hs << w.log2_pack)));
    const int q_slot = q_uses % 2;
    mbarrier_wait(&sm.q_empty[q_slot], ((q_uses / 2) & 1) ^ 1);
    mbarrier_arrive_expect_tx(&sm.q_full[q_slot], kQBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      tma_load_5d(sm.q[q_slot][c], &maps.q, c * kCols, 0, static_cast<int>(it.row0 >> w.log2_pack),
                  static_cast<int>(it.hs), b, &sm.q_full[q_slot]);
    ++q_uses;
    for (int t = 0; t < it.n_tiles; ++t, ++kv_uses) {
      const int slot = kv_uses % kStages;
      const int key = static_cast<int>(it.kv_begin) + t * kBc;
      const uint32_t free_parity = ((kv_uses / kStages) & 1) ^ 1;
      mbarrier_wait_backoff(&sm.k_empty[slot], free_parity);
      mbarrier_arrive_expect_tx(&sm.k_full[slot], kTileBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(sm.k[slot][c], &maps.k, c * kCols, key, h_kv, b, &sm.k_full[slot]);
      mbarrier_wait_backoff(&sm.v_empty[slot], free_parity);
      mbarrier_arrive_expect_tx(&sm.v_full[slot], kTileBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(sm.v[slot][c], &maps.v, c * kCols, key, h_kv, b, &sm.v_full[slot]);
    }
  }
}

// The merge of one output row by one warp, as in 03-05: split s holds O_s (normalised over its
// keys) and LSE_s; with m = max_s LSE_s, O = sum_s e^(LSE_s - m) O_s / sum_s e^(LSE_s - m) and
// LSE = m + log of that sum. Splits in index order: the result is the same bits every run. The
// partials come from other SMs of this launch, so they are read through L2 (__ldcg).
template <typename T, int D>
__device__ __forceinline__ void merge_row(const AttnParams& p, const Work& w, int64_t b, int64_t h,
                                          int64_t i, int lane) {
  constexpr int E = D / kWarp;
  const int64_t n_rows = p.b * p.hq * p.sq;
  const int64_t row = (b * p.hq + h) * p.sq + i;
  float m = -INFINITY;
  for (int s = lane; s < w.num_splits; s += kWarp)
    m = fmaxf(m, __ldcg(w.lse_partial + s * n_rows + row));
  m = warp_max(m);
  const float shift = m == -INFINITY ? 0.0f : m;
  float sum_w = 0.0f, acc[E] = {};
#pragma unroll 8
  for (int s = 0; s < w.num_splits; ++s) {
    const float weight = expf(__ldcg(w.lse_partial + s * n_rows + row) - shift);
    const float* part = w.o_partial + (s * n_rows + row) * D + lane * E;
    sum_w += weight;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += weight * __ldcg(part + e);
  }
  const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] *= inv;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride +
         h * p.o_head_stride;  // [D]
  store_from_float<E>(o + lane * E, acc);
  if (p.lse != nullptr && lane == 0) p.lse[row] = sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
}

// The softmax is on the tile's critical path here (nothing else runs while it does), so it is
// made short: the running maximum of a row moves only when a tile's exceeds it by more than kLazy
// (log2 units), so that every exponential stays at most kMaxExp = 2^kLazy (online_softmax, below),
// and a tile first tries its exponentials with the maxima as they stand (stale_softmax).
constexpr float kLazy = 8.0f, kMaxExp = 256.0f;

// The exponentials of a tile with each row's running maximum m as it stands, and their sums in
// tot: most tiles do not raise a row's maximum, and then this is the whole softmax (alpha = 1).
// Returns true if an exponential may exceed kMaxExp (a thread's sum of a row above it): then the
// tile must be done again from its scores, with its maximum.
template <int N>
__device__ __forceinline__ bool stale_softmax(float (&s)[N], const float (&m)[2], float scale,
                                              float (&tot)[2]) {
  float sum[2][4] = {};
#pragma unroll
  for (int j = 0; j < N; ++j) {
    s[j] = fast_exp2(fmaf(s[j], scale, -m[(j >> 1) & 1]));
    sum[(j >> 1) & 1][(j / 4) % 4] += s[j];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) tot[h] = (sum[h][0] + sum[h][1]) + (sum[h][2] + sum[h][3]);
  return !(tot[0] <= kMaxExp && tot[1] <= kMaxExp);  // an infinite sum fails too
}

// Online softmax of one tile, in registers: S's elements become the tile's exponentials, m and l
// are updated, and alpha returns each row's factor for O (the caller rescales O). Element j of S
// sits in row h = (j >> 1) & 1 and column 8 (j / 4) + quad_col + (j & 1) of the tile. With a
// positive scale (Pos) the largest raw score gives the largest scaled one and each probability is
// one FFMA and one EX2, exp2(s scale - m); a negative scale turns the order around (the smallest
// raw score, and masked scores +inf, which scale to -inf). m_safe keeps a row that has seen no
// key at exp2(-inf - 0) = 0 instead of the NaN of -inf - (-inf).
// m moves only when the tile's maximum exceeds it by more than kLazy (log2 units): the
// exponentials then stay below 2^kLazy = 256, far inside fp32, bf16 and fp16, and alpha is 1, so
// the rescaling of O after the softmax is skipped for most tiles. O and l
// are scaled by the same 2^-m, which the epilogue's O / l and LSE = m + log2 l undo exactly.
template <bool Pos, int N>
__device__ __forceinline__ void online_softmax(float (&s)[N], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], const int (&limit)[2],
                                               bool masked, int quad_col, float scale) {
  constexpr float kMasked = Pos ? -INFINITY : INFINITY;
  auto pick = [](float a, float b) { return Pos ? fmaxf(a, b) : fminf(a, b); };
  if (masked) {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (8 * (j / 4) + quad_col + (j & 1) >= limit[(j >> 1) & 1]) s[j] = kMasked;
  }
  float ext[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < 4; ++k) ext[h][k] = kMasked;
#pragma unroll
  for (int j = 0; j < N; ++j)
    ext[(j >> 1) & 1][(j / 4) % 4] = pick(ext[(j >> 1) & 1][(j / 4) % 4], s[j]);
  float neg_m[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float e = pick(pick(ext[h][0], ext[h][1]), pick(ext[h][2], ext[h][3]));
    e = pick(e, __shfl_xor_sync(kFullMask, e, 1));
    e = pick(e, __shfl_xor_sync(kFullMask, e, 2));
    const bool move = e * scale > m[h] + kLazy;  // false while the row has seen no key
    const float m_new = move ? e * scale : m[h];
    const float m_safe = m_new == -INFINITY ? 0.0f : m_new;
    alpha[h] = move ? fast_exp2(m[h] - m_safe) : 1.0f;
    neg_m[h] = -m_safe;
    m[h] = m_new;
  }
  float sum[2][4] = {};
#pragma unroll
  for (int j = 0; j < N; ++j) {
    s[j] = fast_exp2(fmaf(s[j], scale, neg_m[(j >> 1) & 1]));
    sum[(j >> 1) & 1][(j / 4) % 4] += s[j];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    l[h] = l[h] * alpha[h] + ((sum[h][0] + sum[h][1]) + (sum[h][2] + sum[h][3]));
}

// A consumer warpgroup: rows [64 cw, 64 cw + 64) of each item, warp wq of it rows 16 wq + lane/4
// and + 8 (the accumulator layout, hopper.cuh).
template <typename T, int D, int C>
__device__ __forceinline__ void consume(const AttnParams& p, const Work& w, Smem<D, C>& sm, int cw,
                                        int wq, int lane) {
  constexpr int kStages = Tile<D, C>::kStages, kBr = Tile<D, C>::kBr, kBc = Tile<D, C>::kBc,
                kConsumers = Tile<D, C>::kConsumers;
  constexpr int kS = kBc / 2, kO = D / 2;  // accumulators per thread: S[64][Bc], O[64][D]
  const unsigned rows = static_cast<unsigned>(p.sq) << w.log2_pack;  // packed rows per (b, hs)
  const unsigned pack_mask = (1u << w.log2_pack) - 1;
  const int64_t n_rows = p.b * p.hq * p.sq;
  const int r_in_wg = 16 * wq + lane / 4;
  const int quad_col = 2 * (lane % 4);
  const float scale = p.scale;  // log2 units (the launch folded in log2(e)); may be negative
  uint32_t q_uses = 0, kv_uses = 0;

  for (unsigned round = 0, item = item_of_round(0); item < w.n_items;
       item = item_of_round(++round)) {
    const Item it = decode_item<D, C>(p, w, item);
    const unsigned wg_row0 = it.row0 + 64 * cw;
    const bool active = wg_row0 < rows;  // warpgroup-uniform: a block of padding rows only paces
    // Each thread's two rows: their last key, running max m (log2 units) and partial sum l.
    int end[2];
    float m[2], l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = static_cast<int>((wg_row0 + r_in_wg + 8 * h) >> w.log2_pack);
      end[h] = row_end(p, i, it.split_end);
      m[h] = -INFINITY, l[h] = 0.0f;
    }
    // Tiles before n_unmasked end by the warpgroup's first row's last key: no score is masked.
    const int first_end = row_end(p, static_cast<int>(wg_row0 >> w.log2_pack), it.split_end);
    const int n_unmasked = max(0, first_end - it.kv_begin) / kBc;
    float o[kO];
#pragma unroll
    for (int j = 0; j < kO; ++j) o[j] = 0.0f;

    const int q_slot = q_uses % 2;
    const uint64_t q_desc =  // this warpgroup's 64 rows
        uniform(smem_descriptor(smem_addr(sm.q[q_slot]) + cw * 64 * kRowBytes, 16, 1024));
    if (it.n_tiles > 0) {
      mbarrier_wait(&sm.q_full[q_slot], (q_uses / 2) & 1);
      ++q_uses;
    }
    // Timeline stamps in a -DATTN_TRACE build (common/trace.cuh). Events: 0 tile start,
    // 1 K landed, 3 S done, 4 softmax done, 7 V landed, 5 P.V done.
#define STAMP(t, e) ATTN_STAMP(round == 0, cw, t, e)
    for (int t = 0; t < it.n_tiles; ++t, ++kv_uses) {
      STAMP(t, 0);
      const int slot = kv_uses % kStages;
      const uint32_t phase = (kv_uses / kStages) & 1;
      const int kv_tile = it.kv_begin + t * kBc;
      float s[kS];
      // P, the A operand of P.V: in registers of its own, or (kPInS, the large CTA at D = 64,
      // whose 160 registers cannot hold S, P and O apart) packed into S's first half.
      constexpr bool kPInS = D == 64 && kConsumers == 3;
      uint32_t pa[kBc / 16][4];  // unused (and not allocated by ptxas) when kPInS
      // S = Q.K^T: D/16 steps of 16 along the head dimension; step kk reads 32 bytes into the
      // 128-byte rows of column block kk / 4. The first step ignores S's old contents. A
      // warpgroup of padding rows multiplies too (its Q is TMA's zeros): ptxas cannot prove a
      // branch around wgmma uniform over the warpgroup, and would serialise every product (info
      // C7518) to be safe.
      auto issue_s = [&] {
        const uint64_t k_desc = uniform(smem_descriptor(smem_addr(sm.k[slot]), 16, 1024));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint32_t step = (kk % 4) * 32;
          const uint64_t a = advance(q_desc, (kk / 4) * kBr * kRowBytes + step);
          const uint64_t bk = advance(k_desc, (kk / 4) * kBc * kRowBytes + step);
          if (kk == 0)
            wgmma_ss_n128_first<T>(s, a, bk);  // S's old registers (maybe P) are not read
          else
            wgmma_ss_n128<T>(s, a, bk, 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
      };
      mbarrier_wait(&sm.k_full[slot], phase);
      STAMP(t, 1);
      issue_s();
      STAMP(t, 3);
      // First the exponentials with the maxima as they stand (a warp whose rows have all seen
      // keys, in a tile without masked scores). If one may exceed 2^kLazy anywhere in the
      // warpgroup (named barrier 2 + cw), S is computed again (K is still in its slot) and the
      // tile takes the path with its maximum, below.
      const bool masked = t >= n_unmasked;
      // Not with P packed into S (kPInS): S written on one path and not the other makes ptxas
      // serialise every product (C7518).
      const bool eligible = !kPInS && active && t > 0 && !masked;  // the same in the warpgroup
      const bool stale =
          eligible && __all_sync(kFullMask, m[0] != -INFINITY && m[1] != -INFINITY);
      float tot[2];
      const bool over = stale && stale_softmax(s, m, scale, tot);
      const bool again = eligible && named_barrier_any(2 + cw, kWarpGroup, over);
      if (again) issue_s();
      // K is read: the producer may refill the slot's K. The last tile's S was the item's last
      // read of Q: the producer may bring the next item's.
      if (lane == 0) {
        mbarrier_arrive(&sm.k_empty[slot]);
        if (t == it.n_tiles - 1) mbarrier_arrive(&sm.q_empty[q_slot]);
      }
      if (active) {
        if (stale && !again) {
#pragma unroll
          for (int h = 0; h < 2; ++h) l[h] += tot[h];
        } else {
          // The rows' key limits in the tile matter only where a score may be masked.
          int limit[2] = {kBc, kBc};
          if (masked) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
              limit[h] = max(0, min(end[h] - kv_tile, kBc));
          }
          auto softmax = [&](auto positive) {
            float alpha[2];
            online_softmax<decltype(positive)::value>(s, m, l, alpha, limit, masked, quad_col,
                                                      scale);
            // Rescale O (not needed while no row of the warp finds a larger max).
            if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
              for (int j = 0; j < kO; ++j) o[j] *= alpha[(j >> 1) & 1];
            }
          };
          if (scale > 0.0f)
            softmax(std::true_type{});
          else
            softmax(std::false_type{});
        }
        // P rounded to the input type in the A-fragment layout: pair q of step kk is S elements
        // 8 kk + 2 q and 8 kk + 2 q + 1 (hopper.cuh).
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint32_t pair = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
            if constexpr (kPInS)
              s[8 * kk + q] = __uint_as_float(pair);  // after the elements it replaces were read
            else
              pa[kk][q] = pair;
          }
      }
      STAMP(t, 4);
      mbarrier_wait(&sm.v_full[slot], phase);
      STAMP(t, 7);
      {
        // O += P.V: Bc/16 steps of 16 keys; V is N-major (rows of D elements), 2048 bytes per
        // step of 16 rows, column blocks kBc * 128 bytes apart.
        const uint64_t v_desc =
            uniform(smem_descriptor(smem_addr(sm.v[slot]), kBc * kRowBytes, 1024));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk) {
          const uint64_t bv = advance(v_desc, kk * 16 * kRowBytes);
          uint32_t a[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) a[q] = kPInS ? __float_as_uint(s[8 * kk + q]) : pa[kk][q];
          if constexpr (D == 64)
            wgmma_rs_n64<T>(o, a, bv, 1);
          else
            wgmma_rs_n128<T>(o, a, bv, 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
      }
      STAMP(t, 5);
      if (lane == 0) mbarrier_arrive(&sm.v_empty[slot]);  // this warp is done with the slot's V
    }
#undef STAMP

    // Normalise and store: l summed over the quad; O /= l; LSE = m + log2 l, in natural log. A
    // row with no key has l = 0: O = 0 and LSE = -inf. With one split this is the answer, else
    // the split's part, in fp32, for the merge.
    if (active) {
      float inv[2], lse[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sum = quad_sum(l[h]);
        inv[h] = sum > 0.0f ? 1.0f / sum : 0.0f;
        lse[h] = sum > 0.0f ? (m[h] + log2f(sum)) * kLn2 : -INFINITY;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned r = wg_row0 + r_in_wg + 8 * h;
        if (r >= rows) continue;
        const int64_t i = r >> w.log2_pack, head = (it.hs << w.log2_pack) + (r & pack_mask);
        const int64_t row = (it.b * p.hq + head) * p.sq + i;  // LSE index, partials' row
        if (w.num_splits == 1) {
          T* out = static_cast<T*>(p.o) + it.b * p.o_batch_stride + i * p.o_seq_stride +
                   head * p.o_head_stride;
#pragma unroll
          for (int nb = 0; nb < D / 8; ++nb)
            *reinterpret_cast<uint32_t*>(out + 8 * nb + quad_col) =
                pack2<T>(o[4 * nb + 2 * h] * inv[h], o[4 * nb + 2 * h + 1] * inv[h]);
          if (p.lse != nullptr && lane % 4 == 0) p.lse[row] = lse[h];
        } else {
          float* part = w.o_partial + (it.split * n_rows + row) * D;
#pragma unroll
          for (int nb = 0; nb < D / 8; ++nb)
            *reinterpret_cast<float2*>(part + 8 * nb + quad_col) =
                make_float2(o[4 * nb + 2 * h] * inv[h], o[4 * nb + 2 * h + 1] * inv[h]);
          if (lane % 4 == 0) w.lse_partial[it.split * n_rows + row] = lse[h];
        }
      }
    }

    // The fused merge (03): one consumer thread counts the split in, and the CTA that brings the
    // count to num_splits merges the block's rows, one row per consumer warp, and sets the count
    // back to zero for the next launch. The count is a release and an acquire (GPU scope): with
    // the barriers around it, it orders every CTA's partials before the merge.
    if (w.num_splits > 1) {
      named_barrier_sync(1, kConsumers * kWarpGroup);
      if (cw == 0 && wq == 0 && lane == 0) {
        cuda::atomic_ref<int, cuda::thread_scope_device> arrival(
            w.arrivals[(it.b * (p.hq >> w.log2_pack) + it.hs) * w.q_blocks + it.q_block]);
        const bool last = arrival.fetch_add(1, cuda::memory_order_acq_rel) == w.num_splits - 1;
        if (last) arrival.store(0, cuda::memory_order_relaxed);
        sm.last_split = last;
      }
      named_barrier_sync(1, kConsumers * kWarpGroup);
      if (sm.last_split) {
        for (unsigned r = it.row0 + cw * 4 + wq; r < it.row0 + kBr && r < rows; r += kConsumers * 4)
          merge_row<T, D>(p, w, it.b, (it.hs << w.log2_pack) + (r & pack_mask), r >> w.log2_pack,
                          lane);
      }
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// grid = min(work items, resident CTAs); warpgroup 0 produces, the others consume. Each CTA takes
// one item per round (item_of_round): the producer and the consumers walk the same list.
template <typename T, int D, int C>
__global__ void __launch_bounds__(Tile<D, C>::kThreads, 1)
    warp_specialized_kernel(const __grid_constant__ Maps maps, const AttnParams p, const Work w) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  // Dynamic shared memory is only 16-byte aligned; the swizzled tiles need 1024.
  Smem<D, C>& sm = *reinterpret_cast<Smem<D, C>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                  ~uintptr_t{1023});
  const int warp = __shfl_sync(kFullMask, static_cast<int>(threadIdx.x) / kWarp, 0);
  const int lane = threadIdx.x % kWarp;
  if (threadIdx.x == 0) {
    // The tensor maps' first use would fetch them from memory: start that now.
    prefetch_tensor_map(&maps.q);
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&sm.q_full[s], 1);  // the producer's arrive_expect_tx, then the bytes
      mbarrier_init(&sm.q_empty[s], Tile<D, C>::kConsumers * 4);  // one arrival per consumer warp
    }
    for (int s = 0; s < Tile<D, C>::kStages; ++s) {
      mbarrier_init(&sm.k_full[s], 1);
      mbarrier_init(&sm.v_full[s], 1);
      mbarrier_init(&sm.k_empty[s], Tile<D, C>::kConsumers * 4);
      mbarrier_init(&sm.v_empty[s], Tile<D, C>::kConsumers * 4);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warp / 4 == 0) {
    setmaxnreg_dec<Tile<D, C>::kProducerRegs>();
    if (warp == 0 && lane == 0) produce<D, C>(maps, p, w, sm);
  } else {
    setmaxnreg_inc<Tile<D, C>::kConsumerRegs>();
    consume<T, D, C>(p, w, sm, warp / 4 - 1, warp % 4, lane);
  }
#endif
}

using Kernel = void (*)(Maps, AttnParams, Work);

template <typename T, int D>
Kernel select_kernel(bool small) {
  return small ? warp_specialized_kernel<T, D, 1>
               : warp_specialized_kernel<T, D, kLargeConsumers<D>>;
}
Kernel select_kernel(const AttnParams& p, bool small) {
  if (p.dtype == DType::f16)
    return p.d == 64 ? select_kernel<__half, 64>(small) : select_kernel<__half, 128>(small);
  return p.d == 64 ? select_kernel<__nv_bfloat16, 64>(small)
                   : select_kernel<__nv_bfloat16, 128>(small);
}

// The CTA's shape for p's head dimension, for the host. smem: the layout plus the slack for
// aligning it to 1024 bytes (dynamic shared memory is only 16-byte aligned).
struct TileInfo {
  int consumers, threads, br, bc, stages;
  size_t smem;
};
template <int D, int C>
TileInfo tile_info() {
  using Cfg = Tile<D, C>;
  return {Cfg::kConsumers, Cfg::kThreads, Cfg::kBr,
          Cfg::kBc,        Cfg::kStages,  sizeof(Smem<D, C>) + 1024};
}
TileInfo tile_of(const AttnParams& p, bool small) {
  if (small) return p.d == 64 ? tile_info<64, 1>() : tile_info<128, 1>();
  return p.d == 64 ? tile_info<64, kLargeConsumers<64>>() : tile_info<128, kLargeConsumers<128>>();
}

// How many key ranges: none unless the grid would leave the GPU part-empty; then as many as fit
// one wave of persistent CTAs (an item's fixed costs are paid once per CTA), up to max_splits.
int choose_num_splits(int64_t ctas_without_split, int64_t slots, int64_t max_splits) {
  if (ctas_without_split * 10 >= slots * 8) return 1;  // >= 80% of one wave: splitting buys little
  max_splits = std::min<int64_t>(kMaxSplits, max_splits);
  return static_cast<int>(std::max<int64_t>(1, std::min(max_splits, slots / ctas_without_split)));
}

// Everything launch() decides for a problem.
struct Launch {
  TileInfo tile;      // the CTA's shape
  Work work;          // decomposition (pointers filled at launch)
  int64_t ctas = 0;   // min(items, resident slots)
  int64_t slots = 0;  // resident CTAs per SM x SMs
  int sm_count = 0;
  size_t smem = 0;
  Kernel kernel = nullptr;
};

// The tiles of the busiest CTA when ctas CTAs walk the items in item_of_round's order (one
// split: more items than CTAs). With the causal mask a head's P query blocks repeat in a pattern
// of lengths, longest first; zig-zag pairs a long block with a short one (ranks q and P - 1 - q)
// only on a grid G with 2 G a multiple of P. Otherwise the pairs drift by the remainder each
// round, and over fewer rounds than a whole drift some CTAs draw long blocks round after round
// (128 blocks a head on 132 SMs: half again the mean). One pass over the items, no division.
int64_t busiest_cta(const AttnParams& p, const Launch& l, int64_t ctas) {
  const Work& w = l.work;
  const int64_t rows = p.sq << w.log2_pack;
  std::vector<int64_t> block_tiles(static_cast<size_t>(w.q_blocks));
  std::vector<int64_t> tiles(static_cast<size_t>(ctas));
  for (int64_t q = 0; q < w.q_blocks; ++q) {
    const int i_last = static_cast<int>((std::min((q + 1) * l.tile.br, rows) - 1) >> w.log2_pack);
    const int64_t keys = row_end(p, i_last, static_cast<int>(p.sk));
    block_tiles[static_cast<size_t>(q)] = (keys + l.tile.bc - 1) / l.tile.bc;
  }
  int64_t q_block = w.q_blocks - 1;  // the first item's: causal items come longest first
  for (int64_t item = 0, round = 0; item < w.n_items; ++round)
    for (int64_t k = 0; k < ctas && item < w.n_items; ++k, ++item) {
      tiles[static_cast<size_t>(round % 2 != 0 ? ctas - 1 - k : k)] +=
          block_tiles[static_cast<size_t>(q_block)];
      q_block = q_block == 0 ? w.q_blocks - 1 : q_block - 1;
    }
  return *std::max_element(tiles.begin(), tiles.end());
}

Status make_launch(const AttnParams& p, Launch* out) {
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  const int64_t group = p.hq / p.hkv;
  auto configure = [&](bool small, Launch* l) -> Status {
    l->tile = tile_of(p, small);
    const int kBr = l->tile.br;
    // Pack the largest power of two of a GQA group's heads that divides both the group and Br:
    // TMA's box then takes Br / 2^k query positions of 2^k heads, which is Br packed rows.
    int log2_pack = 0;
    while ((group % (int64_t{2} << log2_pack)) == 0 && kBr % (2 << log2_pack) == 0) ++log2_pack;
    const int64_t rows = p.sq << log2_pack;
    const int64_t kMax32 =
        (int64_t{1} << 31) - kBr - l->tile.bc;  // rows, keys and items in 32 bits
    if (rows >= kMax32 || p.sk >= kMax32 || p.hq >= kMax32)
      return Status::Error("Sq * 2^pack (" + std::to_string(rows) + "), Sk (" +
                           std::to_string(p.sk) + ") and Hq (" + std::to_string(p.hq) +
                           ") must be under stage " + kStageName + "'s limit 2^31");
    l->kernel = select_kernel(p, small);
    l->smem = l->tile.smem;
    if (l->smem > device->smem_per_block_optin)
      return Status::Error(std::string("stage ") + kStageName + " needs " +
                           std::to_string(l->smem) +
                           " bytes of shared memory per CTA, the device allows " +
                           std::to_string(device->smem_per_block_optin));
    int ctas_per_sm = 0;
    ATTN_TRY(resident_ctas_per_sm(reinterpret_cast<const void*>(l->kernel), l->tile.threads,
                                  l->smem, &ctas_per_sm));
    l->slots = static_cast<int64_t>(std::min(ctas_per_sm, kMaxCtasPerSm)) * device->sm_count;
    l->work.log2_pack = log2_pack;
    l->work.q_blocks = static_cast<int>((rows + kBr - 1) / kBr);
    l->sm_count = device->sm_count;
    return Status::Ok();
  };
  Launch large, small;
  ATTN_TRY(configure(false, &large));
  ATTN_TRY(configure(true, &small));
  auto unsplit_of = [&](const Launch& l) {
    return int64_t{l.work.q_blocks} * (p.hq >> l.work.log2_pack) * p.b;
  };
  // The large CTA when its grid fills most of one wave (80%, as for splitting); else the small one
  // when its grid fits in one wave; else the large one (a few long items, not two rounds of short).
  const bool use_large =
      unsplit_of(large) * 10 >= large.slots * 8 || unsplit_of(small) > small.slots;
  Launch l = use_large ? large : small;
  Work& w = l.work;
  const int64_t unsplit = unsplit_of(l);
  const int64_t kv_tiles = (p.sk + l.tile.bc - 1) / l.tile.bc;
  // At most one item per resident CTA: a second round of items would add their fixed costs (a
  // Q copy, a partial output to write and merge) and, for a memory-bound decode, no bandwidth:
  // 128 CTAs of 132 SMs already draw all of it.
  const int splits =
      choose_num_splits(unsplit, l.slots, std::max<int64_t>(1, kv_tiles / kMinTilesPerSplit));
  w.kv_tiles = static_cast<unsigned>(kv_tiles);
  w.num_splits = splits;
  const int64_t items = unsplit * w.num_splits;
  if (items >= (int64_t{1} << 31))
    return Status::Error("work items (" + std::to_string(items) + ") exceed stage " +
                         kStageName + "'s limit 2^31");
  w.n_items = static_cast<unsigned>(items);
  w.by_splits = FastDiv(static_cast<uint32_t>(w.num_splits));
  w.by_q_blocks = FastDiv(static_cast<uint32_t>(w.q_blocks));
  w.by_heads = FastDiv(static_cast<uint32_t>(p.hq >> w.log2_pack));
  w.by_group = FastDiv(static_cast<uint32_t>(p.hq / p.hkv));
  l.ctas = std::min(items, l.slots);
  // With the causal mask over several rounds, rather the largest grid that pairs each CTA's long
  // blocks with short ones (busiest_cta: a multiple of half a head's query blocks, or of all of
  // them when they are odd), if its busiest CTA has at least 4% fewer tiles (the bound on the
  // items keeps the count quick).
  const int64_t period = w.q_blocks % 2 == 0 ? w.q_blocks / 2 : w.q_blocks;
  const int64_t paired = l.slots / period * period;
  if (p.causal && items > l.slots && paired > 0 && items <= (int64_t{1} << 16) &&
      busiest_cta(p, l, paired) * 25 < busiest_cta(p, l, l.ctas) * 24)
    l.ctas = paired;
  *out = l;
  return Status::Ok();
}

// Workspace: [arrival counters][o_partial][lse_partial], each 256-byte aligned. The counters take
// the same bytes for every problem on a device (only a grid under one wave is split, so it has
// fewer query blocks than slots), so the zeros one launch leaves are where the next one reads.
struct WorkspaceLayout {
  size_t o_partial = 0, lse_partial = 0, total = 0;
};

WorkspaceLayout layout_for(const AttnParams& p, const Launch& l) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t rows = static_cast<size_t>(p.b * p.hq * p.sq);
  const size_t splits = l.work.num_splits > 1 ? static_cast<size_t>(l.work.num_splits) : 0;
  WorkspaceLayout ws;
  ws.o_partial =
      align(static_cast<size_t>(kMaxCtasPerSm) * static_cast<size_t>(l.sm_count) * sizeof(int));
  ws.lse_partial = ws.o_partial + align(splits * rows * static_cast<size_t>(p.d) * sizeof(float));
  ws.total = ws.lse_partial + align(splits * rows * sizeof(float));
  return ws;
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
  out->block = dim3(l.tile.threads);
  out->dynamic_smem_bytes = l.smem;
  out->kernel = reinterpret_cast<const void*>(l.kernel);
  out->notes =
      "persistent: " + std::to_string(l.ctas) + " CTAs over " + std::to_string(l.work.n_items) +
      " work items, 1 producer warpgroup + " + std::to_string(l.tile.consumers) +
      " consumer warpgroups, Br=" + std::to_string(l.tile.br) + " packed rows (" +
      std::to_string(1 << l.work.log2_pack) + " heads per block), Bc=" + std::to_string(l.tile.bc) +
      ", " + std::to_string(l.tile.stages) +
      " K/V slots, num_splits=" + std::to_string(l.work.num_splits);
  return Status::Ok();
}

// The three tensor maps. Q: (d, head in pack, position, packed head, batch), box (64, 2^k,
// Br / 2^k): one box is Br packed rows of 64 columns. K and V: (d, position, kv head, batch), box
// (64, Bc). Strides in bytes, from AttnParams' element strides.
Status encode_maps(const AttnParams& p, const TileInfo& tile, int log2_pack, Maps* maps) {
  const uint64_t e = 2, pack = uint64_t{1} << log2_pack;
  const uint64_t q_dims[5] = {static_cast<uint64_t>(p.d), pack, static_cast<uint64_t>(p.sq),
                              static_cast<uint64_t>(p.hq) / pack, static_cast<uint64_t>(p.b)};
  const uint64_t q_strides[4] = {p.q_head_stride * e, p.q_seq_stride * e,
                                 pack * p.q_head_stride * e, p.q_batch_stride * e};
  const uint32_t q_box[5] = {kCols, static_cast<uint32_t>(pack),
                             static_cast<uint32_t>(tile.br / pack), 1, 1};
  ATTN_TRY(encode_tensor_map(&maps->q, p.q, p.dtype, 5, q_dims, q_strides, q_box, "q"));
  const uint32_t kv_box[4] = {kCols, static_cast<uint32_t>(tile.bc), 1, 1};
  const uint64_t kv_dims[4] = {static_cast<uint64_t>(p.d), static_cast<uint64_t>(p.sk),
                               static_cast<uint64_t>(p.hkv), static_cast<uint64_t>(p.b)};
  const uint64_t k_strides[3] = {p.k_seq_stride * e, p.k_head_stride * e, p.k_batch_stride * e};
  ATTN_TRY(encode_tensor_map(&maps->k, p.k, p.dtype, 4, kv_dims, k_strides, kv_box, "k"));
  const uint64_t v_strides[3] = {p.v_seq_stride * e, p.v_head_stride * e, p.v_batch_stride * e};
  return encode_tensor_map(&maps->v, p.v, p.dtype, 4, kv_dims, v_strides, kv_box, "v");
}

Status launch(const AttnParams& p, const Workspace& ws, cudaStream_t stream) {
  ATTN_TRY(validate_launch(p, kStageName, kMinSm, ws, 0));  // parameters and GPU, before the plan
#if !defined(ATTN_HAS_SM90A)
  return Status::Error(std::string("stage ") + kStageName +
                       " was built without sm_90a code: add 90a to CMAKE_CUDA_ARCHITECTURES");
#endif
  Launch l;
  ATTN_TRY(make_launch(p, &l));
  const WorkspaceLayout layout = layout_for(p, l);
  ATTN_TRY(check_workspace(kStageName, ws, layout.total));
  Maps maps;
  ATTN_TRY(encode_maps(p, l.tile, l.work.log2_pack, &maps));
  AttnParams kp = p;
  kp.scale = effective_scale(p) * kLog2e;  // scores in log2 units: exp(x) = exp2(x log2 e)
  Work w = l.work;
  char* base = static_cast<char*>(ws.ptr);
  w.arrivals = reinterpret_cast<int*>(base);
  w.o_partial = reinterpret_cast<float*>(base + layout.o_partial);
  w.lse_partial = reinterpret_cast<float*>(base + layout.lse_partial);
  l.kernel<<<static_cast<unsigned>(l.ctas), l.tile.threads, l.smem, stream>>>(maps, kp, w);
  trace::dump(kStageName, stream);  // a -DATTN_TRACE build's timeline, else nothing
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_06_warp_specialized() {
  StageInfo s;
  s.name = kStageName;
  s.description =
      "Hopper: TMA copies, wgmma, a producer warp feeding consumer warpgroups through an mbarrier "
      "ring";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  return s;
}

}  // namespace attn
