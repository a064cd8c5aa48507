// Private to the CPU kernels: one GEMM entry point on row-major buffers, for every kernel that
// multiplies matrices (matmul, conv2d on im2col, the conv gradients).
//
//   gemm(false, true, m, n, k, a, k, b, k, c, n, /*accumulate=*/false);  // c = a * b^T
//
// It runs Eigen's blocked GEMM single-threaded (callers split the work across TBB tasks) and
// packs A and B into this thread's scratch (conv_common.h) instead of the buffers Eigen's
// product expressions malloc for each product above 128 KiB of packed data, so a steady
// training step's GEMMs allocate nothing (heap_count.h).
#pragma once

#include <cstdint>

namespace loom::runtime {

// c [m, n] (rows ldc apart) = op(a) * op(b), or += with `accumulate`. a is stored [m, k] (rows
// lda apart), or [k, m] when ta; b is stored [k, n] (rows ldb apart), or [n, k] when tb.
// Instantiated for float and double.
template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate);

}  // namespace loom::runtime
