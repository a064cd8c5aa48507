// The transpose-folding pass: a matmul reads a transposed operand in place, and gives the bits
// that multiplying the stored transpose gives; a bfloat16 product's transpose is computed as
// the swapped product; a float32 weight transposed and rounded to bfloat16 is rounded in place
// (widen.h) and read transposed.
#include "compiler/pipeline.h"
#include <loom/autocast.h>
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
  EXPECT_EQ(test::count_instrs(p1, ir::Op::Permute), 0) << ir::to_text(p1);
  EXPECT_EQ(test::count_instrs(p2, ir::Op::Permute), 0) << ir::to_text(p2);
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
  EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 1) << ir::to_text(p);
  std::vector<float> want;
  auto got = y.to_vector<float>();
  {
    EagerModeGuard eager{true};
    want = matmul(a, b.permute({1, 0, 2, 3})).to_vector<float>();
  }
  EXPECT_EQ(got, want);
}

// Whether the CPU runs bfloat16 matmuls as such (on oneDNN, with AVX512_BF16 or AMX); without,
// the compiler widens them to float32 and the rewrites below have no bfloat16 product to see.
bool native_bfloat16_matmul() {
  return runtime::backend(Device{}).target().runs(ir::Op::Matmul, DType::BFloat16);
}

// The product of a [.., m, k] and b [.., k, n] (float32 values), from the definition.
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b,
                            int64_t batches, int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(static_cast<std::size_t>(batches * m * n), 0.0);
  for (int64_t q = 0; q < batches; ++q)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t t = 0; t < k; ++t)
        for (int64_t j = 0; j < n; ++j)
          c[(q * m + i) * n + j] += double(a[(q * m + i) * k + t]) * b[(q * k + t) * n + j];
  return c;
}

// bfloat16 results: within a rounding (2^-8 relative) plus float32 accumulation.
void expect_near_bfloat16(double got, double want, double scale) {
  EXPECT_NEAR(got, want, 8e-3 * std::abs(want) + 1e-5 * scale);
}

// transpose(a @ b) in bfloat16, a [.., m, k], b [.., k, n]: one matmul b^T a^T, no permute.
void check_transposed_product(const Shape& batch, int64_t m, int64_t k, int64_t n) {
  test::fresh_engine();
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  auto a = from_vector(ramp(shape_numel(sa), 0.37f), sa).to(DType::BFloat16);
  auto b = from_vector(ramp(shape_numel(sb), 0.11f), sb).to(DType::BFloat16);
  mark_step();
  auto y = transpose(matmul(a, b), -1, -2);
  auto p = test::compile_for_cpu(test::graph_of(y));
  if (native_bfloat16_matmul()) {
    EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 0) << ir::to_text(p);
    ASSERT_EQ(test::count_instrs(p, ir::Op::Matmul), 1) << ir::to_text(p);
    for (const auto& in : p.instrs)
      if (in.op == ir::Op::Matmul) {
        EXPECT_TRUE(in.attr.get<ir::MatmulAttr>().transpose_a) << ir::to_text(p);
        EXPECT_TRUE(in.attr.get<ir::MatmulAttr>().transpose_b) << ir::to_text(p);
      }
  }
  const int64_t batches = shape_numel(batch);
  const auto want = product(a.to(DType::Float32).to_vector<float>(),
                            b.to(DType::Float32).to_vector<float>(), batches, m, k, n);
  const auto got = y.to(DType::Float32).to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  for (int64_t q = 0; q < batches; ++q)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i)
        expect_near_bfloat16(got[(q * n + j) * m + i], want[(q * m + i) * n + j],
                             static_cast<double>(k));
}

TEST(FoldTranspose, ATransposedBfloat16ProductIsTheSwappedProduct) {
  check_transposed_product({}, 48, 40, 24);
}

TEST(FoldTranspose, ATransposedBatchedBfloat16ProductIsTheSwappedProduct) {
  check_transposed_product({2, 3}, 16, 32, 8);
}

// The product has another reader, or is float32: it is computed once, as it is, and transposed
// (float32 keeps eager mode's bits).
TEST(FoldTranspose, AProductReadElsewhereOrInFloat32KeepsItsTranspose) {
  test::fresh_engine();
  auto a = from_vector(ramp(24 * 40, 0.37f), {24, 40});
  auto b = from_vector(ramp(40 * 16, 0.11f), {40, 16});
  auto ab = a.to(DType::BFloat16), bb = b.to(DType::BFloat16);
  mark_step();
  auto shared = matmul(ab, bb);
  auto p = test::compile_for_cpu(
      ir::build_graph({transpose(shared, 0, 1).impl()->pending(), (shared * 2.0).impl()->pending()}));
  EXPECT_EQ(test::count_instrs(p, ir::Op::Matmul), 1) << ir::to_text(p);
  EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 1) << ir::to_text(p);
  auto y = transpose(matmul(a, b), 0, 1);
  auto q = test::compile_for_cpu(test::graph_of(y));
  EXPECT_EQ(test::count_instrs(q, ir::Op::Permute), 1) << ir::to_text(q);
  const auto got = y.to_vector<float>();
  std::vector<float> want;
  {
    EagerModeGuard eager{true};
    want = transpose(matmul(a, b), 0, 1).to_vector<float>();
  }
  EXPECT_EQ(got, want);
}

