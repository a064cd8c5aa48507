// The channels-last layout pass: convs of a listed dtype take [N,H,W,C] activations, and the
// batch-norm, relu and residual chains between them follow without a transpose; parameters
// keep their layout. (Its numbers are checked by the ChannelsLast.* runs of the reference
// tests, tests/CMakeLists.txt.)
#include "compiler/channels_last.h"
#include "compiler/pipeline.h"
#include "runtime/registry.h"
#include "test_util.h"

#include <loom/autograd.h>

#include <cmath>
#include <cstring>

namespace loom {
namespace {

using ir::Op;
using ir::Program;

Tensor ramp(const Shape& s, double scale) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::cos(i * scale));
  return from_vector(v, s);
}

// Every conv of dtype t channels-last (no choice by geometry).
ir::Target channels_last_target(DType t) {
  ir::Target target = runtime::backend(Device{}).target();
  target.channels_last_convs = static_cast<uint8_t>(1u << static_cast<int>(t));
  target.channels_last_conv = nullptr;
  return target;
}

// Whether a conv instruction runs channels-last; the input channels of its weight.
bool is_channels_last(const ir::Instr& in) {
  return in.op == Op::Conv2d ? in.attr.get<ir::Conv2dAttr>().channels_last
                             : in.attr.get<ir::Conv2dGradAttr>().conv.channels_last;
}
int64_t weight_inputs(const Program& p, const ir::Instr& in) {
  return in.op == Op::Conv2dGradWeight ? in.shape[1] : p.slot_type(in.args[1]).shape[1];
}

// The batch norm of a ResNet block, in its primitive ops: statistics over (N, H, W).
Tensor batch_norm(const Tensor& y, const Tensor& gamma, const Tensor& beta) {
  const int64_t c = y.shape()[1];
  auto m = mean(y, {0, 2, 3}, true);
  auto d = y - m;
  auto v = mean(d * d, {0, 2, 3}, true);
  return d * rsqrt(v + 1e-5) * reshape(gamma, {1, c, 1, 1}) + reshape(beta, {1, c, 1, 1});
}

// A ResNet basic block's training step: conv, batch norm, relu, conv, batch norm, the
// residual add and relu, and the gradients of every parameter.
struct Block {
  Tensor w1, w2, g1, b1, g2, b2;
  Block()
      : w1(ramp({8, 8, 3, 3}, 0.31).requires_grad_()),
        w2(ramp({8, 8, 3, 3}, 0.17).requires_grad_()),
        g1(ramp({8}, 0.5).requires_grad_()),
        b1(ramp({8}, 0.7).requires_grad_()),
        g2(ramp({8}, 0.9).requires_grad_()),
        b2(ramp({8}, 1.1).requires_grad_()) {}

  ir::Graph step_graph(const Tensor& x) {
    Conv2dParams same;
    same.padding = {1, 1};
    auto h = relu(batch_norm(conv2d(x, w1, {}, same), g1, b1));
    auto y = relu(batch_norm(conv2d(h, w2, {}, same), g2, b2) + x);
    (y * y).sum().backward();
    std::vector<ir::NodePtr> roots;
    for (auto* p : {&w1, &w2, &g1, &b1, &g2, &b2}) roots.push_back(p->grad().impl()->pending());
    return ir::build_graph(roots);
  }
};

TEST(ChannelsLast, ABlocksChainsFollowTheConvsWithoutTransposes) {
  test::fresh_engine();
  Block block;
  const ir::Graph g = block.step_graph(ramp({4, 8, 6, 6}, 0.05));
  const Program plain = compiler::compile(g, [] {
    ir::Target t = runtime::backend(Device{}).target();
    t.channels_last_convs = 0;
    return t;
  }());
  const Program p = compiler::compile(g, channels_last_target(DType::Float32));

  int convs = 0;
  for (const auto& in : p.instrs) {
    if (in.op == Op::Conv2d) {
      EXPECT_TRUE(in.attr.get<ir::Conv2dAttr>().channels_last) << ir::to_text(p);
      ++convs;
    } else if (in.op == Op::Conv2dGradInput || in.op == Op::Conv2dGradWeight) {
      EXPECT_TRUE(in.attr.get<ir::Conv2dGradAttr>().conv.channels_last) << ir::to_text(p);
      ++convs;
    }
    if (in.op == Op::Conv2dGradWeight) {
      EXPECT_EQ(in.shape, (Shape{8, 8, 3, 3}));
    }
  }
  EXPECT_EQ(convs, 2 + 1 + 2) << "two forwards, one input gradient, two weight gradients";
  // The one transpose: the block's input, read by the first conv and by the residual add.
  EXPECT_EQ(test::count_instrs(p, Op::Permute), 1) << ir::to_text(p);
  EXPECT_EQ(test::count_instrs(plain, Op::Permute), 0) << ir::to_text(plain);
  // The statistics reduce over (N, H, W) of [N,H,W,C]: axes 0, 1, 2.
  int channel_sums = 0;
  for (const auto& in : p.instrs)
    if ((in.op == Op::Mean || in.op == Op::Sum) && in.shape == Shape{1, 1, 1, 8}) {
      EXPECT_EQ(in.attr.get<ir::AxesAttr>().axes, (std::vector<int64_t>{0, 1, 2}));
      ++channel_sums;
    }
  EXPECT_GE(channel_sums, 4) << ir::to_text(p);
  // The outputs are the parameters' gradients, in their own layout.
  ASSERT_EQ(p.outputs.size(), plain.outputs.size());
  for (std::size_t i = 0; i < p.outputs.size(); ++i)
    EXPECT_EQ(p.slot_type(p.outputs[i]).shape, plain.slot_type(plain.outputs[i]).shape);
}

