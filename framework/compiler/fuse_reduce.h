// Reductions with a fused elementwise prologue.
//
// A Sum, Mean or Max whose operand is a fused elementwise instruction that nothing else reads
// takes that fusion as its prologue (Instr::fusion on the reduction, whose args become the
// fusion's operands): the reduction kernel evaluates it run by run as it folds, so the operand
// never goes to memory. BatchNorm's variance, the softmax denominator and cross-entropy, and
// gradient norms all reduce such chains.
//
// Assumes fuse_elementwise ran. Each element is still folded exactly once and in the same
// order as with the operand in memory, so results do not change.
#pragma once

#include "ir/program.h"

namespace loom::compiler {

ir::Program fuse_reduce_prologue(ir::Program p);

}  // namespace loom::compiler
