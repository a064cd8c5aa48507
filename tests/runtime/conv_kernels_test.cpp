// The conv2d kernels against a direct-loop reference in double, for geometries that take each
// path: the direct AVX-512 kernels (float32, padding within the kernel's reach; strided convs
// by phases), Winograd F(2x2, 3x3) (float32 3x3 stride-1 convs, chosen at 64 channels and
// more), the im2col + GEMM path (float64, dilated strided convs, padding beyond the reach), the
// 1x1 GEMM without im2col, and the input gradient as a transposed conv. tests/CMakeLists.txt
// runs them again with each algorithm forced (LOOM_CONV, oneDNN among them) wherever it applies.
#include "runtime/cpu/kernels.h"
#include "runtime/expect_near.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/conv/conv_matmul.h"
#include "runtime/cpu/conv/conv_winograd.h"
#include "runtime/cpu/conv/conv_winograd_f32.h"
#include "runtime/cpu/onednn.h"

#include <loom/lazy.h>

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

struct Case {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
};

std::string name(const Case& k) {
  std::ostringstream s;
  s << "n" << k.n << " c" << k.c << " " << k.h << "x" << k.w << " o" << k.o << " k" << k.kh << "x"
    << k.kw << " s" << k.sh << "," << k.sw << " p" << k.ph << "," << k.pw << " d" << k.dh << ","
    << k.dw << " g" << k.groups;
  return s.str();
}

std::vector<double> random(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

struct Reference {
  std::vector<double> out, grad_in, grad_w;
};

// out, and the gradients of sum(out * grad_out), by the definition.
Reference reference(const Case& k, int64_t oh, int64_t ow, const std::vector<double>& x,
                    const std::vector<double>& w, const std::vector<double>& go) {
  const int64_t cg = k.c / k.groups, og = k.o / k.groups;
  Reference r{std::vector<double>(go.size()), std::vector<double>(x.size()),
              std::vector<double>(w.size())};
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.o; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          const int64_t oi = ((n * k.o + o) * oh + y) * ow + xx;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t iy = y * k.sh - k.ph + i * k.dh, ix = xx * k.sw - k.pw + j * k.dw;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                const int64_t ci = o / og * cg + c;
                const int64_t xi = ((n * k.c + ci) * k.h + iy) * k.w + ix;
                const int64_t wi = ((o * cg + c) * k.kh + i) * k.kw + j;
                r.out[oi] += x[xi] * w[wi];
                r.grad_in[xi] += go[oi] * w[wi];
                r.grad_w[wi] += go[oi] * x[xi];
              }
        }
  return r;
}

template <class T>
std::vector<double> run(ir::Op op, const ir::Attr& attr, std::vector<double> a, const Shape& sa,
                        std::vector<double> b, const Shape& sb, const Shape& so) {
  const DType dt = sizeof(T) == 4 ? DType::Float32 : DType::Float64;
  std::vector<T> ta(a.begin(), a.end()), tb(b.begin(), b.end());
  std::vector<T> out(static_cast<std::size_t>(shape_numel(so)), T(12345));  // must be overwritten
  std::vector<TensorView> in{{ta.data(), dt, sa}, {tb.data(), dt, sb}};
  run_kernel(op, attr, in, {out.data(), dt, so});
  return {out.begin(), out.end()};
}

// The tolerance of one pass: float32 rounding of a sum of `terms` products grows like
// sqrt(terms) ulps of its magnitude; kUlps leaves room for Winograd's transforms. Each pass
// sums its own count: the forward c/g*kh*kw products per output, the input gradient at most
// o/g*kh*kw per input element, the weight gradient n*oh*ow per weight. A kernel 0.1% wrong
// exceeds this at every geometry here (16 * 1.2e-7 * sqrt(6144) = 1.5e-4 < 1e-3 / 2).
constexpr double kUlps = 16;

double tolerance32(int64_t terms) {
  return kUlps * std::numeric_limits<float>::epsilon() *
         std::sqrt(static_cast<double>(std::max<int64_t>(terms, 1)));
}

