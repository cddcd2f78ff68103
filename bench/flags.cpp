#include "flags.h"

#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <regex>
#include <sstream>

namespace attn {
namespace {

// A comma-separated list of registered stage names, e.g. "01_naive,02_kv_split".
Status parse_stage_list(const std::string& flag, const std::string& list, std::vector<const StageInfo*>* out) {
  out->clear();
  std::stringstream items(list);
  for (std::string name; std::getline(items, name, ',');) {
    const StageInfo* s = nullptr;
    if (!find_stage(name, &s).ok()) {
      std::string names;
      for (const StageInfo& r : registered_stages()) names += (names.empty() ? "" : ", ") + std::string(r.name);
      return Status::Error(flag + " (" + list + "): '" + name + "' is not a registered stage; registered: " + names);
    }
    out->push_back(s);
  }
  if (out->empty()) return Status::Error(flag + " (" + list + ") names no stage");
  return Status::Ok();
}

// What Google Benchmark appends to a name it matches --benchmark_filter against (Iterations(1),
// UseManualTime()); the reports leave it out.
constexpr const char* kBenchNameSuffix = "/iterations:1/manual_time";

bool is_flag(const std::string& arg, const char* name) {
  return arg == name || arg.rfind(std::string(name) + "=", 0) == 0;
}

// Google Benchmark's flags whose values it checks only while running (after the GPU is found),
// or never (an unknown boolean value reads as true): checked here, named.
Status check_benchmark_flag(const std::string& a, BenchOptions* o) {
  const size_t eq = a.find('=');
  const std::string name = a.substr(0, eq);
  const bool has_value = eq != std::string::npos;
  const std::string value = has_value ? a.substr(eq + 1) : "";
  // Google Benchmark reads booleans in any case, names (formats, units) only as written.
  auto one_of = [&](std::initializer_list<const char*> allowed, const std::string& what, bool any_case) -> Status {
    std::string v = value;
    if (any_case) {
      for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    for (const char* x : allowed) {
      if (v == x) return Status::Ok();
    }
    return Status::Error(name + " (" + value + ") must be " + what);
  };
  const std::initializer_list<const char*> truth = {"true", "1", "yes", "on", "t", "y"};
  auto boolean = [&]() -> Status {
    if (!has_value) return Status::Ok();
    return one_of({"true", "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n"}, "true or false",
                  true);
  };
  if (name == "--benchmark_out") {
    if (value.empty()) return Status::Error("--benchmark_out needs a file: --benchmark_out=results/mygpu/bench.json");
    const size_t slash = value.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : value.substr(0, slash == 0 ? 1 : slash);
    struct stat info {};
    if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      return Status::Error("--benchmark_out (" + value + "): the folder " + dir + " does not exist");
    }
    o->out_file = true;
  } else if (name == "--benchmark_out_format" && value != "json") {
    return Status::Error("--benchmark_out_format (" + value + ") is not supported: the file is always JSON");
  } else if (name == "--benchmark_format") {
    return one_of({"console", "json", "csv"}, "console, json or csv", false);
  } else if (name == "--benchmark_time_unit") {
    return one_of({"ns", "us", "ms", "s"}, "ns, us, ms or s", false);
  } else if (name == "--benchmark_color") {
    return one_of({"auto", "true", "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n"},
                  "auto, true or false", true);
  } else if (name == "--benchmark_min_time") {
    // Seconds (0.5 or 0.5s) or iterations (100x); some versions of the library check it only
    // when the benchmarks start, after the GPU is set up, and then abort.
    char* end = nullptr;
    const double t = std::strtod(value.c_str(), &end);
    const bool iterations = end != value.c_str() && *end == 'x' && end[1] == '\0' &&
                            value.find_first_not_of("0123456789") == value.size() - 1;
    const bool seconds = end != value.c_str() && (*end == '\0' || (*end == 's' && end[1] == '\0'));
    if (!(iterations || (seconds && std::isfinite(t) && t >= 0))) {
      return Status::Error("--benchmark_min_time (" + value +
                           ") must be seconds (0.5 or 0.5s) or iterations (100x)");
    }
  } else if (name == "--benchmark_repetitions") {
    char* end = nullptr;
    const long n = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || n < 1 || n > 1000000) {
      return Status::Error("--benchmark_repetitions (" + value + ") must be an integer >= 1");
    }
  } else if (name == "--benchmark_filter") {
    o->filter = value;
  } else if (name == "--benchmark_list_tests") {
    ATTN_TRY(boolean());
    o->list_only = !has_value || one_of(truth, "", true).ok();
  } else if (name == "--benchmark_enable_random_interleaving" || name == "--benchmark_report_aggregates_only" ||
             name == "--benchmark_display_aggregates_only" || name == "--benchmark_counters_tabular") {
    return boolean();
  }
  return Status::Ok();
}

}  // namespace

std::string runner_help(const std::string& program) {
  return "usage: " + program + " [flags]\n" +
         "Runs every registered stage on one shape (default " + kRunnerDefaultShape +
         "), checks each against the fp64\nreference, times it and prints the progression.\n" +
         problem_flags_help(kRunnerDefaultShape) +
         "  --stages A,B          only these stages, in this order (default: all registered)\n"
         "  --list                print the registered stages and exit\n"
         "  --shapes-json         print the shape suite as JSON (for tools/peers.py) and exit\n";
}

