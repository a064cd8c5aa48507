// Channels-last convs as im2col + one oneDNN matmul (runtime/cpu/conv/conv_matmul.h), in
// float32 and (on a CPU with AMX) bfloat16: every pass against float64 sums by the definition on
// the same operands, at shapes that exercise its paths (3x3 and 1x1 kernels, strides, padding 0
// to 2, dilation, odd planes, a 1x1 conv read in place; ResNet-18's last stage), the forward
// with a bias and relu; the choice at ResNet-18's shapes; and the channels-last conv kernel
// running it where it is chosen. The bfloat16 cases skip with one line on a CPU without AMX.
//
// Tolerance: bfloat16 as a direct conv's (conv_weight_bf16_test.cpp): the products are exact in
// float32, the matmul sums in float32 and rounds once, so 4e-3 x (|want| + rms(want)) bounds the
// error. float32: 16 ulps x sqrt(terms), as onednn_test.cpp's.
#include "runtime/cpu/conv/conv_matmul.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/expect_near.h"
#include "runtime/random_bf16.h"

#include <loom/bfloat16.h>
#include <loom/lazy.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

constexpr double kBFloat16Tolerance = 4e-3;

double tolerance(DType dtype, int64_t terms) {
  if (dtype == DType::BFloat16) return kBFloat16Tolerance;
  return 16 * std::numeric_limits<float>::epsilon() * std::sqrt(static_cast<double>(terms));
}

struct Case {
  int64_t n, c, h, w, o, k, stride, pad, dilation;
};

ConvGeometry geometry(const Case& k) {
  const int64_t reach = k.dilation * (k.k - 1);
  const int64_t oh = (k.h + 2 * k.pad - reach - 1) / k.stride + 1;
  const int64_t ow = (k.w + 2 * k.pad - reach - 1) / k.stride + 1;
  return {k.n,      k.c,   k.h,   k.w,   k.o,        k.k,        k.k, oh,
          ow,       k.stride, k.stride, k.pad, k.pad, k.dilation, k.dilation, 1};
}

std::string name(const ConvGeometry& g, ConvPass pass, DType dtype) {
  std::ostringstream s;
  s << dtype_name(dtype) << " " << (pass == ConvPass::kForward     ? "forward"
        : pass == ConvPass::kGradInput ? "grad_input"
                                       : "grad_weight")
    << " n" << g.n << " c" << g.c << " " << g.h << "x" << g.w << " o" << g.o << " k" << g.kh
    << " s" << g.sh << " p" << g.ph << " d" << g.dh;
  return s.str();
}

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

// Calls f(x index, w index, y index) for every product of the conv, x [N,H,W,C],
// w [O,C,kh,kw], y [N,Ho,Wo,O].
template <class F>
void for_each_product(const ConvGeometry& g, F f) {
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t y = 0; y < g.oh; ++y)
      for (int64_t xx = 0; xx < g.ow; ++xx)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iy = y * g.sh - g.ph + i * g.dh, ix = xx * g.sw - g.pw + j * g.dw;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
            for (int64_t o = 0; o < g.o; ++o)
              for (int64_t c = 0; c < g.c; ++c)
                f(((n * g.h + iy) * g.w + ix) * g.c + c, ((o * g.c + c) * g.kh + i) * g.kw + j,
                  ((n * g.oh + y) * g.ow + xx) * g.o + o);
          }
}

struct Operands : ConvOperandsBf16 {
  explicit Operands(const Case& k) : ConvOperandsBf16(geometry(k)) {}

