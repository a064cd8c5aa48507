// Typed attributes: each field of each struct takes part in the hash and in equality, the kind
// is part of both, and the op table names a kind for every op.
#include "ir/attr.h"

#include "ir/graph.h"
#include "ir/node.h"

#include <gtest/gtest.h>

#include <functional>

namespace loom::ir {
namespace {

// `base` and each variant of it (one field changed) hash differently and compare unequal.
template <class T>
void expect_each_field_counts(const T& base, std::vector<std::function<void(T&)>> edits) {
  for (std::size_t i = 0; i < edits.size(); ++i) {
    T changed = base;
    edits[i](changed);
    EXPECT_FALSE(Attr(changed) == Attr(base)) << attr_str(base) << " edit " << i;
    EXPECT_NE(hash_attr(changed), hash_attr(base)) << attr_str(base) << " edit " << i;
  }
  EXPECT_EQ(hash_attr(base), hash_attr(T(base)));
}

TEST(Attr, EveryFieldIsInTheHashAndEquality) {
  expect_each_field_counts(ScalarAttr{1.5}, {[](auto& a) { a.value = -1.5; }});
  expect_each_field_counts(CastAttr{DType::Float32}, {[](auto& a) { a.to = DType::Int64; }});
  expect_each_field_counts(RandomAttr{{2, 3}, DType::Float32},
                           {[](auto& a) { a.shape = {3, 2}; }, [](auto& a) { a.dtype = DType::Float64; }});
  expect_each_field_counts(DimAttr{1}, {[](auto& a) { a.dim = 2; }});
  expect_each_field_counts(AxesAttr{{0, 2}}, {[](auto& a) { a.axes = {0, 1}; }});
  expect_each_field_counts(ShapeAttr{{2, 3}}, {[](auto& a) { a.shape = {6}; }});
  expect_each_field_counts(PermuteAttr{{1, 0}}, {[](auto& a) { a.perm = {0, 1}; }});
  expect_each_field_counts(SliceAttr{{0, 1}, {1, 1}, {2, 2}},
                           {[](auto& a) { a.starts[1] = 0; }, [](auto& a) { a.steps[0] = 2; },
                            [](auto& a) { a.sizes[1] = 1; }});
  expect_each_field_counts(PadAttr{{1, 0}, {0, 1}, 0.0},
                           {[](auto& a) { a.lo[1] = 1; }, [](auto& a) { a.hi[0] = 1; },
                            [](auto& a) { a.value = 2.0; }});
  expect_each_field_counts(MatmulAttr{}, {[](auto& a) { a.transpose_a = true; },
                                          [](auto& a) { a.transpose_b = true; }});
  const Conv2dAttr conv{};
  expect_each_field_counts(conv, {[](auto& a) { a.stride[0] = 2; }, [](auto& a) { a.stride[1] = 2; },
                                  [](auto& a) { a.padding[0] = 1; }, [](auto& a) { a.padding[1] = 1; },
                                  [](auto& a) { a.dilation[0] = 2; }, [](auto& a) { a.dilation[1] = 2; },
                                  [](auto& a) { a.groups = 2; }});
  expect_each_field_counts(Conv2dGradAttr{conv, {8, 8}},
                           {[](auto& a) { a.conv.padding[1] = 1; }, [](auto& a) { a.size[0] = 9; },
                            [](auto& a) { a.size[1] = 9; }});
  const Pool2dAttr pool{.kernel = {2, 2}, .stride = {2, 2}};
  expect_each_field_counts(pool, {[](auto& a) { a.kernel[1] = 3; }, [](auto& a) { a.stride[0] = 1; },
                                  [](auto& a) { a.padding[0] = 1; },
                                  [](auto& a) { a.count_include_pad = true; }});
  expect_each_field_counts(Pool2dGradAttr{pool, {8, 8}},
                           {[](auto& a) { a.pool.padding[1] = 1; }, [](auto& a) { a.size[1] = 9; }});
  expect_each_field_counts(OneHotAttr{10}, {[](auto& a) { a.num_classes = 11; }});
}

TEST(Attr, TheKindIsInTheHashAndEquality) {
  // The same numbers in two kinds are two attributes.
  EXPECT_FALSE(Attr(DimAttr{3}) == Attr(OneHotAttr{3}));
  EXPECT_NE(hash_attr(DimAttr{3}), hash_attr(OneHotAttr{3}));
  EXPECT_FALSE(Attr(ShapeAttr{{1, 0}}) == Attr(PermuteAttr{{1, 0}}));
  EXPECT_NE(hash_attr(ShapeAttr{{1, 0}}), hash_attr(PermuteAttr{{1, 0}}));
  EXPECT_EQ(Attr().kind(), AttrKind::None);
  EXPECT_EQ(Attr(Conv2dAttr{}).kind(), AttrKind::Conv2d);
  EXPECT_TRUE(Attr(SliceAttr{}).is<SliceAttr>());
}

TEST(Attr, PrintsFieldsByName) {
  EXPECT_EQ(attr_str(Conv2dAttr{.stride = {2, 2}, .padding = {1, 1}}),
            "stride=2,2 padding=1,1 dilation=1,1 groups=1");
  EXPECT_EQ(attr_str(SliceAttr{{0, 2}, {1, 1}, {4, 3}}), "starts=[0,2] steps=[1,1] sizes=[4,3]");
  EXPECT_EQ(attr_str(Attr()), "");
}

TEST(Attr, ReadingAnotherKindAborts) {
  const Attr a = DimAttr{1};
  EXPECT_EQ(a.get<DimAttr>().dim, 1);
  EXPECT_DEATH((void)a.get<AxesAttr>(), "read an attribute as AxesAttr, but it is DimAttr");
}

TEST(Attr, BuildingANodeWithAnotherOpsKindAborts) {
  auto x = make_device_data(DType::Float32, {2, 3}, nullptr);
  EXPECT_DEATH(make_node(Op::Sum, {x}, DimAttr{0}), "sum takes AxesAttr, got DimAttr");
  EXPECT_DEATH(make_node(Op::Exp, {x}, DimAttr{0}), "exp takes none, got DimAttr");
}

TEST(OpTable, EveryOpNamesItsAttributeKind) {
  EXPECT_EQ(op_info(Op::Conv2d).attr, AttrKind::Conv2d);
  EXPECT_EQ(op_info(Op::Slice).attr, AttrKind::Slice);
  EXPECT_EQ(op_info(Op::Add).attr, AttrKind::None);
  for (int i = 0; i < kOpCount; ++i)
    EXPECT_LT(op_info(static_cast<Op>(i)).attr, AttrKind::Count_) << op_name(static_cast<Op>(i));
}

TEST(Graph, GraphsThatDifferOnlyInAnAttributeHashApart) {
  auto x = make_device_data(DType::Float32, {1, 2, 6, 6}, nullptr);
  auto w = make_device_data(DType::Float32, {2, 2, 3, 3}, nullptr);
  // Stride 3 over 6 rows: padding 0 and padding 1 both give 2 output rows, so the two convs
  // differ in nothing but their padding.
  auto c1 = make_node(Op::Conv2d, {x, w}, Conv2dAttr{.stride = {3, 3}, .padding = {0, 0}});
  auto c2 = make_node(Op::Conv2d, {x, w}, Conv2dAttr{.stride = {3, 3}, .padding = {1, 1}});
  ASSERT_EQ(c1->shape(), c2->shape());
  EXPECT_NE(build_graph({c1}).hash, build_graph({c2}).hash);

  // Two slices of one size that differ only in their start.
  auto s1 = make_node(Op::Slice, {x}, SliceAttr{{0, 0, 0, 0}, {1, 1, 1, 1}, {1, 2, 6, 3}});
  auto s2 = make_node(Op::Slice, {x}, SliceAttr{{0, 0, 0, 3}, {1, 1, 1, 1}, {1, 2, 6, 3}});
  ASSERT_EQ(s1->shape(), s2->shape());
  EXPECT_NE(s1.get(), s2.get());
  EXPECT_NE(build_graph({s1}).hash, build_graph({s2}).hash);
}

}  // namespace
}  // namespace loom::ir
