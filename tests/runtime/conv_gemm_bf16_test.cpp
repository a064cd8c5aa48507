// bfloat16 channels-last convs as im2col + oneDNN's AMX matmul
// (runtime/cpu/conv/conv_gemm_bf16.h): every pass against float64 sums by the definition on the
// same bfloat16 operands, at shapes that exercise its paths (3x3 and 1x1 kernels, strides,
// padding 0 to 2, dilation, odd planes, a 1x1 conv read in place; ResNet-18's last stage), the
// forward with a bias and relu; the choice at ResNet-18's shapes; and the channels-last conv
// kernel running it where it is chosen. Skipped with one line on a CPU without AMX.
//
// Tolerance: as a direct conv's (conv_weight_bf16_test.cpp): the products are exact in float32,
// the matmul sums in float32 and rounds once, so 4e-3 x (|want| + rms(want)) bounds the error.
#include "runtime/cpu/conv/conv_gemm_bf16.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/expect_near.h"
#include "runtime/random_bf16.h"

#include <loom/bfloat16.h>
#include <loom/lazy.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

constexpr double kTolerance = 4e-3;

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

std::string name(const ConvGeometry& g, ConvPass pass) {
  std::ostringstream s;
  s << (pass == ConvPass::kForward     ? "forward"
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

struct Operands {
  ConvGeometry g;
  std::vector<bfloat16> x, w, grad;
  std::vector<float> bias;
  explicit Operands(const Case& k)
      : g(geometry(k)),
        x(random_bf16(g.n * g.h * g.w * g.c, 1)),
        w(random_bf16(g.o * g.c * g.kh * g.kw, 2)),
        grad(random_bf16(g.n * g.oh * g.ow * g.o, 3)) {
    for (int64_t o = 0; o < g.o; ++o) bias.push_back(static_cast<float>(o % 7) * 0.25f - 0.75f);
  }

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

  std::vector<double> run(ConvPass pass, bool with_bias, bool relu) const {
    std::vector<bfloat16> out(pass == ConvPass::kForward     ? grad.size()
                              : pass == ConvPass::kGradInput ? x.size()
                                                             : w.size());
    const bfloat16* a = pass == ConvPass::kGradInput ? grad.data() : x.data();
    const bfloat16* b = pass == ConvPass::kGradWeight ? grad.data() : w.data();
    conv2d_gemm_bf16(g, pass, a, b, out.data(), with_bias ? bias.data() : nullptr, relu);
    return {out.begin(), out.end()};
  }
};

#define SKIP_WITHOUT_AMX()                                                  \
  if (!onednn::amx_bfloat16())                                              \
  GTEST_SKIP() << "no AMX on this CPU: im2col + matmul never runs a conv here"

const Case kCases[] = {
    {2, 16, 6, 6, 32, 3, 1, 1, 1},      // a ResNet block, small
    {3, 32, 7, 9, 48, 3, 2, 1, 1},      // odd planes, stride 2 (no input gradient here)
    {1, 16, 5, 6, 32, 3, 1, 2, 1},      // padding 2: the input gradient's padding 0
    {2, 16, 6, 7, 16, 3, 1, 0, 1},      // padding 0: the input gradient's 2
    {2, 32, 9, 9, 16, 3, 1, 2, 2},      // dilation 2
    {2, 64, 8, 8, 128, 1, 2, 0, 1},     // a strided 1x1 projection
    {3, 48, 5, 5, 32, 1, 1, 0, 1},      // a 1x1 conv read in place
    {2, 512, 4, 4, 512, 3, 1, 1, 1},    // ResNet-18's last stage
};

TEST(Bf16GemmConv, EveryPassMatchesReference) {
  SKIP_WITHOUT_AMX();
  for (const Case& k : kCases) {
    const Operands op(k);
    for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput, ConvPass::kGradWeight}) {
      if (!bf16_gemm_conv_applies(op.g, pass)) {
        EXPECT_EQ(pass, ConvPass::kGradInput) << name(op.g, pass);
        EXPECT_GT(op.g.sh, 1) << name(op.g, pass);
        continue;
      }
      expect_near(op.run(pass, false, false), op.reference(pass, false, false), kTolerance,
                  name(op.g, pass));
    }
  }
}

