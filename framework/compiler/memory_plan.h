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
#pragma once

#include "compiler/program.h"

namespace loom::compiler {

Program plan_memory(Program program);

}  // namespace loom::compiler
