// Memory planning by liveness: each instruction lists the slots whose last reader it is, so
// the runtime returns their memory to the allocator as soon as they are dead. Graph inputs
// (owned by their tensors) and outputs are never freed by the program.
#pragma once

#include "compiler/program.h"

namespace loom::compiler {

Program plan_memory(Program program);

}  // namespace loom::compiler
