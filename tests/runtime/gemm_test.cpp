// gemm.h: every transpose combination, overwrite and accumulate, strided rows, and the sizes
// on each side of the cut-over to Eigen's coefficient-based product, against a plain triple
// loop in double precision.
#include "runtime/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace loom::runtime {
namespace {

struct Case {
  int64_t m, n, k;
};

template <class T>
void check(bool ta, bool tb, bool accumulate, Case c) {
  const int64_t pad = 3;  // rows wider than the matrix, to exercise the leading dimensions
  const int64_t a_rows = ta ? c.k : c.m, a_cols = ta ? c.m : c.k;
  const int64_t b_rows = tb ? c.n : c.k, b_cols = tb ? c.k : c.n;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = c.n + pad;
  std::mt19937 rng(static_cast<unsigned>(c.m * 131 + c.n * 17 + c.k + ta * 2 + tb));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> a(a_rows * lda), b(b_rows * ldb), out(c.m * ldc);
  for (auto& v : a) v = static_cast<T>(u(rng));
  for (auto& v : b) v = static_cast<T>(u(rng));
  for (auto& v : out) v = static_cast<T>(u(rng));
  const std::vector<T> start = out;
  gemm<T>(ta, tb, c.m, c.n, c.k, a.data(), lda, b.data(), ldb, out.data(), ldc, accumulate);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double want = accumulate ? double(start[i * ldc + j]) : 0.0;
      for (int64_t p = 0; p < c.k; ++p)
        want += double(ta ? a[p * lda + i] : a[i * lda + p]) *
                double(tb ? b[j * ldb + p] : b[p * ldb + j]);
      const double tol = (sizeof(T) == 4 ? 2e-5 : 1e-12) * (1 + std::sqrt(double(c.k)));
      ASSERT_NEAR(out[i * ldc + j], want, tol)
          << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << ta << " tb=" << tb
          << " accumulate=" << accumulate << " at (" << i << ", " << j << ")";
    }
  // Padding between rows is never written.
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < ldc; ++j) ASSERT_EQ(out[i * ldc + j], start[i * ldc + j]);
}

TEST(Gemm, MatchesATripleLoop) {
  const Case cases[] = {{1, 1, 1},  {3, 4, 5},   {1, 40, 33},  {40, 1, 33}, {7, 9, 0},
                        {64, 48, 80}, {130, 70, 300}, {5, 300, 700}, {257, 129, 65}};
  for (Case c : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool acc : {false, true}) {
          check<float>(ta, tb, acc, c);
          check<double>(ta, tb, acc, c);
        }
}

}  // namespace
}  // namespace loom::runtime
