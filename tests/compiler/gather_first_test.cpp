// Gathering before elementwise work (compiler/gather_first.h): a Gather of an elementwise
// result picks from the operands instead, and the picked values are the same bits.
#include "compiler/pipeline.h"
#include "test_util.h"

#include <loom/autocast.h>
#include <loom/nn/functional.h>

#include <cmath>
#include <cstring>

namespace loom {
namespace {

using ir::Program;

std::vector<float> wave(int64_t n, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = std::sin(0.37f * static_cast<float>(i) + 0.2f) * scale;
  return v;
}

// Each Gather of `p` reads a value that no elementwise instruction computes: what it picks
// is stored for some other reason (an input, a matmul's result), not for it.
bool gathers_read_stored_values(const Program& p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  for (const auto& in : p.instrs) {
    if (in.op != ir::Op::Gather) continue;
    const int a = in.args[0];
    if (a >= n_in && p.instrs[static_cast<std::size_t>(a - n_in)].fusion) return false;
  }
  return true;
}

void expect_same_bits(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << i;
}

// Cross-entropy picks each row's target out of log_softmax(logits): the log-probabilities are
// not computed whole, and the loss has the bits eager mode gives (it computes them whole, one
// op at a time) and the float64 value to float32 rounding.
TEST(GatherFirst, CrossEntropyPicksTheTargetsWithoutComputingLogSoftmaxWhole) {
  test::fresh_engine();
  const int64_t n = 6, v = 40;
  const auto lv = wave(n * v, 4.0f);
  const std::vector<int64_t> tv{3, 0, 39, 17, 17, 8};
  auto logits = from_vector(lv, {n, v});
  auto target = from_vector(tv, {n});
  auto f = [&] { return nn::functional::cross_entropy(logits, target); };
  Tensor loss = f();
  const Program p = test::compile_for_cpu(test::graph_of(loss));
  EXPECT_EQ(test::count_instrs(p, ir::Op::Gather), 1) << ir::to_text(p);
  EXPECT_TRUE(gathers_read_stored_values(p)) << ir::to_text(p);
  Tensor eager;
  {
    EagerModeGuard on(true);
    eager = f();
  }
  expect_same_bits(loss, eager);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) {
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(lv[static_cast<std::size_t>(i * v + j)]));
    for (int64_t j = 0; j < v; ++j) s += std::exp(lv[static_cast<std::size_t>(i * v + j)] - m);
    want -= lv[static_cast<std::size_t>(i * v + tv[static_cast<std::size_t>(i)])] - m - std::log(s);
  }
  EXPECT_NEAR(loss.item<float>(), want / n, 2e-6 * std::abs(want / n));
}

// Under autocast the logits are a bfloat16 product widened to float32: the widening is picked
// too, so the Gather reads the bfloat16 logits themselves. Compiled for the CPU's target with
// bfloat16 matmuls, as on a CPU with bfloat16 instructions (elsewhere the compiler widens the
// matmul itself, and its float32 result is what there is to pick).
TEST(GatherFirst, AutocastLogitsArePickedAsBFloat16) {
  test::fresh_engine();
  auto x = from_vector(wave(4 * 8, 1.0f), {4, 8});
  auto w = from_vector(wave(12 * 8, 0.5f), {12, 8});
  auto target = from_vector(std::vector<int64_t>{11, 2, 0, 5}, {4});
  auto f = [&] {
    Autocast bf16(Precision::BFloat16);
    return nn::functional::cross_entropy(matmul(x, transpose(w, 0, 1)), target);
  };
  Tensor loss = f();
  ir::Target bf16_matmuls = runtime::backend(Device{}).target();
  bf16_matmuls.run_bfloat16(ir::Op::Matmul);
  const ir::Graph g = test::graph_of(loss);
  const Program p = compiler::compile(g, bf16_matmuls);
  ASSERT_EQ(test::count_instrs(p, ir::Op::Gather), 1) << ir::to_text(p);
  for (const auto& in : p.instrs) {
    if (in.op == ir::Op::Gather) {
      EXPECT_EQ(in.dtype, DType::BFloat16) << ir::to_text(p);
    }
  }
  EXPECT_TRUE(gathers_read_stored_values(p)) << ir::to_text(p);
  // The program's loss has the bits eager mode gives (which widens the matmul itself where
  // the CPU has no bfloat16 instructions, as the matmul's kernel then does).
  const auto got = test::run_on_cpu(g, bf16_matmuls);
  Tensor eager;
  {
    EagerModeGuard on(true);
    eager = f();
  }
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].size(), 4u);
  float from_run = 0;
  std::memcpy(&from_run, got[0].data(), 4);
  EXPECT_EQ(from_run, eager.item<float>());
  EXPECT_GT(from_run, 0.5f);
  expect_same_bits(loss, eager);
}

