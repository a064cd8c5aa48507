// Bias adds and activations folded into the GEMM or convolution that produces their operand.
//
// `Add(Matmul, Expand(bias))`, the bias one value per column of the product (a Linear layer's
// bias: [N], reshaped to [1, ..., 1, N] and broadcast over the rows), and `Add(Conv2d,
// Expand(bias))`, the bias one value per output channel ([O] reshaped to [1, O, 1, 1]), become
// one Matmul/Conv2d that takes the bias as a third argument and adds it to each block of its
// result as it writes it (Instr::epilogue). A Relu, Sigmoid, Tanh, Silu, Gelu or GeluTanh that
// is the sum's only reader folds in too. The Matmul may reach the Add through a Reshape that
// keeps its last dimension (a Linear layer on [B, S, K] multiplies [B*S, K] rows).
//
// Assumes it runs before fuse_elementwise, on plain instructions: the Add, the activation and
// the Expand are not fused yet. Folds only where the product (and the Reshape, and the sum
// when an activation folds) has that one reader and is not a program output: autograd reads
// relu's and sigmoid's outputs, which the folded instruction still writes, but silu's and
// gelu's inputs, so their sum stays stored and only the bias folds. The folded instruction
// replaces the last instruction it absorbs, whose slot its readers keep; the rest are left
// dead and removed here. The kernels add, then apply the activation, element by element as
// the elementwise kernels do, so results do not change.
#pragma once

#include "ir/program.h"

namespace loom::compiler {

ir::Program fuse_epilogue(ir::Program p);

}  // namespace loom::compiler