TEST(Bf16GemmConv, ForwardAddsBiasThenRelu) {
  SKIP_WITHOUT_AMX();
  for (const Case& k : {kCases[0], kCases[6]}) {
    const Operands op(k);
    expect_near(op.run(ConvPass::kForward, true, true),
                op.reference(ConvPass::kForward, true, true), kTolerance,
                name(op.g, ConvPass::kForward) + " + bias, relu");
  }
}

// ResNet-18 (CIFAR, batch 32): its last stage's small planes and its strided convs' weight
// gradients take the matmul; a stride-1 conv on a 32x32 plane keeps oneDNN's direct kernels;
// deterministic algorithms keep every pass off the matmul, whose sums oneDNN may split by the
// thread count.
TEST(Bf16GemmConv, ChosenWhereItWins) {
  SKIP_WITHOUT_AMX();
  if (std::getenv("LOOM_CONV")) GTEST_SKIP() << "LOOM_CONV forces the choice";
  const ConvGeometry last = geometry({32, 512, 4, 4, 512, 3, 1, 1, 1});
  const ConvGeometry entry = geometry({32, 256, 8, 8, 512, 3, 2, 1, 1});
  const ConvGeometry first = geometry({32, 64, 32, 32, 64, 3, 1, 1, 1});
  for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput, ConvPass::kGradWeight}) {
    EXPECT_TRUE(bf16_gemm_conv_chosen(last, pass)) << name(last, pass);
    EXPECT_FALSE(bf16_gemm_conv_chosen(first, pass)) << name(first, pass);
  }
  EXPECT_TRUE(bf16_gemm_conv_chosen(entry, ConvPass::kGradWeight));
  EXPECT_FALSE(bf16_gemm_conv_chosen(entry, ConvPass::kGradInput));  // strided: not applicable
  use_deterministic_algorithms(true);
  const bool deterministic = bf16_gemm_conv_chosen(last, ConvPass::kGradWeight);
  use_deterministic_algorithms(false);
  EXPECT_FALSE(deterministic);
}

// The channels-last conv kernel (what a bfloat16 training step runs) takes the matmul for
// ResNet-18's last stage: the same bits as calling it.
TEST(Bf16GemmConv, RunsForChosenChannelsLastConvs) {
  SKIP_WITHOUT_AMX();
  const Operands op({2, 512, 4, 4, 256, 3, 1, 1, 1});
  const ConvGeometry& g = op.g;
  if (!bf16_gemm_conv_chosen(g, ConvPass::kGradWeight))
    GTEST_SKIP() << "LOOM_CONV keeps this conv off the matmul";
  const ir::Conv2dAttr conv{.stride = {1, 1}, .padding = {1, 1}, .channels_last = true};
  std::vector<bfloat16> x = op.x, grad = op.grad, out(op.w.size());
  const std::vector<TensorView> in{{x.data(), DType::BFloat16, {g.n, g.h, g.w, g.c}},
                                   {grad.data(), DType::BFloat16, {g.n, g.oh, g.ow, g.o}}};
  run_kernel(ir::Op::Conv2dGradWeight, ir::Conv2dGradAttr{conv, {3, 3}}, in,
             {out.data(), DType::BFloat16, {g.o, g.c, 3, 3}});
  const std::vector<double> got(out.begin(), out.end());
  EXPECT_EQ(got, op.run(ConvPass::kGradWeight, false, false));
  expect_near(got, op.reference(ConvPass::kGradWeight, false, false), kTolerance,
              "channels-last kernel: " + name(g, ConvPass::kGradWeight));
}

}  // namespace
}  // namespace loom::runtime
