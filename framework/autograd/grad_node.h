// The autograd tape: one GradNode per recorded op. It keeps IR *values* (not tensors), so
// saved activations are not live tensors: they do not become outputs of mark_step unless
// the user holds them. Edges lead to the GradNode of each input that needs a gradient, or
// to the leaf tensor that accumulates it.
#pragma once

#include "ir/node.h"
#include "lazy/tensor_impl.h"

#include <memory>
#include <vector>

namespace loom::autograd {

struct Edge {
  std::shared_ptr<GradNode> fn;      // the input was computed: continue there
  std::shared_ptr<TensorImpl> leaf;  // the input is a leaf that requires grad
  bool needed() const { return fn || leaf; }
};

struct GradNode {
  ir::Op op;
  ir::Attr attr;
  std::vector<ir::NodePtr> inputs;  // operand values when the op ran
  ir::NodePtr output;               // the op's value
  std::vector<Edge> next;           // one per operand
  Device device;
  // Set once backward has run through this node: `inputs` and `output` are then dropped, as
  // PyTorch frees saved tensors, so a step's tape no longer holds the parameters' old
  // buffers (which the next program can then take over; compiler/memory_plan.h).
  bool released = false;

  GradNode() = default;
  GradNode(const GradNode&) = delete;
  GradNode& operator=(const GradNode&) = delete;
  // Frees the nodes it alone holds from a loop, not by recursion: a tape recorded without a
  // barrier (eager mode, a long unrolled loop) can be hundreds of thousands of nodes deep.
  ~GradNode();
};

// Called by lazy::apply for every op: links `out` to its operands when grad mode is on and
// an operand needs a gradient.
void record(ir::Op op, const ir::Attr& attr, const std::vector<Tensor>& operands,
            const std::vector<ir::NodePtr>& operand_nodes, const Tensor& out);

// The gradient of each operand given the gradient `g` of the output (undefined where the
// operand gets none). One exhaustive switch over ir::Op: grad_rules.cpp.
std::vector<Tensor> grad_rule(const GradNode& node, const Tensor& g);

}  // namespace loom::autograd
