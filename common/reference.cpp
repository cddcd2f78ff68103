#include "reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

namespace attn {

std::vector<int64_t> all_rows(const ProblemShape& s) {
  std::vector<int64_t> rows(static_cast<size_t>(s.b * s.hq * s.sq));
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int64_t>(r);
  return rows;
}

std::vector<int64_t> rows_to_check(const ProblemShape& s, double max_work, size_t max_rows, uint64_t seed) {
  const int64_t n_rows = s.b * s.hq * s.sq;
  const double work = static_cast<double>(n_rows) * s.sk * s.d;
  if (work <= max_work || static_cast<size_t>(n_rows) <= max_rows) return all_rows(s);
  std::vector<int64_t> rows = {0, s.sq - 1, n_rows - s.sq, n_rows - 1};  // edges of first/last head
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, n_rows - 1);
  while (rows.size() < max_rows) rows.push_back(pick(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

namespace {

void reference_row(const HostInputs& in, int64_t row, double* o, double* lse) {
  const ProblemShape& s = in.shape;
  const int64_t i = row % s.sq, h = (row / s.sq) % s.hq, b = row / (s.sq * s.hq);
  const int64_t h_kv = h / (s.hq / s.hkv);
  const double scale = s.scale != 0.0f ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.d));
  const float* q = in.q.data() + ((b * s.hq + h) * s.sq + i) * s.d;
  const float* k = in.k.data() + (b * s.hkv + h_kv) * s.sk * s.d;
  const float* v = in.v.data() + (b * s.hkv + h_kv) * s.sk * s.d;
  const int64_t n_keys = visible_keys(s, i);

  std::fill(o, o + s.d, 0.0);
  if (n_keys == 0) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  std::vector<double> scores(static_cast<size_t>(n_keys));
  double row_max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n_keys; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < s.d; ++d) dot += static_cast<double>(q[d]) * k[j * s.d + d];
    scores[j] = scale * dot;
    row_max = std::max(row_max, scores[j]);
  }
  double row_sum = 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    const double p = std::exp(scores[j] - row_max);  // max-subtracted: no overflow
    row_sum += p;
    for (int64_t d = 0; d < s.d; ++d) o[d] += p * v[j * s.d + d];
  }
  for (int64_t d = 0; d < s.d; ++d) o[d] /= row_sum;
  *lse = row_max + std::log(row_sum);
}

}  // namespace

ReferenceOutput reference_attention(const HostInputs& in, const std::vector<int64_t>& rows) {
  ReferenceOutput out;
  out.rows = rows;
  out.o.assign(rows.size() * static_cast<size_t>(in.shape.d), 0.0);
  out.lse.assign(rows.size(), 0.0);
  const unsigned n_threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t n = next++; n < rows.size(); n = next++) {
      reference_row(in, rows[n], out.o.data() + n * in.shape.d, &out.lse[n]);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < n_threads && rows.size() > 64; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  return out;
}

}  // namespace attn