  std::vector<double> reference(ConvPass pass, bool with_bias, bool relu) const {
    std::vector<double> out(pass == ConvPass::kForward     ? grad.size()
                            : pass == ConvPass::kGradInput ? x.size()
                                                           : w.size());
    for_each_product(g, [&](int64_t xi, int64_t wi, int64_t yi) {
      const auto v = [](bfloat16 b) { return static_cast<double>(b); };
      switch (pass) {
        case ConvPass::kForward: out[at(yi)] += v(x[at(xi)]) * v(w[at(wi)]); break;
        case ConvPass::kGradInput: out[at(xi)] += v(grad[at(yi)]) * v(w[at(wi)]); break;
        case ConvPass::kGradWeight: out[at(wi)] += v(grad[at(yi)]) * v(x[at(xi)]); break;
      }
    });
    if (pass == ConvPass::kForward && (with_bias || relu))
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (with_bias) out[i] += bias[i % at(g.o)];
        if (relu) out[i] = std::max(out[i], 0.0);
      }
    return out;
  }

  // The terms of each sum in pass `pass`.
  int64_t terms(ConvPass pass) const {
    const int64_t taps = g.kh * g.kw;
    return pass == ConvPass::kForward     ? g.c * taps
           : pass == ConvPass::kGradInput ? g.o * taps
                                          : g.n * g.oh * g.ow;
  }

  // The pass through conv2d_matmul on the operands in `dtype` (each value exact in both).
  std::vector<double> run(ConvPass pass, DType dtype, bool with_bias, bool relu) const {
    const std::size_t n = pass == ConvPass::kForward     ? grad.size()
                          : pass == ConvPass::kGradInput ? x.size()
                                                         : w.size();
    const bfloat16* a = pass == ConvPass::kGradInput ? grad.data() : x.data();
    const bfloat16* b = pass == ConvPass::kGradWeight ? grad.data() : w.data();
    const float* pb = with_bias ? bias.data() : nullptr;
    if (dtype == DType::BFloat16) {
      std::vector<bfloat16> out(n);
      conv2d_matmul(g, pass, dtype, a, b, out.data(), pb, relu);
      return {out.begin(), out.end()};
    }
    const auto widen = [](const bfloat16* p, std::size_t count) {
      return std::vector<float>(p, p + count);
    };
    const std::vector<float> fa = widen(a, pass == ConvPass::kGradInput ? grad.size() : x.size());
    const std::vector<float> fb = widen(b, pass == ConvPass::kGradWeight ? grad.size() : w.size());
    std::vector<float> out(n);
    conv2d_matmul(g, pass, dtype, fa.data(), fb.data(), out.data(), pb, relu);
    return {out.begin(), out.end()};
  }
};

const DType kDTypes[] = {DType::Float32, DType::BFloat16};

// Skips a bfloat16 case on a CPU without AMX, where the path does not run bfloat16.
bool runs(DType dtype) { return dtype == DType::Float32 || onednn::amx_bfloat16(); }

const Case kCases[] = {
    {2, 16, 6, 6, 32, 3, 1, 1, 1},      // a ResNet block, small
    {3, 32, 7, 9, 48, 3, 2, 1, 1},      // odd planes, stride 2 (no input gradient here)
    {1, 16, 5, 6, 32, 3, 1, 2, 1},      // padding 2: the input gradient's padding 0
    {2, 16, 6, 7, 16, 3, 1, 0, 1},      // padding 0: the input gradient's 2
    {2, 32, 9, 9, 16, 3, 1, 2, 2},      // dilation 2
    {2, 64, 8, 8, 128, 1, 2, 0, 1},     // a strided 1x1 projection
    {3, 48, 5, 5, 32, 1, 1, 0, 1},      // a 1x1 conv read in place
    {2, 512, 4, 4, 512, 3, 1, 1, 1},    // ResNet-18's last stage
    {1, 64, 5, 5, 128, 3, 2, 1, 1},     // forward: fewer positions than outputs (weight order)
    {1, 32, 6, 6, 96, 3, 1, 2, 2},      // ... with dilation 2
};

TEST(ConvMatmul, EveryPassMatchesReference) {
  if (!onednn::amx_bfloat16()) std::printf("no AMX on this CPU: bfloat16 cases skipped\n");
  for (DType dtype : kDTypes) {
    if (!runs(dtype)) continue;
    for (const Case& k : kCases) {
      const Operands op(k);
      for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput, ConvPass::kGradWeight}) {
        if (!conv_matmul_applies(op.g, pass, dtype)) {
          EXPECT_EQ(pass, ConvPass::kGradInput) << name(op.g, pass, dtype);
          EXPECT_GT(op.g.sh, 1) << name(op.g, pass, dtype);
          continue;
        }
        expect_near(op.run(pass, dtype, false, false), op.reference(pass, false, false),
                    tolerance(dtype, op.terms(pass)), name(op.g, pass, dtype));
      }
    }
  }
}

TEST(ConvMatmul, ForwardAddsBiasThenRelu) {
  for (DType dtype : kDTypes) {
    if (!runs(dtype)) continue;
    for (const Case& k : {kCases[0], kCases[6]}) {
      const Operands op(k);
      expect_near(op.run(ConvPass::kForward, dtype, true, true),
                  op.reference(ConvPass::kForward, true, true),
                  tolerance(dtype, op.terms(ConvPass::kForward)),
                  name(op.g, ConvPass::kForward, dtype) + " + bias, relu");
    }
  }
}

