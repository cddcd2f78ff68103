// Google Benchmark program: every registered stage x the shape suite, timed by the harness
// (CUDA events around back-to-back launches, a CUDA graph for latency-bound shapes, median of
// samples), named <stage>/<shape> with counters TFLOPs and GBps as SPEC.md says.
//
//   build/bench/attn_bench --benchmark_out=results/h200/bench.json
//   flags: --attn_stages=01_naive,02_kv_split   only these stages
//          --attn_shapes=prefill_d128            only shapes whose name contains this
//          --attn_all_shapes                     also the prefill shapes a stage's bench_max_seq skips
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "buffer.h"
#include "device.h"
#include "problem.h"
#include "registry.h"
#include "shapes.h"
#include "timer.h"

using namespace attn;

namespace {

// Google Benchmark appends "/iterations:1/manual_time" to names; SPEC.md's names are
// <stage>/<shape>, so both reporters see the runs with those parts removed.
template <typename Base>
class SpecNames : public Base {
 public:
  using Base::Base;
  void ReportRuns(const std::vector<benchmark::BenchmarkReporter::Run>& runs) override {
    std::vector<benchmark::BenchmarkReporter::Run> renamed = runs;
    for (auto& run : renamed) {
      run.run_name.iterations.clear();
      run.run_name.time_type.clear();
    }
    Base::ReportRuns(renamed);
  }
};

void bench_stage_shape(benchmark::State& state, const StageInfo* stage, const NamedShape* shape) {
  const DeviceInfo* device = nullptr;
  if (Status s = current_device(&device); !s.ok()) return state.SkipWithError(s.message().c_str());
  if (stage->min_sm > device->sm) {  // shown as skipped in the report, with the reason
    const std::string why = "skipped: " + std::string(stage->name) + " requires sm_" + std::to_string(stage->min_sm) +
                            ", this GPU is sm_" + std::to_string(device->sm);
    return state.SkipWithError(why.c_str());
  }
  const ProblemShape& ps = shape->shape;
  Problem problem;
  const int sets = input_sets_for(attention_bytes(ps), device->l2_bytes);
  Status st = Problem::create(ps, sets, /*with_lse=*/true, &problem);
  if (st.ok()) st = problem.fill_random(/*seed=*/42);
  size_t ws_bytes = 0;
  for (int s = 0; s < sets; ++s) ws_bytes = std::max(ws_bytes, workspace_bytes(*stage, problem.params(s)));
  DeviceBuffer ws_buffer;
  if (st.ok()) st = ws_buffer.allocate(ws_bytes);
  const Workspace ws{ws_buffer.get(), ws_bytes};

  // A broken kernel must not produce a figure: one poisoned run first, every element written
  // and finite (the accuracy itself is test_gpu's job).
  if (st.ok()) st = problem.poison_outputs();
  if (st.ok()) st = stage->launch(problem.params(0), ws, nullptr);
  HostOutput out;
  if (st.ok() && cudaDeviceSynchronize() != cudaSuccess) st = Status::Error(cudaGetErrorString(cudaGetLastError()));
  if (st.ok()) st = problem.download_output(&out);
  if (st.ok()) {
    int64_t bad = 0;
    for (float x : out.o) bad += !std::isfinite(x);
    if (bad > 0) st = Status::Error(std::to_string(bad) + " elements of O are NaN or unwritten");
  }
  if (!st.ok()) return state.SkipWithError(st.message().c_str());

  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  TimingOptions options;
  options.graph = shape->graph;
  Timing timing;
  for (auto _ : state) {
    st = time_launches([&](int i, cudaStream_t s) { return stage->launch(problem.params(i % sets), ws, s); }, stream,
                       options, &timing);
    if (!st.ok()) break;
    state.SetIterationTime(timing.median_us * 1e-6);
  }
  cudaStreamDestroy(stream);
  if (!st.ok()) return state.SkipWithError(st.message().c_str());

  LaunchReport report;
  if (describe_launch(*stage, problem.params(0), &report).ok()) {
    state.counters["ctas"] = static_cast<double>(report.ctas);
    state.counters["waves"] = report.waves;
  }
  const double seconds = timing.median_us * 1e-6;
  state.counters["TFLOPs"] = attention_flops(ps) / seconds * 1e-12;
  state.counters["GBps"] = attention_bytes(ps) / seconds * 1e-9;
  state.counters["samples"] = timing.samples;
  state.counters["launches_per_sample"] = timing.launches_per_sample;
  state.counters["graph"] = shape->graph ? 1 : 0;
}

// Takes --attn_* flags out of argv (Google Benchmark refuses flags it does not know).
struct AttnFlags {
  std::vector<std::string> stages;
  std::string shapes;
  bool all_shapes = false;
  bool out_file = false;  // --benchmark_out=FILE given (left in argv for Google Benchmark)
};

AttnFlags take_attn_flags(int* argc, char** argv) {
  AttnFlags f;
  int kept = 1;
  for (int n = 1; n < *argc; ++n) {
    const std::string a = argv[n];
    if (a.rfind("--attn_stages=", 0) == 0) {
      std::stringstream list(a.substr(std::strlen("--attn_stages=")));
      for (std::string s; std::getline(list, s, ',');) f.stages.push_back(s);
    } else if (a.rfind("--attn_shapes=", 0) == 0) {
      f.shapes = a.substr(std::strlen("--attn_shapes="));
    } else if (a == "--attn_all_shapes") {
      f.all_shapes = true;
    } else {
      f.out_file = f.out_file || a.rfind("--benchmark_out=", 0) == 0;
      argv[kept++] = argv[n];
    }
  }
  *argc = kept;
  return f;
}

std::string commit_id() {
  const char* env = std::getenv("ATTN_COMMIT");
  return env && *env ? env : "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const AttnFlags flags = take_attn_flags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  for (const std::string& name : flags.stages) {
    const StageInfo* s = nullptr;
    if (Status st = find_stage(name, &s); !st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 1;
    }
  }

