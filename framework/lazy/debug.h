// The engine side of loom/debug.h: the executor reports compiles, reads and steps here.
#pragma once

#include "ir/graph.h"

#include <loom/debug.h>

#include <source_location>
#include <string>

namespace loom::debug {

std::string site_of(const std::source_location& loc);

// A graph's structure, node by node (no buffers): what recompile causes and the step-capture
// check compare.
struct NodeDesc {
  ir::Op op;
  DType dtype;
  Shape shape;
  ir::Attr attr;
  std::vector<int> operands;
  bool operator==(const NodeDesc&) const = default;
};
using GraphDesc = std::vector<NodeDesc>;
GraphDesc describe(const ir::Graph& g);
// The first difference between two graphs, in words ("node %12: was add, now mul").
std::string first_difference(const GraphDesc& was, const GraphDesc& now);

// A step replayed by compile() failed a guard at `site`: recorded among the recompile causes.
void note_guard_failure(const std::string& site, const std::string& cause);
// Prints `message` as a warning and keeps it in warnings(), once per `key`.
void warn_once(const std::string& key, const std::string& message);
// An uncached compile of `g` at `site`; returns the cause it recorded.
std::string note_compile(const ir::Graph& g, const std::string& site);
void note_transfer(const std::string& site);
void note_step();
// Set while step closures run: their reads are expected and not counted.
void set_in_closure(bool on);
bool in_closure();

}  // namespace loom::debug
