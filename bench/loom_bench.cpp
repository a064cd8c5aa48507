// loom_bench: where loom stands against the machine, in one table.
//
//   ./build/bench/loom_bench                                   # everything, a few minutes
//   ./build/bench/loom_bench --steps 2 --reps 2                # a quicker, noisier pass
//   ./build/bench/loom_bench --sections train,host --models resnet20 --modes captured,compiled,lazy
//   ./build/bench/loom_bench --device cuda --sections gemm,train,host --modes lazy,captured
//                            --precision fp32,bf16 --batch resnet20=1024,resnet18=256,decoder=64
//
// --device moves the train, host and infer sections to that device (models, optimizer state
// and fake data live there). Sections that measure the CPU itself (sincos, fused) are skipped
// there with one line saying so, and gemm becomes loom's matmul on the device, the %peak
// denominator there (device_peak.cpp).
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

#include <loom/dtype.h>
#include <loom/error.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/openmp.h>

#include <boost/program_options.hpp>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <charconv>
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

int64_t Options::batch(const std::string& model, int64_t fallback) const {
  auto it = batches.find(model);
  return it == batches.end() ? fallback : it->second;
}

std::string device_precision_note(const Options& o) {
  if (device_type_name(o.device.type) != "cuda") return "";
  const char* tf32 = std::getenv("LOOM_CUDA_TF32");
  return tf32 && std::string(tf32) == "1" ? "TF32 on" : "TF32 off";
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
      if (l[c].empty()) l[c].assign(1, '-');  // not = "-": GCC 12 warns falsely there (-Wrestrict)
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

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::string> split_list(const std::string& s, const std::vector<std::string>& valid,
                                    const char* option) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    if (std::find(valid.begin(), valid.end(), item) == valid.end())
      throw Error(std::string("--") + option + ": expected a comma-separated list of " + joined(valid) + ", got '" +
                  item + "'");
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  if (out.empty()) throw Error(std::string("--") + option + ": expected at least one name, got '" + s + "'");
  return out;
}

// "resnet20=1024,decoder=64": a batch per model, each at least 1.
std::map<std::string, int64_t> parse_batches(const std::string& s, const std::vector<std::string>& models) {
  std::map<std::string, int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw Error("--batch: expected model=N pairs separated by commas (models: " + joined(models) + "), got '" +
                  item + "'");
    const std::string model = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(models.begin(), models.end(), model) == models.end())
      throw Error("--batch: unknown model '" + model + "' in '" + item + "' (models: " + joined(models) + ")");
    int64_t n = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size() || n < 1)
      throw Error("--batch: expected a whole number of at least 1 for " + model + ", got '" + value + "'");
    if (!out.emplace(model, n).second) throw Error("--batch: " + model + " is given twice in '" + s + "'");
  }
  return out;
}

// The device named by --device, made now, so that a device that is not there (no GPU, no
// driver) is named with the reason before anything runs.
Device open_device(const std::string& text) {
  try {
    const Device d = parse_device(text);
    wait_device_ops(d);  // makes the device's backend
    return d;
  } catch (const Error& e) {
    std::string why = e.what();
    if (why.rfind("device: ", 0) == 0) why.erase(0, 8);  // the option names it already
    throw Error("--device " + text + ": " + why);
  }
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
    ("device", po::value<std::string>()->default_value("cpu"), "where the train, host and infer sections run: cpu, cuda, cuda:N (sincos and fused measure the CPU and are skipped elsewhere; gemm becomes loom's matmul on the device, fp32 and bf16, the %peak denominators)")
    ("batch", po::value<std::string>()->default_value(""), "training batches per model, e.g. resnet20=1024,resnet18=256,decoder=64 (the decoder's counts sequences of 256 tokens; defaults: resnet20=128, resnet18=32, decoder=8)")
    ("metrics", po::bool_switch(&o.metrics), "print loom's metrics report (loom::metrics::report(): counters and timers since the last warm-up) after the table")
    ("profile", po::value<std::string>(&o.profile), "write a Chrome trace of the timed training steps (one span per kernel on the device thread) to this file; the infer section writes five profiled captured calls of each forward, after its timed ones, beside it (trace.json: trace.infer.json)")
    ("omp_default", "keep libgomp's default wait policy (its threads spin after each oneDNN call) instead of restarting with OMP_WAIT_POLICY=passive (loom/openmp.h)");
  // clang-format on
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << "usage: loom_bench [options]\n\nPrints one table: the hardware's FMA peak and the SGEMM peak, training-step "
                 "throughput per precision, "
                 "sin(cos(x)) against the memory bound, and host overhead.\n"
                 "On a GPU: loom_bench --device cuda --sections gemm,train,host --modes lazy,captured --precision "
                 "fp32,bf16 --batch resnet20=1024,resnet18=256,decoder=64 (LOOM_CUDA_TF32=1 allows TF32).\n\n"
              << desc;
    return 0;
  }
  o.sections = split_list(vm["sections"].as<std::string>(), sections, "sections");
  o.models = split_list(vm["models"].as<std::string>(), models, "models");
  o.modes = split_list(vm["modes"].as<std::string>(), modes, "modes");
  o.precisions = split_list(vm["precision"].as<std::string>(), {"fp32", "bf16"}, "precision");
  o.batches = parse_batches(vm["batch"].as<std::string>(), models);
  require_at_least("steps", o.steps, 1);
  require_at_least("warmup", o.warmup, 2);
  require_at_least("host-steps", o.host_steps, 1);
  require_at_least("reps", o.reps, 1);
  require_at_least("threads", o.threads, 0);
  std::unique_ptr<tbb::global_control> limit;
  if (o.threads > 0)
    limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, o.threads);

  o.device = open_device(vm["device"].as<std::string>());

  const int threads = thread_count();
  const std::string device = device_str(o.device), note = device_precision_note(o);
  if (!o.on_cpu()) progress("device: " + device + (note.empty() ? "" : ", " + note));
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  progress(std::string("OMP_WAIT_POLICY: ") + (policy ? policy : "unset (libgomp's default: spin)"));
  progress("threads: " + std::to_string(threads) + "; " + std::to_string(o.warmup) + " warm-up + " +
           std::to_string(o.steps) + " timed steps per model and mode; best of " + std::to_string(o.reps) +
           " kernel runs");
  Table table;
  Bounds bounds;
  // The peak is the denominator of every %peak cell, so it is measured whenever one is shown.
  if (o.on_cpu()) {
    if (o.section("gemm") || o.section("train")) {
      measure_hardware_peak(o, bounds, table);
      measure_sgemm_peak(o, bounds, table);
    }
    if (o.section("gemm")) bench_loom_matmul(o, bounds, table);
    if (o.section("sincos")) bench_sin_cos(o, bounds, table);
    if (o.section("fused")) bench_fused(o, table);
  } else {
    if (o.section("gemm") || o.section("train")) measure_device_peak(o, bounds, table);
    for (const char* s : {"sincos", "fused"})
      if (o.section(s))
        progress(std::string(s) + ": skipped: it measures the CPU (its memory bandwidth and vector units), not " +
                 device);
  }
  if (o.section("train") || o.section("host")) bench_training(o, bounds, table);
  if (o.section("infer")) bench_inference(o, table);

  std::cout << "loom_bench (device: " << device << (note.empty() ? "" : ", " + note) << ", threads: " << threads
            << ", " << o.steps << " timed steps after " << o.warmup << " warm-up, kernels best of " << o.reps
            << ")\n\n"
            << table.str();
  if (o.metrics) std::cout << "\nloom metrics (since the last warm-up):\n" << metrics::report();
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
