#include "runtime/cpu/gemm.h"

#include "runtime/cpu/conv/conv_common.h"

#include <Eigen/Core>

#include <algorithm>

namespace loom::runtime {
namespace {

using Index = Eigen::Index;

// Eigen's blocking (the kc x mc panel of A and kc x nc block of B that its kernel packs),
// sized by Eigen's own cache model, with the packing buffers in this thread's scratch. Eigen
// runs a row-major product as the column-major product of the transposes, so "A" here is the
// transposed problem's left operand: our B.
template <class T>
class ScratchBlocking : public Eigen::internal::level3_blocking<T, T> {
 public:
  ScratchBlocking(Index m, Index n, Index k) {
    this->m_mc = n;
    this->m_nc = m;
    this->m_kc = k;
    Eigen::internal::computeProductBlockingSizes<T, T, 1, Index>(this->m_kc, this->m_mc,
                                                                 this->m_nc, Index(1));
    this->m_blockA = scratch<T>(this->m_mc * this->m_kc, Scratch::kGemmA);
    this->m_blockB = scratch<T>(this->m_kc * this->m_nc, Scratch::kGemmB);
  }
};

template <class T, int AOrder, int BOrder>
void gemm_ordered(Index m, Index n, Index k, const T* a, Index lda, const T* b, Index ldb, T* c,
                  Index ldc) {
  ScratchBlocking<T> blocking(m, n, k);
  Eigen::internal::general_matrix_matrix_product<Index, T, AOrder, false, T, BOrder, false,
                                                 Eigen::RowMajor, 1>::run(m, n, k, a, lda, b, ldb,
                                                                          c, 1, ldc, T(1),
                                                                          blocking, nullptr);
}

// Tiny products, coefficient by coefficient, each a sum over k in order: the same bits
// whichever operand is stored transposed (Eigen's coefficient-based product vectorises the
// dot products of contiguous rows only, so a^T b and a b differed in the last bits, and a
// folded transpose gave other values than a materialised one).
template <class T>
void gemm_tiny(bool ta, bool tb, Index m, Index n, Index k, const T* a, Index lda, const T* b,
               Index ldb, T* c, Index ldc) {
  for (Index i = 0; i < m; ++i)
    for (Index j = 0; j < n; ++j) {
      T acc = 0;
      for (Index p = 0; p < k; ++p)
        acc += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] += acc;
    }
}

// The product as an Eigen expression, for matrix-vector products (Eigen's GEMV kernels),
// which Eigen does not pack.
template <class T>
void gemm_expression(bool ta, bool tb, Index m, Index n, Index k, const T* a, Index lda,
                     const T* b, Index ldb, T* c, Index ldc) {
  using Stride = Eigen::OuterStride<>;
  StridedMap<T> cm(c, m, n, Stride(ldc));
  const ConstStridedMap<T> am(a, ta ? k : m, ta ? m : k, Stride(lda));
  const ConstStridedMap<T> bm(b, tb ? n : k, tb ? k : n, Stride(ldb));
  auto run = [&](const auto& x, const auto& y) { cm.noalias() += x * y; };
  if (!ta && !tb) run(am, bm);
  else if (!ta) run(am, bm.transpose());
  else if (!tb) run(am.transpose(), bm);
  else run(am.transpose(), bm.transpose());
}

}  // namespace

template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (!accumulate)
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
  if (k <= 0) return;
  // Eigen's own cut-overs: to a coefficient-based product below
  // EIGEN_GEMM_TO_COEFFBASED_THRESHOLD, to GEMV for one row or column.
  if (m + n + k < 20) {
    gemm_tiny(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  if (m == 1 || n == 1) {
    gemm_expression(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  // A stored transposed is the [m, k] operand read column-major; likewise B.
  if (!ta && !tb) gemm_ordered<T, R, R>(m, n, k, a, lda, b, ldb, c, ldc);
  else if (!ta) gemm_ordered<T, R, C>(m, n, k, a, lda, b, ldb, c, ldc);
  else if (!tb) gemm_ordered<T, C, R>(m, n, k, a, lda, b, ldb, c, ldc);
  else gemm_ordered<T, C, C>(m, n, k, a, lda, b, ldb, c, ldc);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t,
                          const float*, int64_t, float*, int64_t, bool);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                           const double*, int64_t, double*, int64_t, bool);

}  // namespace loom::runtime
