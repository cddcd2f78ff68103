// Tests that need no GPU: the fp64 reference against closed forms, validation of bad input,
// the FLOP and byte formulas, the shape suite, the comparison metrics, the registry, and the
// command lines of the programs (run here with bad flags, which they refuse before any GPU work).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "compare.h"
#include "fastdiv.h"
#include "flags.h"
#include "params.h"
#include "reference.h"
#include "registry.h"
#include "programs.h"
#include "shapes.h"

using namespace attn;

namespace {

// Host inputs of the given sizes, filled by a deterministic pseudo-random sequence.
HostInputs make_inputs(const ProblemShape& s, uint32_t seed = 1) {
  HostInputs in;
  in.shape = s;
  in.q.resize(static_cast<size_t>(s.b * s.hq * s.sq * s.d));
  in.k.resize(static_cast<size_t>(s.b * s.hkv * s.sk * s.d));
  in.v.resize(in.k.size());
  uint32_t x = seed * 2654435761u + 1;
  auto next = [&] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  };
  for (float& f : in.q) f = next();
  for (float& f : in.k) f = next();
  for (float& f : in.v) f = next();
  return in;
}

ProblemShape small_shape(int64_t sq, int64_t sk, bool causal = false) {
  ProblemShape s;
  s.b = 1, s.hq = 1, s.hkv = 1, s.sq = sq, s.sk = sk, s.d = 64, s.causal = causal;
  return s;
}

// Valid parameters pointing at fake, aligned addresses: validation never dereferences them.
AttnParams valid_params() {
  AttnParams p;
  p.q = reinterpret_cast<const void*>(0x10000);
  p.k = reinterpret_cast<const void*>(0x20000);
  p.v = reinterpret_cast<const void*>(0x30000);
  p.o = reinterpret_cast<void*>(0x40000);
  p.b = 2, p.hq = 8, p.hkv = 2, p.sq = 16, p.sk = 16, p.d = 64;
  p.q_seq_stride = p.o_seq_stride = p.hq * p.d;
  p.q_batch_stride = p.o_batch_stride = p.sq * p.q_seq_stride;
  p.k_seq_stride = p.v_seq_stride = p.hkv * p.d;
  p.k_batch_stride = p.v_batch_stride = p.sk * p.k_seq_stride;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = p.d;
  return p;
}

std::string error_of(const AttnParams& p) {
  const Status s = validate_params(p);
  return s.ok() ? "ok" : s.message();
}

}  // namespace

TEST_CASE("reference: all keys equal gives the mean of V") {
  ProblemShape s = small_shape(3, 7);
  HostInputs in = make_inputs(s);
  for (int64_t j = 1; j < s.sk; ++j)
    for (int64_t d = 0; d < s.d; ++d) in.k[j * s.d + d] = in.k[d];
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  for (int64_t i = 0; i < s.sq; ++i)
    for (int64_t d = 0; d < s.d; ++d) {
      double mean = 0;
      for (int64_t j = 0; j < s.sk; ++j) mean += in.v[j * s.d + d];
      CHECK(ref.o[i * s.d + d] == doctest::Approx(mean / s.sk).epsilon(1e-12));
    }
}

TEST_CASE("reference: one dominant score selects that V row") {
  ProblemShape s = small_shape(1, 8);
  HostInputs in = make_inputs(s);
  std::fill(in.k.begin(), in.k.end(), 0.0f);
  std::fill(in.q.begin(), in.q.end(), 0.0f);
  for (int64_t j = 0; j < s.sk; ++j) in.k[j * s.d + j] = 30.0f;  // k_j = 30 e_j
  in.q[5] = 30.0f;                                               // q = 30 e_5: score 900/8 on key 5, 0 elsewhere
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  for (int64_t d = 0; d < s.d; ++d) CHECK(ref.o[d] == doctest::Approx(in.v[5 * s.d + d]).epsilon(1e-12));
}

TEST_CASE("reference: the first causal row (Sq == Sk) is V[0]") {
  ProblemShape s = small_shape(9, 9, /*causal=*/true);
  HostInputs in = make_inputs(s);
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  for (int64_t d = 0; d < s.d; ++d) CHECK(ref.o[d] == doctest::Approx(in.v[d]).epsilon(1e-12));
  double dot = 0;  // the only score of row 0: LSE = scale * q0.k0 with the default scale 1/8
  for (int64_t d = 0; d < s.d; ++d) dot += static_cast<double>(in.q[d]) * in.k[d];
  CHECK(ref.lse[0] == doctest::Approx(dot / 8.0).epsilon(1e-6));
}

