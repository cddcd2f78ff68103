/// @file shapes.h
/// @brief Problem shapes, the FLOP and byte formulas, and the named shape suite (README, "The contract").
///
/// This is the one list of shapes: the tests, the benchmarks, the runner and (through
/// `attn_runner --list-shapes`) the peers' script all read it from here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "params.h"
#include "status.h"

namespace attn {

/// Everything about a problem except its data.
struct ProblemShape {
  int64_t b = 1;    ///< batch
  int64_t hq = 1;   ///< query heads
  int64_t hkv = 1;  ///< key/value heads
  int64_t sq = 1;   ///< query length
  int64_t sk = 1;   ///< key length
  int64_t d = 64;   ///< head dimension
  DType dtype = DType::f16;       ///< element type
  bool causal = false;            ///< bottom-right aligned causal mask
  Layout layout = Layout::BSHD;   ///< memory order used to build the strides
  float scale = 0.0f;             ///< 0 selects 1/sqrt(d)
  int64_t seq_pad = 0;            ///< extra elements after each sequence row (tests strides)
};

/// "B1 Hq1 Hkv1 Sq128 Sk128 D64 fp16 BSHD" plus " causal" when causal.
std::string describe(const ProblemShape& s);

/// Check a shape before anything is allocated for it: validate_sizes()'s rules (sizes >= 1,
/// Hq a multiple of Hkv, D 64 or 128, dtype, finite scale), the layout, a padding that keeps
/// rows 16-byte aligned, and a total size that fits in 64-bit offsets.
/// @return an error naming the first offending field and its value.
Status validate_shape(const ProblemShape& s);

/// Number of keys query row @p i sees (0 for an empty row): all Sk, or with the bottom-right
/// causal mask min(Sk, max(0, i + Sk - Sq + 1)).
int64_t visible_keys(const ProblemShape& s, int64_t i);

/// The FLOP count of the results: 4*B*Hq*Sq*Sk*D, halved for causal with Sq == Sk. For causal with
/// Sq != Sk (not in the suite) the exact count of visible (row, key) pairs replaces Sq*Sk.
double attention_flops(const ProblemShape& s);

/// The byte count of the results: Q, K, V read once plus O written once (LSE not counted).
double attention_bytes(const ProblemShape& s);

/// Which part of the suite a shape belongs to.
enum class ShapeKind { seed, prefill, decode, sweep };

/// "seed", "prefill", "decode" or "sweep".
std::string to_string(ShapeKind kind);

/// A shape of the suite with its name.
struct NamedShape {
  std::string name;     ///< e.g. "prefill_d128_s4096_causal"
  ShapeKind kind;       ///< seed, prefill, decode or sweep
  ProblemShape shape;   ///< sizes and settings
  bool graph = false;   ///< latency-bound: time a CUDA graph of launches
};

/// The suite: `seed`, `prefill_d{64,128}_s{512..16384}[_causal]`, `decode_b{1,8}_sk{4096,32768,131072}`,
/// and the parallelism sweep `sweep_bh{1,2,4,...,256}` (the seed shape with B*H = N heads).
const std::vector<NamedShape>& shape_suite();

/// Look up a shape of the suite by name; the error lists the valid names.
Status find_shape(const std::string& name, const NamedShape** out);

/// How many independent input sets a benchmark rotates through so that back-to-back launches
/// do not simply re-read the L2: enough to cover twice the L2, at most 16.
int input_sets_for(double bytes, size_t l2_bytes);

/// The suite as JSON for tools/peers.py: name, kind, sizes, dtype, causal, layout, the scale
/// applied, graph, flops, bytes and input_sets (for a GPU with @p l2_bytes of L2).
std::string shapes_json(const std::vector<NamedShape>& shapes, size_t l2_bytes);

}  // namespace attn
