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

namespace loom {
namespace {

using ir::Op;
using ir::Program;

Tensor ramp(const Shape& s, double scale) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::cos(i * scale));
  return from_vector(v, s);
}

int count(const Program& p, Op op) {
  int n = 0;
  for (const auto& in : p.instrs) n += in.op == op;
  return n;
}

ir::Target channels_last_target(DType t) {
  ir::Target target = runtime::backend(Device{}).target();
  target.channels_last_convs = static_cast<uint8_t>(1u << static_cast<int>(t));
  return target;
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
    if (in.op == Op::Conv2dGradWeight) EXPECT_EQ(in.shape, (Shape{8, 8, 3, 3}));
  }
  EXPECT_EQ(convs, 2 + 1 + 2) << "two forwards, one input gradient, two weight gradients";
  // The one transpose: the block's input, read by the first conv and by the residual add.
  EXPECT_EQ(count(p, Op::Permute), 1) << ir::to_text(p);
  EXPECT_EQ(count(plain, Op::Permute), 0) << ir::to_text(plain);
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
    if (in.op == Op::Conv2d) EXPECT_FALSE(in.attr.get<ir::Conv2dAttr>().channels_last);
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
  EXPECT_EQ(count(p, Op::Permute), 2) << ir::to_text(p);  // the input in, the result out
}

}  // namespace
}  // namespace loom