TEST_CASE("reference: LSE of uniform scores is log(Sk) + score") {
  ProblemShape s = small_shape(2, 100);
  s.scale = 0.5f;
  HostInputs in = make_inputs(s);
  std::fill(in.k.begin(), in.k.end(), 0.25f);
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  for (int64_t i = 0; i < s.sq; ++i) {
    double dot = 0;
    for (int64_t d = 0; d < s.d; ++d) dot += 0.25 * in.q[i * s.d + d];
    CHECK(ref.lse[i] == doctest::Approx(std::log(100.0) + 0.5 * dot).epsilon(1e-12));
  }
}

TEST_CASE("reference: bottom-right causal mask, empty rows and decode") {
  SUBCASE("Sq > Sk: the first Sq - Sk rows see no key: O = 0, LSE = -inf") {
    ProblemShape s = small_shape(10, 4, /*causal=*/true);
    HostInputs in = make_inputs(s);
    const ReferenceOutput ref = reference_attention(in, all_rows(s));
    for (int64_t i = 0; i < s.sq; ++i) {
      CHECK(visible_keys(s, i) == std::max<int64_t>(0, i - 5));
      if (i < 6) {
        CHECK(std::isinf(ref.lse[i]));
        CHECK(ref.lse[i] < 0);
        for (int64_t d = 0; d < s.d; ++d) CHECK(ref.o[i * s.d + d] == 0.0);
      } else {
        CHECK(std::isfinite(ref.lse[i]));
      }
    }
    // row 6 sees exactly key 0
    for (int64_t d = 0; d < s.d; ++d) CHECK(ref.o[6 * s.d + d] == doctest::Approx(in.v[d]).epsilon(1e-12));
  }
  SUBCASE("Sq == 1 (decode) sees every key, causal or not") {
    ProblemShape causal = small_shape(1, 50, true), full = small_shape(1, 50, false);
    CHECK(visible_keys(causal, 0) == 50);
    HostInputs in = make_inputs(causal);
    const ReferenceOutput a = reference_attention(in, all_rows(causal));
    in.shape = full;
    const ReferenceOutput b = reference_attention(in, all_rows(full));
    CHECK(a.o == b.o);
    CHECK(a.lse == b.lse);
  }
  SUBCASE("last row sees every key when Sq < Sk") {
    ProblemShape s = small_shape(3, 10, true);
    CHECK(visible_keys(s, 2) == 10);
    CHECK(visible_keys(s, 0) == 8);
  }
}

TEST_CASE("reference: grouped-query heads read kv head h / (Hq / Hkv)") {
  ProblemShape s = small_shape(2, 5);
  s.hq = 6, s.hkv = 2;
  HostInputs in = make_inputs(s);
  // V of kv head g is the constant g + 1, so every query head's output names its kv head.
  for (int64_t g = 0; g < s.hkv; ++g)
    for (int64_t n = 0; n < s.sk * s.d; ++n) in.v[g * s.sk * s.d + n] = static_cast<float>(g + 1);
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  for (int64_t h = 0; h < s.hq; ++h)
    for (int64_t i = 0; i < s.sq; ++i)
      CHECK(ref.o[((h * s.sq) + i) * s.d] == doctest::Approx(h / 3 + 1).epsilon(1e-12));
}

TEST_CASE("validation: every bad input named with its value") {
  CHECK(error_of(valid_params()) == "ok");
  struct BadCase {
    const char* what;
    void (*mutate)(AttnParams&);
    const char* message;
  };
  const BadCase cases[] = {
      {"null q", [](AttnParams& p) { p.q = nullptr; }, "q is null"},
      {"null k", [](AttnParams& p) { p.k = nullptr; }, "k is null"},
      {"null v", [](AttnParams& p) { p.v = nullptr; }, "v is null"},
      {"null o", [](AttnParams& p) { p.o = nullptr; }, "o is null"},
      {"B 0", [](AttnParams& p) { p.b = 0; }, "B (0) must be >= 1"},
      {"Hq -1", [](AttnParams& p) { p.hq = -1; }, "Hq (-1) must be >= 1"},
      {"Hkv 0", [](AttnParams& p) { p.hkv = 0; }, "Hkv (0) must be >= 1"},
      {"Sq 0", [](AttnParams& p) { p.sq = 0; }, "Sq (0) must be >= 1"},
      {"Sk -5", [](AttnParams& p) { p.sk = -5; }, "Sk (-5) must be >= 1"},
      {"D 0", [](AttnParams& p) { p.d = 0; }, "D (0) must be >= 1"},
      {"Hq % Hkv", [](AttnParams& p) { p.hq = 12, p.hkv = 5; }, "Hq (12) is not a multiple of Hkv (5)"},
      {"D 96", [](AttnParams& p) { p.d = 96; }, "D (96) is not supported: every stage supports 64 and 128"},
      {"dtype 7", [](AttnParams& p) { p.dtype = static_cast<DType>(7); },
       "dtype (7) is not supported: fp16 (0) and bf16 (1) are"},
      {"scale inf", [](AttnParams& p) { p.scale = std::numeric_limits<float>::infinity(); }, "scale (inf) is not finite"},
      {"k misaligned", [](AttnParams& p) { p.k = reinterpret_cast<const void*>(0x20002); },
       "k (0x20002) is not aligned to 16 bytes"},
      {"o misaligned", [](AttnParams& p) { p.o = reinterpret_cast<void*>(0x40008); },
       "o (0x40008) is not aligned to 16 bytes"},
      {"lse misaligned", [](AttnParams& p) { p.lse = reinterpret_cast<float*>(0x50004); },
       "lse (0x50004) is not aligned to 16 bytes"},
      {"q_seq_stride 100", [](AttnParams& p) { p.q_seq_stride = 100; },
       "q_seq_stride (100) is not a non-negative multiple of 8 elements"},
      {"v_head_stride -8", [](AttnParams& p) { p.v_head_stride = -8; },
       "v_head_stride (-8) is not a non-negative multiple of 8 elements"},
      {"o_batch_stride 12", [](AttnParams& p) { p.o_batch_stride = 12; },
       "o_batch_stride (12) is not a non-negative multiple of 8 elements"},
  };
  for (const BadCase& c : cases) {
    CAPTURE(c.what);
    AttnParams p = valid_params();
    c.mutate(p);
    CHECK(error_of(p) == c.message);
  }
}

