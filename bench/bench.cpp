// Google Benchmark program: every registered stage x the shape suite, timed by the harness
// (CUDA events around back-to-back launches, a CUDA graph for latency-bound shapes, median of
// samples), named <stage>/<shape> with counters TFLOPs and GBps.
//
//   build/bench/attn_bench --benchmark_out=results/mygpu/bench.json
//   build/bench/attn_bench --help                 the project's flags (--attn_*), then Google Benchmark's
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
#include "build_info.h"
#include "cli.h"
#include "device.h"
#include "flags.h"
#include "problem.h"
#include "registry.h"
#include "shapes.h"
#include "timer.h"

using namespace attn;

namespace {

// Google Benchmark appends "/iterations:1/manual_time" to names; the results' names are
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
  // A stage newer than the GPU is reported as skipped, with its requirement, and gets no figure.
  if (Status s = check_compute_capability(stage->name, stage->min_sm, device->sm); !s.ok()) {
    return state.SkipWithError(("skipped: " + s.message()).c_str());
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

}  // namespace

int main(int argc, char** argv) {
  // The project's flags and the values Google Benchmark checks late are checked first, before
  // the GPU is looked for.
  std::vector<std::string> args(argv + 1, argv + argc);
  BenchOptions options;
  if (Status st = parse_bench_flags(&args, &options); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  if (options.help) std::cout << bench_help(argv[0]) << std::flush;  // Google Benchmark's follow
  std::vector<char*> kept = {argv[0]};
  for (std::string& a : args) kept.push_back(a.data());
  int kept_count = static_cast<int>(kept.size());
  benchmark::Initialize(&kept_count, kept.data());
  if (benchmark::ReportUnrecognizedArguments(kept_count, kept.data())) return 2;

  for (const BenchCase& c : bench_cases(options)) {
    benchmark::RegisterBenchmark(c.name.c_str(), bench_stage_shape, c.stage, c.shape)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  }

  if (!options.list_only) {
    const DeviceInfo* device = nullptr;
    if (Status st = require_device(&device); !st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 1;
    }
    benchmark::AddCustomContext("gpu", device->name);
    benchmark::AddCustomContext("sm", std::to_string(device->sm));
    benchmark::AddCustomContext("sm_count", std::to_string(device->sm_count));
    benchmark::AddCustomContext("l2_bytes", std::to_string(device->l2_bytes));
    benchmark::AddCustomContext("driver", driver_version_string());
    benchmark::AddCustomContext("cuda", cuda_version_string(device->runtime_version));
    benchmark::AddCustomContext("commit", results_commit());
    for (const StageInfo& stage : registered_stages()) {
      bool chosen = options.stages.empty();
      for (const StageInfo* s : options.stages) chosen = chosen || s == &stage;
      if (chosen) benchmark::AddCustomContext(std::string("stage.") + stage.name, stage.description);
    }
  }

  // The file reporter is always JSON (the results' format), and only given when
  // --benchmark_out= names a file: Google Benchmark refuses a file reporter without one.
  SpecNames<benchmark::ConsoleReporter> display;
  SpecNames<benchmark::JSONReporter> file;
  benchmark::RunSpecifiedBenchmarks(&display, options.out_file ? &file : nullptr);
  benchmark::Shutdown();
  return 0;
}
