// The compiler pipeline: graph and the device's Target in, Program out. The graph is lowered
// to a Program (one instruction per node), then each pass is a function Program -> Program
// (given the Target where it needs one) in its own file (widen.h holds three), run in the
// fixed order that compile() states (pipeline.cpp), skipping the rewrites the target does
// not take (ir/target.h). With LOOM_DUMP_PASSES=1 the graph and the Program after each pass
// are printed to stderr.
//
// Common-subexpression elimination happens while tracing (nodes are hash-consed: one node per
// distinct expression) and a Graph holds only what its roots reach, so the passes start from
// a graph with neither duplicates nor dead nodes.
#pragma once

#include "ir/graph.h"
#include "ir/program.h"
#include "ir/target.h"

namespace loom::compiler {

// Throws loom::Error naming the op and the device when the target does not run an op.
ir::Program compile(const ir::Graph& graph, const ir::Target& target);

}  // namespace loom::compiler