TEST_CASE("validation: a stage on a GPU older than it needs is refused with both versions") {
  const Status s = check_compute_capability("06_warp_specialized", 90, 89);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message() == "stage 06_warp_specialized requires sm_90 or newer, found sm_89");
  CHECK(check_compute_capability("01_naive", 80, 90).ok());
}

TEST_CASE("validation: a too-small workspace is refused before the GPU is touched") {
  AttnParams p = valid_params();
  const Status s = validate_launch(p, "02_kv_split", 80, Workspace{nullptr, 0}, 4096);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message() == "workspace (0 bytes) is smaller than the 4096 bytes stage 02_kv_split needs");
}

TEST_CASE("every registered stage refuses bad input before touching the GPU") {
  // Runs without a GPU: if a stage launched anything, this would fail with a CUDA error
  // instead of the validation message.
  for (const StageInfo& stage : registered_stages()) {
    CAPTURE(stage.name);
    AttnParams p = valid_params();
    p.hq = 12, p.hkv = 5;
    const Status s = stage.launch(p, Workspace{}, nullptr);
    REQUIRE_FALSE(s.ok());
    CHECK(s.message() == "Hq (12) is not a multiple of Hkv (5)");
  }
}

TEST_CASE("registry: stages are described and out-of-range requests refused") {
  REQUIRE_FALSE(registered_stages().empty());
  std::set<std::string> names;
  for (const StageInfo& s : registered_stages()) {
    CAPTURE(s.name);
    CHECK(std::string(s.name).size() > 3);
    CHECK(std::string(s.description).size() > 10);
    CHECK(static_cast<bool>(s.launch));
    CHECK(static_cast<bool>(s.plan));
    CHECK(s.min_sm >= 80);
    names.insert(s.name);
  }
  CHECK(names.size() == registered_stages().size());
  CHECK(std::string(registered_stages().front().name) == "01_naive");
  const StageInfo* found = nullptr;
  CHECK(find_stage("01_naive", &found).ok());
  CHECK(found == &registered_stages().front());
  const Status missing = find_stage("99_missing", &found);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.message().find("stage '99_missing' is not registered") == 0);
  const int n = static_cast<int>(registered_stages().size());
  CHECK_FALSE(stage_at(n, &found).ok());
  CHECK_FALSE(stage_at(-1, &found).ok());
  CHECK(stage_at(-1, &found).message().find("stage index (-1) is out of range") == 0);
}

TEST_CASE("figures: FLOP and byte formulas") {
  const NamedShape* seed = nullptr;
  REQUIRE(find_shape("seed", &seed).ok());
  CHECK(attention_flops(seed->shape) == 4.0 * 128 * 128 * 64);
  CHECK(attention_bytes(seed->shape) == 2.0 * 4 * 128 * 64);
  ProblemShape causal = seed->shape;
  causal.causal = true;
  CHECK(attention_flops(causal) == 2.0 * 128 * 128 * 64);  // halved at Sq == Sk
  ProblemShape decode;
  decode.b = 8, decode.hq = 32, decode.hkv = 8, decode.sq = 1, decode.sk = 4096, decode.d = 128;
  CHECK(attention_flops(decode) == 4.0 * 8 * 32 * 1 * 4096 * 128);
  CHECK(attention_bytes(decode) == 2.0 * (2.0 * 8 * 32 * 128 + 2.0 * 8 * 4096 * 8 * 128));
  ProblemShape rect = small_shape(3, 10, true);  // causal, Sq != Sk: exact visible pairs 8 + 9 + 10
  CHECK(attention_flops(rect) == 4.0 * 64 * 27);
}

