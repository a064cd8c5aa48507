#include "ir/graph.h"

#include <sstream>
#include <unordered_map>

namespace loom::ir {

Graph build_graph(const std::vector<NodePtr>& roots) {
  Graph g;
  std::unordered_map<const Node*, int> index;
  // Iterative post-order DFS: graphs can be deep (long loops without a barrier).
  std::vector<std::pair<const NodePtr*, std::size_t>> stack;
  for (const auto& root : roots) {
    if (!index.count(root.get())) stack.emplace_back(&root, 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const auto& ops = (*node)->operands();
      if (next < ops.size()) {
        const NodePtr* child = &ops[next++];
        if (!index.count(child->get())) stack.emplace_back(child, 0);
        continue;
      }
      if (!index.count(node->get())) {
        index.emplace(node->get(), static_cast<int>(g.nodes.size()));
        if ((*node)->op() == Op::DeviceData) g.inputs.push_back(static_cast<int>(g.nodes.size()));
        g.nodes.push_back(*node);
      }
      stack.pop_back();
    }
    g.outputs.push_back(index.at(root.get()));
  }

  uint64_t h = hash_combine(0x10017, g.nodes.size());
  for (const auto& n : g.nodes) {
    h = hash_combine(h, static_cast<uint64_t>(n->op()));
    h = hash_combine(h, static_cast<uint64_t>(n->dtype()));
    for (auto d : n->shape()) h = hash_combine(h, static_cast<uint64_t>(d));
    h = hash_combine(h, hash_attr(n->attr()));
    for (const auto& o : n->operands()) {
      int at = index.at(o.get());
      g.operands.push_back(at);
      h = hash_combine(h, static_cast<uint64_t>(at));
    }
  }
  for (auto o : g.outputs) h = hash_combine(h, static_cast<uint64_t>(o) + 7);
  g.hash = h;
  return g;
}

GraphKey::GraphKey(const Graph& g) : operands_(g.operands), outputs_(g.outputs) {
  nodes_.reserve(g.nodes.size());
  for (const auto& n : g.nodes) nodes_.push_back({n->op(), n->dtype(), n->shape(), n->attr(), n->operands().size()});
}

bool GraphKey::matches(const Graph& g) const {
  if (g.nodes.size() != nodes_.size() || g.operands != operands_ || g.outputs != outputs_) return false;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = *g.nodes[i];
    const auto& k = nodes_[i];
    if (n.op() != k.op || n.dtype() != k.dtype || n.operands().size() != k.arity || n.shape() != k.shape ||
        !(n.attr() == k.attr))
      return false;
  }
  return true;
}

namespace {

std::string describe(const Node& n) {
  std::ostringstream os;
  os << op_name(n.op()) << ' ' << dtype_name(n.dtype()) << shape_str(n.shape());
  if (auto a = attr_str(n.attr()); !a.empty()) os << ' ' << a;
  return os.str();
}

}  // namespace

std::string to_text(const Graph& g) {
  std::unordered_map<const Node*, int> index;
  std::ostringstream os;
  os << "graph " << std::hex << g.hash << std::dec << " (" << g.nodes.size() << " nodes)\n";
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto& n = *g.nodes[i];
    index[&n] = static_cast<int>(i);
    os << "  %" << i << " = " << describe(n) << '(';
    for (std::size_t k = 0; k < n.operands().size(); ++k)
      os << (k ? ", " : "") << '%' << index.at(n.operand(k).get());
    os << ")\n";
  }
  os << "  outputs:";
  for (auto o : g.outputs) os << " %" << o;
  os << '\n';
  return os.str();
}

std::string to_dot(const Graph& g) {
  std::unordered_map<const Node*, int> index;
  std::ostringstream os;
  os << "digraph loom {\n  node [shape=box, fontname=monospace];\n";
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto& n = *g.nodes[i];
    index[&n] = static_cast<int>(i);
    os << "  n" << i << " [label=\"%" << i << ' ' << describe(n) << "\"];\n";
    for (const auto& o : n.operands()) os << "  n" << index.at(o.get()) << " -> n" << i << ";\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace loom::ir
