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
  std::vector<int> operands;   // every node's operands' positions, node after node
  uint64_t hash = 0;
};

Graph build_graph(const std::vector<NodePtr>& roots);

// A graph's structure without its nodes (so without the buffers its leaves hold): what the
// compile cache keeps beside a program to make sure that a graph with the same hash is the
// same computation, so a hash collision can never run the wrong program.
class GraphKey {
 public:
  explicit GraphKey(const Graph& g);
  bool matches(const Graph& g) const;

 private:
  struct NodeKey {
    Op op;
    DType dtype;
    Shape shape;
    Attr attr;
    std::size_t arity;  // how many of operands_ are this node's
  };
  std::vector<NodeKey> nodes_;
  std::vector<int> operands_;
  std::vector<int> outputs_;
};

std::string to_text(const Graph& g);
std::string to_dot(const Graph& g);

}  // namespace loom::ir
