#include "compiler/lower.h"

#include <cassert>
#include <unordered_map>

namespace loom::compiler {

ir::Program lower(const ir::Graph& graph) {
  ir::Program p;
  p.hash = graph.hash;
  p.graph_nodes = graph.nodes.size();
  std::unordered_map<const ir::Node*, int> slot;
  for (auto i : graph.inputs) {
    const auto& n = graph.nodes[i];
    slot.emplace(n.get(), static_cast<int>(p.inputs.size()));
    p.inputs.push_back({n->dtype(), n->shape()});
  }
  int next = static_cast<int>(p.inputs.size());
  for (const auto& n : graph.nodes) {
    if (n->op() == ir::Op::DeviceData) continue;
    ir::Instr in{n->op(), n->dtype(), n->shape(), n->attr(), {}};
    for (const auto& o : n->operands()) in.args.push_back(slot.at(o.get()));
    slot.emplace(n.get(), next++);
    p.instrs.push_back(std::move(in));
  }
  for (auto o : graph.outputs) p.outputs.push_back(slot.at(graph.nodes[o].get()));
  return p;
}

}  // namespace loom::compiler
