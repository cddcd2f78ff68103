// Fast attention, one idea at a time:
//   ... 05 cp_async -> 06 warp_specialized -> 07 overlap
//
// Stage 07 extends 06 by overlap, at three scales: consumer warpgroups take turns to issue their
// products (pingpong, named barriers), so that one's softmax runs while another's products do; in
// a warpgroup, the softmax of tile t runs while P.V of tile t - 1 is on the tensor cores; and
// launches overlap (programmatic dependent launch). Two more for the same end: O leaves through
// shared memory (stmatrix; from the large CTA by the producer's TMA store) while the next item
// starts, and a half CTA (32 query rows a warpgroup) spreads a small problem's softmax wider.
//   consumers, per tile t: wait for K(t), V(t-1); in their turn issue S(t) and O += P(t-1).V(t-1);
//   wait for S(t), free K(t); softmax(t); wait for P.V, free V(t-1); P(t) from S(t)
// Why: notebooks_md/07_overlap.md.
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

constexpr const char* kStageName = "07_overlap";
constexpr int kMinSm = 90;
constexpr int kWarpGroup = 128;  // wgmma's unit: 4 warps
constexpr int kCols = 64;        // elements per 128-byte swizzled row: the width of a TMA box
constexpr int kRowBytes = kCols * 2;
constexpr int kSmemLimit = 227 * 1024;  // shared memory a Hopper CTA may use
constexpr int kMaxSplits = 128;    // beyond this the merge costs more than the parallelism buys
constexpr int kMaxCtasPerSm = 32;  // sizes the arrival counters (hardware limit of resident CTAs)
constexpr int kMinTilesPerSplit = 4;  // a split must pay for its Q copy and its share of the merge

// The CTA for head dimension D: Consumers warpgroups of R query rows each after the producer's
// warpgroup, Bc keys per K/V tile. R is 64, wgmma's M, or 32 (kHalf): then a warpgroup's
// products still have 64 rows, but only the first 8 of each warp's 16 hold queries (a thread's
// first row, h = 0; Q's descriptor, in consume), and the softmax, P and the epilogue skip the
// other half: on a problem too small to fill the GPU, twice the CTAs each do half the softmax,
// which is what a lone warpgroup's tile waits for (the exponentials run at 16 a cycle per SM).
// While a consumer warpgroup computes its softmax it leaves the tensor cores to the others: more
// consumers keep them busier, as far as the registers allow (S, P and O of a thread, Bc/2 + Bc/4
// + D/2). setmaxnreg leaves the producer warpgroup 32 or 40 registers a thread and gives the rest
// of the launch's pool (65536 / threads each, rounded down to 8) to the consumers. Q has two
// slots, so that the next item's Q lands while this item's last tiles are computed; the K/V ring
// has as many slots as fit beside them (up to 4).
template <int D, int C, int R>
struct Tile {
  static constexpr int kConsumers = C;
  static constexpr int kThreads = (1 + kConsumers) * kWarpGroup;
  static constexpr int kBr = R * kConsumers;   // packed query rows per work item
  static constexpr int kQRows = 64 * kConsumers;  // a Q slot's rows (wgmma's M each)
  static constexpr int kBc = 128;              // keys per K/V tile
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : 40;
  static constexpr int kConsumerRegs =
      std::min(240, (65536 / kThreads / 8 * 8 * kThreads - kProducerRegs * kWarpGroup) /
                        (kConsumers * kWarpGroup) / 8 * 8);
  static constexpr int kTileBytes = kBc * D * 2;
  static constexpr int kStages =
      std::min(4, (kSmemLimit - 2 * kQRows * D * 2 - 2048) / (2 * kTileBytes));
  static_assert(kStages >= 2, "two K/V slots at least");
  static_assert(kConsumerRegs >= 152 && kConsumerRegs <= 256, "consumer registers");
};
// The large CTA, for grids of at least most of a wave: three consumer warpgroups at D = 64 (two
// on heads of at most 128 rows, and with the causal mask on heads of under 4096: Cta::large2),
// two at D = 128 (where S, P and O take more registers).
// The small one, one consumer warpgroup, for small problems and decode: twice (D = 64: three
// times) the CTAs, and a deeper K/V ring.
template <int D>
constexpr int kLargeConsumers = D == 64 ? 3 : 2;

// Shared memory. Every tile is stored as D/64 column blocks of 128-byte rows in TMA's 128-byte
// swizzle (the 16-byte piece c of row r sits at piece c ^ (r % 8)), each block 1024-byte aligned:
// the layout wgmma's descriptors name.
template <int D, int C, int R>
struct Smem {
  static constexpr int kChunks = D / kCols, kStages = Tile<D, C, R>::kStages,
                       kQRows = Tile<D, C, R>::kQRows, kBc = Tile<D, C, R>::kBc;
  alignas(1024) unsigned char q[2][kChunks][kQRows * kRowBytes];  // [slot][D/64][64 C][64]
  alignas(1024) unsigned char k[kStages][kChunks][kBc * kRowBytes];  // [slot][D/64][Bc][64]
  alignas(1024) unsigned char v[kStages][kChunks][kBc * kRowBytes];  // [slot][D/64][Bc][64]
  uint64_t q_full[2], q_empty[2];  // Q landed / every consumer warp done with it (C = 1)
  uint64_t o_full[2];              // the large CTA: O in the slot, for the producer's store
  uint64_t k_full[kStages];        // K tile landed in the slot
  uint64_t v_full[kStages];        // V tile landed in the slot
  uint64_t k_empty[kStages];       // every consumer warp done reading the slot's K (after S)
  uint64_t v_empty[kStages];       // ... and its V (after P.V)
  int last_split;                  // this CTA brought its query block's last split (it merges)
};

