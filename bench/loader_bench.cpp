// loader_bench: DeviceLoader throughput on Fashion-MNIST from HDF5 with augmentation (to_float,
// normalize, random crop with padding 2, horizontal flip), alone and while a compute-heavy
// stand-in training step runs on the device, with the consumer's wait time as a share of the
// step time.
//
//   prepare_data --fashion-mnist --output fashion_mnist.h5
//   loader_bench fashion_mnist.h5 [--batch 256] [--steps 60] [--step mlp|conv] [--hidden 2048]
//                [--threads 1,2,4]
//
// The stand-in step: `mlp` (the default) is matmuls on oneDNN, which on the CPU runs on its
// own OpenMP threads; `conv` is 3x3 convs on loom's float32 Winograd (TBB's threads, which the
// loader's pipeline shares: a loader that held a TBB worker showed there as a loader+step row
// slower than the step row).
//
// Rows (samples/s are delivered to the loop):
//   read ...   HDF5Dataset::get_batch alone on shuffled batches (one thread, no transforms):
//              cold (filling loom's block cache), cached, and uncached with HDF5 reading one
//              regular hyperslab per row ("rows") or one union of hyperslabs per batch ("union")
//   loader     a range-for over the DeviceLoader with an empty body
//   step       the stand-in step on one fixed batch, no loader
//   loader+step  the loop a trainer runs: trace the step, read the previous step's loss
//              (keeping the host one step ahead of the device), ++ → mark_step(). The engine
//              warns that a value is read in most steps: that read is the pacing, on purpose.
#include <loom/data/hdf5.h>
#include <loom/data/loader.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/openmp.h>
#include <loom/tensor.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Args {
  std::string file;
  int64_t batch = 256;
  int64_t steps = 60;
  int64_t hidden = 2048;
  bool conv = false;  // --step conv
  std::vector<int> threads;
};

std::vector<data::Transform> augmentation() {
  return {data::to_float("input"), data::normalize({0.2860}, {0.3530}, "input"),
          data::random_crop({28, 28}, 2, "input"), data::random_horizontal_flip(0.5, "input")};
}

// A stand-in for a training step: an MLP forward pass on the batch, heavy on matmuls, or
// (conv) a 1-to-16-channel 3x3 conv and six 16-channel ones on the 28x28 images.
struct Step {
  bool conv;
  Tensor w1, w2, w3;
  Step(int64_t hidden, bool conv) : conv(conv) {
    if (conv) {
      w1 = randn({16, 1, 3, 3}, 1) * 0.3;
      w2 = randn({16, 16, 3, 3}, 2) * 0.1;
    } else {
      w1 = randn({784, hidden}, 1) * 0.03;
      w2 = randn({hidden, hidden}, 2) * 0.02;
      w3 = randn({hidden, 10}, 3) * 0.02;
    }
    mark_step();
    wait_device_ops();
  }
  Tensor operator()(const data::Batch& b) const {
    if (conv) {
      Tensor h = relu(conv2d(b["input"], w1, {}, {.padding = {1, 1}}));
      for (int i = 0; i < 6; ++i) h = relu(conv2d(h, w2, {}, {.padding = {1, 1}}));
      return mean(h);
    }
    Tensor x = b["input"].reshape({b.size(), 784});
    Tensor h = relu(matmul(x, w1));
    h = relu(matmul(h, w2));
    h = relu(matmul(h, w2));
    return mean(matmul(h, w3));
  }
};

void print_row(const char* mode, int threads, int64_t batches, double samples_per_s, double step_ms,
               double wait_ms, double wait_pct) {
  std::printf("%-12s %7d %8lld %12.0f %9.2f %9.3f %7.2f%%\n", mode, threads, static_cast<long long>(batches),
              samples_per_s, step_ms, wait_ms, wait_pct);
}

