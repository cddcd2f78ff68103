#include "cli.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

namespace attn {

std::string problem_flags_help(const std::string& default_shape) {
  return "  --shape NAME          a shape of the suite (default: " + default_shape +
         "); --list-shapes prints them\n"
         "  --b N --hq N --hkv N --sq N --sk N\n"
         "                        batch, query heads, kv heads, query and key lengths: integers >= 1,\n"
         "                        Hq a multiple of Hkv; each replaces that size of the shape\n"
         "  --d {64,128}  --dtype {fp16,bf16}  --layout {BSHD,BHSD}  --causal\n"
         "                        head dimension, element type, memory order, causal mask (the same)\n"
         "  --scale X             softmax scale, a finite number (0, the default: 1/sqrt(D))\n"
         "  --graph | --no-graph  time a CUDA graph of launches or not (default: the suite's choice;\n"
         "                        with changed sizes, a graph when the problem is under 1 GFLOP)\n"
         "  --no-check            skip the check against the fp64 reference\n"
         "  --seed N              input seed, an integer >= 0 (default 1)\n"
         "  --list-shapes         print the shape suite and exit\n"
         "  --help                print this and exit\n";
}

std::string shape_list() {
  std::string out;
  for (const NamedShape& s : shape_suite()) {
    char line[160];
    std::snprintf(line, sizeof line, "%-28s %s\n", s.name.c_str(), describe(s.shape).c_str());
    out += line;
  }
  return out;
}

namespace {

bool starts_with_space(const std::string& text) {
  return !text.empty() && std::isspace(static_cast<unsigned char>(text[0]));
}

// A size: a whole decimal number >= 1 that fits in 64 bits.
Status parse_size(const std::string& flag, const std::string& text, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || starts_with_space(text) || *end != '\0') {
    return Status::Error(flag + " (" + text + ") is not an integer");
  }
  if (errno == ERANGE) return Status::Error(flag + " (" + text + ") is too large");
  if (v < 1) return Status::Error(flag + " (" + text + ") must be an integer >= 1");
  *out = v;
  return Status::Ok();
}

Status parse_seed(const std::string& flag, const std::string& text, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || starts_with_space(text) || *end != '\0') {
    return Status::Error(flag + " (" + text + ") is not an integer");
  }
  if (errno == ERANGE || text[0] == '-') {
    return Status::Error(flag + " (" + text + ") must be an integer from 0 to 2^64 - 1");
  }
  *out = v;
  return Status::Ok();
}

Status parse_scale(const std::string& flag, const std::string& text, float* out) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || starts_with_space(text) || *end != '\0') {
    return Status::Error(flag + " (" + text + ") is not a number");
  }
  const float f = static_cast<float>(v);
  if (!std::isfinite(f)) return Status::Error(flag + " (" + text + ") is not a finite fp32 number");
  *out = f;
  return Status::Ok();
}

}  // namespace

