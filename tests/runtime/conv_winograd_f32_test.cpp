// Winograd F(4x4,3x3) and F(2x2,3x3) on float32 channels-last convs with AVX2 (runtime/cpu/
// conv/conv_winograd_f32.h): the forward (with a bias and relu), the input gradient and the
// weight gradient (F(3x3,4x4) and F(3x3,2x2); its sums in one group of tiles and in several)
// against float64 sums by the definition on the same operands, at shapes that exercise its
// paths (odd planes, whose last tile is cut; padding 0 to 2; several blocks of tiles; output
// channels in chunks of 64 with a narrower last one, down to one vector of 8; each
// register-tile height; convs with fewer tiles than output channels, which go by chunks of
// output channels); the same bits on 1, 2 and 4 threads; the choice; and the channels-last conv
// kernel running it where it is chosen.
//
// Tolerance: with 2x2 tiles the transformed input (sums of up to 4 inputs) and kernel (of up
// to 9 taps, weighted 1/4 to 1) are rounded to float32 before they are multiplied, and an
// output adds 16 products per input channel with the signs of A^T, so its error is a few
// float32 roundings of the operands' scale (2^-24 of a few inputs' magnitude per term), not one
// per product: 1e-5 x (|want| + rms(want)) bounds that with room. With 4x4 tiles the
// transformed input sums up to 36 inputs weighted up to 25 and an output adds 36 products
// weighted up to 64, so the same roundings weigh more: the worst case here reaches 4.6e-5 of
// the scale (an input gradient over 136 channels), bounded by 1e-4 (LOOM_TEST_SHOW_ERRORS=1
// prints each case's worst share of its bound). A wrong tap, sign or tile edge is off by the
// size of a term, 1e-2 or more.
#include "runtime/cpu/conv/conv_winograd_f32.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kernels_impl.h"
#include "runtime/cpu/onednn.h"
#include "runtime/conv3x3_reference.h"
#include "runtime/expect_near.h"

#include <loom/error.h>
#include <loom/lazy.h>

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

constexpr int kTiles[] = {4, 2};
double tolerance(int tile) {
  return tile == 4 ? kF32WinogradTolerance4x4 : kF32WinogradTolerance2x2;
}

using Case = Conv3x3Case;

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

#define SKIP_WITHOUT_KERNEL()                                                                   \
  if (!f32_winograd_applies(geometry({1, 8, 4, 4, 8, 1, 1})))                                  \
  GTEST_SKIP() << "built without AVX2 and FMA: oneDNN runs every float32 channels-last conv"

// The operands of conv `g`, channels-last: x [N,H,W,C], w [O,C,3,3] and grad (of the output)
// [N,Ho,Wo,O] uniform in [-1, 1) (seeds 1, 2, 3), and a bias per output channel; the passes in
// tiles of `tile`.
struct Operands {
  ConvGeometry g;
  int tile;
  std::vector<float> x, w, grad, bias;
  explicit Operands(const Case& k, int tile = 4)
      : g(geometry(k)),
        tile(tile),
        x(random_floats(g.n * g.h * g.w * g.c, 1)),
        w(random_floats(g.o * g.c * 9, 2)),
        grad(random_floats(g.n * g.oh * g.ow * g.o, 3)) {
    for (int64_t o = 0; o < g.o; ++o) bias.push_back(static_cast<float>(o % 7) * 0.25f - 0.75f);
  }
  std::vector<float> forward(bool with_bias, bool relu) const {
    std::vector<float> out(at(g.n * g.oh * g.ow * g.o));
    conv2d_winograd_f32(g, ConvPass::kForward, tile, x.data(), w.data(), out.data(),
                        with_bias ? bias.data() : nullptr, relu);
    return out;
  }
  std::vector<float> grad_weight() const {
    std::vector<float> out(at(g.o * g.c * 9));
    conv2d_grad_weight_winograd_f32(g, tile, x.data(), grad.data(), out.data());
    return out;
  }
  std::vector<float> grad_input() const {
    std::vector<float> out(at(g.n * g.h * g.w * g.c));
    conv2d_winograd_f32(g, ConvPass::kGradInput, tile, grad.data(), w.data(), out.data(),
                        nullptr, false);
    return out;
  }
};

