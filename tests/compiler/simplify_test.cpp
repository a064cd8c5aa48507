// Algebraic simplification: what it removes from traced graphs, and that the simplified
// programs give the bits one op at a time gives (signed zeros and NaN included).
#include "compiler/pipeline.h"
#include "test_util.h"

#include <loom/bfloat16.h>

#include <cmath>
#include <limits>

namespace loom {
namespace {

using ir::Program;

std::vector<float> specials() {
  return {-0.0f, 0.0f, 1.5f, -2.25f, std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN(), 3e-39f, -7.0f};
}

// The same bits as `want`, computed on the host (signed zeros and NaN included). Eager mode
// would not do as the reference: it compiles each op through the same simplification.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
      continue;
    }
    EXPECT_EQ(got[i], want[i]) << i;
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << i;
  }
}

TEST(Simplify, TransposedTwiceIsReadAsStored) {
  test::fresh_engine();
  auto w = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  auto x = from_vector(std::vector<float>{1, -1, 0.5, 2, 0, 3}, {3, 2});
  auto y = matmul(transpose(transpose(w, 0, 1), 0, 1), x);
  auto p = test::compile_for_cpu(test::graph_of(y));
  EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 0) << ir::to_text(p);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 12, 6.5, 24}));
}

TEST(Simplify, ComposedPermutesBecomeOne) {
  test::fresh_engine();
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<float>(i);
  auto x = from_vector(v, {2, 3, 4});
  auto f = [](const Tensor& t) { return t.permute({1, 2, 0}).permute({2, 0, 1}).permute({0, 2, 1}); };
  auto p = test::compile_for_cpu(test::graph_of(f(x)));
  EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 1) << ir::to_text(p);
  // The three permutes compose to out[a][b][c] = x[c][a][b]... worked out on the host:
  // permute({1,2,0}) gives [3,4,2] with y[i][j][k] = x[k][i][j]; permute({2,0,1}) of that
  // gives z[k][i][j] = y[i][j][k] = x[k][i][j] (shape [2,3,4]); permute({0,2,1}) gives
  // out[k][j][i] = z[k][i][j] = x[k][i][j] (shape [2,4,3]).
  std::vector<float> want(24);
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 3; ++i) want[(k * 4 + j) * 3 + i] = v[(k * 3 + i) * 4 + j];
  EXPECT_EQ(f(x).shape(), (Shape{2, 4, 3}));
  expect_same_bits(f(x).to_vector<float>(), want);
}

TEST(Simplify, ASliceOfASliceBecomesOne) {
  test::fresh_engine();
  std::vector<float> v(5 * 12);
  for (int i = 0; i < 60; ++i) v[i] = static_cast<float>(i);
  auto x = from_vector(v, {5, 12});
  auto f = [](const Tensor& t) {
    return slice(slice(slice(slice(t, 0, 1, 5), 0, 0, 4, 2), 1, 1, 12, 2), 1, 1, 6, 2);
  };
  auto p = test::compile_for_cpu(test::graph_of(f(x)));
  EXPECT_EQ(test::count_instrs(p, ir::Op::Slice), 1) << ir::to_text(p);
  // Rows: [1, 5) then every other from 0: rows 1, 3. Columns: 1, 3, 5, 7, 9, 11, then every
  // other from the second: 3, 7, 11.
  std::vector<float> want;
  for (int r : {1, 3})
    for (int c : {3, 7, 11}) want.push_back(v[r * 12 + c]);
  EXPECT_EQ(f(x).shape(), (Shape{2, 3}));
  expect_same_bits(f(x).to_vector<float>(), want);
}

TEST(Simplify, ExactIdentitiesDisappear) {
  test::fresh_engine();
  auto x = from_vector(specials(), {8});
  auto f = [](const Tensor& t) { return -(-((t * 1.0) / 1.0)) - 0.0; };
  auto p = test::compile_for_cpu(test::graph_of(f(x)));
  EXPECT_EQ(p.instrs.size(), 1u) << "only the view of the input is left\n" << ir::to_text(p);
  EXPECT_EQ(p.instrs[0].op, ir::Op::Reshape) << ir::to_text(p);
  // In IEEE arithmetic each step is an identity, -0 and NaN included: the input's bits.
  expect_same_bits(f(x).to_vector<float>(), specials());
}

TEST(Simplify, AddingZeroStays) {
  test::fresh_engine();
  auto x = from_vector(specials(), {8});
  auto f = [](const Tensor& t) { return t + 0.0; };  // -0 + 0 is +0: not an identity
  auto p = test::compile_for_cpu(test::graph_of(f(x)));
  EXPECT_GE(p.instrs.size(), 1u);
  EXPECT_NE(p.instrs.back().op, ir::Op::Reshape) << ir::to_text(p);
  std::vector<float> want = specials();
  for (float& w : want) w = w + 0.0f;
  expect_same_bits(f(x).to_vector<float>(), want);
  EXPECT_FALSE(std::signbit(f(x).to_vector<float>()[0]));
}

