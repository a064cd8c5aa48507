// The host-side arithmetic of library_ops.cpp (library_layout.h), checked without a GPU: the
// column-major parameters a Matmul hands cuBLASLt, fed to a reference column-major GEMM,
// must reproduce loom's row-major product; and a convolution's operands must be recognised
// as input, weight and output, or rejected.
#include "runtime/cuda/library_layout.h"

#include <loom/error.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace loom::runtime::cuda {
namespace {

// cuBLAS's strided batched GEMM as its documentation defines it, one batch entry at a time:
// C[i + j*ldc] = alpha * sum_p op(A)(i,p) op(B)(p,j) + beta * C[i + j*ldc], column-major, with
// C not read when beta is 0. Reads through at() so that a wrong leading dimension or stride
// fails the test instead of reading past a buffer.
void reference_gemm(bool transa, bool transb, int64_t m, int64_t n, int64_t k, double alpha,
                    const std::vector<double>& a, int64_t lda, int64_t stride_a,
                    const std::vector<double>& b, int64_t ldb, int64_t stride_b, double beta,
                    std::vector<double>& c, int64_t ldc, int64_t stride_c, int64_t batch) {
  auto at = [](const std::vector<double>& v, int64_t i) { return v.at(static_cast<std::size_t>(i)); };
  for (int64_t e = 0; e < batch; ++e) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          double x = transa ? at(a, e * stride_a + p + i * lda) : at(a, e * stride_a + i + p * lda);
          double y = transb ? at(b, e * stride_b + j + p * ldb) : at(b, e * stride_b + p + j * ldb);
          sum += x * y;
        }
        double& out = c.at(static_cast<std::size_t>(e * stride_c + i + j * ldc));
        out = alpha * sum + (beta == 0 ? 0 : beta * out);
      }
    }
  }
}

// Distinct, non-symmetric values, so that a swapped index shows.
std::vector<double> values(int64_t count, double seed) {
  std::vector<double> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(seed + 0.7 * static_cast<double>(i)) + 0.01 * i;
  return v;
}

struct Case {
  Shape batch;
  int64_t M, K, N;
  bool ta, tb;
};

// Runs one case: a and b stored as MatmulAttr says, the row-major product computed directly,
// and again through matmul_layout and the reference GEMM.
void check_case(const Case& c, double alpha = 1, double beta = 0) {
  SCOPED_TRACE(testing::Message() << "batch " << shape_str(c.batch) << " M=" << c.M << " K=" << c.K
                                  << " N=" << c.N << " ta=" << c.ta << " tb=" << c.tb);
  Shape a_shape = c.batch, b_shape = c.batch;
  a_shape.push_back(c.ta ? c.K : c.M);
  a_shape.push_back(c.ta ? c.M : c.K);
  b_shape.push_back(c.tb ? c.N : c.K);
  b_shape.push_back(c.tb ? c.K : c.N);
  const int64_t batch = shape_numel(c.batch);
  const auto a = values(batch * c.M * c.K, 1.0);
  const auto b = values(batch * c.K * c.N, 2.0);
  const auto c0 = values(batch * c.M * c.N, 3.0);

  // The row-major product, straight from the definition (the stored transposes undone by hand).
  std::vector<double> expected(static_cast<std::size_t>(batch * c.M * c.N));
  for (int64_t e = 0; e < batch; ++e)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < c.K; ++p) {
          double x = c.ta ? a[e * c.M * c.K + p * c.M + i] : a[e * c.M * c.K + i * c.K + p];
          double y = c.tb ? b[e * c.K * c.N + j * c.K + p] : b[e * c.K * c.N + p * c.N + j];
          sum += x * y;
        }
        std::size_t o = e * c.M * c.N + i * c.N + j;
        expected[o] = alpha * sum + beta * c0[o];
      }

  MatmulLayout l = matmul_layout(a_shape, b_shape, c.ta, c.tb);
  EXPECT_EQ(l.batch, batch);
  // What cublasLtMatrixLayoutCreate is told must agree with what the GEMM reads.
  EXPECT_EQ(l.a_rows, l.transa ? l.k : l.m);
  EXPECT_EQ(l.a_cols, l.transa ? l.m : l.k);
  EXPECT_EQ(l.b_rows, l.transb ? l.n : l.k);
  EXPECT_EQ(l.b_cols, l.transb ? l.k : l.n);
  EXPECT_GE(l.lda, std::max<int64_t>(1, l.a_rows));
  EXPECT_GE(l.ldb, std::max<int64_t>(1, l.b_rows));
  EXPECT_GE(l.ldc, std::max<int64_t>(1, l.m));

  std::vector<double> got = c0;
  // cuBLAS's first operand is loom's b, its second loom's a.
  reference_gemm(l.transa, l.transb, l.m, l.n, l.k, alpha, b, l.lda, l.stride_a, a, l.ldb, l.stride_b,
                 beta, got, l.ldc, l.stride_c, l.batch);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-12) << "element " << i;
}