// The tensor maps, passed by value as one __grid_constant__ parameter (TMA reads them from
// the parameter space). The large CTA's (kO) also hold O's, for its stores; the others' launches,
// a few microseconds long, are quicker without those 128 bytes of parameters to copy.
template <bool kO>
struct Maps {
  CUtensorMap q, k, v;
};
template <>
struct Maps<true> {
  CUtensorMap q, k, v, o;
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
template <int D, int C, int R>
__device__ __forceinline__ Item decode_item(const AttnParams& p, const Work& w, unsigned item) {
  constexpr int kBr = Tile<D, C, R>::kBr, kBc = Tile<D, C, R>::kBc;
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

// The O of round r of the large CTA, which its consumers left in the round's Q slot: one TMA
// store of the block (rows past Sq are not written), read out before the slot is reused. With
// splits the consumers have written their parts themselves.
template <int D, int C, int R>
__device__ __forceinline__ void store_block(const Maps<true>& maps, const AttnParams& p,
                                            const Work& w, Smem<D, C, R>& sm, unsigned r) {
  if (w.num_splits > 1) return;
  const Item it = decode_item<D, C, R>(p, w, item_of_round(r));
#pragma unroll
  for (int c = 0; c < D / kCols; ++c)
    tma_store_5d(&maps.o, sm.q[r % 2][c], c * kCols, 0, static_cast<int>(it.row0 >> w.log2_pack),
                 static_cast<int>(it.hs), static_cast<int>(it.b));
  tma_store_commit();
  tma_store_wait_read();
}

// The producer: one thread of warpgroup 0 issues every TMA copy of this CTA's items. Q of an item
// waits until the consumers have read the Q of two items before (in the large CTA, and the store
// of its O has read it out); each K/V tile waits for its slot.
template <int D, int C, int R>
__device__ __forceinline__ void produce(const Maps<(C > 1)>& maps, const AttnParams& p,
                                        const Work& w, Smem<D, C, R>& sm) {
  constexpr int kChunks = D / kCols, kStages = Tile<D, C, R>::kStages, kBc = Tile<D, C, R>::kBc;
  constexpr uint32_t kQBytes = Tile<D, C, R>::kBr * D * 2,
                     kTileBytes = Tile<D, C, R>::kTileBytes;  // whole boxes, zeros included
  uint32_t q_uses = 0, kv_uses = 0;  // q_uses: the round, one Q per item
  for (unsigned round = 0, item = item_of_round(0); item < w.n_items;
       item = item_of_round(++round)) {
    const Item it = decode_item<D, C, R>(p, w, item);
    const int b = static_cast<int>(it.b);
    const int h_kv = static_cast<int>(w.by_group.div(static_cast<unsigned>(it.hs << w.log2_pack)));
    const int q_slot = q_uses % 2;
    if constexpr (C > 1) {
      // The large CTA's O leaves from its Q slot by TMA, issued here: the consumers left the O of
      // round - 2 there (o_full); it goes out before this Q reuses the slot.
      mbarrier_wait(&sm.o_full[q_slot], ((q_uses / 2) & 1) ^ 1);
      if (round >= 2) store_block(maps, p, w, sm, round - 2);
    } else {
      mbarrier_wait(&sm.q_empty[q_slot], ((q_uses / 2) & 1) ^ 1);
    }
    mbarrier_arrive_expect_tx(&sm.q_full[q_slot], kQBytes);
    // Programmatic dependent launch: the first read of the inputs (see the kernel) waits here,
    // after Q's slot and byte count are set, so that only the copy follows the wait.
    if (round == 0) {
      cudaGridDependencySynchronize();
      cudaTriggerProgrammaticLaunchCompletion();
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      tma_load_5d(sm.q[q_slot][c], &maps.q, c * kCols, 0, static_cast<int>(it.row0 >> w.log2_pack),
                  static_cast<int>(it.hs), b, &sm.q_full[q_slot]);
    ++q_uses;
    if (it.n_tiles == 0) continue;  // a block that sees no key still gets its Q slot (epilogue)
    // A tile's K and V each wait for their own slot. The consumers read K(t) together with
    // V(t - 1): copying in that order keeps a K from waiting behind the V before it.
    auto load = [&](int t, uint64_t* full, uint64_t* empty, const CUtensorMap* map, auto& dst) {
      const int slot = static_cast<int>((kv_uses + t) % kStages);
      const int key = static_cast<int>(it.kv_begin) + t * kBc;
      mbarrier_wait_backoff(&empty[slot], (((kv_uses + t) / kStages) & 1) ^ 1);
      mbarrier_arrive_expect_tx(&full[slot], kTileBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(dst[slot][c], map, c * kCols, key, h_kv, b, &full[slot]);
    };
    for (int t = 0; t < it.n_tiles; ++t) {
      load(t, sm.k_full, sm.k_empty, &maps.k, sm.k);
      if (t > 0) load(t - 1, sm.v_full, sm.v_empty, &maps.v, sm.v);
    }
    load(it.n_tiles - 1, sm.v_full, sm.v_empty, &maps.v, sm.v);
    kv_uses += it.n_tiles;
  }
  if constexpr (C > 1) {  // the last two rounds' O, then the stores' end (before the CTA exits)
    for (unsigned r = q_uses < 2 ? 0 : q_uses - 2; r < q_uses; ++r) {
      mbarrier_wait(&sm.o_full[r % 2], (r / 2) & 1);
      store_block(maps, p, w, sm, r);
    }
    tma_store_wait();
  }
}

// The merge of one output row by one warp, as in 03-06, with its loads overlapped: split s holds
// O_s (normalised over its keys) and LSE_s; with m = max_s LSE_s, O = sum_s e^(LSE_s - m) O_s /
// sum_s e^(LSE_s - m) and LSE = m + log of that sum. Splits in index order: the result is the same
// bits every run. The partials come from other SMs of this launch, so they are read through L2
// (__ldcg). The merge is the last step of a split launch, after the slowest split: each round
// trip to L2 it saves comes off the launch's time.
template <typename T, int D>
__device__ __forceinline__ void merge_row(const AttnParams& p, const Work& w, int64_t b, int64_t h,
                                          int64_t i, int lane) {
  constexpr int E = D / kWarp;
  const int64_t n_rows = p.b * p.hq * p.sq;
  const int64_t row = (b * p.hq + h) * p.sq + i;
  // One pass, kChunk splits at a time, every load of a chunk issued before the first is used: one
  // L2 round trip per 16 splits, not one for the maximum and then one per few splits. The maximum
  // is kept as it runs, as the online softmax keeps a row's, and the sums rescaled when it grows.
  constexpr int kChunk = 16;
  float m = -INFINITY, sum_w = 0.0f, acc[E] = {};
  for (int s0 = 0; s0 < w.num_splits; s0 += kChunk) {
    float lse[kChunk], part[kChunk][E];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int64_t s = min(s0 + c, w.num_splits - 1);  // past the last split: read, weighed 0
      lse[c] = __ldcg(w.lse_partial + s * n_rows + row);
      load_floats_cg<E>(w.o_partial + (s * n_rows + row) * D + lane * E, part[c]);
    }
    float m_new = m;
#pragma unroll
    for (int c = 0; c < kChunk; ++c)
      if (s0 + c < w.num_splits) m_new = fmaxf(m_new, lse[c]);
    const float shift = m_new == -INFINITY ? 0.0f : m_new;
    const float rescale = expf(m - shift);  // 0 while m = -inf
    sum_w *= rescale;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= rescale;
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const float weight = s0 + c < w.num_splits ? expf(lse[c] - shift) : 0.0f;  // 0: empty split
      sum_w += weight;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += weight * part[c][e];
    }
    m = m_new;
  }
  const float shift = m == -INFINITY ? 0.0f : m;
  const float inv = sum_w > 0.0f ? 1.0f / sum_w : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] *= inv;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + i * p.o_seq_stride +
         h * p.o_head_stride;  // [D]
  store_from_float<E>(o + lane * E, acc);
  if (p.lse != nullptr && lane == 0) p.lse[row] = sum_w > 0.0f ? shift + logf(sum_w) : -INFINITY;
}

// The running maximum of a row moves only when a tile's exceeds it by more than kLazy (log2
// units), so that every exponential stays at most kMaxExp = 2^kLazy (online_softmax, below).
constexpr float kLazy = 8.0f, kMaxExp = 256.0f;

// The exponentials of a tile with each row's running maximum m as it stands, and their sums in
// tot: most tiles do not raise a row's maximum, and then this is the whole softmax (alpha = 1).
// Returns true if an exponential may exceed kMaxExp (a thread's sum of a row above it): then the
// tile must be done again from its scores, with its maximum. Half: the thread's second row (h = 1)
// holds no query, and its elements are left as they are.
template <bool Half, int N>
__device__ __forceinline__ bool stale_softmax(float (&s)[N], const float (&m)[2], float scale,
                                              float (&tot)[2]) {
  float sum[2][4] = {};
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (Half && ((j >> 1) & 1)) continue;
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
// the rescaling of O between one tile's P.V and the next turn is skipped for most tiles. O and l
// are scaled by the same 2^-m, which the epilogue's O / l and LSE = m + log2 l undo exactly.
template <bool Pos, bool Half, int N>
__device__ __forceinline__ void online_softmax(float (&s)[N], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], const int (&limit)[2],
                                               bool masked, int quad_col, float scale) {
  constexpr float kMasked = Pos ? -INFINITY : INFINITY;
  constexpr int kRows = Half ? 1 : 2;  // the thread's rows that hold queries
  auto pick = [](float a, float b) { return Pos ? fmaxf(a, b) : fminf(a, b); };
  if (masked) {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (((j >> 1) & 1) < kRows && 8 * (j / 4) + quad_col + (j & 1) >= limit[(j >> 1) & 1])
        s[j] = kMasked;
  }
  float ext[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < 4; ++k) ext[h][k] = kMasked;
#pragma unroll
  for (int j = 0; j < N; ++j)
    if (((j >> 1) & 1) < kRows)
      ext[(j >> 1) & 1][(j / 4) % 4] = pick(ext[(j >> 1) & 1][(j / 4) % 4], s[j]);
  float neg_m[2] = {};
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
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
    if (((j >> 1) & 1) >= kRows) continue;
    s[j] = fast_exp2(fmaf(s[j], scale, neg_m[(j >> 1) & 1]));
    sum[(j >> 1) & 1][(j / 4) % 4] += s[j];
  }
#pragma unroll
  for (int h = 0; h < kRows; ++h)
    l[h] = l[h] * alpha[h] + ((sum[h][0] + sum[h][1]) + (sum[h][2] + sum[h][3]));
}

