// Dead-code elimination on a Program: drops instructions whose result no output needs.
//
// Graphs hold only what their roots reach, so lowering leaves nothing dead; passes that fold
// an instruction into its readers (fusion folds constants and broadcasts) do, and run this
// after them. Inputs stay: they are bound by position.
#pragma once

#include "ir/program.h"

#include <vector>

namespace loom::compiler {

ir::Program eliminate_dead_code(ir::Program p);

// Per slot, whether an output needs it (the instructions eliminate_dead_code keeps, and every
// input they read).
std::vector<bool> live_slots(const ir::Program& p);

}  // namespace loom::compiler