const Case kCases[] = {
    {2, 16, 8, 8, 16, 1, 1},     // a ResNet block, small: one block of tiles
    {3, 24, 7, 9, 40, 1, 1},     // odd planes (the last tile row and column cut); 16+16+8 outputs
    {1, 8, 5, 6, 8, 0, 2},       // padding 0 and 2 (the input gradient's 2 and 0); one vector
    {2, 64, 12, 12, 80, 1, 1},   // output channels 64 + 16; tiles past one block
    {4, 128, 6, 6, 136, 1, 2},   // 64 + 64 + 8 output channels, 12 tiles per image
    {33, 16, 4, 4, 16, 1, 1},    // 132 tiles: many blocks, a last one of 6 tiles
    {3, 256, 4, 4, 72, 1, 1},    // wide input, blocks of 12 tiles
    {5, 32, 3, 3, 32, 0, 0},     // a 1x1 output: one cut tile per image, 1 to 5 register rows
    {13, 16, 8, 8, 264, 1, 1},   // fewer tiles (208) than outputs: by chunks, 2 blocks of tiles
    {2, 8, 66, 65, 8, 1, 1},     // 2178 tiles: the weight gradient's sums in 3 groups
    {3, 264, 4, 4, 16, 1, 1},    // the weight gradient's input channels in 3 blocks
};

std::string name(const Operands& op, ConvPass pass) {
  return name(op.g, pass) + (op.tile == 4 ? " F(4x4)" : " F(2x2)");
}

TEST(F32Winograd, ForwardMatchesReference) {
  SKIP_WITHOUT_KERNEL();
  for (int tile : kTiles) {
    for (const Case& k : kCases) {
      const Operands op(k, tile);
      ASSERT_TRUE(f32_winograd_applies(op.g)) << name(op, ConvPass::kForward);
      expect_near(values(op.forward(false, false)),
                  forward_reference(op.g, op.x, op.w, {}, false), tolerance(tile),
                  name(op, ConvPass::kForward));
    }
    const Operands op(kCases[1], tile);
    expect_near(values(op.forward(true, true)),
                forward_reference(op.g, op.x, op.w, op.bias, true), tolerance(tile),
                name(op, ConvPass::kForward) + " + bias, relu");
  }
}

TEST(F32Winograd, InputGradientMatchesReference) {
  SKIP_WITHOUT_KERNEL();
  for (int tile : kTiles)
    for (const Case& k : kCases) {
      const Operands op(k, tile);
      expect_near(values(op.grad_input()), grad_input_reference(op.g, op.grad, op.w),
                  tolerance(tile), name(op, ConvPass::kGradInput));
    }
}

TEST(F32Winograd, WeightGradientMatchesReference) {
  SKIP_WITHOUT_KERNEL();
  for (int tile : kTiles)
    for (const Case& k : kCases) {
      const Operands op(k, tile);
      expect_near(values(op.grad_weight()), grad_weight_reference(op.g, op.x, op.grad),
                  tolerance(tile), name(op, ConvPass::kGradWeight));
    }
  // Groups of 4096 output positions: 1024 tiles of 2x2, 256 of 4x4.
  EXPECT_EQ(f32_winograd_weight_grad_groups(geometry(kCases[9]), 2), 3);
  EXPECT_EQ(f32_winograd_weight_grad_groups(geometry(kCases[9]), 4), 3);
  EXPECT_EQ(f32_winograd_weight_grad_groups(geometry({32, 64, 32, 32, 64, 1, 1}), 2), 8);
  EXPECT_EQ(f32_winograd_weight_grad_groups(geometry({32, 64, 32, 32, 64, 1, 1}), 4), 8);
  EXPECT_EQ(f32_winograd_weight_grad_groups(geometry({128, 64, 8, 8, 64, 1, 1}), 4), 2);
  EXPECT_THROW(f32_winograd_weight_grad_groups(geometry(kCases[0]), 3), Error);
}

