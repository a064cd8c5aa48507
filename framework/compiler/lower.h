// Lowering: one instruction per non-input node, in the graph's topological order.
#pragma once

#include "ir/program.h"
#include "ir/graph.h"

namespace loom::compiler {

ir::Program lower(const ir::Graph& graph);

}  // namespace loom::compiler
