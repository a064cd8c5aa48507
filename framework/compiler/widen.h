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

// Moves the widening casts of bfloat16 values (Cast to float32 or float64) below the data
// movement that reads them (Reshape, Permute, Slice), where the target moves bfloat16:
//
//   %2 = Cast f32 (%1 bf16); %3 = Permute f32 (%2)  →  %a = Permute bf16 (%1); %3 = Cast f32 (%a)
//
// The movement then copies 2-byte elements, and the cast, now next to the elementwise ops and
// matmuls that read it, fuses into them or cancels against a rounding back to bfloat16
// (simplify.h): under autocast, a matmul's bfloat16 output reshaped and transposed into
// attention heads reaches the next matmul without a float32 copy. Exact (a widening cast
// changes no value). The original cast stays for its other readers; dead_code.cpp removes it
// when there are none.
ir::Program sink_widening_casts(ir::Program p, const ir::Target& target);

}  // namespace loom::compiler