Status parse_runner_flags(const std::vector<std::string>& args, RunnerOptions* out) {
  RunnerOptions o;
  using Action = RunnerOptions::Action;
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") o.action = Action::help;  // --help wins, else the first of the others
    else if (a == "--list" && o.action == Action::run) o.action = Action::list_stages;
    else if (a == "--list-shapes" && o.action == Action::run) o.action = Action::list_shapes;
    else if (a == "--shapes-json" && o.action == Action::run) o.action = Action::shapes_json;
  }
  if (o.action != Action::run) {
    *out = o;
    return Status::Ok();
  }
  for (const StageInfo& s : registered_stages()) o.stages.push_back(&s);
  std::vector<std::string> rest;
  ATTN_TRY(parse_problem_flags(args, &o.problem, &rest, kRunnerDefaultShape));
  for (size_t n = 0; n < rest.size(); ++n) {
    if (rest[n] == "--stages") {
      if (n + 1 >= rest.size() || rest[n + 1].rfind("--", 0) == 0) return Status::Error("--stages needs a value");
      ATTN_TRY(parse_stage_list("--stages", rest[++n], &o.stages));
    } else {
      return unknown_argument(rest[n]);
    }
  }
  *out = o;
  return Status::Ok();
}

std::string bench_help(const std::string& program) {
  return "usage: " + program + " [flags]\n"
         "Times every registered stage on the shape suite (benchmarks named <stage>/<shape>, counters\n"
         "TFLOPs and GBps); the file of --benchmark_out is Google Benchmark's JSON.\n"
         "  --attn_stages=A,B     only these stages (default: all registered)\n"
         "  --attn_shapes=S       only the shapes whose name contains S (attn_runner --list-shapes)\n"
         "  --attn_all_shapes     also the long prefill shapes a slow stage skips by default\n"
         "  --benchmark_out=FILE  write the results to FILE, always as JSON\n"
         "  --help                print this, then Google Benchmark's flags, and exit\n"
         "Google Benchmark's flags:\n";
}

Status parse_bench_flags(std::vector<std::string>* args, BenchOptions* out) {
  BenchOptions o;
  std::vector<std::string> kept;
  for (const std::string& a : *args) {
    const size_t eq = a.find('=');
    const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (a == "--help" || a == "-h") {
      o.help = true;
      kept.push_back("--help");
    } else if (is_flag(a, "--attn_stages")) {
      if (eq == std::string::npos) {
        return Status::Error("--attn_stages needs a value: --attn_stages=01_naive,02_kv_split");
      }
      ATTN_TRY(parse_stage_list("--attn_stages", value, &o.stages));
    } else if (is_flag(a, "--attn_shapes")) {
      if (eq == std::string::npos || value.empty()) {
        return Status::Error("--attn_shapes needs a value: --attn_shapes=decode");
      }
      o.shapes = value;
      bool any = false;
      for (const NamedShape& s : shape_suite()) any = any || s.name.find(value) != std::string::npos;
      if (!any) {
        return Status::Error("--attn_shapes (" + value +
                             ") is in no shape's name (attn_runner --list-shapes prints them)");
      }
    } else if (a == "--attn_all_shapes") {
      o.all_shapes = true;
    } else if (a.rfind("--attn_", 0) == 0) {
      return Status::Error("unknown flag " + a + " (see --help)");
    } else {
      ATTN_TRY(check_benchmark_flag(a, &o));
      kept.push_back(a);
    }
  }
  if (!o.filter.empty() && !o.help) {
    // Google Benchmark's syntax: an extended regular expression, negated by a leading '-'.
    const bool negated = o.filter[0] == '-';
    std::regex re;
    try {
      re = std::regex(o.filter.substr(negated ? 1 : 0), std::regex::extended);
    } catch (const std::regex_error&) {
      return Status::Error("--benchmark_filter (" + o.filter + ") is not a valid regular expression");
    }
    bool any = false;
    for (const BenchCase& c : bench_cases(o)) {
      any = any || std::regex_search(c.name + kBenchNameSuffix, re) != negated;
    }
    if (!any) {
      return Status::Error("--benchmark_filter (" + o.filter + ") matches no benchmark (names are <stage>/<shape>, "
                           "e.g. 01_naive/seed; --benchmark_list_tests lists them)");
    }
  }
  *args = kept;
  *out = o;
  return Status::Ok();
}

std::vector<BenchCase> bench_cases(const BenchOptions& options) {
  std::vector<BenchCase> cases;
  for (const StageInfo& stage : registered_stages()) {
    bool chosen = options.stages.empty();
    for (const StageInfo* s : options.stages) chosen = chosen || s == &stage;
    if (!chosen) continue;
    for (const NamedShape& shape : shape_suite()) {
      if (!options.shapes.empty() && shape.name.find(options.shapes) == std::string::npos) continue;
      const bool too_long =
          stage.bench_max_seq > 0 && shape.kind == ShapeKind::prefill && shape.shape.sq > stage.bench_max_seq;
      if (too_long && !options.all_shapes) continue;
      cases.push_back({std::string(stage.name) + "/" + shape.name, &stage, &shape});
    }
  }
  return cases;
}

}  // namespace attn
