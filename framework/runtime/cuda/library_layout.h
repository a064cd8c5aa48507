// How library_ops.cpp hands loom's row-major operands to cuBLASLt and cuDNN, as plain numbers
// worked out on the host. Kept apart from library_ops.h, which includes the CUDA headers, so a
// test can check the arithmetic without the toolkit's include path or a GPU:
//
//   // [2, 3, 4] x [2, 4, 5] -> [2, 3, 5]
//   MatmulLayout l = matmul_layout({2, 3, 4}, {2, 4, 5}, false, false);
//   // l.m == 5, l.n == 3, l.k == 4, l.batch == 2: cuBLAS computes C^T = B^T A^T
#pragma once

#include "ir/attr.h"
#include "ir/op.h"

#include <loom/dtype.h>

#include <array>
#include <cstdint>

namespace loom::runtime::cuda {

// A row-major product C[M,N] = A[M,K] B[K,N] as cuBLAS's column-major
// D[m,n] = op(A')[m,k] op(B')[k,n]. A row-major [r,c] matrix is, read column-major, its
// transpose [c,r] with leading dimension c, so C is C^T = B^T A^T: cuBLAS's first operand A'
// is loom's b, its second B' is loom's a, and m = N, n = M. An operand stored transposed
// (MatmulAttr) is already the transpose cuBLAS wants and is read with op = T.
struct MatmulLayout {
  bool transa = false, transb = false;  // op(A'), op(B'): true = CUBLAS_OP_T
  int64_t m = 0, n = 0, k = 0;
  // Leading dimensions of A', B' and C as stored (column-major, before op): at least 1.
  int64_t lda = 1, ldb = 1, ldc = 1;
  // Rows and columns of A' and B' as stored, what cublasLtMatrixLayoutCreate takes.
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  int64_t batch = 1;  // the product of the batch dimensions
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements from one batch entry to the next
};

// The layout of Matmul `a` x `b` (loom's operand shapes as stored, MatmulAttr's transposes).
// Throws loom::Error naming the shapes when they are no [B..., M, K] x [B..., K, N] product.
MatmulLayout matmul_layout(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b);

// The three tensors of a convolution, whichever of Conv2d, Conv2dGradInput and
// Conv2dGradWeight computes which: x the input [N,C,H,W], w the weight [O,C/g,kh,kw], y the
// output [N,O,Ho,Wo].
struct ConvDims {
  std::array<int64_t, 4> x{}, w{}, y{};
};

// The tensors of convolution instruction `op` with operands `a`, `b` and result `out` (the
// operand conventions of ir/op.h), checked against each other and `conv`: the output size
// follows from the input, the kernel, stride, padding and dilation. Channels-last activations
// (conv.channels_last, stored [N,H,W,C]) are given by their logical [N,C,H,W] dimensions.
// Throws loom::Error naming the op and the shapes when they disagree.
ConvDims conv_dims(ir::Op op, const Shape& a, const Shape& b, const Shape& out,
                   const ir::Conv2dAttr& conv);

}  // namespace loom::runtime::cuda
