/// @file reference.h
/// @brief The CPU fp64 reference every stage is checked against.
#pragma once

#include <cstdint>
#include <vector>

#include "problem.h"
#include "shapes.h"

namespace attn {

/// Reference outputs for a list of query rows (row r = (b*Hq + h)*Sq + i).
struct ReferenceOutput {
  std::vector<int64_t> rows;  ///< the rows computed
  std::vector<double> o;      ///< [rows.size()][D]
  std::vector<double> lse;    ///< [rows.size()], natural log; -inf for a row with no visible key
};

/// Every row of @p s, in order.
std::vector<int64_t> all_rows(const ProblemShape& s);

/// The rows worth checking: all of them when the fp64 work (B*Hq*Sq*Sk*D) is at most
/// @p max_work, otherwise a reproducible sample of @p max_rows rows that always includes the
/// first and last row of the first and last (batch, head).
std::vector<int64_t> rows_to_check(const ProblemShape& s, double max_work = 4.0e9, size_t max_rows = 2048,
                                   uint64_t seed = 1);

/// The contract's attention in fp64 for the given rows: S = scale*Q*K^T with the bottom-right causal
/// mask, P = softmax(S) with the row maximum subtracted, O = P*V, LSE = log(sum exp(S)).
/// A row with no visible key gets O = 0 and LSE = -inf. Runs on all hardware threads.
ReferenceOutput reference_attention(const HostInputs& in, const std::vector<int64_t>& rows);

}  // namespace attn