// A consumer warpgroup: rows [R cw, R cw + R) of each item, warp wq of it rows 16 wq + lane/4
// and + 8 (the accumulator layout, hopper.cuh; the half CTA: rows 8 wq + lane/4 only).
template <typename T, int D, int C, int R>
__device__ __forceinline__ void consume(const AttnParams& p, const Work& w,
                                        Smem<D, C, R>& sm, int cw, int wq, int lane) {
  constexpr int kStages = Tile<D, C, R>::kStages, kBr = Tile<D, C, R>::kBr,
                kBc = Tile<D, C, R>::kBc, kQRows = Tile<D, C, R>::kQRows,
                kConsumers = Tile<D, C, R>::kConsumers;
  constexpr bool kHalf = R == 32;  // the half CTA (Tile)
  constexpr int kRows = kHalf ? 1 : 2;  // a thread's rows that hold queries (h = 0, 1)
  constexpr int kS = kBc / 2, kO = D / 2;  // accumulators per thread: S[64][Bc], O[64][D]
  const unsigned rows = static_cast<unsigned>(p.sq) << w.log2_pack;  // packed rows per (b, hs)
  const unsigned pack_mask = (1u << w.log2_pack) - 1;
  const int64_t n_rows = p.b * p.hq * p.sq;
  const int r_in_wg = (kHalf ? 8 : 16) * wq + lane / 4;  // the thread's first row; + 8: second
  const int quad_col = 2 * (lane % 4);
  const float scale = p.scale;  // log2 units (the launch folded in log2(e)); may be negative
  const uint32_t opaque_zero = static_cast<uint32_t>(p.sq >> 32);  // Sq < 2^31 (make_launch)
  uint32_t q_uses = 0, kv_uses = 0;
  // Pingpong: the consumer warpgroups issue their products in turns, in the order 0, 1, .., C - 1,
  // and each hands the turn on right after, so that the others' softmax runs while its products
  // do. Named barrier 2 + cw opens warpgroup cw's turn: its 128 threads wait there for the 128 of
  // the warpgroup before it.
  auto turn_begin = [&](int me) {
    if constexpr (kConsumers > 1) named_barrier_sync(2 + me, 2 * kWarpGroup);
  };
  auto turn_end = [&](int me) {
    if constexpr (kConsumers > 1) named_barrier_arrive(2 + (me + 1) % kConsumers, 2 * kWarpGroup);
  };
  if constexpr (kConsumers > 1)
    if (cw == kConsumers - 1) named_barrier_arrive(2, 2 * kWarpGroup);  // 0 takes the first turn

  for (unsigned round = 0, item = item_of_round(0); item < w.n_items;
       item = item_of_round(++round)) {
    const Item it = decode_item<D, C, R>(p, w, item);
    const unsigned wg_row0 = it.row0 + R * cw;
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
    // Descriptors go through uniform() (common/hopper.cuh): a turn is the issue of a tile's 16
    // products, and with descriptors in ordinary registers each wgmma waits on R2UR copies of its
    // two; in uniform registers it needs only a few uniform adds and moves.
    // kHalf: Q's 32 rows lie packed in the slot, and the 8-row groups of the products' 64 rows
    // step 512 bytes instead of 1024, so that group 2 wq, warp wq's first 8 rows, is Q's rows
    // 8 wq to 8 wq + 7; the odd groups (the rows h = 1, which nothing uses) read across two.
    const uint64_t q_desc =  // this warpgroup's 64 rows
        uniform(smem_descriptor(smem_addr(sm.q[q_slot]) + cw * 64 * kRowBytes, 16,
                                kHalf ? 512 : 1024));
    mbarrier_wait(&sm.q_full[q_slot], (q_uses / 2) & 1);
    ++q_uses;
    // The tiles, overlapped inside the warpgroup: S of tile t is issued together with P.V of
    // tile t - 1, and the softmax of tile t runs while that P.V is on the tensor cores. A turn
    // (pingpong) covers the issue of one tile's products; the other warpgroup's softmax runs
    // during it. Every warpgroup of the CTA takes n_tiles + 1 turns per item (the first issues S
    // alone, the last P.V alone), and no product sits behind a branch: ptxas would serialise it.
    float s[kS];
    // P of the previous tile, the A operand of its P.V: in registers of its own, or (kPInS, the
    // large CTA at D = 64, whose 160 registers cannot hold S, P and O apart) packed into S's.
    constexpr bool kPInS = D == 64 && kConsumers == 3;
    uint32_t pa[kBc / 16][4];  // unused (and not allocated by ptxas) when kPInS
    auto slot_of = [&](int t) { return static_cast<int>((kv_uses + t) % kStages); };
    auto parity_of = [&](int t) { return ((kv_uses + t) / kStages) & 1; };
    auto issue_s = [&](int t) {  // S = Q.K(t)^T: D/16 steps of 16 along the head dimension
      const uint64_t k_desc = uniform(smem_descriptor(smem_addr(sm.k[slot_of(t)]), 16, 1024));
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32;
        const uint64_t a = advance(q_desc, (kk / 4) * kQRows * kRowBytes + step);
        const uint64_t bk = advance(k_desc, (kk / 4) * kBc * kRowBytes + step);
        if (kk == 0)
          wgmma_ss_n128_first<T>(s, a, bk);  // S's old registers (maybe P) are not read
        else
          wgmma_ss_n128<T>(s, a, bk, 1);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int t) {  // O += P(t).V(t), P from registers
      const uint64_t v_desc =
          uniform(smem_descriptor(smem_addr(sm.v[slot_of(t)]), kBc * kRowBytes, 1024));
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
    };
    // After S(t) has landed: K(t) is read; the softmax leaves its exponentials in S and returns
    // O's factors in alpha, touching neither O nor P.
    auto softmax = [&](int t, float(&alpha)[2], bool retry = false) -> bool {
      alpha[0] = alpha[1] = 1.0f;
      if (!active) {
        if (lane == 0) mbarrier_arrive(&sm.k_empty[slot_of(t)]);
        return false;
      }
      // First the exponentials with the maxima as they stand (a warp whose rows have all seen
      // keys, in a tile without masked scores). If one may exceed 2^kLazy anywhere in the
      // warpgroup (named barrier 8 + cw), S(t) is computed again (K(t) is still in its slot) and
      // the tile takes the path with its maximum, below. In the large D = 64 CTA (kPInS) the
      // softmax returns true instead and the loop issues S(t) again from its one issue site: a
      // second site there makes ptxas serialise every product (C7514).
      const bool eligible = !retry && t > 0 && t < n_unmasked;  // the same in the warpgroup
      const bool stale = eligible && __all_sync(kFullMask, m[0] != -INFINITY &&
                                                                 (kHalf || m[1] != -INFINITY));
      float tot[2];
      const bool over = stale && stale_softmax<kHalf>(s, m, scale, tot);
      const bool again = eligible && named_barrier_any(8 + cw, kWarpGroup, over);
      if (again) {
        if constexpr (kPInS) return true;  // the caller computes S(t) again (one issue site)
        wgmma_fence();
        issue_s(t);
        wgmma_wait<0>();
      }
      if (lane == 0) mbarrier_arrive(&sm.k_empty[slot_of(t)]);
      if (stale && !again) {
#pragma unroll
        for (int h = 0; h < 2; ++h) l[h] += tot[h];
        return false;
      }
      // The rows' key limits in the tile matter only where a score may be masked: computed
      // there alone, their arithmetic stays off the other tiles' softmax.
      int limit[2] = {kBc, kBc};
      if (t >= n_unmasked) {
        const int kv_tile = it.kv_begin + t * kBc;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          limit[h] = max(0, min(end[h] - kv_tile, kBc));
      }
      if (scale > 0.0f)
        online_softmax<true, kHalf>(s, m, l, alpha, limit, t >= n_unmasked, quad_col, scale);
      else
        online_softmax<false, kHalf>(s, m, l, alpha, limit, t >= n_unmasked, quad_col, scale);
      return false;
    };
    // After P.V has landed (or before the first): rescale O, round P(t) from S(t).
    auto next_p = [&](const float(&alpha)[2]) {
      if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int j = 0; j < kO; ++j) o[j] *= alpha[(j >> 1) & 1];
      }
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          // Register q holds row h = q % 2. kHalf: zeros for h = 1, its two elements rounded as
          // the others and masked by a zero the compiler cannot see through (opaque_zero). With
          // those elements read by nothing, or only by bitwise operations, ptxas serialises
          // every wgmma of the kernel (C7511).
          uint32_t pair = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
          if (kHalf && q % 2) pair &= opaque_zero;
          if constexpr (kPInS)
            s[8 * kk + q] = __uint_as_float(pair);  // after the elements it replaces were read
          else
            pa[kk][q] = pair;
        }
    };
    // Timeline stamps in a -DATTN_TRACE build (common/trace.cuh). Events: 0 tile start,
    // 7 K and V landed, 1 turn taken, 2 products issued, 3 S landed, 4 softmax done,
    // 5 P.V landed, 6 P ready.
