#include <loom/autograd.h>
#include <loom/dist.h>
#include <loom/lazy.h>
#include <loom/optim.h>

#include <cmath>
#include <optional>

namespace loom::optim {

namespace {

// Where `t` is among ts[0, end), if it is there.
std::optional<std::size_t> index_of(const std::vector<Tensor>& ts, const Tensor& t, std::size_t end) {
  for (std::size_t j = 0; j < end; ++j)
    if (ts[j].impl() == t.impl()) return j;
  return std::nullopt;
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr, const char* name)
    : params_(std::move(params)), name_(name) {
  if (params_.empty()) throw Error(std::string(name) + ": expected at least one parameter, got none");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined() || !is_floating(params_[i].dtype()))
      throw Error(std::string(name) + ": parameter " + std::to_string(i) +
                  " is not a defined floating-point tensor");
    // Given twice, a parameter would be updated twice a step.
    if (auto j = index_of(params_, params_[i], i))
      throw Error(std::string(name) + ": parameter " + std::to_string(i) + " is parameter " + std::to_string(*j) +
                  " again");
  }
  set_lr(lr);
  // Here rather than in each training loop: every loop that owns an optimizer is then right
  // by construction, as optimizer_step's gradient averaging makes it right at every step.
  if (dist::is_distributed()) dist::broadcast_parameters(params_, 0);
}

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error(std::string(name_) + ": expected a learning rate >= 0, got " + std::to_string(lr));
  lr_.set(lr);
}

void Optimizer::add_param_group(std::vector<Tensor> params) {
  if (params.empty()) throw Error(std::string(name_) + ": add_param_group: expected at least one parameter, got none");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || !is_floating(params[i].dtype()))
      throw Error(std::string(name_) + ": add_param_group: parameter " + std::to_string(i) +
                  " is not a defined floating-point tensor");
    if (auto j = index_of(params_, params[i], params_.size()))
      throw Error(std::string(name_) + ": add_param_group: parameter " + std::to_string(i) +
                  " is already optimized (parameter " + std::to_string(*j) + ")");
    if (auto j = index_of(params, params[i], i))
      throw Error(std::string(name_) + ": add_param_group: parameter " + std::to_string(i) + " is parameter " +
                  std::to_string(*j) + " of the group again");
  }
  if (dist::is_distributed()) dist::broadcast_parameters(params, 0);
  params_.insert(params_.end(), params.begin(), params.end());
}

void Optimizer::count_step() {
  guard_on(std::string(name_) + "'s parameter count", [this] { return static_cast<int64_t>(params_.size()); });
  guard_on(std::string(name_) + "'s loaded state", [this] { return state_loads_; });
  every_call([this] { ++steps_; });
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.set_grad({});
}

void reduce_gradients(Optimizer& opt) { dist::all_reduce_gradients(opt.params()); }

void optimizer_step(Optimizer& opt, bool barrier) {
  reduce_gradients(opt);
  opt.step();
  if (barrier) mark_step();
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  if (!(max_norm > 0)) throw Error("clip_grad_norm: expected max_norm > 0, got " + std::to_string(max_norm));
  NoGradGuard no_grad;
  // Summed in float64 if any gradient is float64, else in float32 (bfloat16 gradients too).
  DType acc = DType::Float32;
  for (const auto& p : params)
    if (p.grad().defined() && p.grad().dtype() == DType::Float64) acc = DType::Float64;
  Tensor total;
  for (const auto& p : params) {
    auto g = p.grad();
    if (!g.defined()) continue;
    auto sq = sum(g * g);
    if (sq.dtype() != acc) sq = sq.to(acc);
    total = total.defined() ? total + sq : sq;
  }
  if (!total.defined()) throw Error("clip_grad_norm: no parameter has a gradient");
  total = sqrt(total);
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped at 1.
  auto coef = minimum(max_norm / (total + 1e-6), ones({}, total.dtype(), total.device()));
  for (Tensor p : params) {  // a copy of the handle; the gradient lives in the shared state
    auto g = p.grad();
    if (!g.defined()) continue;
    p.set_grad(g * (g.dtype() == coef.dtype() ? coef : coef.to(g.dtype())));
  }
  return total;
}

}  // namespace loom::optim