template <class T>
void check(const Case& k) {
  const int64_t oh = (k.h + 2 * k.ph - k.dh * (k.kh - 1) - 1) / k.sh + 1;
  const int64_t ow = (k.w + 2 * k.pw - k.dw * (k.kw - 1) - 1) / k.sw + 1;
  const Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c / k.groups, k.kh, k.kw}, os{k.n, k.o, oh, ow};
  auto x = random(shape_numel(xs), 1), w = random(shape_numel(ws), 2),
       go = random(shape_numel(os), 3);
  const Reference r = reference(k, oh, ow, x, w, go);
  const bool single = sizeof(T) == 4;
  const int64_t taps = k.kh * k.kw;
  const double tol_forward = single ? tolerance32(k.c / k.groups * taps) : 1e-12;
  const double tol_grad_input = single ? tolerance32(k.o / k.groups * taps) : 1e-12;
  const double tol_grad_weight = single ? tolerance32(k.n * oh * ow) : 1e-12;
  const std::string what = name(k) + (single ? " float32 " : " float64 ");
  const ir::Conv2dAttr attr{.stride = {k.sh, k.sw}, .padding = {k.ph, k.pw},
                            .dilation = {k.dh, k.dw}, .groups = k.groups};
  expect_near(run<T>(ir::Op::Conv2d, attr, x, xs, w, ws, os), r.out, tol_forward,
              what + "forward");
  const ir::Conv2dGradAttr gi{attr, {k.h, k.w}}, gw{attr, {k.kh, k.kw}};
  expect_near(run<T>(ir::Op::Conv2dGradInput, gi, go, os, w, ws, xs), r.grad_in, tol_grad_input,
              what + "grad_input");
  expect_near(run<T>(ir::Op::Conv2dGradWeight, gw, x, xs, go, os, ws), r.grad_w, tol_grad_weight,
              what + "grad_weight");
}

