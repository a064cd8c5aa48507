// Algebraic simplification.
//
// Rewrites instructions whose value is already computed elsewhere into aliases (a Reshape to
// the same shape, which the backend runs as a shared view of its operand's memory):
//   permute(permute(x))    one permute with the composed permutation, or x itself
//   reshape(reshape(x))    one reshape of x
//   permute, expand, cast  to x's own shape and dtype: x
//   cast to bf16(cast to float(x)), x bfloat16: x (the round trip is exact)
//   neg(neg(x)), x * 1, 1 * x, x / 1, x - 0: x
// So a weight transposed in a Linear layer's forward and transposed back in its input
// gradient is read as it is stored. An instruction reading such an alias (a Reshape to its
// operand's own shape) reads the operand instead, so the alias does not stand between an
// elementwise producer and its reader when they fuse. Producers left unread are removed by
// dead_code.cpp.
//
// Every rewrite is exact in IEEE arithmetic (x + 0 is not rewritten: -0 + 0 is +0). Assumes
// lowering's program: instructions in topological order, constants as Constant instructions
// reached through Reshape and Expand.
#pragma once

#include "ir/program.h"

namespace loom::compiler {

ir::Program simplify(ir::Program p);

}  // namespace loom::compiler
