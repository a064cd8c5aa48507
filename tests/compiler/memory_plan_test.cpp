// Memory planning: intermediates share one arena by liveness, outputs escape it, and
// programs that reuse their arena step after step keep computing the right values.
#include "compiler/pipeline.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>

namespace loom {
namespace {

using ir::Program;

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::cos(static_cast<float>(i) * scale) * 0.2f;
  return v;
}

// Per slot: the slot whose memory it is (through reshapes), and the last instruction that
// writes or reads that memory.
struct Liveness {
  std::vector<int> owner, last;
  explicit Liveness(const Program& p) : owner(p.num_slots()), last(p.num_slots(), -1) {
    const auto n_in = static_cast<int>(p.inputs.size());
    for (int s = 0; s < p.num_slots(); ++s) owner[s] = s;
    for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
      if (p.instrs[i].op == ir::Op::Reshape) owner[n_in + i] = owner[p.instrs[i].args[0]];
      last[owner[n_in + i]] = std::max(last[owner[n_in + i]], i);
      for (auto a : p.instrs[i].args) last[owner[a]] = std::max(last[owner[a]], i);
    }
  }
};

// Every pair of intermediates alive at one time (closed intervals [writer, last reader],
// through reshapes) occupies disjoint bytes.
void expect_no_overlap(const Program& p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  const auto n = static_cast<int>(p.instrs.size());
  const Liveness live(p);
  const auto& owner = live.owner;
  const auto& last = live.last;
  for (int i = 0; i < n; ++i) {
    const auto& a = p.instrs[i];
    if (a.arena_offset < 0 || owner[n_in + i] != n_in + i) continue;
    auto a_end = a.arena_offset + shape_numel(a.shape) * static_cast<int64_t>(dtype_size(a.dtype));
    EXPECT_LE(a_end, p.arena_bytes);
    for (int j = i + 1; j < n; ++j) {
      const auto& b = p.instrs[j];
      if (b.arena_offset < 0 || owner[n_in + j] != n_in + j) continue;
      bool alive_together = j <= last[n_in + i];
      auto b_end = b.arena_offset + shape_numel(b.shape) * static_cast<int64_t>(dtype_size(b.dtype));
      bool share_bytes = a.arena_offset < b_end && b.arena_offset < a_end;
      EXPECT_FALSE(alive_together && share_bytes)
          << "$" << n_in + i << " and $" << n_in + j << "\n" << ir::to_text(p);
    }
  }
}

// Every donor of instruction i is read by no later instruction (through reshapes) and is
// no output itself.
void expect_donors_dead(const Program& p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  const Liveness live(p);
  const auto& owner = live.owner;
  const auto& last = live.last;
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i)
    for (int d : p.instrs[i].donors) {
      EXPECT_LE(last[d], i) << "$" << d << " is read after $" << n_in + i << "\n"
                            << ir::to_text(p);
      for (int o : p.outputs) EXPECT_NE(owner[o], d) << "$" << d << " is an output";
    }
}

TEST(MemoryPlan, AChainReusesTwoBlocks) {
  test::fresh_engine();
  auto w = from_vector(ramp(64 * 64, 0.1f), {64, 64});
  Tensor y = from_vector(ramp(64 * 64, 0.3f), {64, 64});
  for (int k = 0; k < 10; ++k) y = matmul(y, w);
  auto p = test::compile_for_cpu(test::graph_of(y));
  ASSERT_EQ(p.instrs.size(), 10u) << ir::to_text(p);
  const int64_t block = 64 * 64 * 4;
  // Nine intermediates, each alive from its matmul to the next: two blocks take turns.
  EXPECT_EQ(p.arena_bytes, 2 * block) << ir::to_text(p);
  EXPECT_LT(p.instrs.back().arena_offset, 0) << "the output escapes the arena";
  expect_no_overlap(p);
}