TEST_CASE("FastDiv: n / d by multiplication, for n <= 2^31 and d < 2^31") {
  const uint32_t kMax = (uint32_t{1} << 31) - 1;
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 6, 7, 8, 11, 32, 33, 100, 127, 128, 129, 641,
                                    65535, 65536, 65537, 1000003, (uint32_t{1} << 30) - 1,
                                    uint32_t{1} << 30, (uint32_t{1} << 30) + 1, kMax - 1, kMax};
  uint32_t x = 12345;  // a fixed xorshift sequence: more divisors and dividends
  auto next = [&] { x ^= x << 13, x ^= x >> 17, x ^= x << 5; return x & kMax; };
  for (int t = 0; t < 200; ++t) divisors.push_back(std::max<uint32_t>(1, next() >> (t % 31)));
  for (const uint32_t d : divisors) {
    const FastDiv f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, kMax - 1, kMax, kMax + 1};
    for (int t = 0; t < 200; ++t) ns.push_back(next() >> (t % 31));
    for (const uint32_t n : ns) {
      if (n > kMax + 1) continue;
      REQUIRE_MESSAGE(f.div(n) == n / d, "n = " << n << ", d = " << d);
    }
  }
}

TEST_CASE("shape suite: names and sizes") {
  const auto& suite = shape_suite();
  CHECK(suite.size() == 1 + 2 * 6 * 2 + 2 * 3 + 9);
  std::set<std::string> names;
  for (const NamedShape& ns : suite) {
    CAPTURE(ns.name);
    names.insert(ns.name);
    const ProblemShape& s = ns.shape;
    if (ns.kind == ShapeKind::prefill) {
      CHECK(s.b * s.sq == 16384);
      CHECK(s.hq * s.d == 2048);
      CHECK(s.hq == s.hkv);
      CHECK(s.sq == s.sk);
      CHECK(s.dtype == DType::bf16);
      CHECK(ns.name == "prefill_d" + std::to_string(s.d) + "_s" + std::to_string(s.sq) + (s.causal ? "_causal" : ""));
    } else if (ns.kind == ShapeKind::decode) {
      CHECK(s.sq == 1);
      CHECK(s.hq == 32);
      CHECK(s.hkv == 8);
      CHECK(s.d == 128);
      CHECK(ns.name == "decode_b" + std::to_string(s.b) + "_sk" + std::to_string(s.sk));
    } else if (ns.kind == ShapeKind::sweep) {
      CHECK(ns.name == "sweep_bh" + std::to_string(s.b * s.hq));
      CHECK(s.sq == 128);
      CHECK(ns.graph);
    }
  }
  CHECK(names.size() == suite.size());
  for (const char* n : {"seed", "prefill_d64_s512", "prefill_d128_s16384_causal", "decode_b1_sk131072",
                        "decode_b8_sk32768", "decode_b1_sk4096"}) {
    CHECK(names.count(n) == 1);
  }
  const NamedShape* seed = nullptr;
  REQUIRE(find_shape("seed", &seed).ok());
  CHECK(seed->shape.b == 1);
  CHECK(seed->shape.sq == 128);
  CHECK(seed->shape.d == 64);
  CHECK(seed->shape.dtype == DType::f16);
  CHECK_FALSE(seed->shape.causal);
  CHECK(seed->graph);
  CHECK(find_shape("nope", &seed).message().find("shape 'nope' is not in the suite") == 0);
  const std::string json = shapes_json(suite, 60u << 20);
  CHECK(json.find("\"name\": \"prefill_d128_s4096_causal\"") != std::string::npos);
  CHECK(json.find("\"input_sets\"") != std::string::npos);
}

TEST_CASE("input sets cover twice the L2, between 1 and 16") {
  CHECK(input_sets_for(1e9, 60u << 20) == 1);
  CHECK(input_sets_for(16.0 * 1048576, 60u << 20) == 8);
  CHECK(input_sets_for(1000, 60u << 20) == 16);
}

TEST_CASE("rows_to_check: all rows when cheap, a sample with the edges otherwise") {
  ProblemShape s = small_shape(100, 100);
  CHECK(rows_to_check(s).size() == 100);
  s.b = 4, s.hq = 16, s.sq = s.sk = 4096, s.d = 128, s.hkv = 16;
  const auto rows = rows_to_check(s);
  CHECK(rows.size() <= 2048);
  CHECK(rows.size() > 1000);
  CHECK(rows.front() == 0);
  CHECK(rows.back() == s.b * s.hq * s.sq - 1);
}

