// The main job: every registered stage on one shape, checked against the fp64 reference, timed,
// and printed as the progression table (time, TFLOP/s, GB/s, speed-up over 01 and over the
// previous stage, error).
//
//   build/bench/attn_runner                       the default shape, prefill_d128_s4096
//   build/bench/attn_runner --shape seed          any shape of the suite, or --b/--sq/... sizes
//   build/bench/attn_runner --stages 01_naive     a subset of the stages
//   build/bench/attn_runner --shapes-json         the suite as JSON (read by tools/peers.py)
//   build/bench/attn_runner --help                every flag
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "build_info.h"
#include "cli.h"
#include "flags.h"
#include "registry.h"

using namespace attn;

int main(int argc, char** argv) {
  // Every flag and the shape are checked before the GPU is looked for.
  RunnerOptions options;
  if (Status st = parse_runner_flags(std::vector<std::string>(argv + 1, argv + argc), &options); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  switch (options.action) {
    case RunnerOptions::Action::help: std::cout << runner_help(argv[0]); return 0;
    case RunnerOptions::Action::list_stages:
      for (const StageInfo& s : registered_stages())
        std::cout << s.name << "  (sm_" << s.min_sm << "+)  " << s.description << "\n";
      return 0;
    case RunnerOptions::Action::list_shapes: std::cout << shape_list(); return 0;
    case RunnerOptions::Action::shapes_json: {
      // The input sets depend on the GPU's L2: without a GPU the JSON says l2_bytes 0.
      const DeviceInfo* device = nullptr;
      const size_t l2 = current_device(&device).ok() ? device->l2_bytes : 0;
      std::cout << shapes_json(shape_suite(), l2);
      return 0;
    }
    case RunnerOptions::Action::run: break;
  }

  const DeviceInfo* device = nullptr;
  if (Status st = require_device(&device); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 1;
  }
  const CliOptions& problem = options.problem;
  std::cout << "GPU    " << describe(*device) << "\n"
            << "build  commit " << build_commit() << "\n"
            << "shape  " << problem.shape_name << ": " << describe(problem.shape) << "\n"
            << "       " << attention_flops(problem.shape) * 1e-9 << " GFLOP, " << attention_bytes(problem.shape) * 1e-6
            << " MB\n";
  PreparedProblem prepared;
  if (Status s = prepare_problem(problem, &prepared); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  std::printf("\n%-22s %12s %10s %10s %8s %8s  %-28s %s\n", "stage", "time (us)", "TFLOP/s", "GB/s", "x01", "xprev",
              "error vs fp64", "launch");
  double first_us = 0, prev_us = 0;
  bool all_pass = true;
  for (const StageInfo* stage : options.stages) {
    // A stage newer than the GPU is skipped, visibly, and does not fail the run.
    if (Status s = check_compute_capability(stage->name, stage->min_sm, device->sm); !s.ok()) {
      std::printf("%-22s SKIPPED: %s\n", stage->name, s.message().c_str());
      continue;
    }
    StageMeasurement m;
    if (Status s = measure_stage(*stage, prepared, problem, stream, &m); !s.ok()) {
      std::printf("%-22s %s\n", stage->name, s.message().c_str());
      all_pass = false;
      continue;
    }
    if (first_us == 0) first_us = m.timing.median_us;
    const double x_prev = prev_us > 0 ? prev_us / m.timing.median_us : 1.0;
    prev_us = m.timing.median_us;
    char err[64] = "unchecked";
    if (m.checked) std::snprintf(err, sizeof err, "%.1e %s", m.err.rel_l2, m.pass ? "pass" : "FAIL");
    std::printf("%-22s %12.2f %10.3f %10.1f %8.2f %8.2f  %-28s %lld CTAs, %.2f waves\n", stage->name,
                m.timing.median_us, m.tflops, m.gbps, first_us / m.timing.median_us, x_prev, err,
                static_cast<long long>(m.launch.ctas), m.launch.waves);
    all_pass = all_pass && m.pass;
  }
  cudaStreamDestroy(stream);
  std::printf("\nmedian GPU time per launch (CUDA events%s); error: relative L2 vs the fp64 reference on %zu rows\n",
              problem.graph ? ", CUDA graph" : "", prepared.reference.rows.size());
  return all_pass ? 0 : 1;
}
