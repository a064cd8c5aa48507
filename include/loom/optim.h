// Optimizers, learning-rate schedules and gradient clipping, with PyTorch's update rules.
// Updates are lazy ops on the parameters (in place, Tensor::assign), so with
// optimizer_step(opt, /*barrier=*/true) forward, backward and update are one step graph.
// Hyper-parameters are scalars, hence device data: changing the LR every step (a schedule)
// never recompiles. State is updated in place and the LR and step counts are HostScalars and
// every_call() updates, so a compiled step that calls step() is captured and replays with the
// current LR (loom/compile.h).
//
//   loom::optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
//   loom::optim::CosineSchedule sched(opt, {.base_lr = 0.1, .warmup_steps = 200, .total_steps = 10000});
//   for (auto& batch : loader) {
//     opt.zero_grad();
//     loss_fn(model, batch).backward();
//     loom::optim::optimizer_step(opt, /*barrier=*/true);
//     sched.step();
//   }
#pragma once

#include <loom/compile.h>
#include <loom/tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::optim {

class Optimizer {
 public:
  // Under mpirun every rank must train the same model, so the constructor gives every rank
  // rank 0's parameter values (loom::dist::broadcast_parameters): ranks that initialise
  // differently still start identical. Constructing an optimizer is then a collective that
  // every rank makes. Buffers (batch-norm statistics) are not parameters; the Trainer keeps
  // them in step. A parameter given twice (here or by add_param_group) is a loom::Error: it
  // would be updated twice a step (Module::parameters() lists a shared one once).
  Optimizer(std::vector<Tensor> params, double lr, const char* name);
  virtual ~Optimizer() = default;

  // One update of every parameter that has a gradient (parameters without one are skipped).
  virtual void step() = 0;
  // Sets every parameter's gradient to none (PyTorch's set_to_none=True).
  void zero_grad();

  double lr() const { return lr_.value(); }
  void set_lr(double lr);
  int64_t steps() const { return steps_; }
  const std::vector<Tensor>& params() const { return params_; }
  // Adds parameters to those the optimizer updates, with the same options (PyTorch's
  // add_param_group). A captured step that calls step() is then traced again.
  virtual void add_param_group(std::vector<Tensor> params);

  // The optimizer's state as named tensors ("<param index>.<name>") plus the step count, for
  // checkpoints. load_state() checks names and shapes (and Adam's, that a parameter's state
  // is whole), and converts the state to each parameter's dtype and device. A captured step
  // that calls step() is traced again after a load_state() (it would otherwise go on with the
  // state tensors it was captured with, wherever something still holds them).
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) = 0;

 protected:
  // For step(): guards a captured step on the parameter count and on state_loads_, and
  // advances steps_ at every call, replays included.
  void count_step();

  std::vector<Tensor> params_;
  HostScalar lr_{0, "lr"};
  int64_t steps_ = 0;
  int64_t state_loads_ = 0;  // load_state() calls: each makes a captured step trace again
  const char* name_;
};

struct SGDOptions {
  double lr = 0.1;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD final : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) override;

  void add_param_group(std::vector<Tensor> params) override;

 private:
  SGDOptions o_;
  std::vector<Tensor> momentum_;  // undefined until a parameter's first update, then in place
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Adam: added to the gradient; AdamW: decoupled. Unset: PyTorch's defaults, 0 for Adam and
  // 1e-2 for AdamW (so AdamW(params, {.lr = 3e-4}) decays by 1e-2, as torch.optim.AdamW does).
  std::optional<double> weight_decay;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  void step() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) override;
  void add_param_group(std::vector<Tensor> params) override;

 protected:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled, const char* name);

 private:
  // The bias-corrected step size lr/(1-β1^t) and sqrt(1-β2^t) for one step count t; the
  // parameters updated with the optimizer's common count share one pair (one copy to the
  // device per step), a parameter with a count of its own has its own.
  struct Bias {
    HostScalar step_size{0, "Adam step size"};
    HostScalar correction2{0, "Adam sqrt(1 - beta2^t)"};
    void set(double lr, const AdamOptions& o, int64_t t);
  };
  AdamOptions o_;
  bool decoupled_;
  double weight_decay_;  // o_.weight_decay, or the optimizer's default where unset
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // in place after a parameter's first update
  std::vector<int64_t> param_steps_;
  Bias common_;
  std::vector<Bias> own_;
  HostScalar decay_{1, "AdamW decay"};  // 1 - lr·weight_decay
};

class AdamW final : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options = {});
};

// Data-parallel training (several processes under mpirun, see loom/dist.h): replaces each
// parameter's gradient by its mean over the ranks. A no-op in a single process. Call it
// yourself only to work on the averaged gradients before step() (clipping, say).
void reduce_gradients(Optimizer& opt);

// reduce_gradients(), step(), then mark_step() when `barrier` is true.
void optimizer_step(Optimizer& opt, bool barrier = false);

// Scales gradients so their global L2 norm is at most max_norm; returns the norm before
// clipping, lazily (reading it is a transfer). Like torch.nn.utils.clip_grad_norm_, but it
// throws for max_norm <= 0 (which PyTorch takes) and when no parameter has a gradient (where
// PyTorch returns 0).
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// ---- learning-rate schedules: call step() after each optimizer step ----
class Schedule {
 public:
  explicit Schedule(Optimizer& opt) : opt_(opt) {}
  virtual ~Schedule() = default;
  // The LR for a given (0-based) step.
  virtual double lr_at(int64_t step) const = 0;
  // Advances one step and sets the optimizer's LR.
  void step();
  int64_t current_step() const { return step_; }
  void set_step(int64_t step);

 protected:
  Optimizer& opt_;
  int64_t step_ = 0;
};

struct StepOptions {
  double base_lr = 0.1;
  int64_t step_size = 30;  // steps between decays (counted from step 0)
  double gamma = 0.1;      // the decay, in (0, 1]
  int64_t warmup_steps = 0;  // linear from base_lr/warmup_steps over the first steps
};
class StepSchedule final : public Schedule {
 public:
  StepSchedule(Optimizer& opt, StepOptions options);
  double lr_at(int64_t step) const override;

 private:
  StepOptions o_;
};

struct CosineOptions {
  double base_lr = 0.1;
  int64_t warmup_steps = 0;  // linear from base_lr/warmup_steps to base_lr
  int64_t total_steps = 1;   // cosine decay to min_lr at total_steps
  double min_lr = 0;         // in [0, base_lr]
};
class CosineSchedule final : public Schedule {
 public:
  CosineSchedule(Optimizer& opt, CosineOptions options);
  double lr_at(int64_t step) const override;

 private:
  CosineOptions o_;
};

struct WarmupOptions {
  double base_lr = 1e-3;
  int64_t warmup_steps = 100;  // linear to base_lr, constant after
};
class WarmupSchedule final : public Schedule {
 public:
  WarmupSchedule(Optimizer& opt, WarmupOptions options);
  double lr_at(int64_t step) const override;

 private:
  WarmupOptions o_;
};

}  // namespace loom::optim