TEST_CASE("compare: the check fails on error, NaN, unwritten or padding-written output") {
  ProblemShape s = small_shape(4, 4);
  HostInputs in = make_inputs(s);
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  HostOutput got;
  got.o.assign(ref.o.begin(), ref.o.end());
  got.lse.assign(ref.lse.begin(), ref.lse.end());
  CHECK(passes(compare_with_reference(got, ref, s), DType::f16));

  HostOutput wrong = got;
  wrong.o[3] += 0.5f;
  CHECK_FALSE(passes(compare_with_reference(wrong, ref, s), DType::bf16));

  HostOutput nan = got;
  nan.o[7] = std::numeric_limits<float>::quiet_NaN();
  const ErrorStats e = compare_with_reference(nan, ref, s);
  CHECK(e.nan == 1);
  CHECK_FALSE(passes(e, DType::bf16));

  HostOutput unwritten = got;
  unwritten.o_unwritten = 1;
  CHECK_FALSE(passes(compare_with_reference(unwritten, ref, s), DType::bf16));

  HostOutput padding = got;
  padding.padding_written = 2;
  CHECK_FALSE(passes(compare_with_reference(padding, ref, s), DType::bf16));

  HostOutput lse = got;
  lse.lse[1] += 0.01f;
  CHECK_FALSE(passes(compare_with_reference(lse, ref, s), DType::bf16));
}

TEST_CASE("compare: empty rows must read O = 0 and LSE = -inf") {
  ProblemShape s = small_shape(6, 2, /*causal=*/true);
  HostInputs in = make_inputs(s);
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  HostOutput got;
  got.o.assign(ref.o.begin(), ref.o.end());
  got.lse.assign(ref.lse.begin(), ref.lse.end());
  CHECK(passes(compare_with_reference(got, ref, s), DType::f16));
  got.lse[0] = 0.0f;  // an empty row with a finite LSE
  CHECK_FALSE(passes(compare_with_reference(got, ref, s), DType::f16));
}

TEST_CASE("command line: shapes by name or by size, errors named") {
  CliOptions o;
  std::vector<std::string> rest;
  REQUIRE(parse_problem_flags({"--shape", "decode_b8_sk32768"}, &o, &rest).ok());
  CHECK(o.shape_name == "decode_b8_sk32768");
  CHECK(o.shape.b == 8);
  CHECK(o.shape.sk == 32768);
  REQUIRE(parse_problem_flags({"--b", "2", "--hq", "8", "--hkv", "2", "--sq", "17", "--d", "128", "--dtype", "bf16",
                               "--causal", "--layout", "BHSD", "--extra"},
                              &o, &rest)
              .ok());
  CHECK(o.shape_name == "custom");
  CHECK(o.shape.hq == 8);
  CHECK(o.shape.d == 128);
  CHECK(o.shape.dtype == DType::bf16);
  CHECK(o.shape.causal);
  CHECK(o.shape.layout == Layout::BHSD);
  CHECK(rest == std::vector<std::string>{"--extra"});
  CHECK(parse_problem_flags({"--dtype", "fp8"}, &o, &rest).message() == "--dtype (fp8) must be fp16 or bf16");
  CHECK(parse_problem_flags({"--sq", "x"}, &o, &rest).message() == "--sq (x) is not an integer");
  CHECK(parse_problem_flags({"--shape", "nope"}, &o, &rest).message().find("--shape (nope)") == 0);
}

// ---------------------------------------------------------------------------------------------
// The command lines: every bad value is refused, named, before any GPU work.

