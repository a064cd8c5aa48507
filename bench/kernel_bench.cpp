// CPU kernels at the shapes that dominate the ResNet-20 (batch 128), ResNet-18 CIFAR (batch
// 32) and decoder training steps: conv2d forward, its input gradient and its weight gradient
// for each distinct conv, in float32 and bfloat16 (Conv2d*/shape/dtype, dtype 0 float32, 1
// bfloat16), oneDNN's passes in each of its layouts (OneDnnConv*/shape/layout/dtype, layout 0
// loom's own NCHW, 1 blocked with reorders in and out, 2 channels-last activations taken as
// they are, 3 channels-last activations reordered to the blocked layouts and back; the label
// names oneDNN's kernel), the bfloat16 weight gradient of every 3x3 conv
// on channels-last activations by oneDNN and by loom's vdpbf16ps kernel back to back
// (Bf16WeightGrad/shape/kernel: 0 oneDNN, 1 loom), the bfloat16 forward and input gradient of
// every 3x3 stride-1 conv by oneDNN and by loom's Winograd (Bf16Winograd/shape/pass/kernel), the
// same and the weight gradient in float32 by oneDNN, by loom's AVX2 Winograd and by im2col +
// matmul (F32Winograd/shape/pass/kernel; F32WinogradInTurn/shape/pass the same kernels called
// in turn in one benchmark, for a machine whose speed moves between runs), and
// the decoder's matmuls next to raw Eigen GEMMs, and the steps' float32 sums (Reduce/case:
// BatchNorm statistics NCHW and channels-last, the decoder's row sums; GB/s of the operand read
// once). The kernels are called directly
// (runtime::run_kernel), so the figures exclude tracing and compiling.
//
//   build/bench/kernel_bench                              # GFLOP/s per kernel
//   build/bench/kernel_bench --benchmark_filter=Gemm      # GEMM against its Eigen peak
//   build/bench/kernel_bench --benchmark_filter=Reduce    # the sums
//   build/bench/kernel_bench --threads=1                  # one thread (TBB and OpenMP)
//   LOOM_CONV=gemm build/bench/kernel_bench               # im2col + GEMM wherever it can run
//   LOOM_CONV=direct build/bench/kernel_bench             # the direct kernels wherever they fit
//   LOOM_CONV=winograd build/bench/kernel_bench           # Winograd on every 3x3 stride-1 conv
//   LOOM_CONV=onednn build/bench/kernel_bench             # oneDNN everywhere (float32 too)
//   LOOM_MATMUL=eigen build/bench/kernel_bench --benchmark_filter=Matmul   # or onednn
//   build/bench/kernel_bench --benchmark_filter=Sharing   # oneDNN's OpenMP threads beside TBB's
//   build/bench/kernel_bench --benchmark_filter=Sharing --omp_default   # ... spinning (below)
//
// EigenGemmPerThread runs one independent Eigen GEMM on every TBB thread at once: the
// machine's achievable SGEMM rate, the peak that matmul is measured against.
//
// The program restarts itself with OMP_WAIT_POLICY=passive (loom/openmp.h) unless that is set
// or --omp_default is given: then libgomp's default policy applies, whose workers spin after
// each oneDNN call on the cores TBB's next kernel wants. SharingConvThenTbb times that
// alternation (a oneDNN conv, then a TBB elementwise pass over its output, as a training step
// does), to be run both ways; the context line OMP_WAIT_POLICY says which ran.
#include "runtime/cpu/conv/conv_matmul.h"
#include "runtime/cpu/conv/conv_weight_bf16.h"
#include "runtime/cpu/conv/conv_winograd.h"
#include "runtime/cpu/conv/conv_winograd_bf16.h"
#include "runtime/cpu/conv/conv_winograd_f32.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kernels_impl.h"
#include "runtime/cpu/onednn.h"

#include <loom/bfloat16.h>
#include <loom/openmp.h>

#include <Eigen/Core>
#include <benchmark/benchmark.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using loom::DType;
using loom::Shape;
using loom::runtime::TensorView;

// A tensor of random values in [-1, 1], float32 or bfloat16.
struct Buffer {
  std::vector<float> data;
  std::vector<loom::bfloat16> half;
  Shape shape;
  DType dtype;
  explicit Buffer(Shape s, DType t = DType::Float32)
      : data(static_cast<std::size_t>(loom::shape_numel(s))), shape(std::move(s)), dtype(t) {
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto& v : data) v = dist(gen);
    if (t == DType::BFloat16)
      for (float v : data) half.push_back(loom::bfloat16(v));
  }
  void* ptr() { return dtype == DType::BFloat16 ? static_cast<void*>(half.data()) : data.data(); }
  TensorView view() { return {ptr(), dtype, shape}; }
};

DType dtype_arg(int64_t a) { return a == 1 ? DType::BFloat16 : DType::Float32; }

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

void set_label(benchmark::State& state, const ConvShape& s, DType dtype, const char* extra) {
  char label[160];
  std::snprintf(label, sizeof label, "n%ld c%ld o%ld %ldpx %ldx%ld s%ld %s%s%s", long(s.n),
                long(s.c), long(s.o), long(s.size), long(s.k), long(s.k), long(s.stride),
                loom::dtype_name(dtype), *extra ? " " : "", extra);
  state.SetLabel(label);
}

