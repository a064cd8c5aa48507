// nn::Module: the base of every layer and model. Parameters, buffers and submodules are
// registered in constructors, and named_parameters() gives PyTorch's state_dict keys.
//
//   class Mlp : public loom::nn::Module {
//    public:
//     Mlp() {
//       fc1 = register_module("fc1", std::make_shared<loom::nn::Linear>(784, 128));
//       fc2 = register_module("fc2", std::make_shared<loom::nn::Linear>(128, 10));
//     }
//     loom::Tensor forward(const loom::Tensor& x) override {
//       return fc2->forward(loom::relu(fc1->forward(x)));
//     }
//     std::shared_ptr<loom::nn::Linear> fc1, fc2;
//   };
//   // named_parameters(): fc1.weight, fc1.bias, fc2.weight, fc2.bias
//
// Parameters keep their identity for the module's lifetime: optimizers and load_state_dict
// update them in place (Tensor::assign), so every handle sees the new value.
#pragma once

#include <loom/tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The dtype new parameters get (like torch.set_default_dtype): float32 unless changed, or
// float64; anything else throws (bfloat16 runs under loom::Autocast, over float32 weights).
DType default_dtype();
void set_default_dtype(DType dtype);

class Module {
 public:
  virtual ~Module() = default;

  // Single-input modules override this (Sequential calls it).
  virtual Tensor forward(const Tensor& input);

  // A tensor reached under two names (a module registered twice, tied weights) is listed
  // once, under its first name, as in PyTorch; state_dict() keeps every name.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Every submodule with its dotted name, depth first (this module itself is not listed: it
  // is not held by a shared_ptr here). A module registered under two names is listed once,
  // under its first, as in PyTorch.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  // Parameters then buffers of every submodule, with dotted names (PyTorch's state_dict order
  // is per module: its parameters, its buffers, then its children).
  NamedTensors state_dict() const;
  // Copies values in place. Throws loom::Error naming the key for a missing key, an
  // unexpected key, or a shape mismatch (with both shapes). Values are cast to the
  // parameter's dtype and copied to its device.
  void load_state_dict(const NamedTensors& state);

  // Moves every parameter and buffer to `device`, keeping their identity (optimizers made
  // before still hold them); the gradients of those that move are dropped. Returns *this.
  Module& to(Device device);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Sets every parameter's gradient to none.
  void zero_grad();
  int64_t num_parameters() const;

 protected:
  // Registers `value` as a parameter (it gets requires_grad) and returns the stored handle.
  Tensor register_parameter(const std::string& name, Tensor value);
  // A buffer is saved in state_dict() but not trained (running statistics); `value` must be a
  // defined tensor.
  Tensor register_buffer(const std::string& name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // Called by train(); layers whose behaviour depends on the mode need not override it.
  virtual void on_train(bool) {}

  // For forward(): the settings a layer reads into the trace (an eps, a stride, a flag), as a
  // guard of a compiled step (loom::compile): when one changes between calls, the step is
  // traced again, where a replay would go on computing with the captured values. `settings`
  // returns them, each exact as a double (it may read *this: a replay calls it only while this
  // module exists, and traces again once it is gone); `what` names them in the cause
  // ("Conv2d's options"). Outside a compiled step it does nothing, at no cost.
  template <class F>
  void guard_settings(std::string_view what, F&& settings) const {
    if (capturing()) guard_settings_now(what, std::function<std::vector<double>()>(std::forward<F>(settings)));
  }

 private:
  static bool capturing();
  void guard_settings_now(std::string_view what, std::function<std::vector<double>()> settings) const;
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, NamedTensors& out, bool params, bool buffers) const;

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  // Expires with this module (a copy has its own): what guard_settings' replays check first.
  struct Alive {
    std::shared_ptr<char> token = std::make_shared<char>();
    Alive() = default;
    Alive(const Alive&) : token(std::make_shared<char>()) {}
    Alive& operator=(const Alive&) { return *this; }
  } alive_;
};

}  // namespace loom::nn
