#include "autograd/grad_node.h"

#include <loom/autograd.h>

namespace loom {
namespace {
thread_local bool grad_enabled = true;

}  // namespace

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool on) { grad_enabled = on; }

namespace autograd {

GradNode::~GradNode() {
  // As ir::Node's destructor: the nodes this one frees queue up here, and the outermost
  // destructor on the thread frees them one by one.
  thread_local std::vector<std::shared_ptr<GradNode>> dying;
  thread_local bool draining = false;
  for (auto& e : next)
    if (e.fn) dying.push_back(std::move(e.fn));
  if (draining) return;
  draining = true;
  while (!dying.empty()) {
    auto last = std::move(dying.back());
    dying.pop_back();
    last.reset();  // may queue its own inputs' nodes
  }
  draining = false;
}

void record(ir::Op op, const ir::Attr& attr, const std::vector<Tensor>& operands,
            const std::vector<ir::NodePtr>& operand_nodes, const Tensor& out) {
  if (!grad_enabled || !ir::op_info(op).differentiable || !is_floating(out.dtype())) return;
  std::vector<Edge> next(operands.size());
  bool any = false;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const auto& impl = operands[i].impl();
    if (auto fn = impl->grad_fn()) next[i].fn = std::move(fn);
    else if (impl->requires_grad()) next[i].leaf = impl;
    any = any || next[i].needed();
  }
  if (!any) return;
  auto node = std::make_shared<GradNode>();
  node->op = op;
  node->attr = attr;
  node->inputs = operand_nodes;
  // In eager mode the output already ran: its node is then a DeviceData leaf, so the rule
  // reads the value instead of recomputing it.
  node->output = out.impl()->node();
  node->next = std::move(next);
  node->device = out.device();
  out.impl()->set_grad_fn(std::move(node));
}

}  // namespace autograd
}  // namespace loom
