#include "ir/graph.h"

#include <gtest/gtest.h>

namespace loom::ir {
namespace {

NodePtr leaf(Shape s) { return make_device_data(DType::Float32, std::move(s), nullptr); }

TEST(Graph, TopologicalOrderAndInputs) {
  auto x = leaf({4});
  auto y = leaf({4});
  auto s = make_node(Op::Add, {x, y});
  auto g = build_graph({make_node(Op::Mul, {s, s})});
  ASSERT_EQ(g.nodes.size(), 4u);
  EXPECT_EQ(g.nodes[0].get(), x.get());
  EXPECT_EQ(g.nodes[1].get(), y.get());
  EXPECT_EQ(g.nodes[2].get(), s.get());
  EXPECT_EQ(g.inputs, (std::vector<int>{0, 1}));
  EXPECT_EQ(g.outputs, (std::vector<int>{3}));
}

TEST(Graph, SameComputationOverNewBuffersHashesTheSame) {
  auto g1 = build_graph({make_node(Op::Add, {leaf({4}), leaf({4})})});
  auto g2 = build_graph({make_node(Op::Add, {leaf({4}), leaf({4})})});
  EXPECT_EQ(g1.hash, g2.hash);
}

TEST(Graph, ShapesAreInTheHash) {
  auto g1 = build_graph({make_node(Op::Add, {leaf({4}), leaf({4})})});
  auto g2 = build_graph({make_node(Op::Add, {leaf({5}), leaf({5})})});
  EXPECT_NE(g1.hash, g2.hash);
}

TEST(Graph, InputSlotMappingIsInTheHash) {
  // x+y and x+x: same ops and shapes, but one reads two inputs and the other one.
  auto x = leaf({4});
  auto y = leaf({4});
  auto g1 = build_graph({make_node(Op::Add, {x, y})});
  auto g2 = build_graph({make_node(Op::Add, {x, x})});
  EXPECT_EQ(g1.nodes.back()->hash(), g2.nodes.back()->hash());  // structurally alike
  EXPECT_NE(g1.hash, g2.hash);
  // (x*y)+x and (x*y)+y differ only in which input the add reads.
  auto m = make_node(Op::Mul, {x, y});
  EXPECT_NE(build_graph({make_node(Op::Add, {m, x})}).hash,
            build_graph({make_node(Op::Add, {m, y})}).hash);
}

TEST(Graph, OutputsAreInTheHash) {
  auto x = leaf({4});
  auto e = make_node(Op::Exp, {x});
  auto n = make_node(Op::Neg, {e});
  EXPECT_NE(build_graph({n}).hash, build_graph({e, n}).hash);
}

TEST(Graph, TextAndDotNameEveryOp) {
  auto g = build_graph({make_node(Op::Exp, {make_node(Op::Neg, {leaf({2, 2})})})});
  auto text = to_text(g);
  EXPECT_NE(text.find("neg float32[2,2]"), std::string::npos) << text;
  EXPECT_NE(text.find("exp float32[2,2](%1)"), std::string::npos) << text;
  auto dot = to_dot(g);
  EXPECT_NE(dot.find("n1 -> n2"), std::string::npos) << dot;
}

TEST(Graph, DeepChainsDoNotOverflowTheStack) {
  auto n = leaf({1});
  for (int i = 0; i < 200000; ++i) n = make_node(Op::Neg, {n});
  EXPECT_EQ(build_graph({n}).nodes.size(), 200001u);
}

}  // namespace
}  // namespace loom::ir
