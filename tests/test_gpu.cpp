// GPU tests: every registered stage against the fp64 reference (or, for large shapes, against
// stage 01, itself checked against fp64 on sampled rows), over dtypes, head dims, causal,
// layouts and shapes that do not divide any tile. Exits with kSkip (ctest: SKIPPED) when there
// is no CUDA device. ATTN_TEST_REDUCED=1 selects the small set the sanitizer runs;
// ATTN_TEST_STAGES (a comma-separated list) the stages.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "buffer.h"
#include "compare.h"
#include "device.h"
#include "problem.h"
#include "reference.h"
#include "registry.h"

using namespace attn;

namespace {

constexpr int kSkip = 77;  // tests/CMakeLists.txt: SKIP_RETURN_CODE

bool reduced() {
  const char* env = std::getenv("ATTN_TEST_REDUCED");
  return env != nullptr && std::strcmp(env, "0") != 0;
}

struct Sizes {
  int64_t b, hq, hkv, sq, sk;
};

// Shapes that exercise every edge: one row, one key, sizes around a tile, Sq != Sk both ways
// (causal rows with no key), grouped-query 32/8 and 8/1, many (batch, head) pairs, long rows.
std::vector<Sizes> matrix_sizes() {
  if (reduced()) return {{1, 2, 2, 17, 17}, {1, 1, 1, 129, 127}, {2, 8, 1, 1, 300}, {1, 4, 2, 33, 200}};
  return {
      {1, 1, 1, 1, 1},        {1, 2, 2, 17, 17},     {2, 2, 1, 127, 127},    {1, 1, 1, 128, 128},
      {1, 2, 2, 129, 129},    {1, 1, 1, 1000, 1000}, {1, 1, 1, 1, 4099},     {1, 2, 2, 17, 1000},
      {1, 1, 1, 129, 127},    {1, 1, 1, 1000, 17},   {1, 32, 8, 129, 129},   {2, 8, 1, 1, 4099},
      {1, 32, 8, 4, 1000},    {8, 32, 32, 64, 64},   {1, 1, 1, 4099, 4099},  {4, 16, 16, 1024, 1024},
  };
}

// A stage that needs a newer GPU than this one (06 needs sm_90) is skipped, and says so once:
// its launch is refused with its requirement (the last test case checks that), never run.
// ATTN_TEST_STAGES=06_warp_specialized,05_cp_async runs only those stages (the sanitizer's runs).
bool runs_here(const StageInfo& stage) {
  if (const char* only = std::getenv("ATTN_TEST_STAGES"); only != nullptr && *only != '\0') {
    const std::string list = std::string(",") + only + ",";
    if (list.find(std::string(",") + stage.name + ",") == std::string::npos) return false;
  }
  const DeviceInfo* device = nullptr;
  if (!current_device(&device).ok() || stage.min_sm <= device->sm) return true;
  static std::set<std::string> told;
  if (told.insert(stage.name).second)
    std::printf("test_gpu: stage %s SKIPPED - it requires sm_%d, this GPU is sm_%d\n", stage.name, stage.min_sm, device->sm);
  return false;
}

std::string name_of(const StageInfo& stage, const ProblemShape& s) { return std::string(stage.name) + " " + describe(s); }

// Run a stage once over poisoned outputs and bring the outputs back. The workspace is a fresh
// one, or @p shared (already used by earlier launches) when given.
Status run_stage(const StageInfo& stage, Problem& problem, HostOutput* out, const DeviceBuffer* shared = nullptr) {
  DeviceBuffer ws;
  const size_t bytes = workspace_bytes(stage, problem.params());
  if (shared == nullptr) ATTN_TRY(ws.allocate(bytes));
  const Workspace workspace = shared != nullptr ? Workspace{shared->get(), shared->bytes()} : Workspace{ws.get(), bytes};
  ATTN_TRY(problem.poison_outputs());
  ATTN_TRY(stage.launch(problem.params(), workspace, nullptr));
  if (cudaDeviceSynchronize() != cudaSuccess) return Status::Error(cudaGetErrorString(cudaGetLastError()));
  return problem.download_output(out);
}

// Whether a shape is checked against stage 01 instead of the full fp64 reference.
bool large(const ProblemShape& s) { return rows_to_check(s).size() != static_cast<size_t>(s.b * s.hq * s.sq); }

// Check one stage on one shape against docs/contract.md's accuracy contract (on a shared workspace when
// @p shared_ws is given).
void check_stage_on(const StageInfo& stage, const ProblemShape& shape, uint64_t seed,
                    const DeviceBuffer* shared_ws = nullptr) {
  const std::string name = name_of(stage, shape);
  CAPTURE(name);
  Problem problem;
  REQUIRE(Problem::create(shape, 1, true, &problem).ok());
  REQUIRE(problem.fill_random(seed).ok());
  const StageInfo& baseline = registered_stages().front();
  ErrorStats e;
  if (large(shape) && &stage != &baseline) {
    HostOutput base, got;
    const Status st = run_stage(baseline, problem, &base);
    REQUIRE_MESSAGE(st.ok(), st.message());
    const Status st2 = run_stage(stage, problem, &got, shared_ws);
    REQUIRE_MESSAGE(st2.ok(), st2.message());
    e = compare_outputs(got, base, shape);
  } else {
    HostOutput got;
    const Status st = run_stage(stage, problem, &got, shared_ws);
    REQUIRE_MESSAGE(st.ok(), st.message());
    HostInputs inputs;
    REQUIRE(problem.download_inputs(&inputs).ok());
    e = compare_with_reference(got, reference_attention(inputs, rows_to_check(shape)), shape);
  }
  const std::string errors = describe(e);
  CAPTURE(errors);
  CHECK(e.nan == 0);
  CHECK(e.unwritten == 0);
  CHECK(e.padding_written == 0);
  CHECK(e.rel_l2 <= rel_tolerance(shape.dtype));
  CHECK(e.lse_nan == 0);
  CHECK(e.lse_max_abs <= kLseTolerance);
}

}  // namespace

