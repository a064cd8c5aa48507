// Acceptance 2: shapes recompile, scalars do not; 0 and 1 are constants unless
// LOOM_NO_SPECIAL_SCALARS=1.
#include "test_util.h"

#include <cstdlib>

namespace loom {
namespace {

using test::count_ops;
using test::fresh_engine;
using test::graph_of;

Tensor step(const Tensor& x, double scale) {
  auto y = x * scale + 0.5;
  mark_step();
  return y;
}

TEST(Scalars, ANewInputShapeRecompiles) {
  fresh_engine();
  step(from_vector<float>({1, 2, 3, 4}, {4}), 0.1);
  step(from_vector<float>({5, 6, 7, 8}, {4}), 0.1);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  step(from_vector<float>({1, 2, 3, 4, 5, 6}, {6}), 0.1);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 2);
  step(from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}), 0.1);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 3);
}

TEST(Scalars, AChangedScalarDoesNotRecompile) {
  fresh_engine();
  auto x = from_vector<float>({1, 2, 3, 4}, {4});
  auto y1 = step(x, 0.1);
  auto y2 = step(x, 0.2);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), 1);
  auto v1 = y1.to_vector<float>();
  auto v2 = y2.to_vector<float>();
  EXPECT_FLOAT_EQ(v1[3], 4 * 0.1f + 0.5f);
  EXPECT_FLOAT_EQ(v2[3], 4 * 0.2f + 0.5f);
}

TEST(Scalars, ZeroAndOneAreConstants) {
  unsetenv("LOOM_NO_SPECIAL_SCALARS");
  fresh_engine();
  auto x = from_vector<float>({1, 2, 3}, {3});
  auto g = graph_of(x * 1.0 + 0.0);
  EXPECT_EQ(count_ops(g, ir::Op::Constant), 2);
  EXPECT_EQ(g.inputs.size(), 1u);  // only x is device data
  EXPECT_EQ(metrics::counter("TransferToDevice"), 1);  // x; no scalar was transferred
  // Baked in, so x*0 and x*1 are different programs.
  EXPECT_NE(graph_of(x * 0.0).hash, graph_of(x * 1.0).hash);
  // Any other scalar is device data.
  auto h = graph_of(x * 2.0);
  EXPECT_EQ(count_ops(h, ir::Op::Constant), 0);
  EXPECT_EQ(h.inputs.size(), 2u);
  EXPECT_EQ(graph_of(x * 2.0).hash, graph_of(x * 3.0).hash);
}

TEST(Scalars, NoSpecialScalarsMakesZeroAndOneDeviceData) {
  setenv("LOOM_NO_SPECIAL_SCALARS", "1", 1);
  fresh_engine();
  auto x = from_vector<float>({1, 2, 3}, {3});
  auto g = graph_of(x * 1.0 + 0.0);
  EXPECT_EQ(count_ops(g, ir::Op::Constant), 0);
  EXPECT_EQ(g.inputs.size(), 3u);
  EXPECT_EQ(graph_of(x * 0.0).hash, graph_of(x * 1.0).hash);
  EXPECT_EQ((x * 1.0 + 0.0).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  unsetenv("LOOM_NO_SPECIAL_SCALARS");
}

}  // namespace
}  // namespace loom
