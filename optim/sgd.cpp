#include <loom/autograd.h>
#include <loom/optim.h>

#include <cmath>

namespace loom::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params), options.lr, "SGD"), o_(options), momentum_(params_.size()) {
  auto check = [](const char* what, double v) {
    if (!(v >= 0) || !std::isfinite(v))
      throw Error(std::string("SGD: expected a finite ") + what + " >= 0, got " + std::to_string(v));
  };
  check("momentum", o_.momentum);
  check("weight_decay", o_.weight_decay);
  check("dampening", o_.dampening);
  if (o_.nesterov && (o_.momentum <= 0 || o_.dampening != 0))
    throw Error("SGD: nesterov momentum needs momentum > 0 and dampening 0");
}

// torch.optim.SGD: d = g + wd·p; buf = d (first step) or momentum·buf + (1 - dampening)·d;
// d = nesterov ? d + momentum·buf : buf; p -= lr·d.
void SGD::step() {
  NoGradGuard no_grad;
  count_step();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    Tensor d = p.grad();
    if (!d.defined()) continue;
    if (o_.weight_decay != 0) d = d + p * o_.weight_decay;
    if (o_.momentum != 0) {
      auto& buf = momentum_[i];
      if (buf.defined()) buf.assign(buf * o_.momentum + d * (1 - o_.dampening));
      else buf = d.detach();  // a value of its own: assign() on it must not change the gradient
      d = o_.nesterov ? d + buf * o_.momentum : buf;
    }
    p.assign(p - d * lr_.tensor(d.dtype(), d.device()));
  }
}

void SGD::add_param_group(std::vector<Tensor> params) {
  Optimizer::add_param_group(std::move(params));
  momentum_.resize(params_.size());
}

std::vector<std::pair<std::string, Tensor>> SGD::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < momentum_.size(); ++i)
    if (momentum_[i].defined()) out.emplace_back(std::to_string(i) + ".momentum_buffer", momentum_[i]);
  return out;
}

void SGD::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  std::vector<Tensor> loaded(params_.size());
  for (const auto& [name, t] : state) {
    auto dot = name.find('.');
    // "<param index>.<name>": an index that is not all digits (or absurdly long) is no index.
    const bool digits = dot != std::string::npos && dot > 0 && dot < 10 &&
                        name.find_first_not_of("0123456789") == dot;
    std::size_t i = digits ? std::stoul(name.substr(0, dot)) : params_.size();
    if (i >= params_.size() || name.substr(dot + 1) != "momentum_buffer")
      throw Error("SGD: unexpected optimizer state '" + name + "'");
    if (t.shape() != params_[i].shape())
      throw Error("SGD: state '" + name + "' expects shape " + shape_str(params_[i].shape()) +
                  ", got " + shape_str(t.shape()));
    loaded[i] = t.detach().to(params_[i].dtype()).to(params_[i].device());  // a checkpoint's is on the host
  }
  momentum_ = std::move(loaded);
  steps_ = steps;
  ++state_loads_;
}

}  // namespace loom::optim
