#include <loom/autograd.h>
#include <loom/optim.h>

#include <cmath>

namespace loom::optim {

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, false, "Adam") {}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, true, "AdamW") {}

Adam::Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled, const char* name)
    : Optimizer(std::move(params), options.lr, name),
      o_(options),
      decoupled_(decoupled),
      weight_decay_(options.weight_decay.value_or(decoupled ? 1e-2 : 0.0)),
      exp_avg_(params_.size()),
      exp_avg_sq_(params_.size()),
      param_steps_(params_.size(), 0),
      own_(params_.size()) {
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) throw Error(std::string(name) + ": expected " + what);
  };
  check(o_.beta1 >= 0 && o_.beta1 < 1, "beta1 in [0, 1), got " + std::to_string(o_.beta1));
  check(o_.beta2 >= 0 && o_.beta2 < 1, "beta2 in [0, 1), got " + std::to_string(o_.beta2));
  check(o_.eps >= 0 && std::isfinite(o_.eps), "a finite eps >= 0, got " + std::to_string(o_.eps));
  check(weight_decay_ >= 0 && std::isfinite(weight_decay_),
        "a finite weight_decay >= 0, got " + std::to_string(weight_decay_));
}

// torch.optim.Adam / AdamW (single-tensor path of PyTorch 1.13):
//   AdamW: p *= 1 - lr·wd;  Adam: g += wd·p
//   m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²
//   p -= lr / (1-β1^t) · m / (sqrt(v) / sqrt(1-β2^t) + eps)
void Adam::Bias::set(double lr, const AdamOptions& o, int64_t t) {
  auto n = static_cast<double>(t);
  step_size.set(lr / (1 - std::pow(o.beta1, n)));
  correction2.set(std::sqrt(1 - std::pow(o.beta2, n)));
}

void Adam::step() {
  NoGradGuard no_grad;
  count_step();
  std::vector<std::size_t> updated;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined()) updated.push_back(i);
  if (updated.empty()) return;
  // Host state at every call, replays included: the step counts and what follows from them.
  every_call([this, updated] {
    for (auto i : updated) ++param_steps_[i];
    double lr = lr_.value();
    int64_t common = param_steps_[updated.front()];
    common_.set(lr, o_, common);
    for (auto i : updated)
      if (param_steps_[i] != common) own_[i].set(lr, o_, param_steps_[i]);
    decay_.set(1 - lr * weight_decay_);
  });
  const int64_t common = param_steps_[updated.front()];
  for (auto i : updated) {
    auto& p = params_[i];
    Tensor g = p.grad();
    Tensor value = p;
    if (weight_decay_ != 0) {
      if (decoupled_) value = value * decay_.tensor(p.dtype(), p.device());
      else g = g + p * weight_decay_;
    }
    auto& m = exp_avg_[i];
    auto& v = exp_avg_sq_[i];
    if (!m.defined()) {
      m = zeros(p.shape(), p.dtype(), p.device());
      v = zeros(p.shape(), p.dtype(), p.device());
    }
    m.assign(m * o_.beta1 + g * (1 - o_.beta1));
    v.assign(v * o_.beta2 + g * g * (1 - o_.beta2));
    const Bias& bias = param_steps_[i] == common ? common_ : own_[i];
    auto denom = sqrt(v) / bias.correction2.tensor(p.dtype(), p.device()) + o_.eps;
    p.assign(value - m / denom * bias.step_size.tensor(p.dtype(), p.device()));
  }
}

void Adam::add_param_group(std::vector<Tensor> params) {
  Optimizer::add_param_group(std::move(params));
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  param_steps_.resize(params_.size(), 0);
  own_.resize(params_.size());
}

std::vector<std::pair<std::string, Tensor>> Adam::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    out.emplace_back(std::to_string(i) + ".exp_avg", exp_avg_[i]);
    out.emplace_back(std::to_string(i) + ".exp_avg_sq", exp_avg_sq_[i]);
    out.emplace_back(std::to_string(i) + ".step",
                     from_vector<int64_t>({param_steps_[i]}, {}, params_[i].device()));
  }
  return out;
}

void Adam::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  std::vector<Tensor> m(params_.size()), v(params_.size());
  std::vector<int64_t> counts(params_.size(), 0);
  for (const auto& [name, t] : state) {
    auto dot = name.find('.');
    // "<param index>.<name>": an index that is not all digits (or absurdly long) is no index.
    const bool digits = dot != std::string::npos && dot > 0 && dot < 10 &&
                        name.find_first_not_of("0123456789") == dot;
    std::size_t i = digits ? std::stoul(name.substr(0, dot)) : params_.size();
    std::string what = dot == std::string::npos ? name : name.substr(dot + 1);
    if (i >= params_.size() || (what != "exp_avg" && what != "exp_avg_sq" && what != "step"))
      throw Error(std::string(name_) + ": unexpected optimizer state '" + name + "'");
    if (what == "step") {
      if (t.numel() != 1) throw Error(std::string(name_) + ": state '" + name + "' is not one number");
      counts[i] = t.to(DType::Int64).item<int64_t>();
      if (counts[i] < 1)
        throw Error(std::string(name_) + ": state '" + name + "' is " + std::to_string(counts[i]) +
                    "; expected a step count >= 1");
      continue;
    }
    if (t.shape() != params_[i].shape())
      throw Error(std::string(name_) + ": state '" + name + "' expects shape " +
                  shape_str(params_[i].shape()) + ", got " + shape_str(t.shape()));
    // In the parameter's dtype, on its device (a checkpoint's state is read to the host).
    (what == "exp_avg" ? m : v)[i] = t.detach().to(params_[i].dtype()).to(params_[i].device());
  }
  // A parameter's state is whole or absent: moments without a count would be bias-corrected
  // as at step 1, a count without moments would start them from zero at a late step.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const bool any = m[i].defined() || v[i].defined() || counts[i] > 0;
    const char* missing = !m[i].defined() ? "exp_avg" : !v[i].defined() ? "exp_avg_sq" : counts[i] == 0 ? "step" : nullptr;
    if (any && missing)
      throw Error(std::string(name_) + ": the state of parameter " + std::to_string(i) + " has no " + missing +
                  " (a parameter's state is exp_avg, exp_avg_sq and step)");
  }
  exp_avg_ = std::move(m);
  exp_avg_sq_ = std::move(v);
  param_steps_ = std::move(counts);
  steps_ = steps;
  ++state_loads_;
}

}  // namespace loom::optim
