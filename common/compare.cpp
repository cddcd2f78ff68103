#include "compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace attn {

double rel_tolerance(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 2e-3; }

bool passes(const ErrorStats& e, DType dtype) {
  return e.nan == 0 && e.unwritten == 0 && e.padding_written == 0 && e.rel_l2 <= rel_tolerance(dtype) &&
         (!e.lse_checked || (e.lse_nan == 0 && e.lse_max_abs <= kLseTolerance));
}

std::string describe(const ErrorStats& e) {
  char buf[256];
  int n = std::snprintf(buf, sizeof buf, "rel %.2e  max_abs %.2e", e.rel_l2, e.max_abs);
  if (e.lse_checked) n += std::snprintf(buf + n, sizeof buf - n, "  lse %.2e", e.lse_max_abs);
  if (e.nan) n += std::snprintf(buf + n, sizeof buf - n, "  NaN %lld", static_cast<long long>(e.nan));
  if (e.unwritten) n += std::snprintf(buf + n, sizeof buf - n, "  unwritten %lld", static_cast<long long>(e.unwritten));
  if (e.padding_written)
    n += std::snprintf(buf + n, sizeof buf - n, "  padding-written %lld", static_cast<long long>(e.padding_written));
  if (e.lse_nan) std::snprintf(buf + n, sizeof buf - n, "  lse-NaN %lld", static_cast<long long>(e.lse_nan));
  return buf;
}

namespace {

// Accumulates the metrics one element at a time.
struct Accumulator {
  ErrorStats e;
  double diff2 = 0, ref2 = 0;

  void add_o(double got, double want) {
    ++e.elements;
    if (!std::isfinite(got)) {
      ++e.nan;
      return;
    }
    const double diff = got - want;
    diff2 += diff * diff;
    ref2 += want * want;
    e.max_abs = std::max(e.max_abs, std::fabs(diff));
  }
  void add_lse(double got, double want) {
    e.lse_checked = true;
    if (std::isnan(got)) {
      ++e.lse_nan;
      return;
    }
    const bool got_empty = std::isinf(got) && got < 0, want_empty = std::isinf(want) && want < 0;
    const double err = got_empty && want_empty ? 0.0
                       : got_empty != want_empty ? std::numeric_limits<double>::infinity()
                                                 : std::fabs(got - want);
    e.lse_max_abs = std::max(e.lse_max_abs, err);
  }
  ErrorStats finish(const HostOutput& got) {
    e.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    if (e.nan > 0) e.rel_l2 = std::numeric_limits<double>::infinity();
    e.unwritten = got.o_unwritten;
    e.padding_written = got.padding_written;
    // Unwritten LSE elements read as NaN and are counted there; a missing row of the sample
    // must not hide them, so count over the whole tensor.
    e.lse_nan = std::max<int64_t>(e.lse_nan, got.lse_unwritten);
    return e;
  }
};

}  // namespace

ErrorStats compare_with_reference(const HostOutput& got, const ReferenceOutput& ref, const ProblemShape& shape) {
  Accumulator acc;
  for (size_t n = 0; n < ref.rows.size(); ++n) {
    const int64_t row = ref.rows[n];
    for (int64_t d = 0; d < shape.d; ++d) acc.add_o(got.o[row * shape.d + d], ref.o[n * shape.d + d]);
    if (!got.lse.empty()) acc.add_lse(got.lse[row], ref.lse[n]);
  }
  return acc.finish(got);
}

ErrorStats compare_outputs(const HostOutput& got, const HostOutput& baseline, const ProblemShape& shape) {
  Accumulator acc;
  const size_t n_rows = static_cast<size_t>(shape.b * shape.hq * shape.sq);
  for (size_t n = 0; n < n_rows * shape.d; ++n) acc.add_o(got.o[n], baseline.o[n]);
  if (!got.lse.empty() && !baseline.lse.empty())
    for (size_t n = 0; n < n_rows; ++n) acc.add_lse(got.lse[n], baseline.lse[n]);
  return acc.finish(got);
}

}  // namespace attn