TEST(ChannelsLast, OnlyTheListedDtypeChanges) {
  test::fresh_engine();
  Block block;
  const ir::Graph g = block.step_graph(ramp({2, 8, 5, 5}, 0.05));
  const Program p = compiler::compile(g, channels_last_target(DType::BFloat16));
  for (const auto& in : p.instrs) {
    if (in.op == Op::Conv2d) {
      EXPECT_FALSE(in.attr.get<ir::Conv2dAttr>().channels_last);
    }
    EXPECT_NE(in.op, Op::Permute);
  }
}

// A batch of one: [1,C,H,W] and its transpose [1,H,W,C] can have the same shape, which is
// not the same layout.
TEST(ChannelsLast, AnInputWhoseTransposeHasItsShapeIsStillTransposed) {
  test::fresh_engine();
  auto x = ramp({1, 4, 4, 4}, 0.3);
  auto w = ramp({4, 4, 3, 3}, 0.2);
  Conv2dParams same;
  same.padding = {1, 1};
  auto y = conv2d(x, w, {}, same);
  const Program p =
      compiler::compile(test::graph_of(y), channels_last_target(DType::Float32));
  EXPECT_EQ(test::count_instrs(p, Op::Permute), 2) << ir::to_text(p);  // the input in, the result out
}

// Target::channels_last_conv picks convs by geometry: here only the one reading 8 channels.
// Its three passes follow it, the other conv's three stay [N,C,H,W], and transposes join the
// two.
TEST(ChannelsLast, TheTargetChoosesByConvAndAConvsPassesAgree) {
  test::fresh_engine();
  auto x = ramp({2, 8, 6, 6}, 0.05);
  auto w1 = ramp({16, 8, 3, 3}, 0.31).requires_grad_();
  auto w2 = ramp({16, 16, 3, 3}, 0.17).requires_grad_();
  Conv2dParams same;
  same.padding = {1, 1};
  auto y = conv2d(relu(conv2d(x, w1, {}, same)), w2, {}, same);
  (y * y).sum().backward();
  const ir::Graph g = ir::build_graph({w1.grad().impl()->pending(), w2.grad().impl()->pending()});
  ir::Target target = channels_last_target(DType::Float32);
  target.channels_last_conv = [](DType, const ir::Conv2dAttr&, const Shape&, const Shape& weight,
                                 const Shape&) { return weight[1] == 8; };
  const Program p = compiler::compile(g, target);
  int last = 0, first = 0;
  for (const auto& in : p.instrs) {
    if (in.op != Op::Conv2d && in.op != Op::Conv2dGradInput && in.op != Op::Conv2dGradWeight)
      continue;
    EXPECT_EQ(is_channels_last(in), weight_inputs(p, in) == 8) << ir::to_text(p);
    ++(is_channels_last(in) ? last : first);
  }
  EXPECT_EQ(last, 2) << "the first conv's forward and weight gradient\n" << ir::to_text(p);
  EXPECT_EQ(first, 3) << "the second conv's three passes\n" << ir::to_text(p);
  EXPECT_GE(test::count_instrs(p, Op::Permute), 2) << ir::to_text(p);
}