TEST(LibraryOpsMatmulLayout, PlainProductIsTransposedColumnMajor) {
  MatmulLayout l = matmul_layout({3, 4}, {4, 5}, false, false);
  EXPECT_FALSE(l.transa);
  EXPECT_FALSE(l.transb);
  EXPECT_EQ(l.m, 5);
  EXPECT_EQ(l.n, 3);
  EXPECT_EQ(l.k, 4);
  EXPECT_EQ(l.lda, 5);  // b [4,5] read as 5 x 4
  EXPECT_EQ(l.ldb, 4);  // a [3,4] read as 4 x 3
  EXPECT_EQ(l.ldc, 5);
  EXPECT_EQ(l.batch, 1);
}

TEST(LibraryOpsMatmulLayout, EveryTransposeCombination) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_case({{}, 3, 4, 5, ta, tb});
}

TEST(LibraryOpsMatmulLayout, BatchedEveryTransposeCombination) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({{2, 3}, 3, 4, 5, ta, tb});
      check_case({{1}, 2, 7, 3, ta, tb});
    }
}

TEST(LibraryOpsMatmulLayout, DegenerateSizes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({{2}, 1, 4, 5, ta, tb});  // a row vector
      check_case({{2}, 3, 4, 1, ta, tb});  // a column vector
      check_case({{}, 3, 1, 5, ta, tb});   // an outer product
      check_case({{}, 1, 1, 1, ta, tb});
    }
}

TEST(LibraryOpsMatmulLayout, AlphaAndBeta) {
  check_case({{2}, 3, 4, 5, false, true}, 2.0, 0.5);
  check_case({{2}, 3, 4, 5, true, false}, -1.5, 1.0);
}

TEST(LibraryOpsMatmulLayout, EmptySumKeepsValidLeadingDimensions) {
  MatmulLayout l = matmul_layout({2, 3, 0}, {2, 0, 5}, false, false);
  EXPECT_EQ(l.k, 0);
  EXPECT_EQ(l.batch, 2);
  EXPECT_GE(l.lda, 1);
  EXPECT_GE(l.ldb, 1);  // a [3,0] read as 0 x 3: ld still 1
}