// Where the picked elements would need a value broadcast along the gathered dimension (a
// per-column offset), or the index covers only some rows, the Gather reads the elementwise
// result as before; the values are what the host computes either way.
TEST(GatherFirst, OtherGathersAreLeftAsTheyWere) {
  test::fresh_engine();
  auto x = from_vector(wave(3 * 5, 2.0f), {3, 5});
  auto col = from_vector(std::vector<float>{1, 2, 4, 8, 16}, {1, 5});
  auto idx = from_vector(std::vector<int64_t>{4, 0, 2}, {3, 1});
  auto first_rows = from_vector(std::vector<int64_t>{1, 3}, {2, 1});
  Tensor by_column = gather(x * col, 1, idx);     // col is spread along the gathered dim
  Tensor some_rows = gather(x * 2.0, 1, first_rows);  // rows 0 and 1 of 3
  const Program p = test::compile_for_cpu(test::graph_of(by_column));
  EXPECT_FALSE(gathers_read_stored_values(p)) << ir::to_text(p);
  const Program q = test::compile_for_cpu(test::graph_of(some_rows));
  EXPECT_FALSE(gathers_read_stored_values(q)) << ir::to_text(q);
  const auto xv = x.to_vector<float>();
  EXPECT_EQ(by_column.to_vector<float>(), (std::vector<float>{xv[4] * 16, xv[5] * 1, xv[12] * 4}));
  EXPECT_EQ(some_rows.to_vector<float>(), (std::vector<float>{xv[1] * 2, xv[8] * 2}));
}

// A per-row shift (broadcast along the gathered dimension) and a where over a comparison:
// every leaf is picked, and the values are the host's.
TEST(GatherFirst, PerRowBroadcastsAndConditionsArePicked) {
  test::fresh_engine();
  auto x = from_vector(wave(4 * 6, 3.0f), {4, 6});
  auto shift = from_vector(std::vector<float>{0.5f, -1, 2, 0.25f}, {4, 1});
  auto idx = from_vector(std::vector<int64_t>{5, 1, 1, 0, 3, 2, 4, 4}, {4, 2});
  auto f = [&] { return gather(where(gt(x, zeros({4, 6})), x - shift, -x * 3.0), 1, idx); };
  Tensor y = f();
  const Program p = test::compile_for_cpu(test::graph_of(y));
  EXPECT_TRUE(gathers_read_stored_values(p)) << ir::to_text(p);
  const auto xv = x.to_vector<float>();
  const float sv[] = {0.5f, -1, 2, 0.25f};
  const int64_t iv[] = {5, 1, 1, 0, 3, 2, 4, 4};
  std::vector<float> want;
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 2; ++k) {
      const float e = xv[static_cast<std::size_t>(r * 6 + iv[r * 2 + k])];
      want.push_back(e > 0 ? e - sv[r] : -e * 3.0f);
    }
  EXPECT_EQ(y.to_vector<float>(), want);
}

// A value whose every leaf is a broadcast along the gathered dimension would be picked with no
// Gather left to read the index: the Gather stays, and an index out of range fails the step
// naming it (it gave the row's value, and cross_entropy a loss, without a word).
TEST(GatherFirst, AnIndexOutOfRangeFailsWhenEveryLeafIsBroadcast) {
  test::fresh_engine();
  auto rows = from_vector(std::vector<float>{1, 2}, {2, 1});
  auto spread = [&] { return rows + zeros({2, 3}); };
  auto in_range = gather(spread(), 1, from_vector(std::vector<int64_t>{2, 0}, {2, 1}));
  EXPECT_EQ(in_range.to_vector<float>(), (std::vector<float>{1, 2}));
  for (int64_t bad : {int64_t{99}, int64_t{-5}}) {
    auto picked = gather(spread(), 1, from_vector(std::vector<int64_t>{0, bad}, {2, 1}));
    const std::string msg = test::error_of([&] { picked.to_vector<float>(); });
    EXPECT_NE(msg.find("gather"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
  }
  auto loss = nn::functional::cross_entropy(ones({2, 3}), from_vector(std::vector<int64_t>{0, 7}, {2}));
  EXPECT_NE(test::error_of([&] { loss.item<float>(); }).find("7"), std::string::npos);
}

}  // namespace
}  // namespace loom