#define STAMP(t, e) ATTN_STAMP(round == 0, cw, t, e)
    if (it.n_tiles > 0) {
      float alpha[2];
      STAMP(0, 0);
      mbarrier_wait(&sm.k_full[slot_of(0)], parity_of(0));
      turn_begin(cw);
      STAMP(0, 1);
      wgmma_fence();
      issue_s(0);
      turn_end(cw);
      STAMP(0, 2);
      wgmma_wait<0>();
      STAMP(0, 3);
      softmax(0, alpha);
      STAMP(0, 4);
      next_p(alpha);
      STAMP(0, 6);
      for (int t = 1; t < it.n_tiles; ++t) {
        STAMP(t, 0);
        mbarrier_wait(&sm.k_full[slot_of(t)], parity_of(t));
        mbarrier_wait(&sm.v_full[slot_of(t - 1)], parity_of(t - 1));
        STAMP(t, 7);
        turn_begin(cw);
        STAMP(t, 1);
        wgmma_fence();
        if constexpr (kPInS) {  // S(t) overwrites P(t - 1): only after P(t-1).V(t-1) has run
          issue_pv(t - 1);
          wgmma_wait<0>();
          if (lane == 0) mbarrier_arrive(&sm.v_empty[slot_of(t - 1)]);
          for (bool retry = false;; retry = true) {  // again only if the softmax asks
            wgmma_fence();
            issue_s(t);
            if (!retry) turn_end(cw);
            STAMP(t, 2);
            wgmma_wait<0>();
            STAMP(t, 3);
            if (!softmax(t, alpha, retry)) break;
          }
          STAMP(t, 4);
        } else {
          issue_s(t);
          issue_pv(t - 1);
          turn_end(cw);
          STAMP(t, 2);
          wgmma_wait<1>();  // S(t) landed; P(t-1).V(t-1) may still run
          STAMP(t, 3);
          softmax(t, alpha);
          STAMP(t, 4);
          wgmma_wait<0>();
          STAMP(t, 5);
          if (lane == 0) mbarrier_arrive(&sm.v_empty[slot_of(t - 1)]);
        }
        next_p(alpha);
        STAMP(t, 6);
      }
      const int last = it.n_tiles - 1;
      mbarrier_wait(&sm.v_full[slot_of(last)], parity_of(last));
      turn_begin(cw);
      wgmma_fence();
      issue_pv(last);
      turn_end(cw);
      wgmma_wait<0>();
      if (lane == 0) mbarrier_arrive(&sm.v_empty[slot_of(last)]);
    }
    kv_uses += it.n_tiles;