const Case kCases[] = {
    {2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // a ResNet block, small
    {3, 5, 7, 9, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1},      // odd sizes, channels not a multiple of 4
    {2, 4, 10, 6, 6, 3, 3, 1, 1, 0, 0, 1, 1, 1},     // no padding
    {2, 4, 9, 11, 4, 3, 5, 1, 1, 2, 1, 1, 1, 1},     // padding on one side beyond the other
    {2, 3, 12, 10, 5, 3, 3, 1, 1, 2, 2, 2, 2, 1},    // dilation
    {2, 6, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2},      // groups
    {2, 8, 5, 5, 12, 1, 1, 1, 1, 0, 0, 1, 1, 1},     // 1x1
    {2, 8, 6, 6, 12, 1, 1, 2, 2, 0, 0, 1, 1, 1},     // 1x1 stride 2
    {2, 16, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1},     // stride 2
    {2, 3, 6, 6, 4, 3, 3, 1, 1, 3, 3, 1, 1, 1},      // padding beyond the reach
    {1, 3, 20, 40, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // wide rows, many vectors per row
    {2, 2, 7, 7, 3, 2, 3, 2, 1, 1, 0, 1, 2, 1},      // stride and dilation differ per axis
    {20, 2, 4, 4, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // more images than weight chunks
    {1, 40, 3, 3, 36, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // channels beyond one sub-block
    {2, 3, 9, 8, 5, 3, 3, 2, 2, 0, 0, 1, 1, 1},      // stride 2, no padding, odd size
    {2, 4, 11, 10, 6, 5, 4, 3, 2, 2, 1, 1, 1, 1},    // stride 3 x 2, a wider kernel
    {2, 3, 6, 9, 4, 3, 3, 1, 2, 1, 1, 1, 1, 1},      // strided along one axis only
    {2, 4, 8, 8, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2},      // stride 2 with groups
    {3, 16, 16, 16, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1},  // a ResNet stage entry, small
    {3, 16, 16, 16, 32, 1, 1, 2, 2, 0, 0, 1, 1, 1},  // its projection shortcut
    {0, 4, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1},      // no images: a zero weight gradient
    // 3x3 stride 1: Winograd where forced, or at 64 channels and more.
    {2, 3, 1, 1, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},      // 1x1 planes: one partial tile
    {3, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1},      // a partial column of tiles
    {2, 5, 3, 3, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1},      // no padding: one output
    {2, 5, 5, 4, 6, 3, 3, 1, 1, 2, 0, 1, 1, 1},      // padding 2 along y only
    {2, 64, 7, 5, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // Winograd's default, odd planes
    {2, 130, 3, 5, 66, 3, 3, 1, 1, 1, 1, 1, 1, 1},   // two blocks of input channels
    {6, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},  // chunks of several tile blocks
    {2, 256, 3, 3, 260, 3, 3, 1, 1, 1, 1, 1, 1, 1},  // wide: the weight gradient in one piece
};

TEST(Conv2dKernels, Float32MatchesReference) {
  for (const Case& k : kCases) check<float>(k);
}

TEST(Conv2dKernels, Float64MatchesReference) {
  for (const Case& k : kCases) check<double>(k);
}

// With deterministic algorithms, the weight gradient splits its sums by the shapes only: one
// thread and several give the same bits, at geometries where Winograd takes chunks of tiles,
// blocks of channels, or all the tiles in one piece (and the direct kernel, at 16 channels).
// Without them the weight gradient may run on oneDNN, which splits the sum over images by the
// thread count (onednn_test.cpp: DeterministicAlgorithmsKeepTheWeightGradientOffOneDnn).
TEST(Conv2dKernels, WeightGradientIndependentOfThreadCount) {
  use_deterministic_algorithms(true);
  const Case cases[] = {
      {8, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},
      {4, 130, 4, 4, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},
      {16, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1},
      {4, 256, 4, 4, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1},
  };
  for (const Case& k : cases) {
    const Shape xs{k.n, k.c, k.h, k.w}, os{k.n, k.o, k.h, k.w}, ws{k.o, k.c, 3, 3};
    const auto x = random(shape_numel(xs), 1), go = random(shape_numel(os), 3);
    const ir::Conv2dGradAttr attr{{.padding = {1, 1}}, {3, 3}};
    auto in_arena = [&](int threads) {
      std::vector<double> r;
      tbb::task_arena(threads).execute(
          [&] { r = run<float>(ir::Op::Conv2dGradWeight, attr, x, xs, go, os, ws); });
      return r;
    };
    const auto one = in_arena(1);
    for (int threads : {2, 4}) EXPECT_EQ(in_arena(threads), one) << name(k) << " " << threads;
  }
  use_deterministic_algorithms(false);
}

// The Winograd kernels called directly, whatever the choice would be, against the reference.
TEST(Conv2dKernels, WinogradMatchesReference) {
  const Case cases[] = {
      {2, 3, 1, 1, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},   {3, 5, 7, 9, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1},
      {2, 4, 10, 6, 6, 3, 3, 1, 1, 0, 0, 1, 1, 1},  {2, 3, 6, 6, 4, 3, 3, 1, 1, 3, 2, 1, 1, 1},
      {2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1}, {1, 3, 20, 40, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1},
  };
  for (const Case& k : cases) {
    const int64_t oh = k.h + 2 * k.ph - 2, ow = k.w + 2 * k.pw - 2;
    const ConvGeometry g{k.n, k.c, k.h, k.w, k.o, 3, 3, oh, ow, 1, 1, k.ph, k.pw, 1, 1, 1};
    ASSERT_TRUE(winograd_applies(g)) << name(k);
    const auto x = random(k.n * k.c * k.h * k.w, 1), w = random(k.o * k.c * 9, 2),
               go = random(k.n * k.o * oh * ow, 3);
    const Reference r = reference(k, oh, ow, x, w, go);
    const std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()),
        gof(go.begin(), go.end());
    std::vector<float> out(go.size()), gw(w.size());
    ASSERT_TRUE(conv2d_winograd(g, xf.data(), wf.data(), out.data()));
    ASSERT_TRUE(conv2d_grad_weight_winograd(g, xf.data(), gof.data(), gw.data()));
    expect_near({out.begin(), out.end()}, r.out, tolerance32(k.c * 9), name(k) + " winograd forward");
    expect_near({gw.begin(), gw.end()}, r.grad_w, tolerance32(k.n * oh * ow),
                name(k) + " winograd grad_weight");
  }
}

// ResNet-18's last stage (512 channels, 4x4 planes) from batch 16 on takes it in float32
// training steps with AVX-512: the channels-last weight-gradient kernel gives Winograd's bits
// on [N,C,H,W] copies of its operands (which match the reference in WinogradMatchesReference).
// Below AVX-512 the channels-last float32 Winograd takes it instead (conv_winograd_f32.h), and
// the kernel gives that path's bits. Smaller batches, 256 channels or 8x8 planes, and bfloat16
// stay off it.
TEST(Conv2dKernels, WinogradWeightGradientChosenForChannelsLastLastStage) {
  if (std::getenv("LOOM_CONV")) GTEST_SKIP() << "LOOM_CONV forces the choice";
  const auto geometry = [](int64_t n, int64_t c, int64_t size) {
    return ConvGeometry{n, c, size, size, c, 3, 3, size, size, 1, 1, 1, 1, 1, 1, 1};
  };
  const bool avx512 = onednn::avx512_core();
  EXPECT_EQ(winograd_weight_grad_chosen(geometry(32, 512, 4), DType::Float32), avx512);
  EXPECT_FALSE(winograd_weight_grad_chosen(geometry(32, 512, 4), DType::BFloat16));
  EXPECT_FALSE(winograd_weight_grad_chosen(geometry(8, 512, 4), DType::Float32));
  EXPECT_FALSE(winograd_weight_grad_chosen(geometry(32, 256, 4), DType::Float32));
  EXPECT_FALSE(winograd_weight_grad_chosen(geometry(32, 512, 8), DType::Float32));

  const ConvGeometry g = geometry(16, 512, 4);
  ASSERT_EQ(winograd_weight_grad_chosen(g, DType::Float32), avx512);
  ASSERT_NE(f32_winograd_chosen(g, ConvPass::kGradWeight), avx512);
  const auto x = random(g.n * g.c * 16, 6), go = random(g.n * g.o * 16, 7);
  const std::vector<float> xf(x.begin(), x.end()), gof(go.begin(), go.end());
  // The same operands channels-last: element (n, c, p) of [N,C,16] at (n, p, c) of [N,16,C].
  std::vector<float> x_last(xf.size()), go_last(gof.size());
  for (int64_t i = 0; i < g.n * g.c * 16; ++i) {
    const int64_t n = i / (g.c * 16), c = i / 16 % g.c, p = i % 16;
    x_last[static_cast<std::size_t>((n * 16 + p) * g.c + c)] = xf[static_cast<std::size_t>(i)];
    go_last[static_cast<std::size_t>((n * 16 + p) * g.o + c)] = gof[static_cast<std::size_t>(i)];
  }
  std::vector<float> want(static_cast<std::size_t>(g.o * g.c * 9)), got(want.size(), -1.0f);
  if (avx512)
    ASSERT_TRUE(conv2d_grad_weight_winograd(g, xf.data(), gof.data(), want.data()));
  else
    conv2d_grad_weight_winograd_f32(g, f32_winograd_tile(g, ConvPass::kGradWeight),
                                    x_last.data(), go_last.data(), want.data());
  const ir::Conv2dAttr conv{.stride = {1, 1}, .padding = {1, 1}, .channels_last = true};
  const std::vector<TensorView> in{{x_last.data(), DType::Float32, {g.n, 4, 4, g.c}},
                                   {go_last.data(), DType::Float32, {g.n, 4, 4, g.o}}};
  run_kernel(ir::Op::Conv2dGradWeight, ir::Conv2dGradAttr{conv, {3, 3}}, in,
             {got.data(), DType::Float32, {g.o, g.c, 3, 3}});
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace loom::runtime
