/// @file problem.h
/// @brief A problem's data on the device (inputs, outputs, strides) and its host copies.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "buffer.h"
#include "params.h"
#include "shapes.h"
#include "status.h"

namespace attn {

/// Inputs copied back to the host as fp32 (exact: every fp16/bf16 value is a float),
/// in canonical order whatever the device layout: q [B][Hq][Sq][D], k and v [B][Hkv][Sk][D].
struct HostInputs {
  ProblemShape shape;    ///< the problem these came from
  std::vector<float> q;  ///< [B][Hq][Sq][D]
  std::vector<float> k;  ///< [B][Hkv][Sk][D]
  std::vector<float> v;  ///< [B][Hkv][Sk][D]
};

/// Outputs copied back to the host, canonical order. Row r = (b*Hq + h)*Sq + i.
struct HostOutput {
  std::vector<float> o;      ///< [B][Hq][Sq][D]; an element never written reads NaN
  std::vector<float> lse;    ///< [B][Hq][Sq]; empty when the problem has no LSE output
  int64_t o_unwritten = 0;   ///< elements of O still holding the poison pattern
  int64_t lse_unwritten = 0; ///< elements of LSE still holding the poison pattern
  int64_t padding_written = 0;  ///< elements of O's stride padding that were overwritten
};

/// The poison written before every run: all bytes 0xFF, a NaN in fp16, bf16 and fp32 whose
/// pattern (0xFFFF) no float-to-half conversion produces, so it also marks unwritten elements.
constexpr unsigned char kPoisonByte = 0xFF;

/// Q, K, V, O (and LSE) on the device for one shape, in one or more independent input sets.
class Problem {
 public:
  /// Allocate @p input_sets copies of the tensors for @p shape (layout and padding included).
  static Status create(const ProblemShape& shape, int input_sets, bool with_lse, Problem* out);

  /// The shape this problem was created with.
  const ProblemShape& shape() const { return shape_; }
  /// Number of independent input sets.
  int input_sets() const { return static_cast<int>(sets_.size()); }
  /// Pointers and strides of input set @p set, ready for a stage's launch.
  AttnParams params(int set = 0) const;

  /// Fill Q, K and V of every set with normal(0,1) values (cuRAND Philox, seeded by @p seed).
  Status fill_random(uint64_t seed, cudaStream_t stream = nullptr);
  /// Write the poison pattern over every byte of O (padding included) and LSE of every set.
  Status poison_outputs(cudaStream_t stream = nullptr);
  /// Copy set @p set's inputs to the host in canonical order.
  Status download_inputs(HostInputs* out, int set = 0) const;
  /// Copy set @p set's outputs to the host in canonical order, counting unwritten elements.
  Status download_output(HostOutput* out, int set = 0) const;

 private:
  struct Strides {
    int64_t batch = 0, seq = 0, head = 0, elems = 0;  // elems: whole allocation
  };
  struct Set {
    DeviceBuffer q, k, v, o, lse;
  };
  static Strides strides_for(const ProblemShape& s, int64_t seq_len, int64_t heads);

  ProblemShape shape_;
  Strides q_, kv_, o_;
  bool with_lse_ = true;
  std::vector<Set> sets_;
};

}  // namespace attn
