// The main job: every registered stage on one shape, checked against the fp64 reference, timed,
// and printed as the progression table (time, TFLOP/s, GB/s, speed-up over 01 and over the
// previous stage, error).
//
//   build/bench/attn_runner                       the default shape, prefill_d128_s4096
//   build/bench/attn_runner --shape seed          any shape of the suite, or --b/--sq/... sizes
//   build/bench/attn_runner --stages 01_naive     a subset of the stages
//   build/bench/attn_runner --shapes-json         the suite as JSON (read by tools/peers.py)
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "registry.h"

using namespace attn;

namespace {

constexpr const char* kDefaultShape = "prefill_d128_s4096";

void usage(const char* argv0) {
  std::cout << "usage: " << argv0 << " [flags]\n"
            << "Runs every registered stage on one shape (default " << kDefaultShape
            << ") and prints the progression.\n"
            << problem_flags_help()
            << "  --stages A,B        only these stages (default: all registered)\n"
            << "  --list              list the registered stages\n"
            << "  --shapes-json       print the shape suite as JSON (for tools/peers.py)\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = {"--shape", kDefaultShape}, rest;
  args.insert(args.end(), argv + 1, argv + argc);
  std::vector<const StageInfo*> stages;
  for (const StageInfo& s : registered_stages()) stages.push_back(&s);

  for (size_t n = 2; n < args.size(); ++n) {
    if (args[n] == "--help" || args[n] == "-h") {
      usage(argv[0]);
      return 0;
    }
    if (args[n] == "--list") {
      for (const StageInfo& s : registered_stages())
        std::cout << s.name << "  (sm_" << s.min_sm << "+)  " << s.description << "\n";
      return 0;
    }
    if (args[n] == "--shapes-json") {
      const DeviceInfo* device = nullptr;
      const size_t l2 = current_device(&device).ok() ? device->l2_bytes : 0;
      std::cout << shapes_json(shape_suite(), l2);
      return 0;
    }
  }

  CliOptions options;
  Status st = parse_problem_flags(args, &options, &rest);
  for (size_t n = 0; st.ok() && n < rest.size(); ++n) {
    if (rest[n] == "--stages" && n + 1 < rest.size()) {
      stages.clear();
      std::stringstream list(rest[++n]);
      for (std::string name; st.ok() && std::getline(list, name, ',');) {
        const StageInfo* s = nullptr;
        st = find_stage(name, &s);
        stages.push_back(s);
      }
    } else {
      st = Status::Error("unknown flag " + rest[n] + " (see --help)");
    }
  }
  const DeviceInfo* device = nullptr;
  if (st.ok()) st = current_device(&device);
  if (!st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }

  std::cout << "GPU    " << describe(*device) << "\n"
            << "shape  " << options.shape_name << ": " << describe(options.shape) << "\n"
            << "       " << attention_flops(options.shape) * 1e-9 << " GFLOP, " << attention_bytes(options.shape) * 1e-6
            << " MB\n";
  PreparedProblem prepared;
  if (Status s = prepare_problem(options, &prepared); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  std::printf("\n%-22s %12s %10s %10s %8s %8s  %-28s %s\n", "stage", "time (us)", "TFLOP/s", "GB/s", "x01", "xprev",
              "error vs fp64", "launch");
  double first_us = 0, prev_us = 0;
  bool all_pass = true;
  for (const StageInfo* stage : stages) {
    if (stage->min_sm > device->sm) {
      std::printf("%-22s SKIPPED: requires sm_%d, this GPU is sm_%d\n", stage->name, stage->min_sm, device->sm);
      continue;
    }
    StageMeasurement m;
    if (Status s = measure_stage(*stage, prepared, options, stream, &m); !s.ok()) {
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
              options.graph ? ", CUDA graph" : "", prepared.reference.rows.size());
  return all_pass ? 0 : 1;
}