// A float32 weight gradient whose batch's im2col is over the budget runs as a matmul per
// group of images, the groups' products added: the reference's values, and within rounding
// of the one matmul, at shapes whose groups divide the batch or leave a remainder.
TEST(ConvMatmul, WeightGradientInGroupsOfImagesMatchesReference) {
  for (const Case& k : {Case{5, 16, 6, 6, 32, 3, 1, 1, 1}, Case{4, 32, 7, 9, 48, 3, 2, 1, 1},
                        Case{3, 64, 8, 8, 128, 1, 2, 0, 1}}) {
    const Operands op(k);
    const ConvGeometry& g = op.g;
    const int64_t per_image = g.oh * g.ow * g.kh * g.kw * g.c * 4;
    const int64_t budget = per_image * 2;  // two images a matmul
    ASSERT_EQ(weight_grad_images(g, DType::Float32, budget), 2) << name(g, ConvPass::kGradWeight, DType::Float32);
    std::vector<float> x(op.x.begin(), op.x.end()), grad(op.grad.begin(), op.grad.end());
    std::vector<float> grouped(op.w.size()), whole(op.w.size());
    conv2d_matmul_grad_weight(g, DType::Float32, x.data(), grad.data(), grouped.data(), budget);
    conv2d_matmul_grad_weight(g, DType::Float32, x.data(), grad.data(), whole.data(),
                              per_image * g.n);
    const std::string what = name(g, ConvPass::kGradWeight, DType::Float32) + " in groups of 2";
    const double tol = tolerance(DType::Float32, op.terms(ConvPass::kGradWeight));
    expect_near({grouped.begin(), grouped.end()}, op.reference(ConvPass::kGradWeight, false, false),
                tol, what);
    expect_near({grouped.begin(), grouped.end()}, {whole.begin(), whole.end()}, tol, what + " vs one");
  }
  // bfloat16 rounds one sum: never grouped.
  const ConvGeometry g = geometry(kCases[0]);
  EXPECT_EQ(weight_grad_images(g, DType::BFloat16, 1), g.n);
}

// ResNet-18 (CIFAR, batch 32): its last stage's 4x4 planes take the matmul (in float32 the
// forward with AVX-512 only) and, in bfloat16, its strided convs' weight gradients (in float32
// too, and below AVX-512 those from 32 in and 64 out channels); a stride-1 conv on a 32x32
// plane never takes it; deterministic algorithms keep every pass off the
// matmul, whose sums oneDNN may split by the thread count.
TEST(ConvMatmul, ChosenWhereItWins) {
  if (std::getenv("LOOM_CONV")) GTEST_SKIP() << "LOOM_CONV forces the choice";
  const ConvGeometry last = geometry({32, 512, 4, 4, 512, 3, 1, 1, 1});
  const ConvGeometry entry = geometry({32, 256, 8, 8, 512, 3, 2, 1, 1});
  const ConvGeometry first = geometry({32, 64, 32, 32, 64, 3, 1, 1, 1});
  const DType f32 = DType::Float32, bf16 = DType::BFloat16;
  // Below AVX-512 the float32 Winograd (conv_winograd_f32.h) takes every pass of the stride-1
  // 3x3 convs from it; the strided convs' weight gradients stay on it.
  const bool avx2 = !onednn::avx512_core();
  EXPECT_EQ(conv_matmul_chosen(last, ConvPass::kForward, f32), !avx2);
  EXPECT_FALSE(conv_matmul_chosen(last, ConvPass::kGradInput, f32));
  EXPECT_FALSE(conv_matmul_chosen(last, ConvPass::kGradWeight, f32));
  EXPECT_TRUE(conv_matmul_chosen(entry, ConvPass::kGradWeight, f32));
  for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput, ConvPass::kGradWeight}) {
    EXPECT_EQ(conv_matmul_chosen(last, pass, bf16), onednn::amx_bfloat16())
        << name(last, pass, bf16);
    EXPECT_FALSE(conv_matmul_chosen(first, pass, bf16)) << name(first, pass, bf16);
    EXPECT_FALSE(conv_matmul_chosen(first, pass, f32)) << name(first, pass, f32);
  }
  // Below AVX-512 the float32 weight gradient of a strided conv from 32 in and 64 out channels
  // takes it (64 to 128 channels, ResNet-18's layer 2 entry), where the Winograd does not apply.
  const ConvGeometry layer2 = geometry({32, 64, 32, 32, 128, 3, 2, 1, 1});
  EXPECT_EQ(conv_matmul_chosen(layer2, ConvPass::kGradWeight, f32), avx2);
  // Below AVX-512 not the stems or 16-channel convs, nor planes over 32x32.
  const ConvGeometry stem = geometry({32, 3, 32, 32, 64, 3, 1, 1, 1});
  const ConvGeometry narrow = geometry({128, 16, 32, 32, 32, 3, 2, 1, 1});
  const ConvGeometry wide_plane = geometry({8, 64, 56, 56, 64, 3, 1, 1, 1});
  for (const ConvGeometry& g : {stem, narrow, wide_plane})
    EXPECT_FALSE(conv_matmul_chosen(g, ConvPass::kGradWeight, f32))
        << name(g, ConvPass::kGradWeight, f32);
  EXPECT_EQ(conv_matmul_chosen(entry, ConvPass::kGradWeight, bf16), onednn::amx_bfloat16());
  // The same strided conv on 32 ImageNet-sized planes: an im2col of 231M elements.
  const ConvGeometry large = geometry({32, 256, 112, 112, 512, 3, 2, 1, 1});
  EXPECT_FALSE(conv_matmul_chosen(large, ConvPass::kGradWeight, bf16));
  EXPECT_FALSE(conv_matmul_chosen(large, ConvPass::kGradWeight, f32));
  EXPECT_FALSE(conv_matmul_chosen(entry, ConvPass::kGradInput, bf16));  // strided: no path
  use_deterministic_algorithms(true);
  const bool deterministic = conv_matmul_chosen(last, ConvPass::kForward, f32);
  use_deterministic_algorithms(false);
  EXPECT_FALSE(deterministic);
}

