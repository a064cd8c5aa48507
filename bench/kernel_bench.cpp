// CPU kernels at the shapes that dominate the ResNet-20 (batch 128) and ResNet-18 CIFAR
// (batch 32) training steps: conv2d forward, its input gradient and its weight gradient for
// each distinct conv, and a 2048^3
// matmul next to raw Eigen GEMMs of the same size. The kernels are called directly
// (runtime::run_kernel), so the figures exclude tracing and compiling.
//
//   build/bench/kernel_bench                              # GFLOP/s per kernel
//   build/bench/kernel_bench --benchmark_filter=Gemm      # GEMM against its Eigen peak
//   build/bench/kernel_bench --threads=1                  # one TBB thread: CPU time is exact
//   LOOM_CONV=gemm build/bench/kernel_bench               # im2col + GEMM wherever it can run
//   LOOM_CONV=direct build/bench/kernel_bench             # the direct kernels wherever they fit
//   LOOM_CONV=winograd build/bench/kernel_bench           # Winograd on every 3x3 stride-1 conv
//
// EigenGemmPerThread runs one independent Eigen GEMM on every TBB thread at once: the
// machine's achievable SGEMM rate, the peak that matmul is measured against.
#include "runtime/cpu/kernels.h"

#include <Eigen/Core>
#include <benchmark/benchmark.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <cstdint>
#include <iterator>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using loom::DType;
using loom::Shape;
using loom::runtime::TensorView;

struct Buffer {
  std::vector<float> data;
  Shape shape;
  explicit Buffer(Shape s)
      : data(static_cast<std::size_t>(loom::shape_numel(s))), shape(std::move(s)) {
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto& v : data) v = dist(gen);
  }
  TensorView view() { return {data.data(), DType::Float32, shape}; }
};

// One conv of a training step: images, channels in/out, input size, kernel, stride, padding.
struct ConvShape {
  int64_t n, c, o, size, k, stride, pad;
};
// ResNet-20 at batch 128 (0-7) and ResNet-18 in the CIFAR layout at batch 32 (8-18), as the
// loom_bench training rows run them. The stems (0 and 8) need no input gradient.
constexpr ConvShape kShapes[] = {
    {128, 3, 16, 32, 3, 1, 1},    // 0: ResNet-20 stem
    {128, 16, 16, 32, 3, 1, 1},   // 1: stage 1
    {128, 16, 32, 32, 3, 2, 1},   // 2: stage 2 entry
    {128, 16, 32, 32, 1, 2, 0},   // 3: stage 2 projection
    {128, 32, 32, 16, 3, 1, 1},   // 4: stage 2
    {128, 32, 64, 16, 3, 2, 1},   // 5: stage 3 entry
    {128, 32, 64, 16, 1, 2, 0},   // 6: stage 3 projection
    {128, 64, 64, 8, 3, 1, 1},    // 7: stage 3
    {32, 3, 64, 32, 3, 1, 1},     // 8: ResNet-18 stem
    {32, 64, 64, 32, 3, 1, 1},    // 9: layer 1
    {32, 64, 128, 32, 3, 2, 1},   // 10: layer 2 entry
    {32, 64, 128, 32, 1, 2, 0},   // 11: layer 2 projection
    {32, 128, 128, 16, 3, 1, 1},  // 12: layer 2
    {32, 128, 256, 16, 3, 2, 1},  // 13: layer 3 entry
    {32, 128, 256, 16, 1, 2, 0},  // 14: layer 3 projection
    {32, 256, 256, 8, 3, 1, 1},   // 15: layer 3
    {32, 256, 512, 8, 3, 2, 1},   // 16: layer 4 entry
    {32, 256, 512, 8, 1, 2, 0},   // 17: layer 4 projection
    {32, 512, 512, 4, 3, 1, 1},   // 18: layer 4
};
constexpr int64_t kLastShape = std::size(kShapes) - 1;

enum class Pass { Forward, GradInput, GradWeight };

