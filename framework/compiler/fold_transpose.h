// Transposes folded into the matmuls that make or read them.
//
// A Permute that swaps the last two dimensions and keeps the batch dimensions in place is a
// transpose. Two folds, in this order:
// - A transpose of a bfloat16 Matmul's result, when it is the product's only reader and the
//   product has no epilogue, becomes the transposed product: (A B)^T = B^T A^T, the operands swapped and
//   read transposed. A weight gradient computed as x^T dy in the transposed layout of a
//   Linear's weight is so written in the weight's own layout, without a copy.
// - A Matmul operand made by a transpose (a weight's transpose in a Linear layer, x^T and W^T
//   in their gradients, k^T in attention) is read in place instead: the Matmul takes the
//   transpose's source and flips MatmulAttr's transpose_a or transpose_b, and the kernel reads
//   the operand stored transposed (Eigen and oneDNN pack either layout at the same cost).
// A Permute left unread is dropped by dead_code.cpp; it stays for any other reader.
//
// On Eigen's path (a product below oneDNN's size, runtime/cpu/kernels_compute.cpp) the second
// fold is the same GEMM over the same packed blocks, so results do not change. oneDNN, handed
// the operand's transposed strides, may block its sums otherwise than for the stored
// transpose: there a float32 or float64 product can differ from eager mode's (which stores the
// transpose first) in the last bits (a 128^3 float32 product: most elements, by an ulp or so).
// The first fold sums each element's dot product in oneDNN's order for the swapped shape
// (float32 and float64 products are not swapped).
#pragma once

#include "ir/program.h"

namespace loom::compiler {

ir::Program fold_transpose(ir::Program p);

}  // namespace loom::compiler