// A window of a channels-last conv's output (some channels, every other row): sliced as it is
// stored, [N,H,W,C], rather than transposed whole back to [N,C,H,W] first; the only transposes
// are of the conv's input and of the small result. Its values are the plain program's.
TEST(ChannelsLast, AWindowOfAConvOutputIsCutInItsLayout) {
  test::fresh_engine();
  Conv2dParams same;
  same.padding = {1, 1};
  auto x = ramp({2, 3, 6, 6}, 0.05);
  auto w = ramp({8, 3, 3, 3}, 0.31);
  auto y = conv2d(x, w, {}, same);
  auto window = slice(slice(y, 1, 2, 8, 2), 2, 1, 6, 2);  // channels 2, 4, 6; rows 1, 3, 5
  ASSERT_EQ(window.shape(), (Shape{2, 3, 3, 6}));
  const ir::Graph g = test::graph_of(window);
  ir::Target plain = runtime::backend(Device{}).target();
  plain.channels_last_convs = 0;
  const ir::Target last = channels_last_target(DType::Float32);
  const Program p = compiler::compile(g, last);
  int permutes = 0;
  for (const auto& in : p.instrs) {
    if (in.op == Op::Conv2d) {
      EXPECT_TRUE(is_channels_last(in)) << ir::to_text(p);
    }
    if (in.op != Op::Permute) continue;
    ++permutes;
    EXPECT_TRUE(in.shape == (Shape{2, 6, 6, 3}) || in.shape == (Shape{2, 3, 3, 6}))
        << "a transpose of the whole conv output\n" << ir::to_text(p);
  }
  EXPECT_EQ(permutes, 2) << ir::to_text(p);
  const auto got = test::run_on_cpu(g, last);
  const auto want = test::run_on_cpu(g, plain);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].size(), want[0].size());
  std::vector<float> a(got[0].size() / sizeof(float)), b(a.size());
  std::memcpy(a.data(), got[0].data(), got[0].size());
  std::memcpy(b.data(), want[0].data(), want[0].size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
}

// A stem that runs channels-last feeding a 64-channel conv on 16x16 planes kept [N,C,H,W] (the
// CPU's own choice in a batch of 16 where loom's Winograd runs, with AVX-512: cpu_backend.cpp;
// the target here makes the same choice on any CPU): the mixed program's loss and gradients in
// float32, run on the CPU backend, agree with float64's, where no conv changes layout.
TEST(ChannelsLast, MixedLayoutsMatchFloat64) {
  const char* setting = std::getenv("LOOM_CONV_LAYOUT");
  if (setting && std::string(setting) != "auto") GTEST_SKIP() << "LOOM_CONV_LAYOUT sets every conv";
  test::fresh_engine();
  Conv2dParams same;
  same.padding = {1, 1};
  struct Result {
    std::vector<double> loss, g1, g2;
  };
  ir::Target mixed = channels_last_target(DType::Float32);
  mixed.channels_last_conv = [](DType, const ir::Conv2dAttr&, const Shape&, const Shape& weight,
                                const Shape&) { return weight[1] == 3; };  // the stem only
  auto run = [&](DType dtype, Program* program) {
    auto x = ramp({16, 3, 16, 16}, 0.05).to(dtype);
    auto w1 = (ramp({64, 3, 3, 3}, 0.31) * 0.3).to(dtype).requires_grad_();
    auto w2 = (ramp({64, 64, 3, 3}, 0.17) * 0.05).to(dtype).requires_grad_();
    auto h = conv2d(x, w1, {}, same);
    auto m = mean(h, {0, 2, 3}, true);
    auto d = h - m;
    auto n = d * rsqrt(mean(d * d, {0, 2, 3}, true) + 1e-5);
    auto y = conv2d(relu(n), w2, {}, same);
    auto loss = (y * y).mean();
    loss.backward();
    if (!program)
      return Result{loss.to(DType::Float64).to_vector<double>(),
                    w1.grad().to(DType::Float64).to_vector<double>(),
                    w2.grad().to(DType::Float64).to_vector<double>()};
    const ir::Graph g = ir::build_graph(
        {loss.impl()->pending(), w1.grad().impl()->pending(), w2.grad().impl()->pending()});
    *program = compiler::compile(g, mixed);
    const auto out = test::run_on_cpu(g, mixed);
    auto values = [&](std::size_t i) {
      std::vector<float> f(out[i].size() / sizeof(float));
      std::memcpy(f.data(), out[i].data(), out[i].size());
      return std::vector<double>(f.begin(), f.end());
    };
    return Result{values(0), values(1), values(2)};
  };
  Program p;
  const Result got = run(DType::Float32, &p);
  const Result want = run(DType::Float64, nullptr);
  int last = 0, first = 0;
  for (const auto& in : p.instrs)
    if (in.op == Op::Conv2d) ++(is_channels_last(in) ? last : first);
  ASSERT_EQ(last, 1) << "the stem\n" << ir::to_text(p);
  ASSERT_EQ(first, 1) << "the 64-channel conv\n" << ir::to_text(p);
  auto expect_close = [](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    double scale = 0;
    for (double v : b) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-4 * scale) << what << " " << i;
  };
  expect_close(got.loss, want.loss, "loss");
  expect_close(got.g1, want.g1, "grad w1");
  expect_close(got.g2, want.g2, "grad w2");
}

}  // namespace
}  // namespace loom
