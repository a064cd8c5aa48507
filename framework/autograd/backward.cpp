// The backward pass: a topological walk over the tape from the output, applying each op's
// gradient rule and summing the gradients that reach a node or a leaf by several paths.
#include "autograd/grad_node.h"
#include "lazy/ops_util.h"

#include <loom/autograd.h>

#include <unordered_map>

namespace loom {
namespace autograd {
namespace {

using LeafGrads = std::unordered_map<TensorImpl*, Tensor>;

Tensor accumulate(const Tensor& have, const Tensor& add) { return have.defined() ? have + add : add; }

// Runs the tape below `root` with output gradient `g`; returns the gradients reaching leaves.
LeafGrads run(const Tensor& root, Tensor g) {
  LeafGrads leaves;
  auto fn = root.impl()->grad_fn();
  if (!fn) {
    if (root.impl()->requires_grad()) leaves[root.impl().get()] = g;
    return leaves;
  }
  // Count, for every reachable node, the edges that lead into it.
  std::unordered_map<GradNode*, int> pending;
  std::vector<GradNode*> stack{fn.get()};
  pending[fn.get()] = 0;
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next) {
      if (!e.fn) continue;
      if (pending.emplace(e.fn.get(), 0).second) stack.push_back(e.fn.get());
      ++pending[e.fn.get()];
    }
  }
  // Kahn's order: a node runs once every path into it has delivered its gradient.
  std::unordered_map<GradNode*, Tensor> grads{{fn.get(), g}};
  std::vector<GradNode*> ready{fn.get()};
  while (!ready.empty()) {
    auto* n = ready.back();
    ready.pop_back();
    Tensor gn = std::move(grads[n]);
    grads.erase(n);
    if (n->released)
      lazy::fail("backward", std::string("the graph through ") + ir::op_name(n->op) +
                                 " was already run by an earlier backward, which freed its saved "
                                 "values; run the forward again for a second backward");
    auto input_grads = grad_rule(*n, gn);
    n->inputs.clear();
    n->inputs.shrink_to_fit();
    n->output.reset();
    n->released = true;
    for (std::size_t k = 0; k < n->next.size(); ++k) {
      const auto& e = n->next[k];
      if (!e.needed()) continue;
      if (!input_grads[k].defined())
        lazy::fail(ir::op_name(n->op), "gradient rule gave no gradient for a needed operand");
      if (e.fn) {
        auto& slot = grads[e.fn.get()];
        slot = accumulate(slot, input_grads[k]);
        if (--pending[e.fn.get()] == 0) ready.push_back(e.fn.get());
      } else {
        auto& slot = leaves[e.leaf.get()];
        slot = accumulate(slot, input_grads[k]);
      }
    }
  }
  return leaves;
}

Tensor seed_gradient(const Tensor& root, const Tensor& gradient, const char* op) {
  if (!root.defined()) lazy::fail(op, "expected a defined tensor, got an empty handle");
  if (!root.impl()->requires_grad())
    lazy::fail(op, "expected a tensor that requires grad (no input of it has requires_grad_())");
  if (gradient.defined()) {
    if (gradient.shape() != root.shape() || gradient.dtype() != root.dtype())
      lazy::fail(op, "expected a gradient of " + std::string(dtype_name(root.dtype())) +
                         shape_str(root.shape()) + ", got " + dtype_name(gradient.dtype()) +
                         shape_str(gradient.shape()));
    return gradient;
  }
  if (root.numel() != 1)
    lazy::fail(op, "expected a gradient argument for a non-scalar output of shape " +
                       shape_str(root.shape()));
  return ones(root.shape(), root.dtype(), root.device());
}

}  // namespace
}  // namespace autograd

bool Tensor::requires_grad() const { return defined() && impl_->requires_grad(); }

Tensor& Tensor::requires_grad_(bool on) {
  if (!defined()) lazy::fail("requires_grad_", "expected a defined tensor, got an empty handle");
  impl_->set_requires_grad(on);
  return *this;
}

Tensor Tensor::grad() const {
  if (!defined()) lazy::fail("grad", "expected a defined tensor, got an empty handle");
  return impl_->grad();
}

void Tensor::set_grad(const Tensor& g) {
  if (!defined()) lazy::fail("set_grad", "expected a defined tensor, got an empty handle");
  impl_->set_grad(g);
}

void Tensor::backward(const Tensor& gradient) const {
  NoGradGuard no_grad;
  auto g = autograd::seed_gradient(*this, gradient, "backward");
  for (auto& [leaf, lg] : autograd::run(*this, g)) {
    auto have = leaf->grad();
    leaf->set_grad(have.defined() ? have + lg : lg);
  }
}

Tensor Tensor::detach() const {
  if (!defined()) lazy::fail("detach", "expected a defined tensor, got an empty handle");
  return lazy::make_tensor(impl_->node(), impl_->device());
}

void Tensor::assign(const Tensor& value) const {
  if (!defined() || !value.defined()) lazy::fail("assign", "expected defined tensors, got an empty handle");
  impl_->assign(*value.impl());
}

std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs, const Tensor& grad_output) {
  NoGradGuard no_grad;
  // Checked before the tape runs (and is freed): a call with a wrong input can be made again.
  for (const auto& x : inputs)
    if (!x.defined() || !x.impl()->requires_grad() || x.impl()->grad_fn())
      lazy::fail("grad", "expected leaf tensors that require grad as inputs");
  auto g = autograd::seed_gradient(output, grad_output, "grad");
  auto leaves = autograd::run(output, g);
  std::vector<Tensor> out;
  for (const auto& x : inputs) {
    auto it = leaves.find(x.impl().get());
    out.push_back(it != leaves.end() ? it->second : zeros(x.shape(), x.dtype(), x.device()));
  }
  return out;
}

}  // namespace loom
