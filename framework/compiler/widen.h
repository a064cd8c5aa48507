// Widening: bfloat16 arithmetic the device does not run in bfloat16 is done in float32.
//
// For each instruction that reads or produces bfloat16 and whose op the target does not run
// at bfloat16 (ir::Target::runs), the bfloat16 operands are cast to float32, the op runs in
// float32, and a bfloat16 result is cast back:
//
//   %3 = Add bf16 (%1, %2)   →   %a = Cast f32 (%1); %b = Cast f32 (%2); %c = Add f32 (%a, %b);
//                                %3 = Cast bf16 (%c)
//
// This is what bfloat16 means for an elementwise op or a reduction in PyTorch too: compute in
// float32, round the result once. The casts are elementwise, so fuse_elementwise folds them
// into the neighbouring kernels: a chain of bfloat16 ops becomes one float32 fusion that
// rounds after each op and loads and stores bfloat16. An operand cast once serves every
// reader. Runs before the support check; a program without bfloat16 is returned unchanged.
#pragma once

#include "ir/program.h"
#include "ir/target.h"

namespace loom::compiler {

ir::Program widen_bfloat16(ir::Program p, const ir::Target& target);

// Moves casts across the data movement next to them, so that movement copies bfloat16 and
// the casts meet the ops they fuse into or cancel against, where the target moves bfloat16:
// - A widening cast of a bfloat16 value (to float32 or float64) sinks below the Reshape,
//   Permute or Slice that reads it:
//     %2 = Cast f32 (%1 bf16); %3 = Permute f32 (%2)  →  %a = Permute bf16 (%1); %3 = Cast f32 (%a)
//   Under autocast, a matmul's bfloat16 output reshaped and transposed into attention heads so
//   reaches the next matmul without a float32 copy (the cast cancels against the rounding back
//   to bfloat16, simplify.h).
// - A rounding to bfloat16 of a Permute's or Reshape's result rises above it:
//     %2 = Permute f32 (%1); %3 = Cast bf16 (%2)  →  %a = Cast bf16 (%1); %3 = Permute bf16 (%a)
//   Under autocast, a Linear layer's float32 master weight, transposed and rounded, is so
//   rounded in its own layout, and the transpose folds into the matmul (fold_transpose.h); the
//   same for k^T in attention, whose rounding fuses into the rotary embedding before it. A
//   rounding after a Reshape joins the fusion that computes the float value (a decoder's
//   logits gradient, [B*S, V] reshaped to [B, S, V] for the head's matmuls), which then stores
//   bfloat16 instead of a float32 copy read once more.
// Exact (the rounding of each element does not depend on where it is moved). The original
// cast or permute stays for its other readers; dead_code.cpp removes it when there are none.
ir::Program move_casts_across_movement(ir::Program p, const ir::Target& target);

// Where a float value is exactly a bfloat16 value (a widened bfloat16, and what relu, neg,
// abs, max, min, where and movement make of such values) and is both rounded to bfloat16 and
// read by other instructions, those readers read the rounding widened back instead, the same
// values:
//   %2 = Relu f32 (%1); %3 = Cast bf16 (%2); %4 = Add f32 (%2, %x)
//     →  %2 = Relu f32 (%1); %a = Cast bf16 (%2); %b = Cast f32 (%a); %4 = Add f32 (%b, %x)
// (%3, now a round trip of %a, is %a after simplify.h). Under autocast a residual block's
// ReLU over its bfloat16 sum is rounded for the next conv and also read by the next residual
// add and by the backward's mask; those then load the stored rounding, and the sum is
// computed inside the rounding's fusion instead of being stored for them (fuse_elementwise.h).
// Exact but for a signalling NaN, which the rounding makes quiet.
ir::Program read_exact_roundings(ir::Program p);

}  // namespace loom::compiler
