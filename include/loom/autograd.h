// Reverse-mode differentiation on lazy tensors. Gradients are lazy ops too, so forward,
// backward and the optimizer update of one step form one graph.
//
//   auto w = loom::randn({3, 2}, /*seed=*/1).requires_grad_();
//   auto loss = loom::sum(loom::matmul(x, w) * loom::matmul(x, w));
//   loss.backward();           // traces the gradient ops
//   auto g = w.grad();         // pending until mark_step() or a read
//   {
//     loom::NoGradGuard no_grad;
//     w.assign(w - 0.1 * g);  // the update is not recorded
//   }
//
// As in PyTorch, backward() and grad() free the saved values of the graph they run through
// (there is no retain_graph): a second backward through the same graph is an error that
// says so. Run the forward again instead.
#pragma once

#include <loom/tensor.h>

namespace loom {

bool is_grad_enabled();
void set_grad_enabled(bool on);

// Disables recording of autograd history in a scope (thread-local).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Gradients of `output` with respect to `inputs`, returned rather than accumulated. The
// returned gradients carry no autograd history (there is no create_graph). `inputs` must be
// leaf tensors that require grad; anything else throws.
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output = {});

}  // namespace loom
