// Winograd F(2x2,3x3) on bfloat16 channels-last convs (runtime/cpu/conv/conv_winograd_bf16.h):
// the forward (with a bias and relu) and the input gradient against float64 sums by the
// definition on the same bfloat16 operands, at shapes that exercise its paths (odd planes,
// whose last tile is cut; padding 0 to 2; several blocks of tiles; output channels in chunks of
// 64 with a narrower last one; each register-tile height); the same bits on 1, 2 and 4
// threads; and the channels-last conv kernel running it where it is chosen.
//
// Tolerance: unlike a direct conv, the transformed input and kernel are rounded to bfloat16
// before they are multiplied. Each such value is a sum of up to 4 inputs (the kernel's: of 9
// taps, with weights 1/4 to 1), so its rounding is about 2^-9 of a few inputs' scale, and an
// output sums 16 such products per input channel with the signs of A^T before it is rounded
// once more. 2.5e-2 x (|want| + rms(want)) bounds that, where a direct conv's 4e-3 would
// (conv_weight_bf16_test.cpp); the worst seen is 0.72 of it, the fused bias and relu case,
// whose rms is smallest (LOOM_TEST_SHOW_ERRORS=1 prints each case's).
#include "runtime/cpu/conv/conv_winograd_bf16.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/conv3x3_reference.h"
#include "runtime/expect_near.h"
#include "runtime/random_bf16.h"

#include <loom/bfloat16.h>
#include <loom/error.h>

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

constexpr double kTolerance = 2.5e-2;

using Case = Conv3x3Case;

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

std::vector<double> values(const std::vector<bfloat16>& v) { return {v.begin(), v.end()}; }

#define SKIP_WITHOUT_KERNEL()                                                                   \
  if (!bf16_winograd_applies(geometry({1, 16, 4, 4, 16, 1, 1})))                               \
  GTEST_SKIP() << "built without AVX512_BF16: oneDNN runs every bfloat16 conv"

struct Operands : ConvOperandsBf16 {
  explicit Operands(const Case& k) : ConvOperandsBf16(geometry(k)) {}
  std::vector<bfloat16> forward(bool with_bias, bool relu) const {
    std::vector<bfloat16> out(at(g.n * g.oh * g.ow * g.o));
    conv2d_winograd_bf16(g, ConvPass::kForward, x.data(), w.data(), out.data(),
                         with_bias ? bias.data() : nullptr, relu);
    return out;
  }
  std::vector<bfloat16> grad_input() const {
    std::vector<bfloat16> out(at(g.n * g.h * g.w * g.c));
    conv2d_winograd_bf16(g, ConvPass::kGradInput, grad.data(), w.data(), out.data(), nullptr,
                         false);
    return out;
  }
};

const Case kCases[] = {
    {2, 16, 8, 8, 16, 1, 1},      // a ResNet block, small: one block of tiles
    {3, 32, 7, 9, 48, 1, 1},      // odd planes: the last tile row and column cut
    {1, 16, 5, 6, 32, 0, 2},      // padding 0 and 2 (the input gradient's 2 and 0)
    {2, 64, 12, 12, 80, 1, 1},    // output channels 64 + 16; tiles past one block
    {4, 128, 6, 6, 144, 1, 2},    // 64 + 64 + 16 output channels, 12 tiles per image
    {33, 16, 4, 4, 16, 1, 1},     // 132 tiles: blocks of 256 tiles' rows of 12 with a remainder
    {3, 256, 4, 4, 512, 1, 1},    // ResNet-18's last stage
};

TEST(Bf16Winograd, ForwardMatchesReference) {
  SKIP_WITHOUT_KERNEL();
  for (const Case& k : kCases) {
    const Operands op(k);
    ASSERT_TRUE(bf16_winograd_applies(op.g)) << name(op.g, ConvPass::kForward);
    expect_near(values(op.forward(false, false)), forward_reference(op.g, op.x, op.w, {}, false),
                kTolerance, name(op.g, ConvPass::kForward));
  }
  const Operands op(kCases[1]);
  expect_near(values(op.forward(true, true)), forward_reference(op.g, op.x, op.w, op.bias, true),
              kTolerance, name(op.g, ConvPass::kForward) + " + bias, relu");
}

TEST(Bf16Winograd, InputGradientMatchesReference) {
  SKIP_WITHOUT_KERNEL();
  for (const Case& k : kCases) {
    const Operands op(k);
    expect_near(values(op.grad_input()), grad_input_reference(op.g, op.grad, op.w), kTolerance,
                name(op.g, ConvPass::kGradInput));
  }
}

