// The compiler pipeline: graph in, ir::Program out. The graph is lowered to a ir::Program (one
// instruction per node), then each pass is a function ir::Program -> ir::Program in its own file,
// run in a fixed order: simplify, fuse_elementwise, fuse_reduce_prologue, fold_transpose,
// eliminate_dead_code, plan_memory. With LOOM_DUMP_PASSES=1 the graph and the ir::Program after each pass are printed
// to stderr.
//
// Common-subexpression elimination happens while tracing (nodes are hash-consed: one node per
// distinct expression) and a Graph holds only what its roots reach, so the passes start from
// a graph with neither duplicates nor dead nodes.
#pragma once

#include "ir/program.h"
#include "ir/graph.h"

namespace loom::compiler {

ir::Program compile(const ir::Graph& graph);

}  // namespace loom::compiler
