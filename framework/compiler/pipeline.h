// The compiler pipeline: graph in, Program out. Passes run in a fixed order; with
// LOOM_DUMP_PASSES=1 the graph is printed to stderr after each.
//
// Common-subexpression elimination and dead-code elimination need no pass of their own yet:
// nodes are hash-consed (one node per distinct expression) and a Graph holds only what its
// roots reach.
#pragma once

#include "compiler/program.h"
#include "ir/graph.h"

namespace loom::compiler {

Program compile(const ir::Graph& graph);

}  // namespace loom::compiler