namespace {

std::string parse_error(const std::vector<std::string>& args, const std::string& default_shape = "seed") {
  CliOptions o;
  std::vector<std::string> rest;
  Status s = parse_problem_flags(args, &o, &rest, default_shape);
  if (s.ok() && !rest.empty()) s = unknown_argument(rest.front());
  return s.ok() ? "ok" : s.message();
}

// A bad command line and the one line its program must print: "error: <message>".
struct BadArgs {
  std::vector<std::string> args;
  std::string message;
};

// Bad values of the flags every stage program and the runner share.
const std::vector<BadArgs>& bad_problem_args() {
  static const std::vector<BadArgs> cases = {
      {{"--sq", "0"}, "--sq (0) must be an integer >= 1"},
      {{"--sq", "-1"}, "--sq (-1) must be an integer >= 1"},
      {{"--b", "0"}, "--b (0) must be an integer >= 1"},
      {{"--b", "x"}, "--b (x) is not an integer"},
      {{"--hq", "2.5"}, "--hq (2.5) is not an integer"},
      {{"--hkv", ""}, "--hkv () is not an integer"},
      {{"--sk", " 7"}, "--sk ( 7) is not an integer"},
      {{"--sk", "99999999999999999999"}, "--sk (99999999999999999999) is too large"},
      {{"--d", "96"}, "--d (96) must be 64 or 128"},
      {{"--d", "0"}, "--d (0) must be an integer >= 1"},
      {{"--hq", "5", "--hkv", "2"}, "Hq (5) is not a multiple of Hkv (2)"},
      {{"--hkv", "3", "--hq", "4"}, "Hq (4) is not a multiple of Hkv (3)"},
      {{"--dtype", "fp8"}, "--dtype (fp8) must be fp16 or bf16"},
      {{"--layout", "bshd"}, "--layout (bshd) must be BSHD or BHSD"},
      {{"--scale", "abc"}, "--scale (abc) is not a number"},
      {{"--scale", "0.5x"}, "--scale (0.5x) is not a number"},
      {{"--scale", "nan"}, "--scale (nan) is not a finite fp32 number"},
      {{"--scale", "1e39"}, "--scale (1e39) is not a finite fp32 number"},
      {{"--seed", "-1"}, "--seed (-1) must be an integer from 0 to 2^64 - 1"},
      {{"--seed", "1x"}, "--seed (1x) is not an integer"},
      {{"--shape", "nope"}, "--shape (nope) is not a shape of the suite (--list-shapes prints them)"},
      {{"--sq"}, "--sq needs a value"},
      {{"--shape", "--causal"}, "--shape needs a value"},
      {{"--b", "1000000", "--hq", "1", "--hkv", "1", "--sq", "100000000", "--sk", "100000000", "--d", "64", "--dtype",
        "fp16"},
       "the sizes (B1000000 Hq1 Hkv1 Sq100000000 Sk100000000 D64 fp16 BSHD) need 5.12e+16 bytes for Q, K, V "
       "and O, more than 2^50"},
      {{"--bogus"}, "unknown flag --bogus (see --help)"},
      {{"extra"}, "unexpected argument 'extra' (see --help)"},
  };
  return cases;
}

struct Ran {
  int code = -1;       // exit status, -1 when the program did not exit normally
  std::string output;  // stdout and stderr together
};

// Run @p program with @p args through the shell, quoting each argument.
Ran run_program(const std::string& program, const std::vector<std::string>& args) {
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::string command = quote(program);
  for (const std::string& a : args) command += " " + quote(a);
  command += " 2>&1";
  Ran r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string join(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) s += (s.empty() ? "" : " ") + ("'" + a + "'");
  return s;
}

}  // namespace

TEST_CASE("command line: every bad value named, with the flag or field") {
  for (const BadArgs& c : bad_problem_args()) {
    CAPTURE(join(c.args));
    CHECK(parse_error(c.args) == c.message);
  }
}

TEST_CASE("command line: a shape is checked whole, with its fields named") {
  ProblemShape s;
  s.d = 64;
  CHECK(validate_shape(s).ok());
  s.seq_pad = 4;
  CHECK(validate_shape(s).message() == "seq_pad (4) is not a non-negative multiple of 8 elements");
  s.seq_pad = 0, s.layout = static_cast<Layout>(3);
  CHECK(validate_shape(s).message() == "layout (3) is not supported: BSHD (0) and BHSD (1) are");
  s.layout = Layout::BSHD, s.sk = 0;
  CHECK(validate_shape(s).message() == "Sk (0) must be >= 1");
  s.sk = 1, s.d = 96;
  CHECK(validate_shape(s).message() == "D (96) is not supported: every stage supports 64 and 128");
}

TEST_CASE("command line: sizes apply over the chosen shape wherever they stand") {
  CliOptions a, b;
  std::vector<std::string> rest;
  REQUIRE(parse_problem_flags({"--sq", "100", "--shape", "decode_b8_sk32768"}, &a, &rest).ok());
  REQUIRE(parse_problem_flags({"--shape", "decode_b8_sk32768", "--sq", "100"}, &b, &rest).ok());
  CHECK(a.shape.sq == 100);
  CHECK(a.shape.b == 8);
  CHECK(a.shape.hq == 32);
  CHECK(b.shape.sq == 100);
  CHECK(a.shape_name == "custom");
  REQUIRE(parse_problem_flags({"--sq", "100"}, &a, &rest, "prefill_d128_s4096").ok());
  CHECK(a.shape.d == 128);  // from the default shape, not the seed
  CHECK(a.shape.hq == 16);
  REQUIRE(parse_problem_flags({}, &a, &rest, "prefill_d128_s4096").ok());
  CHECK(a.shape_name == "prefill_d128_s4096");
  REQUIRE(parse_problem_flags({"--scale", "-0.25", "--seed", "18446744073709551615"}, &a, &rest).ok());
  CHECK(a.shape.scale == -0.25f);
  CHECK(a.seed == 18446744073709551615ull);
}

