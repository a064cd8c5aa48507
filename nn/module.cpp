#include <loom/autograd.h>
#include <loom/compile.h>
#include <loom/error.h>
#include <loom/nn/module.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <unordered_set>

namespace loom::nn {
namespace {
DType g_default_dtype = DType::Float32;

void check_name(const std::string& name, const char* what) {
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error(std::string(what) + ": expected a non-empty name without '.', got '" + name + "'");
}
}  // namespace

DType default_dtype() { return g_default_dtype; }
void set_default_dtype(DType dtype) {
  // Parameters stay float32 or float64: bfloat16 is a compute dtype (autocast), with float32
  // weights and optimizer state.
  if (dtype != DType::Float32 && dtype != DType::Float64)
    throw Error(std::string("set_default_dtype: expected float32 or float64, got ") + dtype_name(dtype));
  g_default_dtype = dtype;
}

bool Module::capturing() { return loom::capturing(); }

void Module::guard_settings_now(std::string_view what, std::function<std::vector<double>()> settings) const {
  // The guard compares one integer: the settings' bits, mixed (FNV-1a over each value's
  // bits); a module gone since gives a value no settings give (the step traces again).
  guard_on(what, [alive = std::weak_ptr<char>(alive_.token), settings = std::move(settings)] {
    if (alive.expired()) return std::numeric_limits<int64_t>::min();
    uint64_t h = 1469598103934665603u;
    for (double v : settings()) {
      h ^= std::bit_cast<uint64_t>(v);
      h *= 1099511628211u;
    }
    return static_cast<int64_t>(h >> 1);  // never INT64_MIN
  });
}

Tensor Module::forward(const Tensor&) {
  throw Error("forward: this module does not take a single tensor input");
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_name(name, "register_parameter");
  for (auto& [n, t] : params_)
    if (n == name) throw Error("register_parameter: '" + name + "' is already registered");
  if (!value.defined()) throw Error("register_parameter: '" + name + "' is an undefined tensor");
  value.requires_grad_();
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_name(name, "register_buffer");
  for (auto& [n, t] : buffers_)
    if (n == name) throw Error("register_buffer: '" + name + "' is already registered");
  if (!value.defined()) throw Error("register_buffer: '" + name + "' is an undefined tensor");
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name(name, "register_module");
  if (!module) throw Error("register_module: '" + name + "' is null");
  for (auto& [n, m] : children_)
    if (n == name) throw Error("register_module: '" + name + "' is already registered");
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, NamedTensors& out, bool params, bool buffers) const {
  if (params)
    for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  if (buffers)
    for (auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", out, params, buffers);
}

namespace {

// A tensor reached twice (a module registered under two names, tied weights) keeps its first
// name only, as PyTorch's named_parameters() does: an optimizer given both would update it twice.
NamedTensors first_names(NamedTensors all) {
  std::unordered_set<const TensorImpl*> seen;
  NamedTensors out;
  for (auto& [n, t] : all)
    if (seen.insert(t.impl().get()).second) out.emplace_back(std::move(n), std::move(t));
  return out;
}

}  // namespace

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", out, true, false);
  return first_names(std::move(out));
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", out, false, true);
  return first_names(std::move(out));
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  std::unordered_set<const Module*> seen;
  // Depth first, each child before its own children; a module met again is skipped with
  // everything under it (its first name already listed them).
  auto walk = [&](auto&& self, const Module& m, const std::string& prefix) -> void {
    for (const auto& [n, child] : m.children_) {
      if (!seen.insert(child.get()).second) continue;
      const std::string name = prefix.empty() ? n : prefix + "." + n;
      out.emplace_back(name, child);
      self(self, *child, name);
    }
  };
  walk(walk, *this, "");
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect("", out, true, true);
  return out;
}

void Module::load_state_dict(const NamedTensors& state) {
  std::map<std::string, Tensor> given;
  for (auto& [n, t] : state) {
    if (!given.emplace(n, t).second) throw Error("load_state_dict: key '" + n + "' appears twice");
  }
  auto mine = state_dict();
  std::set<std::string> known;
  // PyTorch's BatchNorm state dicts from before it counted batches lack the count: as
  // PyTorch does, such a count starts from 0.
  auto batch_count = [](const std::string& n) {
    return n == "num_batches_tracked" || n.ends_with(".num_batches_tracked");
  };
  for (auto& [n, t] : mine) {
    known.insert(n);
    auto it = given.find(n);
    if (it == given.end() && batch_count(n) && t.numel() == 1) {
      given.emplace(n, zeros(t.shape(), t.dtype()));
      continue;
    }
    if (it == given.end()) throw Error("load_state_dict: missing key '" + n + "' (expected shape " + shape_str(t.shape()) + ")");
    if (!it->second.defined()) throw Error("load_state_dict: key '" + n + "' holds an undefined tensor");
    if (it->second.shape() != t.shape())
      throw Error("load_state_dict: key '" + n + "' expects shape " + shape_str(t.shape()) +
                  ", the state dict has " + shape_str(it->second.shape()));
  }
  for (auto& [n, t] : given)
    if (!known.count(n)) throw Error("load_state_dict: unexpected key '" + n + "' (shape " + shape_str(t.shape()) + ")");
  // Checked everything first, so a bad state dict changes nothing.
  NoGradGuard no_grad;
  for (auto& [n, t] : mine) {
    const Tensor& v = given.at(n);
    auto value = (v.dtype() == t.dtype() ? v.detach() : v.detach().to(t.dtype())).to(t.device());
    t.assign(value);
  }
}

Module& Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [n, t] : state_dict())
    if (!(t.device() == device)) t.assign(t.detach().to(device));
  return *this;
}

void Module::train(bool on) {
  training_ = on;
  on_train(on);
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.set_grad({});
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& t : parameters()) n += t.numel();
  return n;
}

}  // namespace loom::nn
