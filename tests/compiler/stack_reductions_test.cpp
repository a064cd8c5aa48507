// Sibling sums in one pass (compiler/stack_reductions.h): which reductions are stacked, and
// that a stacked sum gives each reduction the bits it has alone.
#include "compiler/pipeline.h"
#include "test_util.h"

#include <loom/nn/init.h>
#include <loom/nn/layers.h>

#include <array>
#include <cmath>

namespace loom {
namespace {

using ir::Op;

// [n, h, w, c] values that differ everywhere.
Tensor rows(int64_t n, int64_t h, int64_t w, int64_t c, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n * h * w * c));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = std::sin(static_cast<float>(i) * scale) * 2.0f + static_cast<float>(i % 5) * 0.1f;
  return from_vector(v, {n, h, w, c});
}

ir::Program compiled(const std::vector<Tensor>& ts) {
  std::vector<ir::NodePtr> nodes;
  for (const auto& t : ts) nodes.push_back(t.impl()->pending());
  return test::compile_for_cpu(ir::build_graph(nodes));
}

// The reductions of a program: how many instructions, and how many prologues they stack.
struct Reductions {
  int instrs = 0, stacked = 0;
};
Reductions reductions(const ir::Program& p) {
  Reductions r;
  for (const auto& in : p.instrs)
    if (in.op == Op::Sum || in.op == Op::Mean) {
      ++r.instrs;
      r.stacked += static_cast<int>(in.stacked.size());
    }
  return r;
}

const std::vector<int64_t> kRowsAxes{0, 1, 2};  // a per-channel statistic, channels last

TEST(StackReductions, SiblingSumsOverOneOperandRunInOnePassWithTheirOwnBits) {
  test::fresh_engine();
  auto x = rows(32, 16, 16, 16, 0.011f);
  auto g = rows(32, 16, 16, 16, 0.017f);
  auto scale = from_vector(std::vector<float>(16, 0.5f), {16});
  auto make = [&] {
    return std::vector<Tensor>{(g * x).sum(kRowsAxes), (g * scale).sum(kRowsAxes),
                               g.sum(kRowsAxes)};
  };
  auto sums = make();
  auto p = compiled(sums);
  const auto r = reductions(p);
  EXPECT_EQ(r.instrs, 1) << ir::to_text(p);
  EXPECT_EQ(r.stacked, 2) << "g.sum has no prologue: it joins through a copy\n" << ir::to_text(p);
  mark_step();  // all three in one program

  // Each alone: a program with one reduction, nothing stacked.
  for (std::size_t k = 0; k < sums.size(); ++k) {
    auto alone = make()[k];
    EXPECT_EQ(reductions(compiled({alone})).stacked, 0);
    EXPECT_EQ(sums[k].to_vector<float>(), alone.to_vector<float>()) << "sum " << k;
  }
}

TEST(StackReductions, ASumThatReadsAnotherStaysApart) {
  test::fresh_engine();
  auto g = rows(32, 16, 16, 16, 0.013f);
  auto first = g.sum(kRowsAxes);
  auto second = (g * first).sum(kRowsAxes);  // needs `first` before it starts
  const auto r = reductions(compiled({first, second}));
  EXPECT_EQ(r.instrs, 2);
  EXPECT_EQ(r.stacked, 0);
}

TEST(StackReductions, OnlyLayoutsTheKernelReadsTogetherAndOneKindOfReduction) {
  test::fresh_engine();
  auto g = rows(32, 16, 16, 16, 0.013f);
  auto stacked = [](const Tensor& a, const Tensor& b) {
    return reductions(compiled({a, b})).stacked;
  };
  // Row sums (the reduced dimension innermost) and a width the kernel does not take.
  EXPECT_EQ(stacked((g * 2.0).sum({3}), (g * 3.0).sum({3})), 0);
  auto odd = rows(64, 16, 16, 12, 0.019f);
  EXPECT_EQ(stacked((odd * 2.0).sum(kRowsAxes), (odd * 3.0).sum(kRowsAxes)), 0);
  // A sum and a mean stay apart; two means stack.
  EXPECT_EQ(stacked((g * 2.0).sum(kRowsAxes), (g * 3.0).mean(kRowsAxes)), 0);
  EXPECT_EQ(stacked((g * 2.0).mean(kRowsAxes), (g * 3.0).mean(kRowsAxes)), 1);
  // Sums that share no whole-size operand stay apart.
  auto h = rows(32, 16, 16, 16, 0.023f);
  EXPECT_EQ(stacked((g * 2.0).sum(kRowsAxes), (h * 3.0).sum(kRowsAxes)), 0);
}

TEST(StackReductions, AtMostFourPerPass) {
  test::fresh_engine();
  auto g = rows(32, 16, 16, 16, 0.013f);
  std::vector<Tensor> sums;
  for (int k = 1; k <= 6; ++k) sums.push_back((g * static_cast<double>(k)).sum(kRowsAxes));
  const auto r = reductions(compiled(sums));
  EXPECT_EQ(r.instrs, 2);
  EXPECT_EQ(r.stacked, 4);  // 4 + 2
}

// A BatchNorm between convolutions, channels last: its backward's sum(g * centered), sum(g)
// through the mean and the bias gradient read the gradient in one pass (the variance reads
// the mean detached, so none waits on another), and the gradients are those computed one op
// at a time.
TEST(StackReductions, ABatchNormBackwardBetweenConvsSumsInOnePass) {
  int checked = 0;
  for (auto [batch, channels, side] :
       {std::array<int64_t, 3>{8, 16, 32}, {4, 32, 16}, {8, 64, 8}}) {
    test::fresh_engine();
    auto x = rows(batch, channels, side, side, 0.021f);
    auto grads = [&] {  // of the same layers each time
      nn::manual_seed(3);
      nn::Conv2d conv(nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false));
      nn::BatchNorm2d bn(channels);
      (relu(bn.forward(conv.forward(x))) * x).sum().backward();
      return std::vector<Tensor>{conv.weight.grad(), bn.weight.grad(), bn.bias.grad()};
    };
    auto lazy = grads();
    auto p = compiled(lazy);
    bool channels_last = false;
    for (const auto& in : p.instrs)
      if (in.op == Op::Conv2d) channels_last = in.attr.get<ir::Conv2dAttr>().channels_last;
    if (!channels_last) continue;  // this CPU runs the conv in NCHW: no column sums to stack
    ++checked;
    int three = 0;
    for (const auto& in : p.instrs) three += in.stacked.size() == 2;
    EXPECT_EQ(three, 1) << ir::to_text(p);
    mark_step();
    std::vector<Tensor> eager;
    {
      EagerModeGuard one_op_at_a_time{true};
      eager = grads();
    }
    for (std::size_t k = 0; k < lazy.size(); ++k) {
      auto a = lazy[k].to_vector<float>(), b = eager[k].to_vector<float>();
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        diff += (a[i] - b[i]) * double(a[i] - b[i]);
        norm += double(b[i]) * b[i];
      }
      EXPECT_LE(std::sqrt(diff), 1e-4 * std::sqrt(norm)) << "gradient " << k << ", " << channels;
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU runs these convs in NCHW: no column sums to stack";
}

}  // namespace
}  // namespace loom