TEST_CASE("runner flags: default shape, --stages, info flags") {
  RunnerOptions o;
  REQUIRE(parse_runner_flags({}, &o).ok());
  CHECK(o.action == RunnerOptions::Action::run);
  CHECK(o.problem.shape_name == "prefill_d128_s4096");
  CHECK(o.stages.size() == registered_stages().size());
  REQUIRE(parse_runner_flags({"--stages", "02_kv_split,01_naive", "--shape", "seed"}, &o).ok());
  REQUIRE(o.stages.size() == 2);
  CHECK(std::string(o.stages[0]->name) == "02_kv_split");
  CHECK(o.problem.shape_name == "seed");
  REQUIRE(parse_runner_flags({"--sq", "0", "--list-shapes"}, &o).ok());
  CHECK(o.action == RunnerOptions::Action::list_shapes);
  REQUIRE(parse_runner_flags({"--list", "--help"}, &o).ok());
  CHECK(o.action == RunnerOptions::Action::help);
  const std::string help = runner_help("attn_runner");
  CHECK(help.find("default prefill_d128_s4096") != std::string::npos);
  CHECK(help.find("(default: prefill_d128_s4096)") != std::string::npos);
  CHECK(help.find("--list-shapes") != std::string::npos);
  CHECK(help.find("seed shape") == std::string::npos);
}

namespace {

const std::vector<BadArgs>& bad_runner_args() {
  static const std::vector<BadArgs> cases = {
      {{"--stages"}, "--stages needs a value"},
      {{"--stages", "--causal"}, "--stages needs a value"},
      {{"--stages", ""}, "--stages () names no stage"},
      {{"--stages", "01_naive,99_missing"},
       "--stages (01_naive,99_missing): '99_missing' is not a registered stage; registered: "},
      {{"--stages", "01_naive", "x"}, "unexpected argument 'x' (see --help)"},
  };
  return cases;
}

const std::vector<BadArgs>& bad_bench_args() {
  static const std::vector<BadArgs> cases = {
      {{"--attn_stages"}, "--attn_stages needs a value: --attn_stages=01_naive,02_kv_split"},
      {{"--attn_stages="}, "--attn_stages () names no stage"},
      {{"--attn_stages=9"}, "--attn_stages (9): '9' is not a registered stage; registered: "},
      {{"--attn_shapes="}, "--attn_shapes needs a value: --attn_shapes=decode"},
      {{"--attn_shapes=zzz"}, "--attn_shapes (zzz) is in no shape's name (attn_runner --list-shapes prints them)"},
      {{"--attn_all_shapes=1"}, "unknown flag --attn_all_shapes=1 (see --help)"},
      {{"--attn_bogus"}, "unknown flag --attn_bogus (see --help)"},
      {{"--benchmark_out="}, "--benchmark_out needs a file: --benchmark_out=results/mygpu/bench.json"},
      {{"--benchmark_out=/nonexistent/dir/bench.json"},
       "--benchmark_out (/nonexistent/dir/bench.json): the folder /nonexistent/dir does not exist"},
      {{"--benchmark_out_format=csv"}, "--benchmark_out_format (csv) is not supported: the file is always JSON"},
      {{"--benchmark_format=xml"}, "--benchmark_format (xml) must be console, json or csv"},
      {{"--benchmark_time_unit=xs"}, "--benchmark_time_unit (xs) must be ns, us, ms or s"},
      {{"--benchmark_color=maybe"}, "--benchmark_color (maybe) must be auto, true or false"},
      {{"--benchmark_repetitions=0"}, "--benchmark_repetitions (0) must be an integer >= 1"},
      {{"--benchmark_min_time=abc"}, "--benchmark_min_time (abc) must be seconds (0.5 or 0.5s) or iterations (100x)"},
      {{"--benchmark_min_time=2y"}, "--benchmark_min_time (2y) must be seconds (0.5 or 0.5s) or iterations (100x)"},
      {{"--benchmark_list_tests=maybe"}, "--benchmark_list_tests (maybe) must be true or false"},
      {{"--benchmark_counters_tabular=2"}, "--benchmark_counters_tabular (2) must be true or false"},
      {{"--benchmark_filter=("}, "--benchmark_filter (() is not a valid regular expression"},
      {{"--benchmark_filter=zzz"},
       "--benchmark_filter (zzz) matches no benchmark (names are <stage>/<shape>, e.g. 01_naive/seed; "
       "--benchmark_list_tests lists them)"},
  };
  return cases;
}

// The message must equal @p expected, or start with it when it ends in ": " (a list follows).
bool message_matches(const std::string& got, const std::string& expected) {
  if (expected.size() >= 2 && expected.compare(expected.size() - 2, 2, ": ") == 0) return got.rfind(expected, 0) == 0;
  return got == expected;
}

}  // namespace

