// Transposes folded into the matmuls that read them.
//
// A Matmul operand made by a Permute that swaps the last two dimensions and keeps the batch
// dimensions in place (a weight's transpose in a Linear layer, x^T and W^T in their
// gradients, k^T in attention) is read in place instead: the Matmul takes the Permute's source
// and sets MatmulAttr's transpose_a or transpose_b, and the kernel hands Eigen a transposed view,
// whose packing reads either layout at the same cost. The Permute stays for any other reader;
// dead_code.cpp drops it when the matmuls were its only readers.
//
// Assumes Matmul instructions come from lowering with neither transpose set. The product is the same
// GEMM over the same packed blocks, so results do not change.
#pragma once

#include "ir/program.h"

namespace loom::compiler {

ir::Program fold_transpose(ir::Program p);

}  // namespace loom::compiler