// Skips a row that would run oneDNN in bfloat16 on a CPU where it has no bfloat16 kernels
// (below AVX-512: onednn::bfloat16_supported); true when skipped.
bool skip_onednn_bfloat16(benchmark::State& state, DType dtype) {
  if (dtype != DType::BFloat16 || loom::runtime::onednn::bfloat16_supported()) return false;
  state.SkipWithError("oneDNN has no bfloat16 kernels on this CPU (it needs AVX-512)");
  return true;
}

double conv_flops(const ConvShape& s) {
  const int64_t out_size = (s.size + 2 * s.pad - s.k) / s.stride + 1;
  return 2.0 * s.n * s.o * out_size * out_size * s.c * s.k * s.k;
}

void conv_bench(benchmark::State& state, Pass pass) {
  const ConvShape s = kShapes[state.range(0)];
  const DType dtype = dtype_arg(state.range(1));
  const int64_t out_size = (s.size + 2 * s.pad - s.k) / s.stride + 1;
  Buffer x({s.n, s.c, s.size, s.size}, dtype), w({s.o, s.c, s.k, s.k}, dtype);
  Buffer y({s.n, s.o, out_size, out_size}, dtype);
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
  state.counters["GFLOPS"] =
      benchmark::Counter(conv_flops(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_label(state, s, dtype, "");
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
// Every shape (the stems, 0 and 8, need no input gradient) in both dtypes.
void all_shapes(benchmark::internal::Benchmark* b, bool stems) {
  for (int64_t dtype : {0, 1})
    for (int64_t i = 0; i <= kLastShape; ++i)
      if (stems || (i != 0 && i != 8)) b->Args({i, dtype});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_Conv2d)->Apply([](auto* b) { all_shapes(b, true); });
BENCHMARK(BM_Conv2dGradInput)->Apply([](auto* b) { all_shapes(b, false); });
BENCHMARK(BM_Conv2dGradWeight)->Apply([](auto* b) { all_shapes(b, true); });

// One pass on oneDNN in the given layout, whatever conv_algorithm would pick.
void onednn_bench(benchmark::State& state, loom::runtime::ConvPass pass) {
  namespace onednn = loom::runtime::onednn;
  const ConvShape s = kShapes[state.range(0)];
  const auto layout = state.range(1) == 3   ? onednn::Layout::kChannelsLastBlocked
                      : state.range(1) == 2 ? onednn::Layout::kChannelsLast
                      : state.range(1) == 1 ? onednn::Layout::kBlocked
                                            : onednn::Layout::kPlain;
  const DType dtype = dtype_arg(state.range(2));
  if (skip_onednn_bfloat16(state, dtype)) return;
  const int64_t os = (s.size + 2 * s.pad - s.k) / s.stride + 1;
  Buffer x({s.n, s.c, s.size, s.size}, dtype), w({s.o, s.c, s.k, s.k}, dtype);
  Buffer y({s.n, s.o, os, os}, dtype);
  const loom::runtime::ConvGeometry g{s.n, s.c, s.size, s.size, s.o, s.k, s.k, os, os,
                                      s.stride, s.stride, s.pad, s.pad, 1, 1, 1};
  using loom::runtime::ConvPass;
  void* a = pass == ConvPass::kGradInput ? y.ptr() : x.ptr();
  void* b = pass == ConvPass::kGradWeight ? y.ptr() : w.ptr();
  void* out = pass == ConvPass::kForward     ? y.ptr()
              : pass == ConvPass::kGradInput ? x.ptr()
                                             : w.ptr();
  for (auto _ : state) onednn::conv2d(pass, g, dtype, layout, a, b, out);
  state.counters["GFLOPS"] =
      benchmark::Counter(conv_flops(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_label(state, s, dtype, onednn::conv2d_implementation(pass, g, dtype, layout));
}

void BM_OneDnnConv2d(benchmark::State& state) {
  onednn_bench(state, loom::runtime::ConvPass::kForward);
}
void BM_OneDnnConv2dGradInput(benchmark::State& state) {
  onednn_bench(state, loom::runtime::ConvPass::kGradInput);
}
void BM_OneDnnConv2dGradWeight(benchmark::State& state) {
  onednn_bench(state, loom::runtime::ConvPass::kGradWeight);
}
void onednn_shapes(benchmark::internal::Benchmark* b, bool stems) {
  for (int64_t dtype : {0, 1})
    for (int64_t layout : {0, 1, 2, 3})
      for (int64_t i = 0; i <= kLastShape; ++i)
        if (stems || (i != 0 && i != 8)) b->Args({i, layout, dtype});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_OneDnnConv2d)->Apply([](auto* b) { onednn_shapes(b, true); });
BENCHMARK(BM_OneDnnConv2dGradInput)->Apply([](auto* b) { onednn_shapes(b, false); });
BENCHMARK(BM_OneDnnConv2dGradWeight)->Apply([](auto* b) { onednn_shapes(b, true); });

// The bfloat16 weight gradient on channels-last activations (what a bfloat16 training step
// runs): oneDNN's (kernel 0) against loom's on vdpbf16ps (1), shape by shape.
void BM_Bf16WeightGrad(benchmark::State& state) {
  namespace onednn = loom::runtime::onednn;
  const ConvShape s = kShapes[state.range(0)];
  const bool own = state.range(1) == 1;
  const int64_t os = (s.size + 2 * s.pad - s.k) / s.stride + 1;
  Buffer x({s.n, s.size, s.size, s.c}, DType::BFloat16), w({s.o, s.c, s.k, s.k}, DType::BFloat16);
  Buffer y({s.n, os, os, s.o}, DType::BFloat16);
  const loom::runtime::ConvGeometry g{s.n, s.c, s.size, s.size, s.o, s.k, s.k, os, os,
                                      s.stride, s.stride, s.pad, s.pad, 1, 1, 1};
  if (own && !loom::runtime::bf16_weight_grad_applies(g)) {
    state.SkipWithError("loom's bfloat16 weight gradient does not apply here (no AVX512_BF16)");
    return;
  }
  if (!own && skip_onednn_bfloat16(state, DType::BFloat16)) return;
  using loom::runtime::ConvPass;
  const auto* px = static_cast<const loom::bfloat16*>(x.ptr());
  const auto* py = static_cast<const loom::bfloat16*>(y.ptr());
  auto* pw = static_cast<loom::bfloat16*>(w.ptr());
  for (auto _ : state) {
    if (own) loom::runtime::conv2d_grad_weight_bf16(g, px, py, pw);
    else onednn::conv2d(ConvPass::kGradWeight, g, DType::BFloat16, onednn::Layout::kChannelsLast,
                        px, py, pw);
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(conv_flops(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_label(state, s, DType::BFloat16, own ? "loom vdpbf16ps" : "oneDNN channels-last");
}
BENCHMARK(BM_Bf16WeightGrad)->Apply([](auto* b) {
  for (int64_t i = 0; i <= kLastShape; ++i)
    if (kShapes[i].k == 3 && kShapes[i].c % 16 == 0)
      for (int64_t own : {0, 1}) b->Args({i, own});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
});

// The forward and input gradient of every 3x3 stride-1 bfloat16 conv on channels-last
// activations: oneDNN's direct kernels (kernel 0) against loom's Winograd on vdpbf16ps (1),
// shape by shape, back to back (Bf16Winograd/shape/pass/kernel: pass 0 forward, 1 input
// gradient). GFLOP/s counts the direct conv's multiplies for both.
void BM_Bf16Winograd(benchmark::State& state) {
  namespace onednn = loom::runtime::onednn;
  using loom::runtime::ConvPass;
  const ConvShape s = kShapes[state.range(0)];
  const ConvPass pass = state.range(1) == 0 ? ConvPass::kForward : ConvPass::kGradInput;
  const bool own = state.range(2) == 1;
  Buffer x({s.n, s.size, s.size, s.c}, DType::BFloat16), w({s.o, s.c, s.k, s.k}, DType::BFloat16);
  Buffer y({s.n, s.size, s.size, s.o}, DType::BFloat16);
  const loom::runtime::ConvGeometry g{s.n, s.c, s.size, s.size, s.o, s.k, s.k, s.size, s.size,
                                      1, 1, s.pad, s.pad, 1, 1, 1};
  if (own && !loom::runtime::bf16_winograd_applies(g)) {
    state.SkipWithError("loom's bfloat16 Winograd does not apply here (no AVX512_BF16)");
    return;
  }
  if (!own && skip_onednn_bfloat16(state, DType::BFloat16)) return;
  const bool forward = pass == ConvPass::kForward;
  const auto* in = static_cast<const loom::bfloat16*>(forward ? x.ptr() : y.ptr());
  const auto* pw = static_cast<const loom::bfloat16*>(w.ptr());
  auto* out = static_cast<loom::bfloat16*>(forward ? y.ptr() : x.ptr());
  for (auto _ : state) {
    if (own) loom::runtime::conv2d_winograd_bf16(g, pass, in, pw, out, nullptr, false);
    else onednn::conv2d(pass, g, DType::BFloat16, onednn::Layout::kChannelsLast, in, pw, out);
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(conv_flops(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_label(state, s, DType::BFloat16, own ? "loom Winograd vdpbf16ps" : "oneDNN channels-last");
}
BENCHMARK(BM_Bf16Winograd)->Apply([](auto* b) {
  for (int64_t i = 0; i <= kLastShape; ++i)
    if (kShapes[i].k == 3 && kShapes[i].stride == 1 && kShapes[i].c % 16 == 0)
      for (int64_t pass : {0, 1})
        for (int64_t own : {0, 1}) b->Args({i, pass, own});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
});

// Every pass of every 3x3 stride-1 float32 conv on channels-last activations: oneDNN in the
// layout loom gives it (onednn::channels_last_layout; kernel 0) against loom's AVX2 Winograd
// in 4x4 output tiles (1: F(4x4,3x3) forward and input gradient, F(3x3,4x4) weight gradient;
// the default) and in 2x2 tiles (3: F(2x2,3x3), F(3x3,2x2); LOOM_F32_WINOGRAD=2x2) and, for the
// weight gradient, im2col + oneDNN matmuls (2, conv_matmul.h), shape by shape, back to back
// (F32Winograd/shape/pass/kernel: pass 0 forward, 1 input gradient, 2 weight gradient).
// GFLOP/s counts the direct conv's multiplies for all.
// One float32 channels-last 3x3 conv pass and its operands, run by kernel number (0 oneDNN, 1
// loom's Winograd in 4x4 output tiles, 3 in 2x2 tiles, 2 im2col + matmul).
struct F32WinogradCase {
  const ConvShape s;
  const loom::runtime::ConvPass pass;
  Buffer x, w, y;
  const loom::runtime::ConvGeometry g;
  const loom::runtime::onednn::Layout layout;
  F32WinogradCase(const ConvShape& shape, loom::runtime::ConvPass p)
      : s(shape), pass(p), x({s.n, s.size, s.size, s.c}, DType::Float32),
        w({s.o, s.c, s.k, s.k}, DType::Float32), y({s.n, s.size, s.size, s.o}, DType::Float32),
        g{s.n, s.c, s.size, s.size, s.o, s.k, s.k, s.size, s.size, 1, 1, s.pad, s.pad, 1, 1, 1},
        layout(loom::runtime::onednn::channels_last_layout(g, p, DType::Float32)) {}
  void run(int64_t kernel) {
    namespace onednn = loom::runtime::onednn;
    using loom::runtime::ConvPass;
    const void* a = pass == ConvPass::kGradInput ? y.ptr() : x.ptr();
    const void* b = pass == ConvPass::kGradWeight ? y.ptr() : w.ptr();
    void* out = pass == ConvPass::kForward     ? y.ptr()
                : pass == ConvPass::kGradInput ? x.ptr()
                                               : w.ptr();
    const auto* fa = static_cast<const float*>(a);
    const auto* fb = static_cast<const float*>(b);
    auto* fo = static_cast<float*>(out);
    if (kernel == 2) loom::runtime::conv2d_matmul(g, pass, DType::Float32, a, b, out);
    else if (kernel == 0) onednn::conv2d(pass, g, DType::Float32, layout, a, b, out);
    else if (pass == ConvPass::kGradWeight)
      loom::runtime::conv2d_grad_weight_winograd_f32(g, kernel == 3 ? 2 : 4, fa, fb, fo);
    else
      loom::runtime::conv2d_winograd_f32(g, pass, kernel == 3 ? 2 : 4, fa, fb, fo, nullptr, false);
  }
};

void BM_F32Winograd(benchmark::State& state) {
  namespace onednn = loom::runtime::onednn;
  F32WinogradCase c(kShapes[state.range(0)], static_cast<loom::runtime::ConvPass>(state.range(1)));
  const int64_t kernel = state.range(2);
  if ((kernel == 1 || kernel == 3) && !loom::runtime::f32_winograd_applies(c.g)) {
    state.SkipWithError("loom's float32 channels-last Winograd does not apply here (no AVX2)");
    return;
  }
  for (auto _ : state) c.run(kernel);
  state.counters["GFLOPS"] =
      benchmark::Counter(conv_flops(c.s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_label(state, c.s, DType::Float32,
            kernel == 1   ? "loom Winograd AVX2 4x4 tiles"
            : kernel == 3 ? "loom Winograd AVX2 2x2 tiles"
            : kernel == 2 ? "im2col + oneDNN matmul"
            : c.layout == onednn::Layout::kChannelsLastBlocked ? "oneDNN channels-last blocked"
                                                                : "oneDNN channels-last");
}
BENCHMARK(BM_F32Winograd)->Apply([](auto* b) {
  for (int64_t i = 0; i <= kLastShape; ++i)
    if (kShapes[i].k == 3 && kShapes[i].stride == 1 && kShapes[i].c % 8 == 0)
      for (int64_t pass : {0, 1, 2})
        for (int64_t kernel : {0, 1, 3, 2})
          if (kernel != 2 || pass == 2) b->Args({i, pass, kernel});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
});

// The same kernels as F32Winograd, called in turn within one benchmark, one call of each per
// round (F32WinogradInTurn/shape/pass: 40 rounds, the median call of each): on a shared
// machine whose speed moves by a third between runs, kernels timed in separate runs compare
// the machine's moments as much as the kernels. Counters: each kernel's median in ms
// (onednn_ms, winograd4_ms, winograd2_ms, im2col_ms for the weight gradient) and the others'
// medians over the 4x4 tiles' (..._over_4x4 > 1: the 4x4 tiles faster).
void BM_F32WinogradInTurn(benchmark::State& state) {
  F32WinogradCase c(kShapes[state.range(0)], static_cast<loom::runtime::ConvPass>(state.range(1)));
  if (!loom::runtime::f32_winograd_applies(c.g)) {
    state.SkipWithError("loom's float32 channels-last Winograd does not apply here (no AVX2)");
    return;
  }
  std::vector<int> kernels{0, 1, 3};
  if (c.pass == loom::runtime::ConvPass::kGradWeight) kernels.push_back(2);
  constexpr int kRounds = 40;
  std::vector<std::vector<double>> times(4);
  for (auto _ : state) {
    for (int k : kernels) c.run(k);  // warm-up: scratch grown, oneDNN primitives made
    for (int r = 0; r < kRounds; ++r)
      for (int k : kernels) {
        const auto t0 = std::chrono::steady_clock::now();
        c.run(k);
        times[k].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
  }
  const auto median = [&](int k) {
    std::vector<double> v = times[k];
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const char* names[] = {"onednn", "winograd4", "im2col", "winograd2"};
  const double four = median(1);
  for (int k : kernels) {
    state.counters[std::string(names[k]) + "_ms"] = median(k);
    if (k != 1) state.counters[std::string(names[k]) + "_over_4x4"] = median(k) / four;
  }
  set_label(state, c.s, DType::Float32, "in turn: oneDNN, loom Winograd 4x4 and 2x2 tiles");
}
BENCHMARK(BM_F32WinogradInTurn)->Apply([](auto* b) {
  for (int64_t i = 0; i <= kLastShape; ++i)
    if (kShapes[i].k == 3 && kShapes[i].stride == 1 && kShapes[i].c % 8 == 0)
      for (int64_t pass : {0, 1, 2}) b->Args({i, pass});
  b->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
});

// Every pass of every conv on channels-last activations, float32 and bfloat16: oneDNN's
// direct kernels (kernel 0) against im2col + one oneDNN matmul (1, conv_matmul.h), shape by
// shape, back to back (ConvMatmul/shape/pass/dtype/kernel: pass 0 forward, 1 input gradient,
// 2 weight gradient; dtype 0 float32, 1 bfloat16).
void BM_ConvMatmul(benchmark::State& state) {
  namespace onednn = loom::runtime::onednn;
  using loom::runtime::ConvPass;
  const ConvShape s = kShapes[state.range(0)];
  const auto pass = static_cast<ConvPass>(state.range(1));
  const DType dtype = dtype_arg(state.range(2));
  const bool own = state.range(3) == 1;
  const int64_t os = (s.size + 2 * s.pad - s.k) / s.stride + 1;
  Buffer x({s.n, s.size, s.size, s.c}, dtype), w({s.o, s.c, s.k, s.k}, dtype);
  Buffer y({s.n, os, os, s.o}, dtype);
  const loom::runtime::ConvGeometry g{s.n, s.c, s.size, s.size, s.o, s.k, s.k, os, os,
                                      s.stride, s.stride, s.pad, s.pad, 1, 1, 1};
  if (own && !loom::runtime::conv_matmul_applies(g, pass, dtype)) {
    state.SkipWithError("im2col + matmul does not apply (bf16 without AMX, or a strided input "
                        "gradient)");
    return;
  }
  if (!own && skip_onednn_bfloat16(state, dtype)) return;
  const void* a = pass == ConvPass::kGradInput ? y.ptr() : x.ptr();
  const void* b = pass == ConvPass::kGradWeight ? y.ptr() : w.ptr();
  void* out = pass == ConvPass::kForward     ? y.ptr()
              : pass == ConvPass::kGradInput ? x.ptr()
                                             : w.ptr();
  for (auto _ : state) {
    if (own) loom::runtime::conv2d_matmul(g, pass, dtype, a, b, out);
    else onednn::conv2d(pass, g, dtype, onednn::Layout::kChannelsLast, a, b, out);
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(conv_flops(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_label(state, s, dtype, own ? "im2col + oneDNN matmul" : "oneDNN channels-last");
}
BENCHMARK(BM_ConvMatmul)->Apply([](auto* b) {
  for (int64_t i = 0; i <= kLastShape; ++i)
    for (int64_t pass : {0, 1, 2})
      for (int64_t dtype : {0, 1})
        if (pass != 1 || (i != 0 && i != 8))
          for (int64_t own : {0, 1}) b->Args({i, pass, dtype, own});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
});

// The float32 weight gradient of every 3x3 stride-1 conv from 64 channels on, on channels-last
// activations: oneDNN's (kernel 0) against loom's Winograd on [N,C,H,W] copies of both
// operands, the copies included (1, as the channels-last conv kernel runs it where
// winograd_weight_grad_chosen), shape by shape, back to back (WinogradWeightGrad/shape/kernel).
void BM_WinogradWeightGrad(benchmark::State& state) {
  namespace onednn = loom::runtime::onednn;
  using loom::runtime::ConvPass;
  const ConvShape s = kShapes[state.range(0)];
  const bool own = state.range(1) == 1;
  Buffer x({s.n, s.size, s.size, s.c}, DType::Float32), w({s.o, s.c, s.k, s.k}, DType::Float32);
  Buffer y({s.n, s.size, s.size, s.o}, DType::Float32);
  Buffer xf({s.n, s.c, s.size, s.size}, DType::Float32), yf({s.n, s.o, s.size, s.size}, DType::Float32);
  const loom::runtime::ConvGeometry g{s.n, s.c, s.size, s.size, s.o, s.k, s.k, s.size, s.size,
                                      1, 1, s.pad, s.pad, 1, 1, 1};
  const auto* px = static_cast<const float*>(x.ptr());
  const auto* py = static_cast<const float*>(y.ptr());
  auto* pw = static_cast<float*>(w.ptr());
  const loom::ir::Attr to_first = loom::ir::PermuteAttr{{0, 3, 1, 2}};
  for (auto _ : state) {
    if (own) {
      loom::runtime::permute_kernel(to_first, x.view(), xf.view());
      loom::runtime::permute_kernel(to_first, y.view(), yf.view());
      loom::runtime::conv2d_grad_weight_winograd(g, static_cast<const float*>(xf.ptr()),
                                                 static_cast<const float*>(yf.ptr()), pw);
    } else onednn::conv2d(ConvPass::kGradWeight, g, DType::Float32, onednn::Layout::kChannelsLast,
                        px, py, pw);
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(conv_flops(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_label(state, s, DType::Float32, own ? "loom Winograd on copies" : "oneDNN channels-last");
}
BENCHMARK(BM_WinogradWeightGrad)->Apply([](auto* b) {
  for (int64_t i = 0; i <= kLastShape; ++i)
    if (kShapes[i].k == 3 && kShapes[i].stride == 1 && kShapes[i].c >= 64)
      for (int64_t own : {0, 1}) b->Args({i, own});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
});

// The reductions of a training step, float32 stored operands (no prologue): BatchNorm's
// per-channel statistics at the ResNets' activation shapes, NCHW (runs of H*W reduced
// innermost) and channels-last (rows of C), and the decoder's row reductions (softmax's over
// the vocabulary and over attention's rows, RMSNorm's over the hidden size) and column sums
// (RMSNorm's weight gradient), each as a sum (BM_Reduce/case/0) and a maximum (/1). GB/s
// counts the operand read once.
struct ReduceCase {
  Shape shape;
  std::vector<int64_t> axes;
  const char* what;
};
const ReduceCase kReductions[] = {
    {{128, 16, 32, 32}, {0, 2, 3}, "ResNet-20 stage 1 stats, NCHW"},
    {{128, 64, 8, 8}, {0, 2, 3}, "ResNet-20 stage 3 stats, NCHW"},
    {{32, 128, 16, 16}, {0, 2, 3}, "ResNet-18 stage 2 stats, NCHW"},
    {{128, 32, 32, 16}, {0, 1, 2}, "ResNet-20 stage 1 stats, channels-last"},
    {{128, 8, 8, 64}, {0, 1, 2}, "ResNet-20 stage 3 stats, channels-last"},
    {{32, 32, 32, 64}, {0, 1, 2}, "ResNet-18 stage 1 stats, channels-last"},
    {{32, 16, 16, 128}, {0, 1, 2}, "ResNet-18 stage 2 stats, channels-last"},
    {{32, 8, 8, 256}, {0, 1, 2}, "ResNet-18 stage 3 stats, channels-last"},
    {{32, 4, 4, 512}, {0, 1, 2}, "ResNet-18 stage 4 stats, channels-last"},
    {{2048, 8192}, {1}, "decoder softmax rows over the vocabulary"},
    {{2048, 512}, {1}, "decoder RMSNorm rows"},
    {{8, 8, 256, 256}, {3}, "decoder attention softmax rows"},
    {{2048, 512}, {0}, "decoder RMSNorm weight-gradient columns"},
};

void BM_Reduce(benchmark::State& state) {
  const ReduceCase& c = kReductions[state.range(0)];
  Buffer x(c.shape);
  Shape out_shape = c.shape;
  for (int64_t a : c.axes) out_shape[static_cast<std::size_t>(a)] = 1;
  Buffer out(out_shape);
  std::vector<TensorView> in{x.view()};
  const loom::ir::AxesAttr attr{c.axes};
  const loom::ir::Op op = state.range(1) ? loom::ir::Op::Max : loom::ir::Op::Sum;
  for (auto _ : state) loom::runtime::run_kernel(op, attr, in, out.view());
  state.counters["GB/s"] = benchmark::Counter(4e-9 * static_cast<double>(loom::shape_numel(c.shape)),
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(c.what) + (state.range(1) ? ", amax" : ", sum"));
}
BENCHMARK(BM_Reduce)
    ->ArgsProduct({benchmark::CreateDenseRange(0, std::size(kReductions) - 1, 1), {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Permutes that move the innermost dimension, at ResNet activation shapes, float32 and
// bfloat16: loom's tiled transpose (strided_copy, kernel 0) against oneDNN's reorder (1), back
// to back (BM_Permute/case/dtype/kernel). kernels_movement.cpp's onednn_transposes chooses by
// these rows. Then the decoder's: two that move rows of 64 whole (strided_copy's row copies;
// 60-66 GB/s here with the 4 MB in cache, 2026-11-28, against 0.5-0.7 ms a call inside the
// training step, where they come from memory) and k^T. GB/s counts the tensor read and written
// once.
struct PermuteCase {
  Shape shape;
  std::vector<int64_t> perm;
  const char* what;
};
const PermuteCase kPermutes[] = {
    {{32, 64, 32, 32}, {0, 2, 3, 1}, "ResNet-18 layer 1, NCHW to NHWC"},
    {{32, 32, 32, 64}, {0, 3, 1, 2}, "ResNet-18 layer 1, NHWC to NCHW"},
    {{32, 16, 16, 128}, {0, 3, 1, 2}, "ResNet-18 layer 2, NHWC to NCHW"},
    {{128, 32, 32, 16}, {0, 3, 1, 2}, "ResNet-20 stage 1, NHWC to NCHW"},
    {{32, 32, 32, 32}, {0, 3, 1, 2}, "32 channels onto 32x32 planes, NHWC to NCHW"},
    {{128, 16, 32, 32}, {0, 3, 1, 2}, "32 channels onto 16x32 planes, NHWC to NCHW"},
    {{8, 256, 8, 64}, {0, 2, 1, 3}, "decoder q/k/v, tokens to heads (rows of 64 move)"},
    {{8, 8, 256, 64}, {0, 2, 1, 3}, "decoder attention output, heads to tokens (rows of 64 move)"},
    {{8, 256, 8, 64}, {0, 2, 3, 1}, "decoder k^T for the value gradient"},
};

void BM_Permute(benchmark::State& state) {
  namespace onednn = loom::runtime::onednn;
  const PermuteCase& c = kPermutes[state.range(0)];
  const DType dtype = dtype_arg(state.range(1));
  const bool reorder = state.range(2) == 1;
  if (reorder && skip_onednn_bfloat16(state, dtype)) return;
  Shape out_shape;
  for (int64_t d : c.perm) out_shape.push_back(c.shape[static_cast<std::size_t>(d)]);
  Buffer x(c.shape, dtype), out(out_shape, dtype);
  const auto in_strides = loom::runtime::contiguous_strides(c.shape);
  const auto out_strides = loom::runtime::contiguous_strides(out_shape);
  loom::runtime::Strides src(c.perm.size());
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = in_strides[static_cast<std::size_t>(c.perm[i])];
  onednn::Strided s;
  for (std::size_t i = 0; i < 4; ++i) {
    s.dims[i] = out_shape[i];
    s.src[i] = src[i];
    s.dst[i] = out_strides[i];
  }
  for (auto _ : state) {
    if (reorder) onednn::reorder(s, dtype, x.ptr(), out.ptr());
    else loom::runtime::strided_copy(x.ptr(), src, 0, out.ptr(), out_strides, 0, out_shape, dtype);
  }
  const double bytes = 2.0 * static_cast<double>(loom::shape_numel(c.shape) * dtype_size(dtype));
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(c.what) + (dtype == DType::BFloat16 ? " bfloat16" : " float32") +
                 (reorder ? ", oneDNN reorder" : ", loom tiles"));
}
BENCHMARK(BM_Permute)->Apply([](auto* b) {
  for (int64_t i = 0; i < static_cast<int64_t>(std::size(kPermutes)); ++i)
    for (int64_t dtype : {0, 1})
      for (int64_t reorder : {0, 1}) b->Args({i, dtype, reorder});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
});

// The decoder's products (8x256 tokens, hidden 512, SwiGLU 1408, vocab 8192, 8 heads of 64), a
// 2048^3 square one and small ones (the ResNets' classifiers, 64^3, 128^3): [batch] m x k times k x n, A stored transposed when ta, B when tb.
struct MatmulCase {
  int64_t batch, m, k, n;
  bool ta, tb;
  const char* what;
};
constexpr MatmulCase kMatmuls[] = {
    {1, 2048, 2048, 2048, false, false, "square"},
    {1, 2048, 512, 512, false, true, "q/k/v/o projection"},
    {1, 2048, 512, 1408, false, true, "gate/up projection"},
    {1, 2048, 1408, 512, false, true, "down projection"},
    {1, 2048, 512, 8192, false, true, "lm head"},
    {1, 2048, 1408, 512, false, false, "gate/up input gradient"},
    {1, 1408, 2048, 512, true, false, "gate/up weight gradient"},
    {1, 512, 2048, 512, true, false, "q/k/v/o weight gradient"},
    {1, 8192, 2048, 512, true, false, "lm head weight gradient"},
    {64, 256, 64, 256, false, true, "attention scores"},
    {64, 256, 256, 64, false, false, "attention values"},
    {1, 128, 64, 10, false, true, "ResNet-20 classifier"},
    {1, 10, 128, 64, true, false, "ResNet-20 classifier weight gradient"},
    {1, 32, 512, 10, false, true, "ResNet-18 classifier"},
    {1, 64, 64, 64, false, false, "64^3"},
    {1, 128, 128, 128, false, false, "128^3"},
};
constexpr int64_t kLastMatmul = std::size(kMatmuls) - 1;

void BM_Matmul(benchmark::State& state) {
  const MatmulCase c = kMatmuls[state.range(0)];
  const DType dtype = dtype_arg(state.range(1));
  Buffer a(c.ta ? Shape{c.batch, c.k, c.m} : Shape{c.batch, c.m, c.k}, dtype);
  Buffer b(c.tb ? Shape{c.batch, c.n, c.k} : Shape{c.batch, c.k, c.n}, dtype);
  Buffer out({c.batch, c.m, c.n}, dtype);
  std::vector<TensorView> in{a.view(), b.view()};
  const loom::ir::MatmulAttr attr{.transpose_a = c.ta, .transpose_b = c.tb};
  for (auto _ : state) loom::runtime::run_kernel(loom::ir::Op::Matmul, attr, in, out.view());
  state.counters["GFLOPS"] = benchmark::Counter(2e-9 * c.batch * c.m * c.k * c.n,
                                                benchmark::Counter::kIsIterationInvariantRate);
  char label[128];
  std::snprintf(label, sizeof label, "%s %ldx[%ld,%ld]x[%ld,%ld]%s%s %s", c.what, long(c.batch),
                long(c.m), long(c.k), long(c.k), long(c.n), c.ta ? " ta" : "", c.tb ? " tb" : "",
                loom::dtype_name(dtype));
  state.SetLabel(label);
}
BENCHMARK(BM_Matmul)
    ->ArgsProduct({benchmark::CreateDenseRange(0, kLastMatmul, 1), {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr int64_t kGemm = 2048;
const double kGemmFlops = 2.0 * kGemm * kGemm * kGemm;

// A oneDNN conv, then a TBB elementwise kernel (relu) over its output, in turn, as a training
// step alternates them: with OMP_WAIT_POLICY=passive oneDNN's OpenMP workers sleep when the
// conv ends; with libgomp's default (--omp_default) they spin on, on the cores TBB's tasks
// need. ResNet-20's stage 1 and stage 3 convs. Compare the time with the sum of the two
// kernels alone (SharingConvAlone, SharingTbbAlone).
struct SharingCase {
  Buffer x, w, y, z;
  loom::runtime::ConvGeometry g;
  explicit SharingCase(const ConvShape& s)
      : x({s.n, s.c, s.size, s.size}), w({s.o, s.c, s.k, s.k}), y({s.n, s.o, s.size, s.size}),
        z({s.n, s.o, s.size, s.size}),
        g{s.n, s.c, s.size, s.size, s.o, s.k, s.k, s.size, s.size, 1, 1, s.pad, s.pad, 1, 1, 1} {}
  void conv() {
    namespace onednn = loom::runtime::onednn;
    onednn::conv2d(loom::runtime::ConvPass::kForward, g, DType::Float32,
                   onednn::Layout::kBlocked, x.ptr(), w.ptr(), y.ptr());
  }
  void relu() {
    const std::vector<TensorView> in{y.view()};
    loom::runtime::run_kernel(loom::ir::Op::Relu, {}, in, z.view());
  }
};

const char* wait_policy() {
  const char* p = std::getenv("OMP_WAIT_POLICY");
  return p ? p : "unset (libgomp's default: spin)";
}

void BM_SharingConvThenTbb(benchmark::State& state) {
  SharingCase c(kShapes[state.range(0)]);
  double tbb_seconds = 0;
  for (auto _ : state) {
    c.conv();
    const auto start = std::chrono::steady_clock::now();
    c.relu();
    tbb_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (state.range(1) > 0) std::this_thread::sleep_for(std::chrono::microseconds(state.range(1)));
  }
  // The TBB kernel's own time, right after each conv: compare with SharingTbbAlone.
  state.counters["tbb_ms"] = benchmark::Counter(tbb_seconds * 1e3 / static_cast<double>(state.iterations()));
  state.SetLabel(std::string("OMP_WAIT_POLICY=") + wait_policy());
}
void BM_SharingConvAlone(benchmark::State& state) {
  SharingCase c(kShapes[state.range(0)]);
  for (auto _ : state) c.conv();
  state.SetLabel(std::string("OMP_WAIT_POLICY=") + wait_policy());
}
void BM_SharingTbbAlone(benchmark::State& state) {
  SharingCase c(kShapes[state.range(0)]);
  for (auto _ : state) c.relu();
  state.SetLabel(std::string("OMP_WAIT_POLICY=") + wait_policy());
}
BENCHMARK(BM_SharingConvThenTbb)->Args({1, 0})->Args({7, 0})->Args({1, 2000})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SharingConvAlone)->Arg(1)->Arg(7)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SharingTbbAlone)->Arg(1)->Arg(7)->UseRealTime()->Unit(benchmark::kMillisecond);

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

// BENCHMARK_MAIN plus --threads=N, which caps TBB's threads for the kernels (and so
// oneDNN's), and --omp_default, which keeps libgomp's default wait policy.
int main(int argc, char** argv) {
  bool omp_default = false;
  for (int i = 1; i < argc; ++i) omp_default = omp_default || std::strcmp(argv[i], "--omp_default") == 0;
  if (!omp_default) loom::openmp_passive_or_reexec(argc, argv);
  std::unique_ptr<tbb::global_control> limit;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--omp_default") == 0) continue;
    if (std::strncmp(argv[i], "--threads=", 10) == 0)
      limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                    std::stoul(argv[i] + 10));
    else
      args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::AddCustomContext("OMP_WAIT_POLICY", wait_policy());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