TEST(LibraryOpsMatmulLayout, RejectsMismatchedShapes) {
  EXPECT_THROW(matmul_layout({3, 4}, {5, 6}, false, false), Error);     // K differs
  EXPECT_THROW(matmul_layout({4, 3}, {4, 5}, false, false), Error);     // K differs unless ta
  EXPECT_NO_THROW(matmul_layout({4, 3}, {4, 5}, true, false));
  EXPECT_THROW(matmul_layout({4}, {4}, false, false), Error);           // rank 1
  EXPECT_THROW(matmul_layout({2, 3, 4}, {4, 5}, false, false), Error);  // ranks differ
  EXPECT_THROW(matmul_layout({2, 3, 4}, {3, 4, 5}, false, false), Error);  // batches differ
  try {
    matmul_layout({3, 4}, {5, 6}, false, false);
    FAIL() << "expected a loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3,4] and [5,6]"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------

TEST(LibraryOpsConvDims, ForwardAndGradientsNameTheSameTensors) {
  ir::Conv2dAttr conv{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2};
  // input [2,4,7,9], weight [6,2,3,3]: Ho = (7+2-3)/2+1 = 4, Wo = (9-5)/1+1 = 5.
  const Shape x{2, 4, 7, 9}, w{6, 2, 3, 3}, y{2, 6, 4, 5};
  for (ir::Op op : {ir::Op::Conv2d, ir::Op::Conv2dGradInput, ir::Op::Conv2dGradWeight}) {
    const Shape& a = op == ir::Op::Conv2dGradInput ? y : x;
    const Shape& b = op == ir::Op::Conv2dGradWeight ? y : w;
    const Shape& out = op == ir::Op::Conv2d ? y : op == ir::Op::Conv2dGradInput ? x : w;
    ConvDims d = conv_dims(op, a, b, out, conv);
    EXPECT_EQ(d.x, (std::array<int64_t, 4>{2, 4, 7, 9})) << ir::op_name(op);
    EXPECT_EQ(d.w, (std::array<int64_t, 4>{6, 2, 3, 3})) << ir::op_name(op);
    EXPECT_EQ(d.y, (std::array<int64_t, 4>{2, 6, 4, 5})) << ir::op_name(op);
  }
}

TEST(LibraryOpsConvDims, GradInputOfAStridedConvKeepsTheOddSize) {
  // H = 8 and H = 7 both give Ho = 4 with stride 2: the result's size decides.
  ir::Conv2dAttr conv{.stride = {2, 2}, .padding = {1, 1}};
  ConvDims d = conv_dims(ir::Op::Conv2dGradInput, {1, 3, 4, 4}, {3, 3, 3, 3}, {1, 3, 8, 8}, conv);
  EXPECT_EQ(d.x[2], 8);
  d = conv_dims(ir::Op::Conv2dGradInput, {1, 3, 4, 4}, {3, 3, 3, 3}, {1, 3, 7, 7}, conv);
  EXPECT_EQ(d.x[2], 7);
}

TEST(LibraryOpsConvDims, RejectsWhatDoesNotAgree) {
  ir::Conv2dAttr conv;
  EXPECT_THROW(conv_dims(ir::Op::Conv2d, {1, 3, 5, 5}, {4, 3, 3, 3}, {1, 4, 4, 4}, conv), Error);  // Ho is 3
  EXPECT_THROW(conv_dims(ir::Op::Conv2d, {1, 3, 5, 5}, {4, 2, 3, 3}, {1, 4, 3, 3}, conv), Error);  // C/g
  EXPECT_THROW(conv_dims(ir::Op::Conv2d, {1, 3, 5}, {4, 3, 3, 3}, {1, 4, 3, 3}, conv), Error);     // rank
  EXPECT_THROW(conv_dims(ir::Op::Conv2d, {2, 3, 5, 5}, {4, 3, 3, 3}, {1, 4, 3, 3}, conv), Error);  // N
  EXPECT_THROW(conv_dims(ir::Op::Matmul, {1, 3, 5, 5}, {4, 3, 3, 3}, {1, 4, 3, 3}, conv), Error);
  EXPECT_NO_THROW(conv_dims(ir::Op::Conv2d, {1, 3, 5, 5}, {4, 3, 3, 3}, {1, 4, 3, 3}, conv));
  ir::Conv2dAttr grouped{.groups = 2};
  EXPECT_THROW(conv_dims(ir::Op::Conv2d, {1, 4, 5, 5}, {3, 2, 3, 3}, {1, 3, 3, 3}, grouped), Error);  // O % g
}

// Channels-last activations are stored [N,H,W,C]; conv_dims gives their logical [N,C,H,W],
// what cuDNN's descriptors take whatever the format. The weight keeps [O,C/g,kh,kw].
TEST(LibraryOpsConvDims, ChannelsLastActivationsAreReadAsNhwc) {
  ir::Conv2dAttr cl{.stride = {2, 2}, .padding = {1, 1}, .channels_last = true};
  using A = std::array<int64_t, 4>;
  // x [2,3,8,6] stored [2,8,6,3]; w [4,3,3,3]; y [2,4,4,3] stored [2,4,3,4].
  ConvDims d = conv_dims(ir::Op::Conv2d, {2, 8, 6, 3}, {4, 3, 3, 3}, {2, 4, 3, 4}, cl);
  EXPECT_EQ(d.x, (A{2, 3, 8, 6}));
  EXPECT_EQ(d.w, (A{4, 3, 3, 3}));
  EXPECT_EQ(d.y, (A{2, 4, 4, 3}));
  d = conv_dims(ir::Op::Conv2dGradInput, {2, 4, 3, 4}, {4, 3, 3, 3}, {2, 8, 6, 3}, cl);
  EXPECT_EQ(d.x, (A{2, 3, 8, 6}));
  EXPECT_EQ(d.y, (A{2, 4, 4, 3}));
  d = conv_dims(ir::Op::Conv2dGradWeight, {2, 8, 6, 3}, {2, 4, 3, 4}, {4, 3, 3, 3}, cl);
  EXPECT_EQ(d.x, (A{2, 3, 8, 6}));
  EXPECT_EQ(d.w, (A{4, 3, 3, 3}));
  // The NCHW shapes are no channels-last conv: C would be 6, not the weight's 3.
  try {
    conv_dims(ir::Op::Conv2d, {2, 3, 8, 6}, {4, 3, 3, 3}, {2, 4, 4, 3}, cl);
    FAIL() << "expected a loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[N,H,W,C]"), std::string::npos) << e.what();
  }
}

TEST(LibraryOpsConvDims, EmptyBatchIsAccepted) {
  // N = 0: the forward result is empty, the weight gradient a sum over nothing (zeros).
  ir::Conv2dAttr conv;
  EXPECT_NO_THROW(conv_dims(ir::Op::Conv2dGradWeight, {0, 3, 5, 5}, {0, 4, 3, 3}, {4, 3, 3, 3}, conv));
}

}  // namespace
}  // namespace loom::runtime::cuda
