// Tests that need no GPU: the fp64 reference against closed forms, validation of bad input,
// the FLOP and byte formulas, the shape suite, the comparison metrics and the registry.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "cli.h"
#include "compare.h"
#include "params.h"
#include "reference.h"
#include "registry.h"
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

TEST_CASE("shape suite: SPEC names and sizes") {
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
  CHECK(parse_problem_flags({"--shape", "nope"}, &o, &rest).message().find("shape 'nope'") == 0);
}