TEST(MemoryPlan, ReshapesShareTheirOperandsBlock) {
  test::fresh_engine();
  auto x = from_vector(ramp(6 * 8, 0.2f), {6, 8});
  auto w = from_vector(ramp(8 * 8, 0.4f), {8, 8});
  auto h = matmul(x, w).reshape({2, 3, 8}).sum({1});  // reshape of an intermediate
  auto out = matmul(h, w);
  auto p = test::compile_for_cpu(test::graph_of(out));
  expect_no_overlap(p);
  for (std::size_t i = 1; i < p.instrs.size(); ++i) {
    if (p.instrs[i].op != ir::Op::Reshape) continue;
    EXPECT_EQ(p.instrs[i].arena_offset, p.instrs[i - 1].arena_offset) << ir::to_text(p);
  }
}

TEST(MemoryPlan, ReusedArenaGivesTheSameValuesEveryStep) {
  test::fresh_engine();
  auto w = from_vector(ramp(32 * 32, 0.15f), {32, 32});
  auto x0 = from_vector(ramp(16 * 32, 0.05f), {16, 32});
  // The same expression on the host, in double: every step (the first included, whose arena
  // is fresh) must give it, not merely what the first step gave.
  const auto hw = ramp(32 * 32, 0.15f), hx = ramp(16 * 32, 0.05f);
  auto host_matmul = [](const std::vector<double>& a, const std::vector<float>& b, int64_t rows) {
    std::vector<double> c(static_cast<std::size_t>(rows * 32), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < 32; ++k)
        for (int64_t j = 0; j < 32; ++j) c[i * 32 + j] += a[i * 32 + k] * b[k * 32 + j];
    return c;
  };
  std::vector<double> h(hx.begin(), hx.end());
  h = host_matmul(h, hw, 16);
  for (auto& v : h) v = std::max(v, 0.0) * 0.5;
  auto t = host_matmul(h, hw, 16);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::tanh(t[i]) + h[i];
  t = host_matmul(t, hw, 16);
  std::vector<double> want(16, 0.0);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 32; ++j) want[i] += t[i * 32 + j];
  for (int step = 0; step < 3; ++step) {
    auto hl = relu(matmul(x0, w)) * 0.5;
    auto out = matmul(tanh(matmul(hl, w)) + hl, w).sum({1});
    mark_step();
    auto v = out.to_vector<float>();
    ASSERT_EQ(v.size(), want.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      EXPECT_NEAR(v[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "step " << step << " row " << i;
  }
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1) << "one program, run three times";
}

TEST(MemoryPlan, NoOverlapInATrainingLikeGraph) {
  test::fresh_engine();
  auto x = from_vector(ramp(8 * 3 * 6 * 6, 0.21f), {8, 3, 6, 6});
  auto w = from_vector(ramp(4 * 3 * 3 * 3, 0.33f), {4, 3, 3, 3});
  w.requires_grad_();
  auto y = relu(conv2d(x, w, {}, {.padding = {1, 1}}));
  auto loss = (y * y).mean();
  loss.backward();
  auto p = test::compile_for_cpu(ir::build_graph({loss.impl()->pending(), w.grad().impl()->pending()}));
  EXPECT_GT(p.arena_bytes, 0);
  expect_no_overlap(p);
  expect_donors_dead(p);
}

// Donation: which inputs a result may take over (memory_plan.h).
TEST(MemoryPlan, AnUpdateListsTheInputItOverwritesAsDonor) {
  test::fresh_engine();
  auto w = from_vector(ramp(256, 0.1f), {256});
  auto g = from_vector(ramp(256, 0.7f), {256});
  auto other = from_vector(ramp(128, 0.2f), {128});
  mark_step();
  auto updated = w - g * 0.5f + other.sum();  // w and g are read element for element
  auto p = test::compile_for_cpu(test::graph_of(updated));
  const auto& last = p.instrs.back();
  ASSERT_FALSE(last.donors.empty()) << ir::to_text(p);
  for (int d : last.donors) {
    ASSERT_LT(d, static_cast<int>(p.inputs.size())) << "donors are inputs";
    EXPECT_EQ(p.inputs[d].shape, Shape{256}) << "donors have the result's size";
  }
  // An intermediate (the sum) is not an output, so it lists no donors.
  for (std::size_t i = 0; i + 1 < p.instrs.size(); ++i)
    EXPECT_TRUE(p.instrs[i].donors.empty()) << ir::to_text(p);
}

TEST(MemoryPlan, DonorsAreDeadWhenTheirResultIsWritten) {
  test::fresh_engine();
  auto x = from_vector(ramp(64 * 64, 0.1f), {64, 64});
  auto w = from_vector(ramp(64 * 64, 0.3f), {64, 64});
  mark_step();
  auto first = x * 2.0f;                     // x is read again below
  auto second = matmul(x, w).sum() + first.sum();
  auto passthrough = w.reshape({4096});      // an input that is an output
  auto p = test::compile_for_cpu(ir::build_graph(
      {first.impl()->pending(), second.impl()->pending(), passthrough.impl()->pending()}));
  expect_donors_dead(p);
}

const void* storage_of(const Tensor& t) { return t.impl()->data()->wait("test").data(); }

TEST(MemoryPlan, AStepTakesOverTheBufferOfTheValueItOverwrites) {
  test::fresh_engine();
  auto w = from_vector(ramp(4096, 0.1f), {4096});
  mark_step();
  const auto start = w.to_vector<float>();
  const void* buffer = storage_of(w);
  for (int step = 1; step <= 3; ++step) {
    w.assign(w * 0.5f + 1.0f);
    mark_step();
    wait_device_ops();
    EXPECT_EQ(storage_of(w), buffer) << "step " << step << ": the update wrote in place";
  }
  EXPECT_EQ(metrics::counter("DonatedBuffer"), 3);
  const auto now = w.to_vector<float>();
  for (std::size_t i = 0; i < now.size(); ++i)
    ASSERT_FLOAT_EQ(now[i], ((start[i] * 0.5f + 1.0f) * 0.5f + 1.0f) * 0.5f + 1.0f) << i;
}

// A step that failed holds none of its inputs afterwards: the value it read can still be
// taken over by the next update (a failed run kept its references, and with them the memory,
// until its program ran again).
TEST(MemoryPlan, AFailedStepKeepsNoInputAlive) {
  test::fresh_engine();
  auto w = from_vector(ramp(4096, 0.1f), {4096});
  mark_step();
  {
    auto bad = embedding(w.reshape({4096, 1}), from_vector<int64_t>({5000}, {1}));  // row 5000 of 4096
    mark_step();
    EXPECT_NE(test::error_of([&] { bad.to_vector<float>(); }).find("out of range"), std::string::npos);
  }
  w.assign(w * 0.5f + 1.0f);
  mark_step();
  wait_device_ops();
  EXPECT_EQ(metrics::counter("DonatedBuffer"), 1);
}

TEST(MemoryPlan, ABufferSomethingElseHoldsIsNeverDonated) {
  test::fresh_engine();
  auto w = from_vector(ramp(4096, 0.1f), {4096});
  mark_step();
  const auto start = w.to_vector<float>();
  Tensor kept = w.detach();  // another tensor on the same buffer
  Tensor shaped = w.reshape({64, 64});
  mark_step();
  w.assign(w * 0.5f + 1.0f);
  mark_step();
  wait_device_ops();
  EXPECT_EQ(metrics::counter("DonatedBuffer"), 0);
  EXPECT_EQ(kept.to_vector<float>(), start);
  EXPECT_EQ(shaped.to_vector<float>(), start);
  const auto now = w.to_vector<float>();
  for (std::size_t i = 0; i < now.size(); ++i) ASSERT_FLOAT_EQ(now[i], start[i] * 0.5f + 1.0f);
}

}  // namespace
}  // namespace loom