TEST_CASE("every stage matches the reference over dtype x D x causal x layout x shapes") {
  uint64_t seed = 1;
  for (const StageInfo& stage : registered_stages())
    if (runs_here(stage))
    for (DType dtype : {DType::f16, DType::bf16})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          for (Layout layout : {Layout::BSHD, Layout::BHSD})
            for (const Sizes& z : matrix_sizes()) {
              ProblemShape s;
              s.b = z.b, s.hq = z.hq, s.hkv = z.hkv, s.sq = z.sq, s.sk = z.sk, s.d = d;
              s.dtype = dtype, s.causal = causal, s.layout = layout;
              check_stage_on(stage, s, ++seed);
            }
}

TEST_CASE("split-KV edge cases: many splits, splits past the keys, fully masked splits, GQA decode") {
  const Sizes cases[] = {
      {1, 32, 8, 1, 1},     {1, 32, 8, 1, 2},        {1, 32, 8, 1, 33},  // splits of one key, or none
      {1, 32, 8, 1, 4097},  {2, 32, 8, 1, 131072},                      // decode, group 4, many splits
      {1, 32, 4, 1, 5000},  {1, 32, 4, 4, 5000},                        // group 8, Sq = 1 and 4
      {3, 16, 4, 4, 777},   {1, 8, 1, 4, 3000},                         // group 4 and 8 at Sq = 4
      {1, 1, 1, 200, 40},   {1, 2, 1, 3000, 3000},                      // causal: empty rows, long rows
  };
  uint64_t seed = 1000;
  for (const StageInfo& stage : registered_stages())
    if (runs_here(stage))
    for (DType dtype : {DType::f16, DType::bf16})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          for (const Sizes& z : cases) {
            if (reduced() && (z.sk > 5000 || z.sq > 1000)) continue;
            ProblemShape s;
            s.b = z.b, s.hq = z.hq, s.hkv = z.hkv, s.sq = z.sq, s.sk = z.sk, s.d = d;
            s.dtype = dtype, s.causal = causal;
            check_stage_on(stage, s, ++seed);
          }
}

