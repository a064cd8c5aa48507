#include "ir/node.h"

#include <loom/error.h>

#include <gtest/gtest.h>

namespace loom::ir {
namespace {

NodePtr leaf(Shape s, DType t = DType::Float32) { return make_device_data(t, std::move(s), nullptr); }

TEST(Node, EqualExpressionsAreOneNode) {
  auto a = leaf({2, 3});
  auto b = leaf({2, 3});
  auto s1 = make_node(Op::Add, {a, b});
  auto s2 = make_node(Op::Add, {a, b});
  EXPECT_EQ(s1.get(), s2.get());
  EXPECT_NE(make_node(Op::Add, {b, a}).get(), s1.get());
  EXPECT_NE(make_node(Op::Mul, {a, b}).get(), s1.get());
}

TEST(Node, DeviceDataLeavesAreDistinctButHashByShapeAndDtype) {
  auto a = leaf({2, 3});
  auto b = leaf({2, 3});
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(a->hash(), b->hash());
  EXPECT_NE(a->hash(), leaf({3, 2})->hash());
  EXPECT_NE(a->hash(), leaf({2, 3}, DType::Float64)->hash());
}

TEST(Node, InternTableForgetsDeadNodes) {
  auto before = interned_node_count();
  {
    auto a = leaf({4});
    auto n = make_node(Op::Exp, {make_node(Op::Neg, {a})});
    EXPECT_EQ(interned_node_count(), before + 2);
  }
  EXPECT_EQ(interned_node_count(), before);
}

TEST(Node, AttributesAreStructural) {
  auto a = leaf({2, 3});
  auto r1 = make_node(Op::Sum, {a}, AxesAttr{{0}});
  auto r2 = make_node(Op::Sum, {a}, AxesAttr{{1}});
  EXPECT_NE(r1->hash(), r2->hash());
  EXPECT_EQ(r1->shape(), (Shape{1, 3}));
  EXPECT_EQ(r2->shape(), (Shape{2, 1}));
}

TEST(Node, ShapeInferenceRejectsBadOperands) {
  auto a = leaf({2, 3});
  auto b = leaf({3, 2});
  EXPECT_THROW(make_node(Op::Add, {a, b}), Error);
  EXPECT_THROW(make_node(Op::Add, {a, leaf({2, 3}, DType::Float64)}), Error);
  EXPECT_THROW(make_node(Op::Exp, {leaf({2}, DType::Int64)}), Error);
  EXPECT_THROW(make_node(Op::Sum, {a}, AxesAttr{{2}}), Error);
}

TEST(OpTable, EveryOpHasANameAndTheRightRow) {
  for (int i = 0; i < kOpCount; ++i) {
    auto& info = op_info(static_cast<Op>(i));
    EXPECT_EQ(static_cast<int>(info.op), i);
    EXPECT_NE(std::string(info.name), "");
  }
}

}  // namespace
}  // namespace loom::ir
