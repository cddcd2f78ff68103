#include "cli.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace attn {

std::string problem_flags_help() {
  return "  --shape NAME        a shape of the suite (default: seed); --list-shapes prints them\n"
         "  --b N --hq N --hkv N --sq N --sk N --d {64,128}\n"
         "  --dtype {fp16,bf16}  --causal  --layout {BSHD,BHSD}  --scale X\n"
         "                      a custom shape (starts from the seed shape)\n"
         "  --graph | --no-graph  time a CUDA graph of launches (default: the suite's choice)\n"
         "  --no-check          skip the fp64 reference check\n"
         "  --seed N            input seed (default 1)\n";
}

namespace {

Status parse_int(const std::string& flag, const std::string& text, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') return Status::Error(flag + " (" + text + ") is not an integer");
  *out = v;
  return Status::Ok();
}

}  // namespace

Status parse_problem_flags(const std::vector<std::string>& args, CliOptions* out, std::vector<std::string>* rest) {
  CliOptions o;
  const NamedShape* seed = nullptr;
  ATTN_TRY(find_shape("seed", &seed));
  o.shape = seed->shape;
  o.graph = seed->graph;
  bool custom = false, graph_set = false;
  for (size_t n = 0; n < args.size(); ++n) {
    const std::string& a = args[n];
    auto value = [&](std::string* v) -> Status {
      if (n + 1 >= args.size()) return Status::Error(a + " needs a value");
      *v = args[++n];
      return Status::Ok();
    };
    std::string v;
    int64_t* size_field = a == "--b"     ? &o.shape.b
                          : a == "--hq"  ? &o.shape.hq
                          : a == "--hkv" ? &o.shape.hkv
                          : a == "--sq"  ? &o.shape.sq
                          : a == "--sk"  ? &o.shape.sk
                          : a == "--d"   ? &o.shape.d
                                         : nullptr;
    if (size_field != nullptr) {
      ATTN_TRY(value(&v));
      ATTN_TRY(parse_int(a, v, size_field));
      custom = true;
    } else if (a == "--shape") {
      ATTN_TRY(value(&v));
      const NamedShape* s = nullptr;
      ATTN_TRY(find_shape(v, &s));
      o.shape_name = s->name;
      o.shape = s->shape;
      if (!graph_set) o.graph = s->graph;
    } else if (a == "--dtype") {
      ATTN_TRY(value(&v));
      if (v != "fp16" && v != "bf16") return Status::Error("--dtype (" + v + ") must be fp16 or bf16");
      o.shape.dtype = v == "fp16" ? DType::f16 : DType::bf16;
      custom = true;
    } else if (a == "--layout") {
      ATTN_TRY(value(&v));
      if (v != "BSHD" && v != "BHSD") return Status::Error("--layout (" + v + ") must be BSHD or BHSD");
      o.shape.layout = v == "BSHD" ? Layout::BSHD : Layout::BHSD;
      custom = true;
    } else if (a == "--scale") {
      ATTN_TRY(value(&v));
      o.shape.scale = std::strtof(v.c_str(), nullptr);
      custom = true;
    } else if (a == "--causal") {
      o.shape.causal = true;
      custom = true;
    } else if (a == "--graph" || a == "--no-graph") {
      o.graph = a == "--graph";
      graph_set = true;
    } else if (a == "--no-check") {
      o.check = false;
    } else if (a == "--seed") {
      ATTN_TRY(value(&v));
      int64_t s = 0;
      ATTN_TRY(parse_int(a, v, &s));
      o.seed = static_cast<uint64_t>(s);
    } else {
      rest->push_back(a);
    }
  }
  if (custom) {
    o.shape_name = "custom";
    if (!graph_set) o.graph = attention_flops(o.shape) < 1e9;  // latency-bound: a graph hides launch gaps
  }
  *out = o;
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
                << ") on one shape, checks it against the fp64 reference and times it.\n"
                << problem_flags_help() << "  --list-shapes       print the shape suite\n";
      return 0;
    }
    if (a == "--list-shapes") {
      for (const NamedShape& s : shape_suite()) std::cout << s.name << "  " << describe(s.shape) << "\n";
      return 0;
    }
  }
  CliOptions options;
  Status st = parse_problem_flags(args, &options, &rest);
  if (st.ok() && !rest.empty()) st = Status::Error("unknown flag " + rest.front() + " (see --help)");
  if (!st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }

  const DeviceInfo* device = nullptr;
  if (Status s = current_device(&device); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
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
