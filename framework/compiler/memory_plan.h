// Memory planning: every intermediate gets a byte offset in one arena per program, chosen by
// liveness so that values never alive at the same time share memory. The runtime allocates the
// arena once per compiled program and reuses it every step, so a steady-state step asks the
// allocator only for the program's outputs.
//
// Rewrites: sets Instr::arena_offset and Program::arena_bytes. Assumes instructions in
// execution order. A value is alive from the instruction that writes it through its last
// reader, inclusive, so no kernel ever writes over an operand it is reading. Reshape shares its
// operand's memory: the two are one value, alive as long as either is read. Values that leave
// the program (outputs, and what they reshape) escape: they get their own allocation, because
// tensors keep them after the step.
//
// Donation: an escaping result may take over an input's buffer, as an optimizer step's new
// parameters take over the old ones'. The plan lists, per escaping result, the inputs of its
// dtype and size that are dead by then: last read by an earlier instruction, or read by this
// one, a fused elementwise kernel, only element for element (every load of it contiguous over
// the whole result, so each block is read before it is written). The runtime donates the
// first listed input that nothing outside the program holds any more (Instr::donors).
#pragma once

#include "ir/program.h"

namespace loom::compiler {

ir::Program plan_memory(ir::Program program);

}  // namespace loom::compiler