// The channels-last conv kernel (what a training step runs) takes the matmul for ResNet-18's
// last stage: the same bits as calling it.
TEST(ConvMatmul, RunsForChosenChannelsLastConvs) {
  const Operands op({2, 512, 4, 4, 256, 3, 1, 1, 1});
  const ConvGeometry& g = op.g;
  const ir::Conv2dAttr conv{.stride = {1, 1}, .padding = {1, 1}, .channels_last = true};
  for (DType dtype : kDTypes) {
    // bfloat16: the weight gradient; float32: the forward (its only 4x4 stride-1 pass here).
    const ConvPass pass = dtype == DType::BFloat16 ? ConvPass::kGradWeight : ConvPass::kForward;
    if (!conv_matmul_chosen(g, pass, dtype)) {
      std::printf("%s: not chosen here (no AMX, LOOM_CONV, or the float32 Winograd below "
                  "AVX-512)\n", name(g, pass, dtype).c_str());
      continue;
    }
    std::vector<double> got;
    if (dtype == DType::BFloat16) {
      std::vector<bfloat16> x = op.x, grad = op.grad, out(op.w.size());
      const std::vector<TensorView> in{{x.data(), dtype, {g.n, g.h, g.w, g.c}},
                                       {grad.data(), dtype, {g.n, g.oh, g.ow, g.o}}};
      run_kernel(ir::Op::Conv2dGradWeight, ir::Conv2dGradAttr{conv, {3, 3}}, in,
                 {out.data(), dtype, {g.o, g.c, 3, 3}});
      got.assign(out.begin(), out.end());
    } else {
      std::vector<float> x(op.x.begin(), op.x.end()), w(op.w.begin(), op.w.end());
      std::vector<float> out(op.grad.size());
      const std::vector<TensorView> in{{x.data(), dtype, {g.n, g.h, g.w, g.c}},
                                       {w.data(), dtype, {g.o, g.c, 3, 3}}};
      run_kernel(ir::Op::Conv2d, conv, in, {out.data(), dtype, {g.n, g.oh, g.ow, g.o}});
      got.assign(out.begin(), out.end());
    }
    EXPECT_EQ(got, op.run(pass, dtype, false, false)) << name(g, pass, dtype);
    expect_near(got, op.reference(pass, false, false), tolerance(dtype, op.terms(pass)),
                "channels-last kernel: " + name(g, pass, dtype));
  }
}

}  // namespace
}  // namespace loom::runtime