Status parse_problem_flags(const std::vector<std::string>& args, CliOptions* out, std::vector<std::string>* rest,
                           const std::string& default_shape) {
  // The size flags apply over the chosen shape wherever they stand, so they are collected first.
  std::string shape_name = default_shape;
  std::optional<int64_t> b, hq, hkv, sq, sk, d;
  std::optional<DType> dtype;
  std::optional<Layout> layout;
  std::optional<float> scale;
  bool causal = false, graph_set = false, graph = false, check = true;
  uint64_t seed = 1;
  for (size_t n = 0; n < args.size(); ++n) {
    const std::string& a = args[n];
    // A flag's value is the next argument, unless that is a flag itself ("--sq --causal" lacks one).
    auto value = [&](std::string* v) -> Status {
      if (n + 1 >= args.size() || args[n + 1].rfind("--", 0) == 0) return Status::Error(a + " needs a value");
      *v = args[++n];
      return Status::Ok();
    };
    std::string v;
    std::optional<int64_t>* size = a == "--b"     ? &b
                                   : a == "--hq"  ? &hq
                                   : a == "--hkv" ? &hkv
                                   : a == "--sq"  ? &sq
                                   : a == "--sk"  ? &sk
                                   : a == "--d"   ? &d
                                                  : nullptr;
    if (size != nullptr) {
      ATTN_TRY(value(&v));
      int64_t x = 0;
      ATTN_TRY(parse_size(a, v, &x));
      if (a == "--d" && x != 64 && x != 128) return Status::Error("--d (" + v + ") must be 64 or 128");
      *size = x;
    } else if (a == "--shape") {
      ATTN_TRY(value(&v));
      const NamedShape* s = nullptr;
      if (!find_shape(v, &s).ok()) {
        return Status::Error("--shape (" + v + ") is not a shape of the suite (--list-shapes prints them)");
      }
      shape_name = v;
    } else if (a == "--dtype") {
      ATTN_TRY(value(&v));
      if (v != "fp16" && v != "bf16") return Status::Error("--dtype (" + v + ") must be fp16 or bf16");
      dtype = v == "fp16" ? DType::f16 : DType::bf16;
    } else if (a == "--layout") {
      ATTN_TRY(value(&v));
      if (v != "BSHD" && v != "BHSD") return Status::Error("--layout (" + v + ") must be BSHD or BHSD");
      layout = v == "BSHD" ? Layout::BSHD : Layout::BHSD;
    } else if (a == "--scale") {
      ATTN_TRY(value(&v));
      float x = 0;
      ATTN_TRY(parse_scale(a, v, &x));
      scale = x;
    } else if (a == "--causal") {
      causal = true;
    } else if (a == "--graph" || a == "--no-graph") {
      graph = a == "--graph";
      graph_set = true;
    } else if (a == "--no-check") {
      check = false;
    } else if (a == "--seed") {
      ATTN_TRY(value(&v));
      ATTN_TRY(parse_seed(a, v, &seed));
    } else {
      rest->push_back(a);
    }
  }

  const NamedShape* base = nullptr;
  ATTN_TRY(find_shape(shape_name, &base));
  CliOptions o;
  o.shape_name = base->name;
  o.shape = base->shape;
  o.graph = base->graph;
  o.check = check;
  o.seed = seed;
  const bool custom = b || hq || hkv || sq || sk || d || dtype || layout || scale || causal;
  if (b) o.shape.b = *b;
  if (hq) o.shape.hq = *hq;
  if (hkv) o.shape.hkv = *hkv;
  if (sq) o.shape.sq = *sq;
  if (sk) o.shape.sk = *sk;
  if (d) o.shape.d = *d;
  if (dtype) o.shape.dtype = *dtype;
  if (layout) o.shape.layout = *layout;
  if (scale) o.shape.scale = *scale;
  if (causal) o.shape.causal = true;
  if (custom) {
    o.shape_name = "custom";
    o.graph = attention_flops(o.shape) < 1e9;  // latency-bound: a graph hides launch gaps
  }
  if (graph_set) o.graph = graph;
  ATTN_TRY(validate_shape(o.shape));
  *out = o;
  return Status::Ok();
}

Status unknown_argument(const std::string& arg) {
  if (arg.rfind("-", 0) == 0) return Status::Error("unknown flag " + arg + " (see --help)");
  return Status::Error("unexpected argument '" + arg + "' (see --help)");
}

Status require_device(const DeviceInfo** out) {
  if (Status s = current_device(out); !s.ok()) {
    return Status::Error(s.message() + ": this program needs an NVIDIA GPU of sm_80 or newer; the build and "
                         "test_cpu do not");
  }
  return Status::Ok();
}

Status prepare_problem(const CliOptions& options, PreparedProblem* out) {
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  const int sets = input_sets_for(attention_bytes(options.shape), device->l2_bytes);
  ATTN_TRY(Problem::create(options.shape, sets, /*with_lse=*/true, &out->problem));
  ATTN_TRY(out->problem.fill_random(options.seed));
  out->checked = options.check;
  if (options.check) {
    HostInputs inputs;
    ATTN_TRY(out->problem.download_inputs(&inputs));
    out->reference = reference_attention(inputs, rows_to_check(options.shape));
  }
  return Status::Ok();
}