// Autocast's Linear layer: x @ w^T with w a float32 master weight, the transpose rounded to
// bfloat16 for the matmul. The rounding moves above the transpose, so w is rounded in its own
// layout and the matmul reads it transposed: no permute is left.
TEST(FoldTranspose, ARoundedTransposedWeightIsRoundedInPlaceAndReadTransposed) {
  test::fresh_engine();
  const int64_t m = 32, k = 48, n = 24;
  auto x = from_vector(ramp(m * k, 0.37f), {m, k});
  auto w = from_vector(ramp(n * k, 0.11f), {n, k});
  mark_step();
  auto y = matmul(x.to(DType::BFloat16), transpose(w, 0, 1).to(DType::BFloat16));
  auto p = test::compile_for_cpu(test::graph_of(y));
  if (native_bfloat16_matmul()) {
    EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 0) << ir::to_text(p);
    for (const auto& in : p.instrs)
      if (in.op == ir::Op::Matmul) {
        EXPECT_FALSE(in.attr.get<ir::MatmulAttr>().transpose_a) << ir::to_text(p);
        EXPECT_TRUE(in.attr.get<ir::MatmulAttr>().transpose_b) << ir::to_text(p);
      }
  }
  // Against the definition, over the bfloat16 roundings of x and w.
  auto xr = x.to(DType::BFloat16).to(DType::Float32).to_vector<float>();
  auto wr = w.to(DType::BFloat16).to(DType::Float32).to_vector<float>();
  std::vector<float> wt(static_cast<std::size_t>(k * n));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < k; ++t) wt[t * n + j] = wr[j * k + t];
  const auto want = product(xr, wt, 1, m, k, n);
  const auto got = y.to(DType::Float32).to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    expect_near_bfloat16(got[i], want[i], static_cast<double>(k));
}

// A Linear layer under autocast, trained: its weight gradient x^T dy comes out of the matmul
// in the weight's own layout, and its forward reads the rounded weight transposed. No
// transpose is left in the step, though the fusion pass leaves readers of the products it
// absorbed behind for dead_code.cpp.
TEST(FoldTranspose, AnAutocastLinearsStepHasNoTranspose) {
  test::fresh_engine();
  const int64_t m = 64, k = 48, n = 40;
  auto x = from_vector(ramp(m * k, 0.37f), {m, k});
  auto w = from_vector(ramp(n * k, 0.11f), {n, k}).requires_grad_();
  mark_step();
  {
    Autocast bf16;
    auto y = matmul(x, transpose(w, 0, 1));
    (y * y).sum().backward();
  }
  auto p = test::compile_for_cpu(ir::build_graph({w.grad().impl()->pending()}));
  if (native_bfloat16_matmul()) {
    EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 0) << ir::to_text(p);
  }
  EXPECT_EQ(test::count_instrs(p, ir::Op::Matmul), 2) << ir::to_text(p);
  // d/dw sum((x w^T)^2) = 2 (x w^T)^T x, from the bfloat16 roundings.
  auto xr = x.to(DType::BFloat16).to(DType::Float32).to_vector<float>();
  auto wr = w.detach().to(DType::BFloat16).to(DType::Float32).to_vector<float>();
  std::vector<float> wt(static_cast<std::size_t>(k * n));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < k; ++t) wt[t * n + j] = wr[j * k + t];
  const auto y = product(xr, wt, 1, m, k, n);
  const auto got = w.grad().to_vector<float>();
  ASSERT_EQ(got.size(), static_cast<std::size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < k; ++t) {
      double want = 0, scale = 0;
      for (int64_t r = 0; r < m; ++r) {
        want += 2.0 * y[r * n + j] * xr[r * k + t];
        scale += std::abs(2.0 * y[r * n + j] * xr[r * k + t]);
      }
      // dy = 2y is rounded to bfloat16 before the product: 2^-8 of each term.
      EXPECT_NEAR(got[j * k + t], want, 8e-3 * scale + 1e-4) << j << "," << t;
    }
}

}  // namespace
}  // namespace loom
