// loom_bench: where loom stands against the machine, in one table.
//
//   ./build/bench/loom_bench                                   # everything, a few minutes
//   ./build/bench/loom_bench --steps 2 --reps 2                # a quicker, noisier pass
//   ./build/bench/loom_bench --sections train,host --models resnet20 --modes captured,compiled,lazy
//
// Sections (see the README's "Benchmarks" for every column):
//   gemm    the machine's SGEMM peak (Eigen, split over the TBB threads) and loom's matmul
//   sincos  y = sin(cos(x)) on 16M floats, one graph vs one op at a time (into recycled
//           buffers, and into fresh ones as an allocator without a cache gives), against the
//           stream bandwidth bound and a cache-resident sin+cos compute bound
//   fused   fused elementwise chains (batch-norm apply + ReLU, its backward, residual
//           add + ReLU) at ResNet shapes, and a bfloat16 channels-last batch norm's statistics
//           and normalise + ReLU, against the stream triad measured beside them
//   train   whole training steps (fake data) of ResNet-20, ResNet-18 (CIFAR) and a 2-layer
//           Llama-style decoder in captured, compiled, lazy and eager modes
//   host    tracing, graph build + hash, lookup + launch and compile time per node, a
//           captured step's replay; device buffers and executor heap allocations per step
//   infer   small-batch forward passes (ResNet-18 CIFAR b1, decoder b1x32), lazy vs captured
// Progress goes to stderr; the table alone to stdout.
#include "loom_bench.h"

#include <loom/error.h>
#include <loom/openmp.h>

#include <boost/program_options.hpp>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>

