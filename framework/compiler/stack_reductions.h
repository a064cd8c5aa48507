// Sibling reductions in one pass.
//
// Sums (or means) that reduce operands of one shape over the same axes (fused prologues, or a
// stored float tensor read through a copy step), where none depends on another and they read a
// whole-size operand in common, become one instruction:
// a Sum or Mean whose `fusion` and `stacked` prologues are reduced side by side, result
// [k, reduced shape...], followed per original by a Slice of its row and a Reshape back to
// its shape. A BatchNorm backward's sum(g) and sum(g * centered) read the gradient and the
// input once between them instead of once each; the kernel evaluates each prologue over the
// same piece of the operands while it is in cache (kernels_reduce.cpp).
//
// Only where the target's `stack_reductions` says its kernel reads such a group together (a
// CPU column sum over channels-last rows), at most kMaxStacked at a time. The stacked sum folds
// every element exactly as each reduction alone does, so results do not change. Assumes
// fuse_reduce_prologue ran. The stacked instruction runs as early as it may: once every
// member's operands are computed, which must come before any member is read.
#pragma once

#include "ir/program.h"
#include "ir/target.h"

namespace loom::compiler {

inline constexpr int kMaxStacked = 4;

ir::Program stack_reductions(ir::Program p, const ir::Target& target);

}  // namespace loom::compiler