TEST_CASE("padded strides, custom scales (one negative) and a missing LSE output") {
  for (const StageInfo& stage : registered_stages()) {
    if (!runs_here(stage)) continue;
    ProblemShape s;
    s.b = 2, s.hq = 4, s.hkv = 2, s.sq = 77, s.sk = 130, s.d = 128, s.dtype = DType::bf16, s.causal = true;
    s.seq_pad = 24;  // rows 48 bytes apart from their neighbours' ends; padding must stay untouched
    check_stage_on(stage, s, 7);
    s.layout = Layout::BHSD, s.dtype = DType::f16, s.d = 64;
    check_stage_on(stage, s, 8);

    ProblemShape scaled;
    scaled.b = 1, scaled.hq = 2, scaled.hkv = 1, scaled.sq = 50, scaled.sk = 300, scaled.scale = 0.3f;
    check_stage_on(stage, scaled, 9);
    ProblemShape negative = scaled;  // a negative scale turns the softmax around: min scores win
    negative.scale = -0.2f, negative.causal = true;
    check_stage_on(stage, negative, 11);
    // Scores ten times the default's spread: a row's maximum jumps from tile to tile, so that
    // 06 and 07, which try each tile's exponentials with the running maxima first, must find them
    // too large and compute the tile again with its own maximum.
    ProblemShape sharp = scaled;
    sharp.sq = 130, sharp.sk = 1000, sharp.d = 128, sharp.scale = 3.0f;
    check_stage_on(stage, sharp, 12);
    sharp.scale = -3.0f, sharp.causal = true, sharp.dtype = DType::f16;
    check_stage_on(stage, sharp, 13);

    // LSE is optional: null means not written, and O is unchanged by its absence.
    Problem with, without;
    REQUIRE(Problem::create(scaled, 1, true, &with).ok());
    REQUIRE(Problem::create(scaled, 1, false, &without).ok());
    REQUIRE(with.fill_random(10).ok());
    REQUIRE(without.fill_random(10).ok());
    HostOutput a, b;
    REQUIRE(run_stage(stage, with, &a).ok());
    REQUIRE(run_stage(stage, without, &b).ok());
    CHECK(b.lse.empty());
    CHECK(a.o == b.o);
  }
}

TEST_CASE("one workspace serves launch after launch, of any shape, with no memset between them") {
  // Stages 03+ keep a work queue and per-block arrival counters in the workspace and must leave
  // them at zero; a counter left over would skip work items or merge too early. Decode (many
  // splits: arrival counters) and causal grids over one wave (the queue) alternate: one of 8-row
  // CTAs and, for stage 03, one of key-warp CTAs (32 heads of 128 rows: sweep_bh32).
  ProblemShape split_heavy, queued, queued_key_warps;
  split_heavy.b = 2, split_heavy.hq = 32, split_heavy.hkv = 8, split_heavy.sq = 1, split_heavy.sk = reduced() ? 5000 : 20000;
  split_heavy.d = 128, split_heavy.dtype = DType::bf16;
  queued.b = 4, queued.hq = 16, queued.hkv = 16, queued.sq = 700, queued.sk = 300, queued.causal = true;
  queued_key_warps.b = 2, queued_key_warps.hq = 16, queued_key_warps.hkv = 16, queued_key_warps.sq = 128, queued_key_warps.sk = 128;
  for (const StageInfo& stage : registered_stages()) {
    if (!runs_here(stage)) continue;
    CAPTURE(stage.name);
    size_t bytes = 0;
    for (const ProblemShape& shape : {split_heavy, queued, queued_key_warps}) {
      Problem sizing;
      REQUIRE(Problem::create(shape, 1, true, &sizing).ok());
      bytes = std::max(bytes, workspace_bytes(stage, sizing.params()));
    }
    DeviceBuffer ws;
    REQUIRE(ws.allocate(bytes).ok());
    uint64_t seed = 500;
    for (int round = 0; round < 2; ++round) {
      check_stage_on(stage, split_heavy, ++seed, &ws);
      check_stage_on(stage, queued, ++seed, &ws);
      check_stage_on(stage, split_heavy, ++seed, &ws);
      check_stage_on(stage, queued_key_warps, ++seed, &ws);
    }
  }
}