  const DeviceInfo* device = nullptr;
  if (Status st = current_device(&device); !st.ok()) {
    std::cerr << "attn_bench: " << st.message() << "\n";
    return 1;
  }
  benchmark::AddCustomContext("gpu", device->name);
  benchmark::AddCustomContext("sm", std::to_string(device->sm));
  benchmark::AddCustomContext("sm_count", std::to_string(device->sm_count));
  benchmark::AddCustomContext("l2_bytes", std::to_string(device->l2_bytes));
  benchmark::AddCustomContext("driver", driver_version_string());
  benchmark::AddCustomContext("cuda", cuda_version_string(device->runtime_version));
  benchmark::AddCustomContext("commit", commit_id());

  for (const StageInfo& stage : registered_stages()) {
    if (!flags.stages.empty() && std::find(flags.stages.begin(), flags.stages.end(), stage.name) == flags.stages.end())
      continue;
    benchmark::AddCustomContext(std::string("stage.") + stage.name, stage.description);
    for (const NamedShape& shape : shape_suite()) {
      if (!flags.shapes.empty() && shape.name.find(flags.shapes) == std::string::npos) continue;
      const bool too_long = stage.bench_max_seq > 0 && shape.kind == ShapeKind::prefill &&
                            shape.shape.sq > stage.bench_max_seq;
      if (too_long && !flags.all_shapes) continue;
      benchmark::RegisterBenchmark((std::string(stage.name) + "/" + shape.name).c_str(), bench_stage_shape, &stage,
                                   &shape)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
    }
  }

  // The file reporter is always JSON (SPEC.md's result format), and only given when
  // --benchmark_out= names a file: Google Benchmark refuses a file reporter without one.
  SpecNames<benchmark::ConsoleReporter> display;
  SpecNames<benchmark::JSONReporter> file;
  benchmark::RunSpecifiedBenchmarks(&display, flags.out_file ? &file : nullptr);
  benchmark::Shutdown();
  return 0;
}
