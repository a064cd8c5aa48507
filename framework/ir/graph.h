// A graph: the nodes that a list of roots needs, in topological order.
//
// The graph hash covers every node's op, dtype, shape and attributes and, for each operand,
// its position in the order — not the operand's own hash. So two graphs that differ only in
// which input feeds which use (x+y vs x+x, both leaves of one shape) hash differently, while
// the next step's graph, over new buffers of the same shapes, hashes the same.
#pragma once

#include "ir/node.h"

#include <string>
#include <vector>

namespace loom::ir {

struct Graph {
  std::vector<NodePtr> nodes;  // topological order, operands first
  std::vector<int> inputs;     // DeviceData leaves, by first visit
  std::vector<int> outputs;    // one per root, in the roots' order
  uint64_t hash = 0;
};

Graph build_graph(const std::vector<NodePtr>& roots);

std::string to_text(const Graph& g);
std::string to_dot(const Graph& g);

}  // namespace loom::ir
