// The bfloat16 weight gradient on vdpbf16ps (runtime/cpu/conv/conv_weight_bf16.h): against a
// float64 sum by the definition on the same bfloat16 operands, at the shapes that exercise its
// paths (odd batches, whose last image pair is half; strides; padding past the kernel; pieces
// of image pairs staged in turn; image chunks and output-channel groups); the same bits on 1, 2
// and 4 threads; and the channels-last conv kernel running it for bfloat16 weight gradients.
//
// Tolerance: every product of two bfloat16 values is exact in float32 and the sums run in
// float32, so the error is the final rounding to bfloat16 (half an ulp: at most 2^-8 of
// |want|) plus a float32 sum's (about 1e-4 of rms(want) here): 4e-3 x (|want| + rms(want))
// bounds both, below the op harness's 1e-2 (the worst seen: 0.77 of it).
#include "runtime/cpu/conv/conv_weight_bf16.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/expect_near.h"
#include "runtime/random_bf16.h"

#include <loom/bfloat16.h>
#include <loom/lazy.h>

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

constexpr double kTolerance = 4e-3;

struct Case {
  int64_t n, c, h, w, o, kh, sh, ph, pw;
};

ConvGeometry geometry(const Case& k) {
  const int64_t oh = (k.h + 2 * k.ph - k.kh) / k.sh + 1, ow = (k.w + 2 * k.pw - 3) / k.sh + 1;
  return {k.n, k.c, k.h, k.w, k.o, k.kh, 3, oh, ow, k.sh, k.sh, k.ph, k.pw, 1, 1, 1};
}

std::string name(const ConvGeometry& g) {
  std::ostringstream s;
  s << "n" << g.n << " c" << g.c << " " << g.h << "x" << g.w << " o" << g.o << " k" << g.kh
    << "x3 s" << g.sh << " p" << g.ph << "," << g.pw;
  return s.str();
}

// grad_w [O,C,kh,kw] by the definition, x [N,H,W,C] and grad [N,Ho,Wo,O] channels-last.
std::vector<double> reference(const ConvGeometry& g, const std::vector<bfloat16>& x,
                              const std::vector<bfloat16>& grad) {
  std::vector<double> out(static_cast<std::size_t>(g.o * g.c * g.kh * g.kw));
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t y = 0; y < g.oh; ++y)
      for (int64_t xx = 0; xx < g.ow; ++xx)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iy = y * g.sh - g.ph + i, ix = xx * g.sw - g.pw + j;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
            const auto at = [](int64_t i) { return static_cast<std::size_t>(i); };
            const bfloat16* xp = &x[at(((n * g.h + iy) * g.w + ix) * g.c)];
            const bfloat16* gp = &grad[at(((n * g.oh + y) * g.ow + xx) * g.o)];
            for (int64_t o = 0; o < g.o; ++o)
              for (int64_t c = 0; c < g.c; ++c)
                out[static_cast<std::size_t>(((o * g.c + c) * g.kh + i) * g.kw + j)] +=
                    static_cast<double>(gp[o]) * static_cast<double>(xp[c]);
          }
  return out;
}

std::vector<double> values(const std::vector<bfloat16>& v) { return {v.begin(), v.end()}; }

// A build without AVX512_BF16 (LOOM_NATIVE=OFF, or another processor) has no such kernel.
#define SKIP_WITHOUT_KERNEL()                                                                   \
  if (!bf16_weight_grad_applies(geometry({2, 16, 8, 8, 16, 3, 1, 1, 1})))                       \
  GTEST_SKIP() << "built without AVX512_BF16: oneDNN runs every bfloat16 weight gradient"

struct Operands {
  ConvGeometry g;
  std::vector<bfloat16> x, grad;
  explicit Operands(const Case& k)
      : g(geometry(k)),
        x(random_bf16(g.n * g.h * g.w * g.c, 1)),
        grad(random_bf16(g.n * g.oh * g.ow * g.o, 2)) {}
  std::vector<bfloat16> run() const {
    std::vector<bfloat16> out(static_cast<std::size_t>(g.o * g.c * g.kh * g.kw));
    conv2d_grad_weight_bf16(g, x.data(), grad.data(), out.data());
    return out;
  }
};

const Case kCases[] = {
    {2, 16, 8, 8, 16, 3, 1, 1, 1},     // a ResNet block, small
    {3, 16, 7, 9, 32, 3, 1, 1, 1},     // an odd batch: the last pair is one image
    {1, 16, 4, 4, 16, 3, 1, 1, 1},     // a single image
    {2, 32, 9, 9, 16, 3, 2, 1, 1},     // stride 2, odd size (a stage entry)
    {5, 16, 6, 5, 48, 3, 1, 0, 0},     // no padding
    {2, 16, 6, 6, 16, 5, 1, 2, 1},     // a 5x3 kernel, padding differing per axis
    {3, 16, 6, 6, 16, 3, 1, 3, 3},     // padding beyond the kernel's reach
    {20, 16, 5, 5, 16, 3, 1, 1, 1},    // 10 pairs in 8 image chunks of 1 or 2
    {4, 64, 40, 40, 16, 3, 1, 1, 1},   // a pair per staged piece
    {2, 80, 5, 5, 144, 3, 1, 1, 1},    // wide: output-channel groups of 32, the last of 16
    {3, 256, 4, 4, 512, 3, 1, 1, 1},   // ResNet-18's last stage, one image short of two pairs
};