Status measure_stage(const StageInfo& stage, PreparedProblem& prepared, const CliOptions& options,
                     cudaStream_t stream, StageMeasurement* out) {
  Problem& problem = prepared.problem;
  StageMeasurement m;
  ATTN_TRY(describe_launch(stage, problem.params(0), &m.launch));

  size_t ws_bytes = 0;
  for (int s = 0; s < problem.input_sets(); ++s) ws_bytes = std::max(ws_bytes, workspace_bytes(stage, problem.params(s)));
  DeviceBuffer workspace_buffer;
  ATTN_TRY(workspace_buffer.allocate(ws_bytes));
  const Workspace ws{workspace_buffer.get(), ws_bytes};

  // Correctness first: one launch over poisoned outputs, compared with the reference.
  ATTN_TRY(problem.poison_outputs(stream));
  ATTN_TRY(stage.launch(problem.params(0), ws, stream));
  if (cudaStreamSynchronize(stream) != cudaSuccess) {
    return Status::Error(std::string("stage ") + stage.name + ": " + cudaGetErrorString(cudaGetLastError()));
  }
  if (prepared.checked) {
    HostOutput got;
    ATTN_TRY(problem.download_output(&got));
    m.checked = true;
    m.err = compare_with_reference(got, prepared.reference, options.shape);
    m.pass = passes(m.err, options.shape.dtype);
  }

  TimingOptions timing;
  timing.graph = options.graph;
  const int sets = problem.input_sets();
  ATTN_TRY(time_launches(
      [&](int index, cudaStream_t s) { return stage.launch(problem.params(index % sets), ws, s); }, stream, timing,
      &m.timing));
  const double seconds = m.timing.median_us * 1e-6;
  m.tflops = attention_flops(options.shape) / seconds * 1e-12;
  m.gbps = attention_bytes(options.shape) / seconds * 1e-9;
  *out = m;
  return Status::Ok();
}

std::string describe(const DeviceInfo& d) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (sm_%d, %d SMs, L2 %.0f MB, %.2f GHz), driver %s, CUDA runtime %s",
                d.name.c_str(), d.sm, d.sm_count, d.l2_bytes / 1048576.0, d.clock_ghz,
                driver_version_string().c_str(), cuda_version_string(d.runtime_version).c_str());
  return buf;
}

namespace {

std::string percent_of(double value, double peak) {
  if (peak <= 0) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * value / peak);
  return buf;
}

}  // namespace

int stage_main(int argc, char** argv, const StageInfo& stage) {
  std::vector<std::string> args(argv + 1, argv + argc), rest;
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << "usage: " << argv[0] << " [flags]\nRuns stage " << stage.name << " (" << stage.description
                << ", sm_" << stage.min_sm << " or newer) on one shape, checks it against the fp64 reference"
                << " and times it.\n"
                << problem_flags_help("seed");
      return 0;
    }
    if (a == "--list-shapes") {
      std::cout << shape_list();
      return 0;
    }
  }
  // Every flag and the whole shape are checked before the GPU is looked for.
  CliOptions options;
  Status st = parse_problem_flags(args, &options, &rest);
  if (st.ok() && !rest.empty()) st = unknown_argument(rest.front());
  if (!st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }

  const DeviceInfo* device = nullptr;
  st = require_device(&device);
  if (st.ok()) st = check_compute_capability(stage.name, stage.min_sm, device->sm);
  if (!st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 1;
  }
  std::cout << "stage   " << stage.name << ": " << stage.description << "\n"
            << "GPU     " << describe(*device) << "\n"
            << "shape   " << options.shape_name << ": " << describe(options.shape) << "\n";

  PreparedProblem prepared;
  StageMeasurement m;
  cudaStream_t stream = nullptr;
  st = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess
           ? Status::Ok()
           : Status::Error("cudaStreamCreate failed");
  if (st.ok()) st = prepare_problem(options, &prepared);
  if (st.ok()) st = measure_stage(stage, prepared, options, stream, &m);
  if (stream) cudaStreamDestroy(stream);
  if (!st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 1;
  }
  std::printf("launch  %s\n", describe(m.launch).c_str());
  std::printf("time    %.2f us median (min %.2f, max %.2f; %d samples x %d launches%s)\n", m.timing.median_us,
              m.timing.min_us, m.timing.max_us, m.timing.samples, m.timing.launches_per_sample,
              options.graph ? ", CUDA graph" : "");
  std::printf("rate    %.3f TFLOP/s = %s of the tensor-core peak (%.0f), %s of the fp32 peak (%.1f)\n", m.tflops,
              percent_of(m.tflops, device->tensor_peak_tflops).c_str(), device->tensor_peak_tflops,
              percent_of(m.tflops, device->fp32_peak_tflops).c_str(), device->fp32_peak_tflops);
  std::printf("        %.1f GB/s = %s of the DRAM peak (%.0f GB/s)   [peaks: spec sheet at the max clock]\n", m.gbps,
              percent_of(m.gbps, device->dram_peak_gbps).c_str(), device->dram_peak_gbps);
  if (m.checked) {
    std::printf("check   vs fp64 reference on %zu rows: %s  %s\n", prepared.reference.rows.size(),
                describe(m.err).c_str(), m.pass ? "PASS" : "FAIL");
  }
  return m.pass ? 0 : 1;
}

}  // namespace attn