namespace loom::bench {

bool Options::has(const std::vector<std::string>& list, const std::string& item) const {
  return std::find(list.begin(), list.end(), item) != list.end();
}

int thread_count() {
  // --threads lowers the global limit; the default arena still reports every core.
  auto limit = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(std::max<std::size_t>(
      1, std::min<std::size_t>(limit, static_cast<std::size_t>(tbb::this_task_arena::max_concurrency()))));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

std::string format_time(double s) {
  // Three significant digits in the largest unit that keeps the figure at 1 or more.
  const std::array<std::pair<double, const char*>, 3> units{{{1, "%.3g s"}, {1e3, "%.3g ms"}, {1e6, "%.3g us"}}};
  for (const auto& [scale, fmt] : units)
    if (s * scale >= 0.9995) return format(fmt, s * scale);
  return format("%.3g ns", s * 1e9);
}

void progress(const std::string& line) { std::cerr << "loom_bench: " << line << std::endl; }

std::string Table::str() const {
  constexpr std::size_t kColumns = 11;
  using Cells = std::array<std::string, kColumns>;
  auto cells = [](const Row& r) {
    return Cells{r.section, r.benchmark, r.mode, r.precision, r.time, r.rate, r.gflops, r.peak, r.ratio, r.vs, r.idle};
  };
  std::vector<Cells> lines{{"section", "benchmark", "mode", "precision", "time", "rate", "GFLOP/s", "%peak", "ratio",
                            "vs", "dev idle"}};
  for (const auto& r : rows_) lines.push_back(cells(r));
  std::array<std::size_t, kColumns> width{};
  for (auto& l : lines)
    for (std::size_t c = 0; c < kColumns; ++c) {
      if (l[c].empty()) l[c] = "-";
      width[c] = std::max(width[c], l[c].size());
    }
  // Text columns flush left, figures flush right.
  auto left = [](std::size_t c) { return c < 4 || c == 9; };
  std::ostringstream os;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string line;
    for (std::size_t c = 0; c < kColumns; ++c) {
      const auto& s = lines[i][c];
      std::string pad(width[c] - s.size(), ' ');
      line += (c ? "  " : "") + (left(c) ? s + pad : pad + s);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    os << line << '\n';
    if (i == 0) os << std::string(line.size(), '-') << '\n';
  }
  return os.str();
}

namespace {

namespace po = boost::program_options;

std::vector<std::string> split_list(const std::string& s, const std::vector<std::string>& valid,
                                    const char* option) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    if (std::find(valid.begin(), valid.end(), item) == valid.end()) {
      std::string names;
      for (const auto& v : valid) names += (names.empty() ? "" : ", ") + v;
      throw Error(std::string("--") + option + ": expected a comma-separated list of " + names + ", got '" +
                  item + "'");
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  if (out.empty()) throw Error(std::string("--") + option + ": expected at least one name, got '" + s + "'");
  return out;
}

void require_at_least(const char* option, int64_t value, int64_t min) {
  if (value < min)
    throw Error(std::string("--") + option + ": expected at least " + std::to_string(min) + ", got " +
                std::to_string(value));
}

int run(int argc, char** argv) {
  const std::vector<std::string> sections{"gemm", "sincos", "fused", "train", "host", "infer"};
  const std::vector<std::string> models{"resnet20", "resnet18", "decoder"};
  const std::vector<std::string> modes{"captured", "compiled", "lazy", "eager"};
  Options o;
  po::options_description desc("loom_bench options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("sections", po::value<std::string>()->default_value("gemm,sincos,fused,train,host,infer"), "sections to run")
    ("models", po::value<std::string>()->default_value("resnet20,resnet18,decoder"), "training workloads")
    ("modes", po::value<std::string>()->default_value("captured,compiled,lazy,eager"), "execution modes of the training steps and of sin(cos(x)) (captured: compile() with step capture; compiled: traced at every call)")
    ("precision", po::value<std::string>()->default_value("fp32"), "precisions of the training steps: fp32, bf16 (matmuls and convolutions in bfloat16 under loom::Autocast), or both: fp32,bf16")
    ("steps", po::value<int64_t>(&o.steps)->default_value(o.steps), "timed training steps per model and mode")
    ("warmup", po::value<int64_t>(&o.warmup)->default_value(o.warmup), "untimed steps before them (at least 2: the first step also creates the optimizer state)")
    ("host-steps", po::value<int64_t>(&o.host_steps)->default_value(o.host_steps), "lazy steps on an idle device for the host rows (the best counts)")
    ("reps", po::value<int64_t>(&o.reps)->default_value(o.reps), "repetitions of each kernel measurement (the best counts)")
    ("threads", po::value<int>(&o.threads)->default_value(0), "TBB threads (0: all cores)")
    ("profile", po::value<std::string>(&o.profile), "write a Chrome trace of the timed training steps (one span per kernel on the device thread) to this file")
    ("omp_default", "keep libgomp's default wait policy (its threads spin after each oneDNN call) instead of restarting with OMP_WAIT_POLICY=passive (loom/openmp.h)");
  // clang-format on
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << "usage: loom_bench [options]\n\nPrints one table: the hardware's FMA peak and the SGEMM peak, training-step "
                 "throughput per precision, "
                 "sin(cos(x)) against the memory bound, and host overhead.\n\n"
              << desc;
    return 0;
  }
  o.sections = split_list(vm["sections"].as<std::string>(), sections, "sections");
  o.models = split_list(vm["models"].as<std::string>(), models, "models");
  o.modes = split_list(vm["modes"].as<std::string>(), modes, "modes");
  o.precisions = split_list(vm["precision"].as<std::string>(), {"fp32", "bf16"}, "precision");
  require_at_least("steps", o.steps, 1);
  require_at_least("warmup", o.warmup, 2);
  require_at_least("host-steps", o.host_steps, 1);
  require_at_least("reps", o.reps, 1);
  require_at_least("threads", o.threads, 0);
  std::unique_ptr<tbb::global_control> limit;
  if (o.threads > 0)
    limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, o.threads);

  const int threads = thread_count();
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  progress(std::string("OMP_WAIT_POLICY: ") + (policy ? policy : "unset (libgomp's default: spin)"));
  progress("threads: " + std::to_string(threads) + "; " + std::to_string(o.warmup) + " warm-up + " +
           std::to_string(o.steps) + " timed steps per model and mode; best of " + std::to_string(o.reps) +
           " kernel runs");
  Table table;
  Bounds bounds;
  // The peak is the denominator of every %peak cell, so it is measured whenever one is shown.
  if (o.section("gemm") || o.section("train")) {
    measure_hardware_peak(o, bounds, table);
    measure_sgemm_peak(o, bounds, table);
  }
  if (o.section("gemm")) bench_loom_matmul(o, bounds, table);
  if (o.section("sincos")) bench_sin_cos(o, bounds, table);
  if (o.section("fused")) bench_fused(o, table);
  if (o.section("train") || o.section("host")) bench_training(o, bounds, table);
  if (o.section("infer")) bench_inference(o, table);

  std::cout << "loom_bench (threads: " << threads << ", " << o.steps << " timed steps after " << o.warmup
            << " warm-up, kernels best of " << o.reps << ")\n\n"
            << table.str();
  return 0;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  if (std::none_of(argv + 1, argv + argc, [](const char* a) { return std::string(a) == "--omp_default"; }))
    loom::openmp_passive_or_reexec(argc, argv);
  try {
    return loom::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "loom_bench: error: " << e.what() << '\n';
    return 1;
  }
}