TEST(Bf16WeightGrad, MatchesReference) {
  SKIP_WITHOUT_KERNEL();
  for (const Case& k : kCases) {
    const Operands op(k);
    ASSERT_TRUE(bf16_weight_grad_applies(op.g)) << name(op.g);
    expect_near(values(op.run()), reference(op.g, op.x, op.grad), kTolerance, name(op.g));
  }
}

TEST(Bf16WeightGrad, IndependentOfThreadCount) {
  SKIP_WITHOUT_KERNEL();
  for (const Case& k : {kCases[1], kCases[7], kCases[9]}) {
    const Operands op(k);
    const auto in_arena = [&](int threads) {
      std::vector<bfloat16> r;
      tbb::task_arena(threads).execute([&] { r = op.run(); });
      return values(r);
    };
    const auto one = in_arena(1);
    for (int threads : {2, 4}) EXPECT_EQ(in_arena(threads), one) << name(op.g);
  }
}

// Where it applies (3-wide kernels, channels by 16, no groups or dilation) and is chosen.
TEST(Bf16WeightGrad, AppliesToThreeWideKernelsAndIsChosenWhereItWins) {
  SKIP_WITHOUT_KERNEL();
  EXPECT_TRUE(bf16_weight_grad_applies(geometry({128, 16, 32, 32, 16, 3, 1, 1, 1})));
  EXPECT_TRUE(bf16_weight_grad_applies(geometry({32, 256, 8, 8, 512, 3, 2, 1, 1})));
  ConvGeometry g = geometry({2, 16, 8, 8, 16, 3, 1, 1, 1});
  for (auto change : {+[](ConvGeometry& v) { v.c = 3; }, +[](ConvGeometry& v) { v.o = 24; },
                      +[](ConvGeometry& v) { v.kw = 1; }, +[](ConvGeometry& v) { v.groups = 2; },
                      +[](ConvGeometry& v) { v.dh = 2; }}) {
    ConvGeometry other = g;
    change(other);
    EXPECT_FALSE(bf16_weight_grad_applies(other)) << name(other);
  }
  // Chosen over oneDNN's where it wins: strided, or stride 1 up to 64 x 64 channels, where
  // oneDNN has no AMX kernels; and everywhere under deterministic algorithms.
  const bool own = !onednn::amx_bfloat16();
  const ConvGeometry wide = geometry({32, 128, 16, 16, 128, 3, 1, 1, 1});
  EXPECT_EQ(bf16_weight_grad_chosen(geometry({32, 64, 32, 32, 64, 3, 1, 1, 1})), own);
  EXPECT_EQ(bf16_weight_grad_chosen(geometry({32, 256, 8, 8, 512, 3, 2, 1, 1})), own);
  EXPECT_FALSE(bf16_weight_grad_chosen(wide));
  use_deterministic_algorithms(true);
  EXPECT_TRUE(bf16_weight_grad_chosen(wide));
  use_deterministic_algorithms(false);
}

// The channels-last conv kernel runs it for a bfloat16 weight gradient (the same bits), with
// deterministic algorithms too.
TEST(Bf16WeightGrad, RunsForChannelsLastBFloat16WeightGradients) {
  SKIP_WITHOUT_KERNEL();
  const Operands op(kCases[1]);
  const ConvGeometry& g = op.g;
  const bool chosen = bf16_weight_grad_chosen(g);  // not where oneDNN has AMX kernels
  EXPECT_EQ(chosen, !onednn::amx_bfloat16());
  const ir::Conv2dAttr conv{.stride = {g.sh, g.sw}, .padding = {g.ph, g.pw}, .channels_last = true};
  const auto through_kernel = [&] {
    std::vector<bfloat16> out(static_cast<std::size_t>(g.o * g.c * g.kh * g.kw));
    std::vector<bfloat16> x = op.x, grad = op.grad;
    const std::vector<TensorView> in{{x.data(), DType::BFloat16, {g.n, g.h, g.w, g.c}},
                                     {grad.data(), DType::BFloat16, {g.n, g.oh, g.ow, g.o}}};
    run_kernel(ir::Op::Conv2dGradWeight, ir::Conv2dGradAttr{conv, {g.kh, g.kw}}, in,
               {out.data(), DType::BFloat16, {g.o, g.c, g.kh, g.kw}});
    return values(out);
  };
  const auto direct = values(op.run());
  if (chosen) {
    EXPECT_EQ(through_kernel(), direct);
  }
  use_deterministic_algorithms(true);
  ASSERT_TRUE(bf16_weight_grad_chosen(g));
  EXPECT_EQ(through_kernel(), direct);
  use_deterministic_algorithms(false);
}

}  // namespace
}  // namespace loom::runtime
