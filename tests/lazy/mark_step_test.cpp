// Acceptance 1: one graph without a barrier; compiled once and reused with mark_step.
#include "test_util.h"

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
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(bv[i], av[i] * av[i]);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);  // reads of materialized tensors compile nothing
}

}  // namespace
}  // namespace loom
