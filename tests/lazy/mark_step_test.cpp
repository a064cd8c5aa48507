// Acceptance 1: one graph without a barrier; compiled once and reused with mark_step.
#include "test_util.h"

#include <cmath>

namespace loom {
namespace {

using test::count_ops;
using test::fresh_engine;
using test::graph_of;

constexpr int kSteps = 10;

std::vector<float> values(int step, float scale) {
  return {scale * step, scale * step + 1, scale * step + 2, -scale * step};
}

TEST(MarkStep, WithoutABarrierOneGraphHoldsEveryAdd) {
  fresh_engine();
  auto z = from_vector<float>({0, 0, 0, 0}, {4});
  for (int i = 0; i < kSteps; ++i) {
    auto x = from_vector(values(i, 1), {4});
    auto y = from_vector(values(i, 2), {4});
    z += x + y;
  }
  auto g = graph_of(z);
  EXPECT_EQ(count_ops(g, ir::Op::Add), 2 * kSteps);  // x + y and z + (x + y), per iteration
  EXPECT_EQ(count_ops(g, ir::Op::DeviceData), 1 + 2 * kSteps);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 0);  // nothing ran yet

  auto got = z.to_vector<float>();
  std::vector<float> want(4, 0);
  for (int i = 0; i < kSteps; ++i)
    for (int k = 0; k < 4; ++k) want[k] += values(i, 1)[k] + values(i, 2)[k];
  EXPECT_EQ(got, want);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::stat("GraphSize").max, static_cast<double>(g.nodes.size()));
}

TEST(MarkStep, WithABarrierTheStepCompilesOnceAndIsReused) {
  fresh_engine();
  auto z = from_vector<float>({0, 0, 0, 0}, {4});
  std::vector<float> want(4, 0);
  for (int i = 0; i < kSteps; ++i) {
    auto x = from_vector(values(i, 1), {4});
    auto y = from_vector(values(i, 2), {4});
    z += x + y;
    mark_step();
    EXPECT_FALSE(z.is_pending());
    for (int k = 0; k < 4; ++k) want[k] += values(i, 1)[k] + values(i, 2)[k];
  }
  EXPECT_EQ(metrics::counter("MarkStep"), kSteps);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), kSteps - 1);
  EXPECT_EQ(metrics::counter("TransferFromDevice"), 0);
  EXPECT_EQ(z.to_vector<float>(), want);
  EXPECT_EQ(metrics::counter("TransferFromDevice"), 1);
}

TEST(MarkStep, WithNothingPendingCompilesNothing) {
  fresh_engine();
  mark_step();
  mark_step();
  EXPECT_EQ(metrics::counter("MarkStep"), 2);
  EXPECT_EQ(metrics::counter("UncachedCompile") + metrics::counter("CachedCompile"), 0);
}

TEST(MarkStep, EveryLivePendingTensorGetsItsBuffer) {
  fresh_engine();
  auto x = from_vector<double>({1, 2, 3}, {3});
  auto a = exp(x);
  auto b = a * a;
  mark_step();
  EXPECT_FALSE(a.is_pending());
  EXPECT_FALSE(b.is_pending());
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);  // one program owes both
  auto av = a.to_vector<double>();
  auto bv = b.to_vector<double>();
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(av[i], std::exp(i + 1.0), 1e-15 * std::exp(i + 1.0)) << i;  // a holds exp(x)
    EXPECT_DOUBLE_EQ(bv[i], av[i] * av[i]);
  }
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);  // reads of materialized tensors compile nothing
}

// The compile cache is keyed by the graph's hash: graphs that differ in nothing but one
// attribute field must hash apart, or the second would run the first's program.
TEST(MarkStep, GraphsThatDifferOnlyInAnAttributeCompileApart) {
  fresh_engine();
  auto x = from_vector<float>(std::vector<float>(36, 1), {1, 1, 6, 6});
  auto w = from_vector<float>(std::vector<float>(9, 1), {1, 1, 3, 3});
  // Stride 3 over 6 rows: padding 0 and 1 both give a [1,1,2,2] result.
  Conv2dParams o;
  o.stride = {3, 3};
  auto a = conv2d(x, w, {}, o);
  const uint64_t hash_a = graph_of(a).hash;
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{9, 9, 9, 9}));
  o.padding = {1, 1};
  auto b = conv2d(x, w, {}, o);
  EXPECT_NE(graph_of(b).hash, hash_a);
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{4, 6, 6, 9}));
  EXPECT_EQ(metrics::counter("UncachedCompile"), 2);

  auto v = from_vector<float>({0, 1, 2, 3, 4, 5}, {6});
  auto s1 = slice(v, 0, 0, 3);
  const uint64_t hash_s1 = graph_of(s1).hash;
  EXPECT_EQ(s1.to_vector<float>(), (std::vector<float>{0, 1, 2}));
  auto s2 = slice(v, 0, 3, 6);
  EXPECT_NE(graph_of(s2).hash, hash_s1);
  EXPECT_EQ(s2.to_vector<float>(), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(metrics::counter("UncachedCompile"), 4);
}

}  // namespace
}  // namespace loom