TEST(F32Winograd, IndependentOfThreadCount) {
  SKIP_WITHOUT_KERNEL();
  for (int tile : kTiles)
    for (const Case& k : {kCases[3], kCases[5], kCases[9]}) {
      const Operands op(k, tile);
      const auto in_arena = [&](int threads) {
        std::vector<double> r;
        tbb::task_arena(threads).execute([&] {
          r = values(op.forward(true, false));
          const auto gi = values(op.grad_input());
          const auto gw = values(op.grad_weight());
          r.insert(r.end(), gi.begin(), gi.end());
          r.insert(r.end(), gw.begin(), gw.end());
        });
        return r;
      };
      const auto one = in_arena(1);
      for (int threads : {2, 4}) EXPECT_EQ(in_arena(threads), one) << name(op, ConvPass::kForward);
    }
}

TEST(F32Winograd, AppliesToThreeByThreeStrideOneConvs) {
  SKIP_WITHOUT_KERNEL();
  if (std::getenv("LOOM_CONV")) GTEST_SKIP() << "LOOM_CONV forces the choice";
  EXPECT_TRUE(f32_winograd_applies(geometry({32, 64, 32, 32, 64, 1, 1})));
  const ConvGeometry g = geometry({2, 16, 8, 8, 16, 1, 1});
  for (auto change : {+[](ConvGeometry& v) { v.c = 12; }, +[](ConvGeometry& v) { v.o = 4; },
                      +[](ConvGeometry& v) { v.kh = v.kw = 1; },
                      +[](ConvGeometry& v) { v.sh = v.sw = 2; },
                      +[](ConvGeometry& v) { v.groups = 2; }, +[](ConvGeometry& v) { v.dh = 2; },
                      +[](ConvGeometry& v) { v.ph = 3; }}) {
    ConvGeometry other = g;
    change(other);
    EXPECT_FALSE(f32_winograd_applies(other)) << name(other, ConvPass::kForward);
    EXPECT_THROW(conv2d_winograd_f32(other, ConvPass::kForward, 4, nullptr, nullptr, nullptr,
                                     nullptr, false),
                 Error);
  }
  EXPECT_THROW(conv2d_winograd_f32(g, ConvPass::kGradWeight, 4, nullptr, nullptr, nullptr,
                                   nullptr, false),
               Error);
  EXPECT_THROW(conv2d_winograd_f32(g, ConvPass::kForward, 3, nullptr, nullptr, nullptr, nullptr,
                                   false),
               Error);
  // Chosen over oneDNN's and im2col + matmul below AVX-512, on planes from 4x4 (the pass's
  // output; the weight gradient's: the conv's output), every pass.
  const bool own = !onednn::avx512_core();
  const ConvGeometry wide = geometry({32, 64, 32, 32, 128, 1, 1});
  EXPECT_EQ(f32_winograd_chosen(wide, ConvPass::kForward), own);
  EXPECT_EQ(f32_winograd_chosen(wide, ConvPass::kGradInput), own);
  EXPECT_EQ(f32_winograd_chosen(wide, ConvPass::kGradWeight), own);
  EXPECT_EQ(f32_winograd_chosen(geometry({32, 512, 4, 4, 512, 1, 1}), ConvPass::kGradWeight), own);
  EXPECT_FALSE(f32_winograd_chosen(geometry({32, 512, 3, 3, 512, 1, 1}), ConvPass::kGradWeight));
  EXPECT_EQ(f32_winograd_chosen(geometry({32, 256, 8, 8, 256, 1, 1}), ConvPass::kGradInput), own);
  EXPECT_EQ(f32_winograd_chosen(geometry({32, 512, 4, 4, 512, 1, 1}), ConvPass::kForward), own);
  EXPECT_EQ(f32_winograd_chosen(geometry({32, 512, 4, 4, 512, 1, 1}), ConvPass::kGradInput), own);
  EXPECT_FALSE(f32_winograd_chosen(geometry({32, 512, 3, 3, 512, 1, 1}), ConvPass::kForward));
  // 4x4 tiles on planes over 4x4 (the pass's output), 2x2 on 4x4 planes (unless
  // LOOM_F32_WINOGRAD names a tile).
  if (!std::getenv("LOOM_F32_WINOGRAD")) {
    EXPECT_EQ(f32_winograd_tile(wide, ConvPass::kForward), 4);
    const ConvGeometry small = geometry({32, 512, 4, 4, 512, 1, 1});
    for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput, ConvPass::kGradWeight})
      EXPECT_EQ(f32_winograd_tile(small, pass), 2) << name(small, pass);
    const ConvGeometry shrinking = geometry({8, 16, 6, 6, 16, 0, 0});  // 6x6 -> 4x4
    EXPECT_EQ(f32_winograd_tile(shrinking, ConvPass::kGradInput), 4);
    EXPECT_EQ(f32_winograd_tile(shrinking, ConvPass::kForward), 2);
  }
}