TEST_CASE("runner and bench flags: bad values named") {
  for (const BadArgs& c : bad_runner_args()) {
    CAPTURE(join(c.args));
    RunnerOptions o;
    const Status s = parse_runner_flags(c.args, &o);
    REQUIRE_FALSE(s.ok());
    CHECK(message_matches(s.message(), c.message));
  }
  for (const BadArgs& c : bad_bench_args()) {
    CAPTURE(join(c.args));
    std::vector<std::string> args = c.args;
    BenchOptions o;
    const Status s = parse_bench_flags(&args, &o);
    REQUIRE_FALSE(s.ok());
    CHECK(message_matches(s.message(), c.message));
  }
  std::vector<std::string> args = {"--attn_stages=01_naive", "--attn_shapes=decode", "--benchmark_filter=sk4096",
                                   "--benchmark_min_time=0.1"};
  BenchOptions o;
  REQUIRE(parse_bench_flags(&args, &o).ok());
  CHECK(args == std::vector<std::string>{"--benchmark_filter=sk4096", "--benchmark_min_time=0.1"});
  const std::vector<BenchCase> cases = bench_cases(o);
  REQUIRE(cases.size() == 6);
  CHECK(cases.front().name == "01_naive/decode_b1_sk4096");
}

TEST_CASE("programs: bad flags refused before any GPU work, with the flag or field named") {
  // Without a GPU a program that looked for one first would print "no CUDA device"; with one, it
  // would run. Either way the output would differ from the one expected line.
  std::vector<std::string> programs(std::begin(kStageProgramPaths), std::end(kStageProgramPaths));
  programs.push_back(kRunnerPath);
  for (const std::string& program : programs) {
    const bool runner = program == kRunnerPath;
    std::vector<BadArgs> cases = bad_problem_args();
    if (runner) cases.insert(cases.end(), bad_runner_args().begin(), bad_runner_args().end());
    for (const BadArgs& c : cases) {
      CAPTURE(program);
      CAPTURE(join(c.args));
      const Ran r = run_program(program, c.args);
      CHECK(r.code == 2);
      const std::string prefix = "error: ";
      REQUIRE(r.output.rfind(prefix, 0) == 0);
      REQUIRE(r.output.back() == '\n');
      CHECK(r.output.find('\n') == r.output.size() - 1);  // one line
      CHECK(message_matches(r.output.substr(prefix.size(), r.output.size() - prefix.size() - 1), c.message));
    }
  }
  if (*kBenchPath == '\0') return;
  std::vector<BadArgs> cases = bad_bench_args();
  // Google Benchmark's own flags are refused by its library, which names them, also before the GPU.
  for (const char* gb : {"--v=x", "--bogus"}) cases.push_back({{gb}, ""});
  for (const BadArgs& c : cases) {
    CAPTURE(join(c.args));
    const Ran r = run_program(kBenchPath, c.args);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("CUDA") == std::string::npos);
    if (c.message.empty()) {
      CHECK(r.output.find(c.args.front()) != std::string::npos);
    } else {
      CHECK(r.output.rfind("error: ", 0) == 0);
      CHECK(message_matches(r.output.substr(7, r.output.size() - 8), c.message));
    }
  }
}

TEST_CASE("programs: --help and the lists need no GPU") {
  for (const char* program : kStageProgramPaths) {
    CAPTURE(program);
    const Ran help = run_program(program, {"--help"});
    CHECK(help.code == 0);
    CHECK(help.output.find("(default: seed)") != std::string::npos);
    CHECK(help.output.find("--list-shapes") != std::string::npos);
    const Ran list = run_program(program, {"--list-shapes"});
    CHECK(list.code == 0);
    CHECK(list.output.find("decode_b8_sk131072") != std::string::npos);
  }
  const Ran help = run_program(kRunnerPath, {"--help"});
  CHECK(help.code == 0);
  CHECK(help.output == runner_help(kRunnerPath));
  const std::pair<const char*, const char*> lists[] = {
      {"--list-shapes", "prefill_d64_s512_causal"}, {"--list", "01_naive"}, {"--shapes-json", "\"name\": \"seed\""}};
  for (const auto& [flag, expected] : lists) {
    CAPTURE(flag);
    const Ran r = run_program(kRunnerPath, {flag});
    CHECK(r.code == 0);
    CHECK(r.output.find(expected) != std::string::npos);
  }
  if (*kBenchPath == '\0') return;
  const Ran bench = run_program(kBenchPath, {"--help"});
  CHECK(bench.code == 0);
  for (const char* flag : {"--attn_stages=", "--attn_shapes=", "--attn_all_shapes", "--benchmark_filter"}) {
    CAPTURE(flag);
    CHECK(bench.output.find(flag) != std::string::npos);
  }
  const Ran list = run_program(kBenchPath, {"--benchmark_list_tests", "--attn_shapes=seed"});
  CHECK(list.code == 0);
  CHECK(list.output.find("01_naive/seed") != std::string::npos);
}