TEST_CASE("the same inputs twice give bit-identical outputs") {
  for (const StageInfo& stage : registered_stages()) {
    if (!runs_here(stage)) continue;
    CAPTURE(stage.name);
    ProblemShape s;
    s.b = 2, s.hq = 8, s.hkv = 2, s.sq = 300, s.sk = 1000, s.d = 128, s.dtype = DType::bf16, s.causal = true;
    Problem problem;
    REQUIRE(Problem::create(s, 1, true, &problem).ok());
    REQUIRE(problem.fill_random(11).ok());
    HostOutput first, second;
    REQUIRE(run_stage(stage, problem, &first).ok());
    REQUIRE(run_stage(stage, problem, &second).ok());
    CHECK(std::memcmp(first.o.data(), second.o.data(), first.o.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float)) == 0);
  }
}

// The stream, graph and executable graph of one capture, destroyed when it goes out of scope, also
// when a REQUIRE ends the test case early.
struct CapturedLaunch {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedLaunch() = default;
  CapturedLaunch(const CapturedLaunch&) = delete;
  CapturedLaunch& operator=(const CapturedLaunch&) = delete;
  ~CapturedLaunch() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

TEST_CASE("a launch captured into a CUDA graph gives what the same launch gives on a stream") {
  // The benchmarks time latency-bound shapes as graphs of launches: every launch must capture
  // cleanly. Seed-sized (no split) and decode (splits, merge counters).
  ProblemShape seed, decode;
  seed.b = 1, seed.hq = 1, seed.hkv = 1, seed.sq = 128, seed.sk = 128;
  decode.b = 1, decode.hq = 32, decode.hkv = 8, decode.sq = 1, decode.sk = 4097, decode.d = 128, decode.dtype = DType::bf16;
  for (const StageInfo& stage : registered_stages())
    if (runs_here(stage))
    for (const ProblemShape& shape : {seed, decode}) {
      const std::string name = name_of(stage, shape);
      CAPTURE(name);
      Problem problem;
      REQUIRE(Problem::create(shape, 1, true, &problem).ok());
      REQUIRE(problem.fill_random(14).ok());
      HostOutput streamed, replayed;
      REQUIRE(run_stage(stage, problem, &streamed).ok());

      DeviceBuffer ws;
      REQUIRE(ws.allocate(workspace_bytes(stage, problem.params())).ok());
      REQUIRE(problem.poison_outputs().ok());
      {
        CapturedLaunch c;
        REQUIRE(cudaStreamCreate(&c.stream) == cudaSuccess);
        REQUIRE(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeRelaxed) == cudaSuccess);
        const Status st = stage.launch(problem.params(), Workspace{ws.get(), ws.bytes()}, c.stream);
        const cudaError_t ended = cudaStreamEndCapture(c.stream, &c.graph);
        CHECK_MESSAGE(st.ok(), st.message());
        REQUIRE(ended == cudaSuccess);
        REQUIRE(cudaGraphInstantiate(&c.exec, c.graph, 0) == cudaSuccess);
        REQUIRE(cudaGraphLaunch(c.exec, c.stream) == cudaSuccess);
        REQUIRE(cudaStreamSynchronize(c.stream) == cudaSuccess);
      }
      REQUIRE(problem.download_output(&replayed).ok());
      CHECK(std::memcmp(streamed.o.data(), replayed.o.data(), streamed.o.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(streamed.lse.data(), replayed.lse.data(), streamed.lse.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("bad input launches nothing and writes nothing") {
  for (const StageInfo& stage : registered_stages()) {
    CAPTURE(stage.name);
    ProblemShape s;
    s.b = 1, s.hq = 4, s.hkv = 4, s.sq = 64, s.sk = 64;
    Problem problem;
    REQUIRE(Problem::create(s, 1, true, &problem).ok());
    REQUIRE(problem.fill_random(12).ok());
    REQUIRE(problem.poison_outputs().ok());
    AttnParams p = problem.params();
    p.hkv = 3;
    const Status st = stage.launch(p, Workspace{}, nullptr);
    CHECK(st.message() == "Hq (4) is not a multiple of Hkv (3)");
    p = problem.params();
    p.k_seq_stride = 4;
    CHECK(stage.launch(p, Workspace{}, nullptr).message() == "k_seq_stride (4) is not a non-negative multiple of 8 elements");
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    HostOutput out;
    REQUIRE(problem.download_output(&out).ok());
    CHECK(out.o_unwritten == static_cast<int64_t>(out.o.size()));
    CHECK(out.lse_unwritten == static_cast<int64_t>(out.lse.size()));
  }
}

TEST_CASE("a stage needing a newer GPU is refused with its requirement, launching nothing") {
  const DeviceInfo* device = nullptr;
  REQUIRE(current_device(&device).ok());
  for (const StageInfo& stage : registered_stages()) {
    if (stage.min_sm <= device->sm) continue;
    CAPTURE(stage.name);
    ProblemShape s;
    s.b = 1, s.hq = 1, s.hkv = 1, s.sq = 64, s.sk = 64;
    Problem problem;
    REQUIRE(Problem::create(s, 1, true, &problem).ok());
    REQUIRE(problem.fill_random(15).ok());
    REQUIRE(problem.poison_outputs().ok());
    const Status st = stage.launch(problem.params(), Workspace{}, nullptr);
    CHECK(st.message() == std::string("stage ") + stage.name + " requires sm_" + std::to_string(stage.min_sm) +
                              " or newer, found sm_" + std::to_string(device->sm));
    HostOutput out;
    REQUIRE(problem.download_output(&out).ok());
    CHECK(out.o_unwritten == static_cast<int64_t>(out.o.size()));
  }
}

TEST_CASE("a corrupted output fails the check (the test can fail)") {
  const StageInfo& stage = registered_stages().front();
  ProblemShape s;
  s.b = 1, s.hq = 2, s.hkv = 2, s.sq = 40, s.sk = 90;
  Problem problem;
  REQUIRE(Problem::create(s, 1, true, &problem).ok());
  REQUIRE(problem.fill_random(13).ok());
  HostOutput got;
  REQUIRE(run_stage(stage, problem, &got).ok());
  HostInputs in;
  REQUIRE(problem.download_inputs(&in).ok());
  const ReferenceOutput ref = reference_attention(in, all_rows(s));
  CHECK(passes(compare_with_reference(got, ref, s), s.dtype));
  got.o[17] += 0.25f;
  CHECK_FALSE(passes(compare_with_reference(got, ref, s), s.dtype));
}

TEST_CASE("an out-of-range stage request is refused") {
  const StageInfo* stage = nullptr;
  CHECK_FALSE(find_stage("99_does_not_exist", &stage).ok());
  CHECK_FALSE(stage_at(static_cast<int>(registered_stages().size()), &stage).ok());
}

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("test_gpu: SKIPPED - no CUDA device on this machine (exit %d; ctest reports it as skipped)\n", kSkip);
    return kSkip;
  }
  const DeviceInfo* device = nullptr;
  if (Status s = current_device(&device); !s.ok()) {
    std::printf("test_gpu: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("test_gpu on %s (sm_%d)%s\n", device->name.c_str(), device->sm,
              reduced() ? ", reduced set (ATTN_TEST_REDUCED)" : "");
  doctest::Context context(argc, argv);
  return context.run();
}