#undef STAMP

    // Normalise and store: l summed over the quad; O /= l; LSE = m + log2 l, in natural log. A
    // row with no key has l = 0: O = 0 and LSE = -inf. With one split O is the answer: it goes
    // into this warpgroup's rows of the Q slot, which its products have finished reading, in the
    // same swizzled layout, and leaves in 16-byte stores (the large CTA: the producer's TMA
    // store); the global writes then drain while the warpgroup starts its next item. With several
    // splits O is the split's part, in fp32, for the merge.
    float inv[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(l[h]);
      // sum >= 1 (the row's largest score gives exp2(0)): the fast reciprocal and logarithm
      // (one MUFU instruction each) are exact to a few ulp.
      inv[h] = sum > 0.0f ? __fdividef(1.0f, sum) : 0.0f;
      lse[h] = sum > 0.0f ? (m[h] + __log2f(sum)) * kLn2 : -INFINITY;
    }
    if (w.num_splits == 1 && active) {
      // stmatrix: each instruction stores four 8x8 blocks of the warp's 16 rows, (rows h, columns
      // nb + n) for h, n in {0, 1}; lane l names row l % 8 of block l / 8. A block row is one
      // 16-byte piece of the swizzled layout.
      const int row_in_wg = 16 * wq + 8 * ((lane / 8) % 2) + lane % 8;
#pragma unroll
      for (int nb = 0; nb < D / 8; nb += 2) {
        const int piece = nb + lane / 16;  // the lane's block column
        uint32_t pk[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int e = 4 * (nb + j / 2) + 2 * (j % 2);
          pk[j] = pack2<T>(o[e] * inv[j % 2], o[e + 1] * inv[j % 2]);
        }
        stmatrix_x4(smem_addr(sm.q[q_slot][piece / 8] + (cw * 64 + row_in_wg) * kRowBytes +
                              ((piece % 8) ^ (lane % 8)) * 16),
                    pk[0], pk[1], pk[2], pk[3]);
      }
      // The small and half CTAs' warps store their 16 rows in 16-byte pieces, D/8 to a row, 8
      // consecutive lanes on 128 contiguous bytes: whole lines, as coalesced as a TMA store, and
      // without its issue and its wait for the read (the stores drain on their own, past the
      // CTA's exit). Rows past Sq are not written. The warp reads only what it wrote:
      // __syncwarp() is the only barrier. The large CTA's items come one after another, and the
      // stores would hold its consumers between two: there the producer stores the block by TMA
      // instead (produce), and the consumers go on.
      if constexpr (kConsumers == 1) {
        __syncwarp();
        constexpr int kPieces = D / 8, kWarpRows = kHalf ? 8 : 16;  // per row; the warp's rows
#pragma unroll
        for (int k = 0; k < kWarpRows * kPieces / kWarp; ++k) {
          const int g = k * kWarp + lane, row = g / kPieces, cp = g % kPieces;
          const uint4 val = *reinterpret_cast<const uint4*>(
              sm.q[q_slot][cp / 8] + (cw * 64 + 16 * wq + row) * kRowBytes +
              ((cp % 8) ^ (row % 8)) * 16);
          const unsigned r = wg_row0 + kWarpRows * wq + row;
          if (r < rows) {
            const int64_t i = r >> w.log2_pack, head = (it.hs << w.log2_pack) + (r & pack_mask);
            T* dst = static_cast<T*>(p.o) + it.b * p.o_batch_stride + i * p.o_seq_stride +
                     head * p.o_head_stride + cp * 8;
            *reinterpret_cast<uint4*>(dst) = val;
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      if (!active) break;
      const unsigned r = wg_row0 + r_in_wg + 8 * h;
      const int64_t i = r >> w.log2_pack, head = (it.hs << w.log2_pack) + (r & pack_mask);
      const int64_t row = (it.b * p.hq + head) * p.sq + i;  // LSE index, partials' row
      if (w.num_splits == 1) {
        if (p.lse != nullptr && lane % 4 == 0 && r < rows) p.lse[row] = lse[h];
      } else if (r < rows) {
        float* part = w.o_partial + (it.split * n_rows + row) * D;
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb)
          *reinterpret_cast<float2*>(part + 8 * nb + quad_col) =
              make_float2(o[4 * nb + 2 * h] * inv[h], o[4 * nb + 2 * h + 1] * inv[h]);
        if (lane % 4 == 0) w.lse_partial[it.split * n_rows + row] = lse[h];
      }
    }
    // The slot goes back to the producer when every consumer warp has read its rows (an
    // arrival releases the warp's earlier reads and writes); in the large CTA with its O, whose
    // writes the fence orders before the TMA store's reads.
    if constexpr (kConsumers > 1) fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) mbarrier_arrive(kConsumers > 1 ? &sm.o_full[q_slot] : &sm.q_empty[q_slot]);

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
  // The last warpgroup's last turn handed one to warpgroup 0 that no item takes: take it, so that
  // no arrival is left on the barrier.
  if constexpr (kConsumers > 1)
    if (cw == 0) named_barrier_sync(2, 2 * kWarpGroup);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// grid = min(work items, resident CTAs); warpgroup 0 produces, the others consume. Each CTA takes
// one item per round (item_of_round): the producer and the consumers walk the same list.
template <typename T, int D, int C, int R>
__global__ void __launch_bounds__(Tile<D, C, R>::kThreads, 1)
    overlap_kernel(const __grid_constant__ Maps<(C > 1)> maps, const AttnParams p, const Work w) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  // Dynamic shared memory is only 16-byte aligned; the swizzled tiles need 1024.
  Smem<D, C, R>& sm = *reinterpret_cast<Smem<D, C, R>*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int warp = __shfl_sync(kFullMask, static_cast<int>(threadIdx.x) / kWarp, 0);
  const int lane = threadIdx.x % kWarp;
  if (threadIdx.x == 0) {
    // The tensor maps' first use would fetch them from memory: start that now.
    prefetch_tensor_map(&maps.q);
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    if constexpr (C > 1) prefetch_tensor_map(&maps.o);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&sm.q_full[s], 1);  // the producer's arrive_expect_tx, then the bytes
      // One arrival per consumer warp, on q_empty, or in the large CTA on o_full.
      mbarrier_init(C > 1 ? &sm.o_full[s] : &sm.q_empty[s], C * 4);
    }
    for (int s = 0; s < Tile<D, C, R>::kStages; ++s) {
      mbarrier_init(&sm.k_full[s], 1);
      mbarrier_init(&sm.v_full[s], 1);
      mbarrier_init(&sm.k_empty[s], Tile<D, C, R>::kConsumers * 4);
      mbarrier_init(&sm.v_empty[s], Tile<D, C, R>::kConsumers * 4);
    }
    fence_barrier_init();
  }
  __syncthreads();
  // Programmatic dependent launch: what comes before the producer's first copy may run while the
  // previous launch in the stream drains: the barriers, the register split, the first item's
  // decoding. Only the producer reads the inputs, so only it waits for that launch to finish,
  // just before its first copy. The consumers read and write memory only after a copy of it has
  // landed, so after that launch too. Past these points (the producer's wait, the consumers'
  // start; the other threads exit) the next launch may start its own prologue.
  if (warp / 4 == 0) {
    setmaxnreg_dec<Tile<D, C, R>::kProducerRegs>();
    if (warp == 0 && lane == 0) produce<D, C, R>(maps, p, w, sm);
  } else {
    cudaTriggerProgrammaticLaunchCompletion();
    setmaxnreg_inc<Tile<D, C, R>::kConsumerRegs>();
    consume<T, D, C, R>(p, w, sm, warp / 4 - 1, warp % 4, lane);
  }