// Autocast's attention heads: a matmul's bfloat16 result widened, split into heads and
// transposed, then rounded back for the next matmul. The widening cast sinks below the
// reshape and the transpose (widen.h's move_casts_across_movement) and cancels against the rounding:
// the transpose moves the bfloat16 values, and no cast is left.
TEST(Simplify, AWideningCastSinksBelowMovementAndCancelsAgainstTheRoundingBack) {
  test::fresh_engine();
  std::vector<float> v(4 * 6 * 8);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 0.7f) * 5.0f;
  auto x = from_vector(v, {4, 6, 8}).to(DType::BFloat16);
  mark_step();
  auto heads = permute(reshape(x.to(DType::Float32), {4, 6, 2, 4}), {0, 2, 1, 3});
  auto y = heads.to(DType::BFloat16);
  auto p = test::compile_for_cpu(test::graph_of(y));
  EXPECT_EQ(test::count_instrs(p, ir::Op::Cast), 0) << ir::to_text(p);
  int fused = 0;
  for (const auto& in : p.instrs) fused += in.fusion != nullptr;
  EXPECT_EQ(fused, 0) << ir::to_text(p);
  ASSERT_EQ(test::count_instrs(p, ir::Op::Permute), 1) << ir::to_text(p);
  for (const auto& in : p.instrs) {
    if (in.op != ir::Op::Permute) continue;
    EXPECT_EQ(in.dtype, DType::BFloat16) << ir::to_text(p);
  }
  // The values: x's bfloat16 values in the transposed order.
  auto xv = x.to(DType::Float32).to_vector<float>();
  auto got = y.to(DType::Float32).to_vector<float>();
  ASSERT_EQ(got.size(), xv.size());
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t s = 0; s < 6; ++s)
        for (int64_t d = 0; d < 4; ++d)
          EXPECT_EQ(got[static_cast<std::size_t>(((b * 2 + h) * 6 + s) * 4 + d)],
                    xv[static_cast<std::size_t>((b * 6 + s) * 8 + h * 4 + d)]);
  // A float32 reader of the heads still gets them widened, after the transpose.
  auto z = heads * 2.0;
  auto q = test::compile_for_cpu(test::graph_of(z));
  for (const auto& in : q.instrs) {
    if (in.op != ir::Op::Permute) continue;
    EXPECT_EQ(in.dtype, DType::BFloat16) << ir::to_text(q);
  }
}

// A rounding to bfloat16 after a reshape rises above it (move_casts_across_movement): the
// fusion computing the float value stores it rounded, and no float32 copy is written and read
// back (a decoder's logits gradient, [B*S, V] reshaped to [B, S, V] for the head's matmuls).
TEST(Simplify, ARoundingRisesAboveAReshapeIntoTheFusionBeforeIt) {
  test::fresh_engine();
  std::vector<float> v(6 * 8);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 0.9f) * 7.0f;
  auto x = from_vector(v, {6, 8});
  auto y = reshape(x * 3.0, {2, 3, 8}).to(DType::BFloat16);
  auto p = test::compile_for_cpu(test::graph_of(y));
  int fused = 0;
  for (const auto& in : p.instrs) {
    if (!in.fusion) continue;
    ++fused;
    EXPECT_EQ(in.dtype, DType::BFloat16) << "no float32 result is stored\n" << ir::to_text(p);
  }
  EXPECT_EQ(fused, 1) << ir::to_text(p);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 8}));
  auto got = y.to(DType::Float32).to_vector<float>();
  ASSERT_EQ(got.size(), v.size());
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(got[i], round_to_bfloat16(v[i] * 3.0f)) << i;
}

// An elementwise value made an alias of itself (x * 1, as an optimizer's dampening of 0 does
// to a gradient: a Reshape to the same shape) is read through the alias by its elementwise
// reader: the two fuse, and the value is not stored.
TEST(Simplify, AnAliasDoesNotKeepTwoElementwiseChainsApart) {
  test::fresh_engine();
  std::vector<float> v(4096), m(4096);
  for (int i = 0; i < 4096; ++i) v[i] = std::sin(0.1f * static_cast<float>(i)), m[i] = 0.25f * v[i];
  auto g = from_vector(v, {64, 64});
  auto p = from_vector(m, {64, 64});
  auto buf = from_vector(v, {64, 64});
  mark_step();
  auto d = (g + p * 0.01) * 1.0;
  auto next = buf * 0.9 + d;
  auto program = test::compile_for_cpu(test::graph_of(next));
  int fused = 0;
  for (const auto& in : program.instrs) fused += in.fusion != nullptr;
  EXPECT_EQ(fused, 1) << ir::to_text(program);
  const auto got = next.to_vector<float>();
  for (int i = 0; i < 4096; ++i) {  // (the fused code may contract a multiply and add)
    const double want = v[i] * 0.9 + (v[i] + m[i] * 0.01);
    EXPECT_NEAR(got[i], want, 1e-6 * (1 + std::abs(want))) << i;
  }
}

}  // namespace
}  // namespace loom