// Shuffled batches read through HDF5 (no block cache), one thread, no transforms. Run before
// any other HDF5Dataset opens the file: HDF5 shares an open dataset, chunk cache included.
void uncached_reads(const Args& a) {
  const data::HDF5Fields fields{{"train/images", "input"}, {"train/labels", "target"}};
  data::HDF5Dataset rows(a.file, fields, {.block_cache = false});
  auto batches = data::make_batches(data::RandomSampler(rows.size(), 7).indices(0), a.batch, data::LastBatch::Drop);
  auto epoch = [&](const data::HDF5Dataset& ds) {
    const auto t0 = Clock::now();
    int64_t n = 0;
    for (const auto& b : batches) n += static_cast<int64_t>(ds.get_batch(b).size());
    return static_cast<double>(n) / seconds_since(t0);
  };
  epoch(rows);  // fills HDF5's chunk cache
  print_row("read rows", 1, static_cast<int64_t>(batches.size()), epoch(rows), 0, 0, 0);
  data::HDF5Dataset uni(a.file, fields, {.block_cache = false, .single_selection = true});
  print_row("read union", 1, static_cast<int64_t>(batches.size()), epoch(uni), 0, 0, 0);
}

int run(const Args& a) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::string mlp = "MLP 784-" + std::to_string(a.hidden) + "-" + std::to_string(a.hidden) + "-" +
                          std::to_string(a.hidden) + "-10";
  std::printf("loader_bench: %s, batch %lld, %d cores, step: %s\n", a.file.c_str(), static_cast<long long>(a.batch),
              cores, a.conv ? "3x3 convs, 1 to 16 channels, then 6 of 16, 28x28" : mlp.c_str());
  std::printf("%-12s %7s %8s %12s %9s %9s %8s\n", "mode", "threads", "batches", "samples/s", "step ms",
              "wait ms", "wait %");
  uncached_reads(a);
  auto train = std::make_shared<data::HDF5Dataset>(
      a.file, data::HDF5Fields{{"train/images", "input"}, {"train/labels", "target"}});
  // Raw reads of shuffled batches on one thread (no transforms) through loom's block cache:
  // the first epoch fills it, the second copies rows.
  {
    data::RandomSampler sampler(train->size(), 7);
    auto batches = data::make_batches(sampler.indices(0), a.batch, data::LastBatch::Drop);
    auto epoch = [&](const data::HDF5Dataset& ds, int64_t limit) {
      const auto t0 = Clock::now();
      int64_t n = 0;
      for (std::size_t b = 0; b < batches.size() && static_cast<int64_t>(b) < limit; ++b)
        n += static_cast<int64_t>(ds.get_batch(batches[b]).size());
      return static_cast<double>(n) / seconds_since(t0);
    };
    const double cold = epoch(*train, 1 << 30);
    print_row("read cold", 1, static_cast<int64_t>(batches.size()), cold, 0, 0, 0);
    print_row("read cached", 1, static_cast<int64_t>(batches.size()), epoch(*train, 1 << 30), 0, 0, 0);
  }

  std::vector<double> alone(a.threads.size());
  for (std::size_t i = 0; i < a.threads.size(); ++i) {
    data::DeviceLoader loader(train, {.batch_size = a.batch, .shuffle = true, .seed = 1, .threads = a.threads[i],
                                      .prefetch = 4},
                              augmentation());
    for (auto& b : loader) (void)b;  // epoch 0 warms the chunk cache
    loader.reset_stats();
    for (auto& b : loader) (void)b;
    const auto s = loader.stats();
    alone[i] = s.samples_per_second();
    print_row("loader", a.threads[i], s.batches, s.samples_per_second(), 0, 1e3 * s.wait_seconds / s.batches,
              100 * s.wait_fraction());
  }

  Step step(a.hidden, a.conv);
  // The step alone, on one batch already on the device.
  double step_alone_ms = 0;
  {
    data::DeviceLoader one(train, {.batch_size = a.batch, .threads = 1, .mark_step = false}, augmentation());
    auto it = one.begin();
    const data::Batch batch = std::move(*it);
    Tensor prev = step(batch);
    mark_step();
    prev.item<float>();
    const auto t0 = Clock::now();
    for (int64_t k = 0; k < a.steps; ++k) {
      Tensor loss = step(batch);
      prev.item<float>();
      mark_step();
      prev = loss;
    }
    prev.item<float>();
    step_alone_ms = 1e3 * seconds_since(t0) / static_cast<double>(a.steps);
    print_row("step", 0, a.steps, 1e3 * static_cast<double>(a.batch) / step_alone_ms, step_alone_ms, 0, 0);
  }

  for (std::size_t i = 0; i < a.threads.size(); ++i) {
    data::DeviceLoader loader(train, {.batch_size = a.batch, .shuffle = true, .seed = 1, .threads = a.threads[i],
                                      .prefetch = 4},
                              augmentation());
    for (auto& b : loader) (void)b;  // warm the chunk cache, as above
    Tensor prev;
    int64_t k = 0;
    for (auto& batch : loader) {
      if (k == 1) loader.reset_stats();  // the first step compiles; measure the steady state
      Tensor loss = step(batch);
      if (prev.defined()) prev.item<float>();
      prev = loss;
      if (++k == a.steps + 1) break;
    }
    if (prev.defined()) prev.item<float>();
    const auto s = loader.stats();
    const double step_ms = 1e3 * s.iterate_seconds / static_cast<double>(s.batches);
    print_row("loader+step", a.threads[i], s.batches, s.samples_per_second(), step_ms,
              1e3 * s.wait_seconds / static_cast<double>(s.batches), 100 * s.wait_fraction());
  }
  std::printf("\nloader alone vs loader+step samples/s ratio uses the rows above; wait %% = LoaderWaitTime / "
              "loop time (acceptance: < 2%% when the step is slower than loading)\n");
  std::printf("metrics: LoaderBatches %lld, LoaderSamples %lld, MarkStep %lld, UncachedCompile %lld\n",
              static_cast<long long>(metrics::counter("LoaderBatches")),
              static_cast<long long>(metrics::counter("LoaderSamples")),
              static_cast<long long>(metrics::counter("MarkStep")),
              static_cast<long long>(metrics::counter("UncachedCompile")));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The mlp step's matmuls run on oneDNN's OpenMP threads: passive, as in the recipes.
  loom::openmp_passive_or_reexec(argc, argv);
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "loader_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--batch") a.batch = std::stoll(value());
    else if (arg == "--steps") a.steps = std::stoll(value());
    else if (arg == "--hidden") a.hidden = std::stoll(value());
    else if (arg == "--step") {
      const std::string step = value();
      if (step != "mlp" && step != "conv") {
        std::fprintf(stderr, "loader_bench: --step takes mlp or conv, got '%s'\n", step.c_str());
        return 2;
      }
      a.conv = step == "conv";
    }
    else if (arg == "--threads") {
      std::stringstream ss(value());
      for (std::string t; std::getline(ss, t, ',');) a.threads.push_back(std::stoi(t));
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: loader_bench FILE.h5 [--batch N] [--steps N] [--step mlp|conv] [--hidden N] "
                  "[--threads 1,2,4]\n"
                  "FILE.h5 is what `prepare_data --fashion-mnist --output FILE.h5` writes.\n");
      return 0;
    } else if (a.file.empty()) a.file = arg;
    else {
      std::fprintf(stderr, "loader_bench: unexpected argument '%s' (see --help)\n", arg.c_str());
      return 2;
    }
  }
  if (a.file.empty()) a.file = "fashion_mnist.h5";
  if (!std::filesystem::exists(a.file)) {
    std::printf("loader_bench: skipped: %s not found (make it with: prepare_data --fashion-mnist --output %s)\n",
                a.file.c_str(), a.file.c_str());
    return 0;
  }
  if (a.threads.empty()) {
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (int t = 1; t < cores; t *= 2) a.threads.push_back(t);
    a.threads.push_back(cores);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
}