#endif
}

using Kernel = const void*;  // overlap_kernel: Maps<C > 1>, AttnParams, Work

// The CTAs: the large one; the large one with two consumer warpgroups at any D, for short heads
// and, with the causal mask, heads of under 4096 rows (at D = 64 blocks of 128 rows instead of 192
// leave less to padding, or to the diagonal's masked tiles); the small one (one consumer
// warpgroup) and the half one (one consumer warpgroup of 32 rows).
enum class Cta { large, large2, small, half };

template <typename T, int D>
Kernel select_kernel(Cta cta) {
  if (cta == Cta::half) return reinterpret_cast<Kernel>(overlap_kernel<T, D, 1, 32>);
  if (cta == Cta::large2) return reinterpret_cast<Kernel>(overlap_kernel<T, D, 2, 64>);
  return cta == Cta::small ? reinterpret_cast<Kernel>(overlap_kernel<T, D, 1, 64>)
                           : reinterpret_cast<Kernel>(overlap_kernel<T, D, kLargeConsumers<D>, 64>);
}
Kernel select_kernel(const AttnParams& p, Cta cta) {
  if (p.dtype == DType::f16)
    return p.d == 64 ? select_kernel<__half, 64>(cta) : select_kernel<__half, 128>(cta);
  return p.d == 64 ? select_kernel<__nv_bfloat16, 64>(cta)
                   : select_kernel<__nv_bfloat16, 128>(cta);
}