// The channels-last conv kernel runs it where it is chosen (the same bits), both passes, with
// the bias and relu of a fused epilogue.
TEST(F32Winograd, RunsForChosenChannelsLastFloat32Convs) {
  SKIP_WITHOUT_KERNEL();
  if (std::getenv("LOOM_CONV")) GTEST_SKIP() << "LOOM_CONV forces the choice";
  const Operands op({2, 32, 8, 8, 48, 1, 1},
                   f32_winograd_tile(geometry({2, 32, 8, 8, 48, 1, 1}), ConvPass::kForward));
  const ConvGeometry& g = op.g;
  if (!f32_winograd_chosen(g, ConvPass::kForward))
    GTEST_SKIP() << "this CPU has AVX-512: oneDNN's and loom's other kernels run float32 convs";
  ASSERT_TRUE(f32_winograd_chosen(g, ConvPass::kGradInput));
  const ir::Conv2dAttr conv{.stride = {1, 1}, .padding = {g.ph, g.pw}, .channels_last = true};
  std::vector<float> x = op.x, w = op.w, grad = op.grad, bias = op.bias;
  std::vector<float> out(at(g.n * g.oh * g.ow * g.o));
  const std::vector<TensorView> forward_in{{x.data(), DType::Float32, {g.n, g.h, g.w, g.c}},
                                           {w.data(), DType::Float32, {g.o, g.c, 3, 3}}};
  const TensorView forward_out{out.data(), DType::Float32, {g.n, g.oh, g.ow, g.o}};
  run_kernel(ir::Op::Conv2d, conv, forward_in, forward_out);
  EXPECT_EQ(values(out), values(op.forward(false, false)));
  conv2d_channels_last(ConvPass::kForward, conv, forward_in[0], forward_in[1], forward_out,
                       bias.data(), true);
  EXPECT_EQ(values(out), values(op.forward(true, true)));
  std::vector<float> gi(at(g.n * g.h * g.w * g.c));
  const std::vector<TensorView> grad_in{{grad.data(), DType::Float32, {g.n, g.oh, g.ow, g.o}},
                                        {w.data(), DType::Float32, {g.o, g.c, 3, 3}}};
  run_kernel(ir::Op::Conv2dGradInput, ir::Conv2dGradAttr{conv, {g.h, g.w}}, grad_in,
             {gi.data(), DType::Float32, {g.n, g.h, g.w, g.c}});
  EXPECT_EQ(values(gi), values(op.grad_input()));
  // The weight gradient, also under deterministic algorithms (its sums by the shape only).
  ASSERT_TRUE(f32_winograd_chosen(g, ConvPass::kGradWeight));
  const std::vector<TensorView> weight_in{{x.data(), DType::Float32, {g.n, g.h, g.w, g.c}},
                                          {grad.data(), DType::Float32, {g.n, g.oh, g.ow, g.o}}};
  for (bool deterministic : {false, true}) {
    use_deterministic_algorithms(deterministic);
    std::vector<float> gw(at(g.o * g.c * 9));
    run_kernel(ir::Op::Conv2dGradWeight, ir::Conv2dGradAttr{conv, {3, 3}}, weight_in,
               {gw.data(), DType::Float32, {g.o, g.c, 3, 3}});
    use_deterministic_algorithms(false);
    EXPECT_EQ(values(gw), values(op.grad_weight())) << "deterministic " << deterministic;
  }
}

}  // namespace
}  // namespace loom::runtime
