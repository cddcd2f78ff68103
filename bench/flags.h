// The command lines of attn_runner and attn_bench, parsed and checked on the host only, so that
// a bad value is named before either program looks for a GPU (tests/test_cpu.cpp checks them).
#pragma once

#include <string>
#include <vector>

#include "cli.h"
#include "registry.h"
#include "status.h"

namespace attn {

/// attn_runner's default shape.
constexpr const char* kRunnerDefaultShape = "prefill_d128_s4096";

/// What attn_runner was asked to do.
struct RunnerOptions {
  enum class Action { run, help, list_stages, list_shapes, shapes_json };
  Action action = Action::run;
  CliOptions problem;                    ///< the shape and how to run it
  std::vector<const StageInfo*> stages;  ///< --stages, in the order given; all registered by default
};

/// attn_runner --help.
std::string runner_help(const std::string& program);

/// Parse attn_runner's arguments (without argv[0]). --help, --list, --list-shapes and
/// --shapes-json win over everything else; otherwise every flag and the shape are checked.
Status parse_runner_flags(const std::vector<std::string>& args, RunnerOptions* out);

/// attn_bench's own flags (Google Benchmark's are its library's).
struct BenchOptions {
  bool help = false;                     ///< --help: ours, then Google Benchmark's
  std::vector<const StageInfo*> stages;  ///< --attn_stages=A,B; all registered when empty
  std::string shapes;                    ///< --attn_shapes=S: shapes whose name contains S
  bool all_shapes = false;               ///< --attn_all_shapes
  bool out_file = false;                 ///< --benchmark_out=FILE given
  bool list_only = false;                ///< --benchmark_list_tests: names only, no GPU needed
  std::string filter;                    ///< --benchmark_filter=REGEX, checked against the names
};

/// The project's part of attn_bench --help.
std::string bench_help(const std::string& program);

/// Take attn_bench's own flags out of @p args (Google Benchmark refuses flags it does not know)
/// and check those of Google Benchmark's that it would only check after the GPU is found:
/// --benchmark_out, --benchmark_out_format, --benchmark_format, --benchmark_filter.
Status parse_bench_flags(std::vector<std::string>* args, BenchOptions* out);

/// The benchmarks attn_bench registers for @p options: "<stage>/<shape>" with the stage and shape.
struct BenchCase {
  std::string name;         ///< e.g. "05_cp_async/seed"
  const StageInfo* stage;   ///< the stage
  const NamedShape* shape;  ///< the shape
};
std::vector<BenchCase> bench_cases(const BenchOptions& options);

}  // namespace attn
