// The transpose-folding pass: a matmul reads a transposed operand in place, and gives the bits
// that multiplying the stored transpose gives.
#include "compiler/pipeline.h"
#include "test_util.h"

#include <cmath>

namespace loom {
namespace {

using ir::Program;

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::cos(static_cast<float>(i) * scale);
  return v;
}

int count(const Program& p, ir::Op op) {
  int n = 0;
  for (const auto& in : p.instrs) n += in.op == op;
  return n;
}

// a [.., m, k] and b stored as [.., n, k]: a @ b^T, and (a^T)^T @ b^T with both folded.
void check(const Shape& batch, int64_t m, int64_t k, int64_t n) {
  test::fresh_engine();
  Shape sa = batch, sb = batch, sat = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {n, k});
  sat.insert(sat.end(), {k, m});
  auto a = from_vector(ramp(shape_numel(sa), 0.37f), sa);
  auto b = from_vector(ramp(shape_numel(sb), 0.11f), sb);
  auto at = from_vector(ramp(shape_numel(sat), 0.23f), sat);
  auto y1 = matmul(a, transpose(b, -1, -2));
  auto y2 = matmul(transpose(at, -1, -2), transpose(b, -1, -2));
  auto p1 = test::compile_for_cpu(test::graph_of(y1));
  auto p2 = test::compile_for_cpu(test::graph_of(y2));
  EXPECT_EQ(count(p1, ir::Op::Permute), 0) << ir::to_text(p1);
  EXPECT_EQ(count(p2, ir::Op::Permute), 0) << ir::to_text(p2);
  auto got1 = y1.to_vector<float>(), got2 = y2.to_vector<float>();
  std::vector<float> want1, want2;
  {
    EagerModeGuard eager{true};  // the transposes stored, then a plain GEMM
    want1 = matmul(a, transpose(b, -1, -2)).to_vector<float>();
    want2 = matmul(transpose(at, -1, -2), transpose(b, -1, -2)).to_vector<float>();
  }
  EXPECT_EQ(got1, want1);
  EXPECT_EQ(got2, want2);
  // And against the definition, for the first product.
  const auto av = ramp(shape_numel(sa), 0.37f), bv = ramp(shape_numel(sb), 0.11f);
  const int64_t batches = shape_numel(batch);
  for (int64_t q = 0; q < batches; ++q)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t t = 0; t < k; ++t) s += double(av[(q * m + i) * k + t]) * bv[(q * n + j) * k + t];
        ASSERT_NEAR(got1[(q * m + i) * n + j], s, 1e-4 * (1 + std::abs(s)));
      }
}

TEST(FoldTranspose, TwoDimensionalOperandsAreReadInPlace) { check({}, 37, 29, 41); }

TEST(FoldTranspose, BatchedOperandsAreReadInPlace) { check({2, 3}, 17, 64, 9); }

TEST(FoldTranspose, APermuteOfBatchDimensionsStaysStored) {
  test::fresh_engine();
  auto a = from_vector(ramp(2 * 3 * 4 * 5, 0.3f), {2, 3, 4, 5});
  auto b = from_vector(ramp(3 * 2 * 5 * 6, 0.2f), {3, 2, 5, 6});
  auto y = matmul(a, b.permute({1, 0, 2, 3}));
  auto p = test::compile_for_cpu(test::graph_of(y));
  EXPECT_EQ(count(p, ir::Op::Permute), 1) << ir::to_text(p);
  std::vector<float> want;
  auto got = y.to_vector<float>();
  {
    EagerModeGuard eager{true};
    want = matmul(a, b.permute({1, 0, 2, 3})).to_vector<float>();
  }
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace loom