void conv_bench(benchmark::State& state, Pass pass) {
  const ConvShape s = kShapes[state.range(0)];
  const int64_t out_size = (s.size + 2 * s.pad - s.k) / s.stride + 1;
  Buffer x({s.n, s.c, s.size, s.size}), w({s.o, s.c, s.k, s.k});
  Buffer y({s.n, s.o, out_size, out_size});
  const loom::ir::Conv2dAttr conv{.stride = {s.stride, s.stride}, .padding = {s.pad, s.pad}};
  loom::ir::Attr attr = conv;
  loom::ir::Op op = loom::ir::Op::Conv2d;
  std::vector<TensorView> in{x.view(), w.view()};
  TensorView out = y.view();
  if (pass == Pass::GradInput) {
    op = loom::ir::Op::Conv2dGradInput;
    attr = loom::ir::Conv2dGradAttr{conv, {s.size, s.size}};
    in = {y.view(), w.view()};
    out = x.view();
  } else if (pass == Pass::GradWeight) {
    op = loom::ir::Op::Conv2dGradWeight;
    attr = loom::ir::Conv2dGradAttr{conv, {s.k, s.k}};
    in = {x.view(), y.view()};
    out = w.view();
  }
  for (auto _ : state) loom::runtime::run_kernel(op, attr, in, out);
  const double flops = 2.0 * s.n * s.o * out_size * out_size * s.c * s.k * s.k;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  char label[64];
  std::snprintf(label, sizeof label, "n%ld c%ld o%ld %ldpx %ldx%ld s%ld", long(s.n), long(s.c),
                long(s.o), long(s.size), long(s.k), long(s.k), long(s.stride));
  state.SetLabel(label);
}

void BM_Conv2d(benchmark::State& state) {
  conv_bench(state, Pass::Forward);
}
void BM_Conv2dGradInput(benchmark::State& state) {
  conv_bench(state, Pass::GradInput);
}
void BM_Conv2dGradWeight(benchmark::State& state) {
  conv_bench(state, Pass::GradWeight);
}
BENCHMARK(BM_Conv2d)->DenseRange(0, kLastShape)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dGradInput)
    ->DenseRange(1, 7)
    ->DenseRange(9, kLastShape)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dGradWeight)
    ->DenseRange(0, kLastShape)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr int64_t kGemm = 2048;
const double kGemmFlops = 2.0 * kGemm * kGemm * kGemm;

void BM_Matmul(benchmark::State& state) {
  Buffer a({kGemm, kGemm}), b({kGemm, kGemm}), c({kGemm, kGemm});
  std::vector<TensorView> in{a.view(), b.view()};
  for (auto _ : state) loom::runtime::run_kernel(loom::ir::Op::Matmul, loom::ir::MatmulAttr{}, in, c.view());
  state.counters["GFLOPS"] =
      benchmark::Counter(kGemmFlops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)->UseRealTime()->Unit(benchmark::kMillisecond);

using EigenMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

EigenMatrix random_matrix() {
  Buffer b({kGemm, kGemm});
  return Eigen::Map<EigenMatrix>(b.data.data(), kGemm, kGemm);
}

// One Eigen GEMM on the calling thread (Eigen itself is single-threaded in this build).
void BM_EigenGemm(benchmark::State& state) {
  EigenMatrix a = random_matrix(), b = random_matrix(), c(kGemm, kGemm);
  for (auto _ : state) c.noalias() = a * b;
  state.counters["GFLOPS"] =
      benchmark::Counter(kGemmFlops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_EigenGemm)->UseRealTime()->Unit(benchmark::kMillisecond);

// Every TBB thread runs its own Eigen GEMM of the same size at once: the aggregate rate.
void BM_EigenGemmPerThread(benchmark::State& state) {
  const int threads = tbb::this_task_arena::max_concurrency();
  std::vector<EigenMatrix> a(threads, random_matrix()), b = a, c = a;
  for (auto _ : state)
    tbb::parallel_for(
        0, threads, [&](int t) { c[t].noalias() = a[t] * b[t]; }, tbb::static_partitioner());
  state.counters["GFLOPS"] = benchmark::Counter(kGemmFlops * threads * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_EigenGemmPerThread)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

// BENCHMARK_MAIN plus --threads=N, which caps TBB's threads for the kernels.
int main(int argc, char** argv) {
  std::unique_ptr<tbb::global_control> limit;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0)
      limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                    std::stoul(argv[i] + 10));
    else
      args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
