/// @file compare.h
/// @brief Error metrics of a stage's output against the fp64 reference or another stage.
#pragma once

#include <cstdint>
#include <string>

#include "problem.h"
#include "reference.h"

namespace attn {

/// How far an output is from what it should be. NaN-aware: a NaN anywhere fails the check.
struct ErrorStats {
  int64_t elements = 0;       ///< elements of O compared
  double rel_l2 = 0;          ///< ||O - O_ref||_2 / ||O_ref||_2 (absolute when ||O_ref|| = 0)
  double max_abs = 0;         ///< max |O - O_ref| over finite elements
  int64_t nan = 0;            ///< non-finite elements of O (unwritten ones included)
  int64_t unwritten = 0;      ///< elements of O still holding the poison
  int64_t padding_written = 0;  ///< elements written outside O's logical extent
  bool lse_checked = false;   ///< whether LSE was compared
  double lse_max_abs = 0;     ///< max |LSE - LSE_ref|; infinite when exactly one of them is -inf
  int64_t lse_nan = 0;        ///< NaN elements of LSE (unwritten ones included)
};

/// The contract's relative-L2 bound: 2e-3 for fp16, 1e-2 for bf16.
double rel_tolerance(DType dtype);
/// The contract's bound on |LSE - LSE_ref|.
constexpr double kLseTolerance = 1e-3;

/// True when @p e meets the accuracy contract for @p dtype.
bool passes(const ErrorStats& e, DType dtype);
/// "rel 1.2e-03 max 3.1e-03 lse 2.0e-06" plus any NaN / unwritten counts.
std::string describe(const ErrorStats& e);

/// Compare a stage's output with the fp64 reference on the reference's rows.
ErrorStats compare_with_reference(const HostOutput& got, const ReferenceOutput& ref, const ProblemShape& shape);
/// Compare a stage's output with another stage's (the baseline) on every row.
ErrorStats compare_outputs(const HostOutput& got, const HostOutput& baseline, const ProblemShape& shape);

}  // namespace attn