// The CTA's shape for p's head dimension, for the host. smem: the layout plus the slack for
// aligning it to 1024 bytes (dynamic shared memory is only 16-byte aligned).
struct TileInfo {
  int consumers, threads, br, bc, stages;
  size_t smem;
};
template <int D, int C, int R>
TileInfo tile_info() {
  using Cfg = Tile<D, C, R>;
  return {Cfg::kConsumers, Cfg::kThreads, Cfg::kBr,
          Cfg::kBc,        Cfg::kStages,  sizeof(Smem<D, C, R>) + 1024};
}
TileInfo tile_of(const AttnParams& p, Cta cta) {
  if (cta == Cta::half) return p.d == 64 ? tile_info<64, 1, 32>() : tile_info<128, 1, 32>();
  if (cta == Cta::small) return p.d == 64 ? tile_info<64, 1, 64>() : tile_info<128, 1, 64>();
  if (cta == Cta::large2) return p.d == 64 ? tile_info<64, 2, 64>() : tile_info<128, 2, 64>();
  return p.d == 64 ? tile_info<64, kLargeConsumers<64>, 64>()
                   : tile_info<128, kLargeConsumers<128>, 64>();
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
  auto configure = [&](Cta cta, Launch* l) -> Status {
    l->tile = tile_of(p, cta);
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
    l->kernel = select_kernel(p, cta);
    l->smem = l->tile.smem;
    if (l->smem > device->smem_per_block_optin)
      return Status::Error(std::string("stage ") + kStageName + " needs " +
                           std::to_string(l->smem) +
                           " bytes of shared memory per CTA, the device allows " +
                           std::to_string(device->smem_per_block_optin));
    int ctas_per_sm = 0;
    ATTN_TRY(resident_ctas_per_sm(l->kernel, l->tile.threads,
                                  l->smem, &ctas_per_sm));
    l->slots = static_cast<int64_t>(std::min(ctas_per_sm, kMaxCtasPerSm)) * device->sm_count;
    l->work.log2_pack = log2_pack;
    l->work.q_blocks = static_cast<int>((rows + kBr - 1) / kBr);
    l->sm_count = device->sm_count;
    return Status::Ok();
  };
  Launch large, small, half;
  // On heads of at most 128 rows (the sweep), and with the causal mask on heads of under 4096, the
  // large CTA has two consumer warpgroups: at D = 64 a block of 192 rows would leave the third
  // only padding, or more of the diagonal's masked tiles than blocks of 128.
  const bool two = (p.causal && p.sq * group < 4096) || p.sq * group <= 128;
  ATTN_TRY(configure(two ? Cta::large2 : Cta::large, &large));
  ATTN_TRY(configure(Cta::small, &small));
  ATTN_TRY(configure(Cta::half, &half));
  auto unsplit_of = [&](const Launch& l) {
    return int64_t{l.work.q_blocks} * (p.hq >> l.work.log2_pack) * p.b;
  };
  // The large CTA when its grid fills most of one wave (80%, as for splitting); else the small one
  // when its grid fits in one wave, or rather the half one (below); else the large one (a few long
  // items, not two rounds of short). The half CTA when it packs as many heads as the small one
  // and has as many items (blocks of at most 32 rows, as in decode: the same copies, half the
  // softmax), or twice as many in at most half a wave: those read each K/V tile twice, which only
  // a grid far from the memory's bandwidth pays for with the shorter softmax.
  const bool use_large =
      unsplit_of(large) * 10 >= large.slots * 8 || unsplit_of(small) > small.slots;
  const bool use_half =
      half.work.log2_pack == small.work.log2_pack &&
      (unsplit_of(half) == unsplit_of(small) || unsplit_of(half) * 2 <= half.slots);
  Launch l = use_large ? large : use_half ? half : small;
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
  out->kernel = l.kernel;
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
Status encode_maps(const AttnParams& p, const TileInfo& tile, int log2_pack, Maps<true>* maps) {
  const uint64_t e = 2, pack = uint64_t{1} << log2_pack;
  const uint64_t q_dims[5] = {static_cast<uint64_t>(p.d), pack, static_cast<uint64_t>(p.sq),
                              static_cast<uint64_t>(p.hq) / pack, static_cast<uint64_t>(p.b)};
  const uint64_t q_strides[4] = {p.q_head_stride * e, p.q_seq_stride * e,
                                 pack * p.q_head_stride * e, p.q_batch_stride * e};
  const uint32_t q_box[5] = {kCols, static_cast<uint32_t>(pack),
                             static_cast<uint32_t>(tile.br / pack), 1, 1};
  ATTN_TRY(encode_tensor_map(&maps->q, p.q, p.dtype, 5, q_dims, q_strides, q_box, "q"));
  if (tile.consumers > 1) {  // the large CTA stores O by TMA, in Q's boxes
    const uint64_t o_strides[4] = {p.o_head_stride * e, p.o_seq_stride * e,
                                   pack * p.o_head_stride * e, p.o_batch_stride * e};
    ATTN_TRY(encode_tensor_map(&maps->o, p.o, p.dtype, 5, q_dims, o_strides, q_box, "o"));
  }
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
  Maps<true> maps;
  ATTN_TRY(encode_maps(p, l.tile, l.work.log2_pack, &maps));
  Maps<false> maps_qkv{maps.q, maps.k, maps.v};
  AttnParams kp = p;
  kp.scale = effective_scale(p) * kLog2e;  // scores in log2 units: exp(x) = exp2(x log2 e)
  Work w = l.work;
  char* base = static_cast<char*>(ws.ptr);
  w.arrivals = reinterpret_cast<int*>(base);
  w.o_partial = reinterpret_cast<float*>(base + layout.o_partial);
  w.lse_partial = reinterpret_cast<float*>(base + layout.lse_partial);
  // Launched with programmatic stream serialization: the kernel's prologue may overlap the end of
  // the previous kernel in the stream (or graph), which the kernel waits for before its loads.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(l.ctas));
  config.blockDim = dim3(l.tile.threads);
  config.dynamicSmemBytes = l.smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  void* args[] = {l.tile.consumers > 1 ? static_cast<void*>(&maps) : &maps_qkv, &kp, &w};
  const cudaError_t err = cudaLaunchKernelExC(&config, l.kernel, args);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::Error(std::string("stage ") + kStageName +
                         ": CUDA error during launch: " + cudaGetErrorString(err));
  }
  trace::dump(kStageName, stream);  // a -DATTN_TRACE build's timeline, else nothing
  return check_launch(kStageName);
}

}  // namespace

StageInfo stage_07_overlap() {
  StageInfo s;
  s.name = kStageName;
  s.description =
      "overlap: warpgroups take turns (pingpong), the next S during the softmax, launches (PDL)";
  s.min_sm = kMinSm;
  s.launch = launch;
  s.plan = plan;
  s.workspace_bytes = workspace_bytes;
  return s;
}

}  // namespace attn