TEST(Bf16Winograd, IndependentOfThreadCount) {
  SKIP_WITHOUT_KERNEL();
  for (const Case& k : {kCases[3], kCases[5]}) {
    const Operands op(k);
    const auto in_arena = [&](int threads) {
      std::vector<double> r;
      tbb::task_arena(threads).execute([&] {
        r = values(op.forward(true, false));
        const auto gi = values(op.grad_input());
        r.insert(r.end(), gi.begin(), gi.end());
      });
      return r;
    };
    const auto one = in_arena(1);
    for (int threads : {2, 4}) EXPECT_EQ(in_arena(threads), one) << name(op.g, ConvPass::kForward);
  }
}

TEST(Bf16Winograd, AppliesToThreeByThreeStrideOneConvs) {
  SKIP_WITHOUT_KERNEL();
  EXPECT_TRUE(bf16_winograd_applies(geometry({32, 64, 32, 32, 64, 1, 1})));
  const ConvGeometry g = geometry({2, 16, 8, 8, 16, 1, 1});
  for (auto change : {+[](ConvGeometry& v) { v.c = 24; }, +[](ConvGeometry& v) { v.o = 8; },
                      +[](ConvGeometry& v) { v.kh = v.kw = 1; },
                      +[](ConvGeometry& v) { v.sh = v.sw = 2; },
                      +[](ConvGeometry& v) { v.groups = 2; }, +[](ConvGeometry& v) { v.dh = 2; },
                      +[](ConvGeometry& v) { v.ph = 3; }}) {
    ConvGeometry other = g;
    change(other);
    EXPECT_FALSE(bf16_winograd_applies(other)) << name(other, ConvPass::kForward);
  }
  EXPECT_THROW(conv2d_winograd_bf16(g, ConvPass::kGradWeight, nullptr, nullptr, nullptr, nullptr,
                                    false),
               Error);
  // Chosen over oneDNN's where it wins: from 64 channels on both sides (the input gradient on
  // planes over 4x4), where oneDNN has no AMX kernels; never for the weight gradient.
  const bool own = !onednn::amx_bfloat16();
  const ConvGeometry wide = geometry({32, 64, 32, 32, 128, 1, 1});
  EXPECT_EQ(bf16_winograd_chosen(wide, ConvPass::kForward), own);
  EXPECT_EQ(bf16_winograd_chosen(wide, ConvPass::kGradInput), own);
  EXPECT_FALSE(bf16_winograd_chosen(wide, ConvPass::kGradWeight));
  EXPECT_FALSE(bf16_winograd_chosen(geometry({128, 32, 16, 16, 64, 1, 1}), ConvPass::kForward));
  const ConvGeometry last_stage = geometry({32, 512, 4, 4, 512, 1, 1});  // ResNet-18's, 4x4
  EXPECT_EQ(bf16_winograd_chosen(last_stage, ConvPass::kForward), own);
  EXPECT_FALSE(bf16_winograd_chosen(last_stage, ConvPass::kGradInput));
}

// The channels-last conv kernel runs it where it is chosen (the same bits), both passes.
TEST(Bf16Winograd, RunsForChosenChannelsLastBFloat16Convs) {
  SKIP_WITHOUT_KERNEL();
  if (onednn::amx_bfloat16())
    GTEST_SKIP() << "oneDNN runs bfloat16 convs on AMX tiles here, so loom's Winograd is not chosen";
  const Operands op({2, 64, 8, 8, 64, 1, 1});
  const ConvGeometry& g = op.g;
  ASSERT_TRUE(bf16_winograd_chosen(g, ConvPass::kForward));
  ASSERT_TRUE(bf16_winograd_chosen(g, ConvPass::kGradInput));
  const ir::Conv2dAttr conv{.stride = {1, 1}, .padding = {g.ph, g.pw}, .channels_last = true};
  std::vector<bfloat16> x = op.x, w = op.w, grad = op.grad;
  std::vector<bfloat16> out(at(g.n * g.oh * g.ow * g.o));
  const std::vector<TensorView> forward_in{{x.data(), DType::BFloat16, {g.n, g.h, g.w, g.c}},
                                           {w.data(), DType::BFloat16, {g.o, g.c, 3, 3}}};
  run_kernel(ir::Op::Conv2d, conv, forward_in, {out.data(), DType::BFloat16, {g.n, g.oh, g.ow, g.o}});
  EXPECT_EQ(values(out), values(op.forward(false, false)));
  std::vector<bfloat16> gi(at(g.n * g.h * g.w * g.c));
  const std::vector<TensorView> grad_in{{grad.data(), DType::BFloat16, {g.n, g.oh, g.ow, g.o}},
                                        {w.data(), DType::BFloat16, {g.o, g.c, 3, 3}}};
  run_kernel(ir::Op::Conv2dGradInput, ir::Conv2dGradAttr{conv, {g.h, g.w}}, grad_in,
             {gi.data(), DType::BFloat16, {g.n, g.h, g.w, g.c}});
  EXPECT_EQ(values(gi), values(op.grad_input()));
}

}  // namespace
}  // namespace loom::runtime
