/// @file cli.h
/// @brief The command line shared by every stage's program and the runner: pick a shape, run a
///        stage on it, check it against the fp64 reference, time it, print the figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "compare.h"
#include "device.h"
#include "problem.h"
#include "reference.h"
#include "shapes.h"
#include "stage.h"
#include "status.h"
#include "timer.h"

namespace attn {

/// The problem chosen on the command line.
struct CliOptions {
  std::string shape_name = "seed";  ///< suite name, or "custom" when sizes were given
  ProblemShape shape;               ///< the shape to run
  bool graph = true;                ///< time with a CUDA graph (from the suite entry, or --graph)
  bool check = true;                ///< compare with the fp64 reference (--no-check skips)
  uint64_t seed = 1;                ///< input seed (--seed)
};

/// The flags parse_problem_flags() reads, for --help; @p default_shape is the program's.
std::string problem_flags_help(const std::string& default_shape);

/// The shape suite, one "name  sizes" line per shape (--list-shapes).
std::string shape_list();

/// Parse --shape NAME, the size flags --b --hq --hkv --sq --sk --d --dtype --causal --layout
/// --scale, and --graph / --no-graph, --no-check, --seed. The shape is --shape's (else
/// @p default_shape), with the size flags applied over it wherever they stand. Every value is
/// checked here, and then the whole shape (validate_shape()), so that nothing reaches a GPU
/// unchecked; an error names the flag or field and its value. Arguments it does not know (other
/// programs' flags and their values) are left in @p rest, in order.
Status parse_problem_flags(const std::vector<std::string>& args, CliOptions* out, std::vector<std::string>* rest,
                           const std::string& default_shape = "seed");

/// The error for an argument no parser took: "unknown flag --x (see --help)" for a flag,
/// "unexpected argument 'x' (see --help)" for anything else.
Status unknown_argument(const std::string& arg);

/// The current GPU; without one, an error that says what needs a GPU and what does not.
Status require_device(const DeviceInfo** out);

/// Inputs on the device (rotating sets sized for the L2) and, when @p check, the reference.
struct PreparedProblem {
  Problem problem;            ///< device tensors
  bool checked = false;       ///< whether reference holds anything
  ReferenceOutput reference;  ///< fp64 reference on rows_to_check()
};

/// Allocate, fill with normal(0,1) and (when options.check) compute the reference.
Status prepare_problem(const CliOptions& options, PreparedProblem* out);

/// One stage's figures on one problem.
struct StageMeasurement {
  LaunchReport launch;  ///< grid, block, occupancy, resources
  Timing timing;        ///< median per-launch time
  double tflops = 0;    ///< attention_flops / time
  double gbps = 0;      ///< attention_bytes / time
  bool checked = false; ///< whether err holds a comparison
  ErrorStats err;       ///< vs the fp64 reference
  bool pass = true;     ///< err within the contract's bounds (true when unchecked)
};

/// Run @p stage on @p prepared once with poisoned outputs, check it, then time it.
Status measure_stage(const StageInfo& stage, PreparedProblem& prepared, const CliOptions& options,
                     cudaStream_t stream, StageMeasurement* out);

/// One line about the GPU: name, sm, SMs, L2, driver, CUDA runtime.
std::string describe(const DeviceInfo& d);

/// main() of a stage's own program (build/stages/NN_name/NN_name).
int stage_main(int argc, char** argv, const StageInfo& stage);

}  // namespace attn
