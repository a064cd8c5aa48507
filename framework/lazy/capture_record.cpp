// Step capture, the recording side: the hooks a traced call reports to, the Plan built from
// them and how two plans compare; HostScalar, every_call() and guard_on().
#include "lazy/capture_plan.h"

#include "ir/unreachable.h"
#include "lazy/ops_util.h"
#include "runtime/registry.h"

#include <loom/autograd.h>

#include <algorithm>
#include <cstring>

namespace loom {
namespace lazy::capture {
namespace {

const char* describe_class(ScalarClass c) {
  switch (c) {
    case ScalarClass::Zero: return "baked in as 0";
    case ScalarClass::One: return "baked in as 1";
    case ScalarClass::Data: return "device data";
  }
  LOOM_UNREACHABLE("scalar class");
}

bool same_buffer(const std::weak_ptr<DeviceBuffer>& w, const std::shared_ptr<DeviceBuffer>& s) {
  return !w.owner_before(s) && !s.owner_before(w);
}

// The same tensor, even once both are gone (two expired pointers to different tensors differ).
bool same_tensor(const std::weak_ptr<TensorImpl>& a, const std::weak_ptr<TensorImpl>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

std::string tensor_type(DType dtype, const Shape& shape, Device device) {
  return std::string(dtype_name(dtype)) + shape_str(shape) + " on " + device_str(device);
}

std::vector<unsigned char> bytes_of(const std::shared_ptr<DeviceBuffer>& b, runtime::Backend& be) {
  std::vector<unsigned char> out(static_cast<std::size_t>(shape_numel(b->shape)) * dtype_size(b->dtype));
  be.copy_out(b->wait("step capture"), out.data(), out.size());
  return out;
}

}  // namespace

ScalarClass class_of(double v) {
  if (!bakes_scalar(v)) return ScalarClass::Data;
  return v == 0 ? ScalarClass::Zero : ScalarClass::One;
}

constinit thread_local Recorder* active = nullptr;

void note_read(TensorImpl& t, const std::shared_ptr<DeviceBuffer>& data) {
  auto* r = active;
  if (!r || !r->existed(t)) return;
  r->persistent.try_emplace(&t, Recorder::Seen{t.weak_from_this(), data});
}

void note_assign(TensorImpl& t, const std::shared_ptr<DeviceBuffer>& data) {
  auto* r = active;
  if (!r || !r->existed(t)) return;
  r->persistent.try_emplace(&t, Recorder::Seen{t.weak_from_this(), data});
}

void note_set_grad(TensorImpl& t, bool had, bool has) {
  auto* r = active;
  if (!r || !r->existed(t)) return;
  r->fresh_grad.try_emplace(&t, !had && has);
}

void note_host_data(const std::shared_ptr<DeviceBuffer>& data) {
  if (auto* r = active) r->host_data.emplace(data.get(), data);
}

void refuse(const std::string& why) {
  if (auto* r = active) r->refuse(why, true);
}

bool note_program(Device device, const ir::Graph& g, const std::shared_ptr<const runtime::Executable>& exe,
                  const std::vector<std::shared_ptr<TensorImpl>>& owed) {
  auto* r = active;
  if (!r->finishing) {
    r->refuse("it runs a graph before its end (mark_step(), eager mode or a graph cut inside)", true);
    return false;
  }
  if (r->has_program) {
    r->refuse("its step computes on several devices", true);
    return false;
  }
  r->has_program = true;
  auto& p = r->plan;
  p.device = device;
  p.exe = exe;
  p.hash = g.hash;
  p.desc = debug::describe(g);
  // Two tensors that held one buffer at entry (one assign()ed from the other,
  // load_state_dict) are one input of the program: a replay binds it from one of them and
  // reads that one for both, which holds while they still share it (a guard, SharedAtEntry).
  std::unordered_map<const DeviceBuffer*, const Recorder::Seen*> entry_of;
  for (const auto& [impl, seen] : r->persistent) {
    auto b = seen.entry.lock();
    if (!b) continue;
    auto [it, first] = entry_of.emplace(b.get(), &seen);
    if (!first) p.shared.push_back({-1, it->second->tensor, seen.tensor});
  }
  for (std::size_t j = 0; j < r->arg_buffers.size(); ++j) {
    const auto* b = r->arg_buffers[j].get();
    if (!b) continue;
    for (std::size_t k = 0; k < j; ++k)
      if (r->arg_buffers[k].get() == b && r->arg_impls[k] != r->arg_impls[j])
        p.shared.push_back({static_cast<int>(j), {}, r->arg_impls[k]});
    if (auto it = entry_of.find(b); it != entry_of.end() && it->second->tensor.lock() != r->arg_impls[j])
      p.shared.push_back({static_cast<int>(j), {}, it->second->tensor});
  }
  for (auto i : g.inputs) {
    auto buf = std::static_pointer_cast<DeviceBuffer>(g.nodes[i]->payload());
    Source s{};
    bool found = false;
    for (std::size_t j = 0; j < r->arg_buffers.size() && !found; ++j) {
      if (r->arg_buffers[j] == buf) {
        s.kind = Source::Arg;
        s.arg = static_cast<int>(j);
        found = true;
      }
    }
    for (const auto& use : r->scalars) {
      if (found) break;
      if (use.cls == ScalarClass::Data && same_buffer(use.data, buf)) {
        s.kind = Source::Scalar;
        s.scalar = use.state;
        s.dtype = use.dtype;
        found = true;
      }
    }
    if (!found) {
      if (auto it = entry_of.find(buf.get()); it != entry_of.end() && same_buffer(it->second->entry, buf)) {
        s.kind = Source::Persistent;
        s.tensor = it->second->tensor;
        found = true;
      }
    }
    if (!found) {
      if (auto it = r->host_data.find(buf.get()); it != r->host_data.end() && same_buffer(it->second, buf)) {
        s.kind = Source::Constant;
        s.constant = buf;
        found = true;
      }
    }
    if (!found) {
      r->refuse("input " + std::to_string(p.inputs.size()) + " of its step has no origin a replay can find", false);
      return true;
    }
    p.inputs.push_back(std::move(s));
  }
  r->owed = owed;
  return true;
}


const char* counter_of(GuardKind k) {
  switch (k) {
    case GuardKind::Argument: return "GuardFailArgument";
    case GuardKind::Tensor: return "GuardFailTensor";
    case GuardKind::GradMode: return "GuardFailGradMode";
    case GuardKind::Autocast: return "GuardFailAutocast";
    case GuardKind::Host: return "GuardFailHost";
    case GuardKind::Scalar: return "GuardFailScalar";
  }
  LOOM_UNREACHABLE("guard kind");
}

int same_tensor_before(const std::vector<Tensor>& tensors, std::size_t i) {
  if (!tensors[i].defined()) return -1;
  for (std::size_t j = 0; j < i; ++j)
    if (tensors[i].impl() == tensors[j].impl()) return static_cast<int>(j);
  return -1;
}

// The guards a replay checks before anything runs; the first that fails, if any.
std::optional<Failure> check_guards(const Plan& p, const CaptureArgs& a) {
  if (is_grad_enabled() != p.grad_enabled)
    return Failure{GuardKind::GradMode, std::string("grad mode is ") + (p.grad_enabled ? "off" : "on") +
                                            ", the step was captured with it " + (p.grad_enabled ? "on" : "off")};
  if (autocast_precision() != p.precision)
    return Failure{GuardKind::Autocast, std::string("autocast precision is ") + precision_name(autocast_precision()) +
                                            ", the step was captured under " + precision_name(p.precision)};
  if (a.tensors.size() != p.arg_tensors.size())
    return Failure{GuardKind::Argument, "the arguments hold " + std::to_string(a.tensors.size()) +
                                            " tensors, the captured step's " + std::to_string(p.arg_tensors.size())};
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& t = a.tensors[i];
    const auto& m = p.arg_tensors[i];
    if (!t.defined()) return Failure{GuardKind::Argument, "argument tensor " + std::to_string(i) + " is undefined"};
    if (t.dtype() != m.dtype || t.shape() != m.shape || !(t.device() == m.device))
      return Failure{GuardKind::Argument, "argument tensor " + std::to_string(i) + " changed from " +
                                              tensor_type(m.dtype, m.shape, m.device) + " to " +
                                              tensor_type(t.dtype(), t.shape(), t.device())};
    if (t.impl()->requires_grad() != m.requires_grad)
      return Failure{GuardKind::Argument, "argument tensor " + std::to_string(i) + " now " +
                                              (m.requires_grad ? "does not require" : "requires") + " grad"};
  }
  for (std::size_t i = 0; i < a.tensors.size(); ++i)
    if (const int was = p.arg_tensors[i].same_as, now = same_tensor_before(a.tensors, i); now != was) {
      return Failure{GuardKind::Argument,
                     "argument tensor " + std::to_string(i) +
                         (now >= 0 ? " is now argument " + std::to_string(now) + " itself"
                                   : " is no longer argument " + std::to_string(was) + " itself") +
                         " (the step was captured for " + (was >= 0 ? "one tensor" : "two tensors") + ")"};
    }
  if (a.integers != p.integers) {
    for (std::size_t i = 0; i < std::min(a.integers.size(), p.integers.size()); ++i)
      if (a.integers[i] != p.integers[i])
        return Failure{GuardKind::Argument, "argument integer " + std::to_string(i) + " changed from " +
                                                std::to_string(p.integers[i]) + " to " + std::to_string(a.integers[i])};
    return Failure{GuardKind::Argument, "the arguments hold another number of integers"};
  }
  if (a.numbers.size() != p.numbers.size() ||
      (!a.numbers.empty() && std::memcmp(a.numbers.data(), p.numbers.data(), a.numbers.size() * sizeof(double)) != 0)) {
    for (std::size_t i = 0; i < std::min(a.numbers.size(), p.numbers.size()); ++i)
      if (std::memcmp(&a.numbers[i], &p.numbers[i], sizeof(double)) != 0)
        return Failure{GuardKind::Argument, "argument number " + std::to_string(i) + " changed from " +
                                                std::to_string(p.numbers[i]) + " to " + std::to_string(a.numbers[i]) +
                                                " (pass numbers that change as a HostScalar)"};
    return Failure{GuardKind::Argument, "the arguments hold another count of numbers"};
  }
  if (a.texts != p.texts) return Failure{GuardKind::Argument, "a string argument (or a key of a map of tensors) changed"};
  for (const auto& s : p.shared) {
    if (s.arg < 0) continue;  // two tensors, not an argument: check_watched
    auto t = s.tensor.lock();
    const auto& arg = a.tensors[static_cast<std::size_t>(s.arg)];
    if (!t || !arg.defined() || arg.impl()->data() != t->data())
      return Failure{GuardKind::Argument, "argument tensor " + std::to_string(s.arg) +
                                              " shared a buffer with another tensor the step reads when it was "
                                              "captured, and no longer does"};
  }
  return check_watched(p);
}

// The tensors the step reads and writes: alive, on the step's device, requiring grad as
// they did. Checked before the effects and again after them (an every_call() update may
// replace one).
std::optional<Failure> check_watched(const Plan& p) {
  for (const auto& s : p.shared) {
    auto t = s.tensor.lock(), o = s.other.lock();
    if (s.arg < 0 && (!t || !o || t->data() != o->data()))
      return Failure{GuardKind::Tensor, "two tensors the step reads shared one buffer when it was captured, and no longer do"};
  }
  for (const auto& s : p.outputs) {
    if (s.kind != Sink::Grad || !s.fresh_grad) continue;
    auto t = s.tensor.lock();
    if (t && t->grad().defined())
      return Failure{GuardKind::Tensor, "a tensor the step gives a gradient has one already (" +
                                            tensor_type(t->dtype(), t->shape(), t->device()) +
                                            "): the step was traced without, so a replay would replace it"};
  }
  for (const auto& w : p.watched) {
    auto t = w.tensor.lock();
    if (!t) return Failure{GuardKind::Tensor, "a tensor the step reads or writes no longer exists"};
    if (!(t->device() == p.device))
      return Failure{GuardKind::Tensor, "a tensor the step reads or writes moved from " + device_str(p.device) +
                                            " to " + device_str(t->device())};
    if (t->requires_grad() != w.requires_grad)
      return Failure{GuardKind::Tensor, std::string("a tensor the step reads or writes ") +
                                            (w.requires_grad ? "no longer requires" : "now requires") + " grad (" +
                                            tensor_type(t->dtype(), t->shape(), t->device()) + ")"};
  }
  return std::nullopt;
}

// After the effects ran (as in the traced call, where guard_on() follows the every_call()
// updates before it): the tensors the step reads and writes, the host values the trace
// depended on, and every HostScalar entering the graph as it did when captured.
std::optional<Failure> check_host_values(const Plan& p) {
  if (auto f = check_watched(p)) return f;
  for (const auto& g : p.host_guards) {
    int64_t now = g.fn();
    if (now != g.value)
      return Failure{GuardKind::Host, g.what + " changed from " + std::to_string(g.value) + " to " + std::to_string(now)};
  }
  for (const auto& s : p.scalars) {
    double v;
    {
      std::lock_guard lock(s.state->mutex);
      v = s.state->value;
    }
    auto now = class_of(v);
    if (now != s.cls)
      return Failure{GuardKind::Scalar, "HostScalar '" + s.state->name + "' is now " + std::to_string(v) + " (" +
                                            describe_class(now) + "); the captured step read it " +
                                            describe_class(s.cls)};
  }
  return std::nullopt;
}

std::string plan_difference(const Plan& a, const Plan& b, runtime::Backend* backend) {
  if (!(a.device == b.device)) return "the step ran on " + device_str(b.device) + ", before on " + device_str(a.device);
  if (a.hash != b.hash || a.desc != b.desc) return "the graph changed: " + debug::first_difference(a.desc, b.desc);
  if (a.inputs.size() != b.inputs.size()) return "the step's inputs changed";
  if (a.shared.size() != b.shared.size()) return "which tensors share a buffer at entry changed";
  for (std::size_t i = 0; i < a.inputs.size(); ++i) {
    const auto& x = a.inputs[i];
    const auto& y = b.inputs[i];
    std::string where = "input " + std::to_string(i) + " ";
    if (x.kind != y.kind) return where + "comes from elsewhere";
    switch (x.kind) {
      case Source::Arg:
        if (x.arg != y.arg) return where + "is another argument";
        break;
      case Source::Persistent:
        if (!same_tensor(x.tensor, y.tensor))
          return where + "is another tensor (state replaced instead of updated in place with Tensor::assign?)";
        break;
      case Source::Scalar:
        if (x.scalar != y.scalar || x.dtype != y.dtype) return where + "is another HostScalar";
        break;
      case Source::Constant:
        if (x.constant->dtype != y.constant->dtype || x.constant->shape != y.constant->shape ||
            (backend && bytes_of(x.constant, *backend) != bytes_of(y.constant, *backend)))
          return where + "is a value made from host data inside the function (a scalar, from_host), and it "
                         "changed: it would be frozen (pass it as an argument or a HostScalar)";
        break;
    }
  }
  if (a.outputs.size() != b.outputs.size()) return "the step's outputs changed";
  for (std::size_t i = 0; i < a.outputs.size(); ++i) {
    const auto& x = a.outputs[i];
    const auto& y = b.outputs[i];
    if (x.kind != y.kind || x.arg != y.arg || !same_tensor(x.tensor, y.tensor))
      return "output " + std::to_string(i) + " goes elsewhere";
  }
  if (a.results != b.results) return "the returned tensors changed";
  if (a.grad_enabled != b.grad_enabled) return "grad mode changed";
  if (a.precision != b.precision) return "autocast precision changed";
  for (std::size_t i = 0; i < std::min(a.arg_tensors.size(), b.arg_tensors.size()); ++i)
    if (a.arg_tensors[i].same_as != b.arg_tensors[i].same_as) return "the arguments that are one tensor changed";
  if (a.arg_tensors.size() != b.arg_tensors.size() || a.integers != b.integers || a.texts != b.texts ||
      a.numbers.size() != b.numbers.size() ||
      (!a.numbers.empty() && std::memcmp(a.numbers.data(), b.numbers.data(), a.numbers.size() * sizeof(double)) != 0))
    return "the arguments changed";
  if (a.host_guards.size() != b.host_guards.size()) return "guard_on() was called another number of times";
  for (std::size_t i = 0; i < a.host_guards.size(); ++i)
    if (a.host_guards[i].what != b.host_guards[i].what || a.host_guards[i].value != b.host_guards[i].value)
      return a.host_guards[i].what + " changed";
  if (a.effects.size() != b.effects.size()) return "every_call() was called another number of times";
  if (a.scalars.size() != b.scalars.size()) return "another number of HostScalars was read";
  for (std::size_t i = 0; i < a.scalars.size(); ++i)
    if (a.scalars[i].state != b.scalars[i].state || a.scalars[i].cls != b.scalars[i].cls ||
        a.scalars[i].dtype != b.scalars[i].dtype)
      return "HostScalar '" + b.scalars[i].state->name + "' entered the graph differently";
  return {};
}

// Resolves the outputs of the recorded program; the plan is complete after it. Returns the
// reason when a replay could not reproduce the call.
std::string resolve_outputs(Recorder& r, const CaptureArgs& results) {
  auto& p = r.plan;
  // The tensors that existed before the call and that the step reads or writes, and their
  // gradients: a gradient computed by the step is an output a replay hands to its tensor.
  std::unordered_map<const TensorImpl*, std::shared_ptr<TensorImpl>> grad_holder;
  for (const auto& [raw, seen] : r.persistent) {
    auto t = seen.tensor.lock();
    if (!t || std::find(r.arg_impls.begin(), r.arg_impls.end(), t) != r.arg_impls.end()) continue;
    if (auto g = t->grad(); g.defined()) grad_holder.emplace(g.impl().get(), t);
  }
  for (const auto& t : r.owed) {
    Sink s{};
    s.dtype = t->dtype();
    s.shape = t->shape();
    auto arg = std::find(r.arg_impls.begin(), r.arg_impls.end(), t);
    if (arg != r.arg_impls.end()) {
      s.kind = Sink::Arg;
      s.arg = static_cast<int>(arg - r.arg_impls.begin());
    } else if (r.existed(*t)) {
      s.kind = Sink::Persistent;
      s.tensor = t;
      if (t->grad_fn()) return "a tensor the step updates in place keeps autograd history";
    } else if (auto it = grad_holder.find(t.get()); it != grad_holder.end()) {
      s.kind = Sink::Grad;
      s.tensor = it->second;
      auto fresh = r.fresh_grad.find(it->second.get());
      s.fresh_grad = fresh != r.fresh_grad.end() && fresh->second;
    } else {
      s.kind = Sink::Result;
    }
    p.outputs.push_back(std::move(s));
  }
  // Each returned tensor is an output, and a tensor made in the call is held only where a
  // replay puts it: our list, its .grad() slot, the return value (and the list of it).
  for (const auto& t : results.tensors) {
    auto it = std::find(r.owed.begin(), r.owed.end(), t.impl());
    if (!t.defined() || it == r.owed.end())
      return "it returns a tensor that its step does not compute (return only what the step computes)";
    p.results.push_back(static_cast<int>(it - r.owed.begin()));
  }
  // Guarded at each replay: the tensors that existed before the call and that the step reads,
  // updates or gives a gradient.
  std::unordered_map<const TensorImpl*, bool> watched;
  auto watch = [&](const std::weak_ptr<TensorImpl>& w) {
    auto t = w.lock();
    if (t && watched.emplace(t.get(), true).second) p.watched.push_back({t, t->requires_grad()});
  };
  for (const auto& src : p.inputs) {
    if (src.kind != Source::Persistent) continue;
    if (src.tensor.expired())
      return "a tensor its step reads is gone by the step's end (a gradient accumulated over calls, or state "
             "replaced instead of updated in place with Tensor::assign)";
    watch(src.tensor);
  }
  for (const auto& sink : p.outputs)
    if (sink.kind == Sink::Persistent || sink.kind == Sink::Grad) watch(sink.tensor);
  for (std::size_t k = 0; k < r.owed.size(); ++k) {
    const auto& s = p.outputs[k];
    if (s.kind == Sink::Arg || s.kind == Sink::Persistent) continue;
    long expected = 1 + (s.kind == Sink::Grad ? 1 : 0);
    for (int out : p.results) expected += out == static_cast<int>(k) ? 2 : 0;
    if (s.kind == Sink::Result && expected == 1)
      return "a tensor its step computes is kept outside it, neither returned, nor a gradient, nor updated in "
             "place with Tensor::assign (a replay could not update it)";
    if (r.owed[k].use_count() > expected)
      return "a tensor its step computes is also kept elsewhere (a replay would not update that copy)";
  }
  return {};
}


}  // namespace lazy::capture

// ---- HostScalar, every_call, guard_on ----

ir::NodePtr detail::HostScalarState::device_copy(DType dtype, Device device) {
  std::lock_guard lock(mutex);
  auto fresh = [&] { return lazy::scalar_data(value, dtype, device).impl()->node(); };
  for (auto& c : copies) {
    if (c.dtype != dtype || !(c.device == device)) continue;
    // Compared bitwise: -0.0 and NaN payloads are values too.
    if (std::memcmp(&c.value, &value, sizeof value) != 0) {
      c.leaf = fresh();
      c.value = value;
    }
    return c.leaf;
  }
  copies.push_back({dtype, device, value, fresh()});
  return copies.back().leaf;
}

HostScalar::HostScalar(double value, std::string name) : state_(std::make_shared<detail::HostScalarState>()) {
  state_->name = std::move(name);
  state_->value = value;
}

void HostScalar::set(double value) {
  std::lock_guard lock(state_->mutex);
  state_->value = value;
}

double HostScalar::value() const {
  std::lock_guard lock(state_->mutex);
  return state_->value;
}

const std::string& HostScalar::name() const { return state_->name; }

Tensor HostScalar::tensor(DType dtype, Device device) const {
  double v = value();
  auto cls = lazy::capture::class_of(v);
  Tensor t = cls == lazy::capture::ScalarClass::Data ? lazy::make_tensor(state_->device_copy(dtype, device), device)
                                                      : scalar_tensor(v, dtype, device);
  if (auto* r = lazy::capture::active) {
    lazy::capture::ScalarUse use{state_, dtype, cls, {}};
    if (cls == lazy::capture::ScalarClass::Data) use.data = t.impl()->data();
    r->scalars.push_back(std::move(use));
  }
  return t;
}

void every_call(std::function<void()> fn) {
  auto* r = lazy::capture::active;
  if (!r || !r->suppress_effects) fn();
  if (r) r->effects.push_back(std::move(fn));
}

bool capturing() { return lazy::capture::active != nullptr; }

void guard_on(std::string_view what, std::function<int64_t()> fn) {
  auto* r = lazy::capture::active;
  if (!r) return;  // nothing recorded: no copy of `what` on the tracing path
  int64_t value = fn();
  r->host_guards.push_back({std::string(what), std::move(fn), value});
}

}  // namespace loom
