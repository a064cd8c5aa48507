// Target::recompute_costly_steps (fuse_elementwise.h): a softmax's exponentials are computed
// again in each reader instead of going to memory. The programs are compiled for a copy of
// the CPU's target with the flag set and run on the CPU backend, so the GPU's program shape is
// checked, and its values compared, without a GPU.
#include "compiler/pipeline.h"
#include "test_util.h"

#include <loom/autocast.h>
#include <loom/autograd.h>
#include <loom/nn/functional.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace loom {
namespace {

namespace F = nn::functional;

// LOOM_RECOMPUTE_COSTLY overrides the targets these tests compare: they skip under it.
constexpr const char* kOverridden =
    "LOOM_RECOMPUTE_COSTLY is set: it overrides the targets compared";
bool overridden() { return std::getenv("LOOM_RECOMPUTE_COSTLY") != nullptr; }

// The CPU's target with the flag, and with bfloat16 matmuls kept in bfloat16 as on a CPU with
// bfloat16 instructions (elsewhere the compiler would widen the logits' matmul to float32, and
// there would be no bfloat16 logits to recompute from; its kernel then widens it itself).
ir::Target cpu_target_with(bool recompute_costly) {
  ir::Target t = runtime::backend(Device{}).target();
  t.recompute_costly_steps = recompute_costly;
  t.run_bfloat16(ir::Op::Matmul);
  return t;
}

// Instructions of `p` whose result is float32 with `elements` elements: what goes to memory
// at the logits' size in float32.
int float32_results(const ir::Program& p, int64_t elements) {
  int n = 0;
  for (const auto& in : p.instrs)
    n += in.op != ir::Op::Reshape && in.dtype == DType::Float32 &&
         shape_numel(in.shape) == elements;
  return n;
}

// Steps of `op` in the fusions of `p`, prologues included.
int fused_steps(const ir::Program& p, ir::Op op) {
  int n = 0;
  for (const auto& in : p.instrs)
    if (in.fusion)
      for (const auto& s : in.fusion->steps) n += s.op == op;
  return n;
}

// Cross-entropy over bfloat16 logits under autocast, and its gradient: the exponentials
// exp(logit - max) are read by the softmax's sum and by the gradient. Stored once on the CPU
// (a float32 [rows, classes] tensor written and read twice); with the flag, computed from the
// bfloat16 logits in the sum's prologue and in the gradient's fusion, with the same bits.
TEST(RecomputeCostly, SoftmaxExponentialsAreComputedInTheirReaders) {
  if (overridden()) GTEST_SKIP() << kOverridden;
  test::fresh_engine();
  const int64_t rows = 64, hidden = 32, classes = 96;
  auto values = [](int64_t n, float scale) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = std::sin(scale * static_cast<float>(i));
    return v;
  };
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = (r * 7) % classes;
  auto h = from_vector(values(rows * hidden, 0.37f), {rows, hidden});
  auto w = from_vector(values(hidden * classes, 0.11f), {hidden, classes});
  w.requires_grad_();
  auto target = from_vector(t, {rows});
  mark_step();
  Tensor loss;
  {
    Autocast scope(Precision::BFloat16);  // the logits are a bfloat16 matmul's, as an LM head's
    loss = F::cross_entropy(matmul(h, w) * 2.0, target);
  }
  loss.backward();
  const auto g = ir::build_graph({loss.impl()->pending(), w.grad().impl()->pending()});

  const auto stored = compiler::compile(g, cpu_target_with(false));
  const auto recomputed = compiler::compile(g, cpu_target_with(true));
  EXPECT_GE(float32_results(stored, rows * classes), 1) << ir::to_text(stored);
  EXPECT_EQ(float32_results(recomputed, rows * classes), 0)
      << "only the gradient, in bfloat16, is stored at the logits' size\n"
      << ir::to_text(recomputed);
  EXPECT_EQ(fused_steps(stored, ir::Op::Exp), 1) << ir::to_text(stored);
  EXPECT_GE(fused_steps(recomputed, ir::Op::Exp), 2) << ir::to_text(recomputed);
  const auto got = test::run_on_cpu(g, cpu_target_with(true));
  EXPECT_EQ(got, test::run_on_cpu(g, cpu_target_with(false)));
  // And what the engine itself computes (the CPU's own target), so the runs above are real.
  mark_step();
  const auto loss_value = loss.to_vector<float>();
  ASSERT_EQ(got[0].size(), 4u);  // the loss, a float32 scalar under autocast
  float from_run = 0;
  std::memcpy(&from_run, got[0].data(), 4);
  EXPECT_EQ(from_run, loss_value[0]);
  EXPECT_GT(loss_value[0], 1.0f);
}

// A float32 exp read by two fusions: computed in both (reading x costs what reading e would,
// and e is never written), with the values of the stored program.
TEST(RecomputeCostly, AnExpReadTwiceIsComputedInEachReader) {
  if (overridden()) GTEST_SKIP() << kOverridden;
  test::fresh_engine();
  std::vector<float> xv(1000);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = std::cos(0.1f * static_cast<float>(i));
  auto x = from_vector(xv, {1000});
  mark_step();
  auto e = exp(x);
  auto a = e + 1.0;
  auto b = e * 3.0;
  const auto g = ir::build_graph({a.impl()->pending(), b.impl()->pending()});
  const auto p = compiler::compile(g, cpu_target_with(true));
  int fused = 0;
  for (const auto& in : p.instrs) fused += in.fusion != nullptr;
  EXPECT_EQ(fused, 2) << ir::to_text(p);
  EXPECT_EQ(fused_steps(p, ir::Op::Exp), 2) << ir::to_text(p);
  EXPECT_EQ(test::run_on_cpu(g, cpu_target_with(true)),
            test::run_on_cpu(g, cpu_target_with(false)));
  mark_step();
}

}  // namespace
}  // namespace loom
