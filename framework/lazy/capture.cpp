// Step capture (loom/compile.h), per compiled function: a traced call is recorded as a Plan
// (capture_record.cpp); two equal plans in a row make it the captured step, and a replay
// checks the plan's guards, binds the current buffers and queues its program without running
// the function.
#include "lazy/capture_plan.h"

#include "lazy/executor.h"
#include "runtime/registry.h"

#include <loom/autograd.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/profiler.h>

#include <chrono>
#include <list>
#include <optional>

namespace loom {

namespace detail {

using lazy::capture::Plan;

class CaptureState {
 public:
  std::string site;
  std::list<Plan> plans;  // captured, most recently replayed first
  std::optional<Plan> candidate;
  int failures_in_row = 0;
  int unstable_in_row = 0;
  bool lazy_forever = false;
  int check_every = 0;  // LOOM_CAPTURE_CHECK
  int replays_since_check = 0;
  std::optional<std::list<Plan>::iterator> checking;  // the plan a checking trace compares with
  bool effects_ran = false;  // a replay ran the effects, then failed a scalar guard

  void give_up(const std::string& why) {
    lazy_forever = true;
    plans.clear();
    candidate.reset();
    metrics::increment("CaptureGiveUp");
    debug::warn_once("capture " + site, "the compiled function at " + site + " is traced at every call: " + why);
  }
};

namespace {

// LOOM_CAPTURE_CHECK, or 0 (off): the checking mode's period.
int check_every_from_env() { return static_cast<int>(lazy::env_integer("LOOM_CAPTURE_CHECK", 0, 0, 1'000'000)); }

// Work traced before the call is not the function's: it runs first, as its own step, so
// that the step's graph is the function's alone at every call.
void run_pending_work(const std::string& site) {
  if (lazy::has_live_pending()) lazy::mark_step_at(site);
}

}  // namespace

std::shared_ptr<CaptureState> make_capture_state(const std::source_location& site, bool capture) {
  auto s = std::make_shared<CaptureState>();
  s->site = debug::site_of(site);
  s->lazy_forever = !capture;
  s->check_every = check_every_from_env();
  return s;
}

bool is_captured(const CaptureState& state) { return !state.plans.empty(); }
bool stays_lazy(const CaptureState& state) { return state.lazy_forever; }

}  // namespace detail

namespace detail {

using lazy::capture::Failure;
using lazy::capture::Plan;
using lazy::capture::Recorder;
using lazy::capture::Sink;
using lazy::capture::Source;

namespace {

void note_failure(CaptureState& s, const Failure& f) {
  metrics::increment("GuardFail");
  metrics::increment(lazy::capture::counter_of(f.kind));
  debug::note_guard_failure(s.site, f.cause);
  if (++s.failures_in_row >= lazy::capture::kMaxFailuresInRow)
    s.give_up("its guards failed at " + std::to_string(s.failures_in_row) + " calls in a row (the last: " + f.cause + ")");
}

double since_ns(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const std::any* try_replay(CaptureState& s, const CaptureArgs& args, std::vector<Tensor>& results) {
  // A replay queues its program without a graph the enclosing trace could see.
  lazy::capture::refuse("it calls another compiled function inside");
  // A step closure's error surfaces here, before the call traces, replays or changes anything.
  lazy::rethrow_closure_error();
  if (s.lazy_forever) return nullptr;
  run_pending_work(s.site);
  if (s.plans.empty()) return nullptr;
  auto start = std::chrono::steady_clock::now();
  profiler::Trace span("replay");
  auto plan = s.plans.end();
  std::optional<Failure> failure;
  for (auto it = s.plans.begin(); it != s.plans.end(); ++it) {
    auto f = lazy::capture::check_guards(*it, args);
    if (!f) {
      plan = it;
      break;
    }
    if (!failure) failure = std::move(f);
  }
  if (plan == s.plans.end()) {
    note_failure(s, *failure);
    return nullptr;
  }
  if (s.check_every > 0 && ++s.replays_since_check >= s.check_every) {
    s.replays_since_check = 0;
    s.checking = plan;  // trace instead, and compare (CaptureTrace::finish)
    return nullptr;
  }
  Plan& p = *plan;
  for (const auto& fn : p.effects) fn();
  if (auto f = lazy::capture::check_host_values(p)) {
    s.effects_ran = true;  // the trace that follows must not run them again
    note_failure(s, *f);
    return nullptr;
  }
  s.failures_in_row = 0;
  if (plan != s.plans.begin()) s.plans.splice(s.plans.begin(), s.plans, plan);

  runtime::BufferList inputs;
  inputs.reserve(p.inputs.size());
  for (const auto& src : p.inputs) {
    switch (src.kind) {
      case Source::Arg: inputs.push_back(args.tensors[src.arg].impl()->data()); break;
      case Source::Persistent: inputs.push_back(src.tensor.lock()->data()); break;
      case Source::Scalar:
        inputs.push_back(std::static_pointer_cast<runtime::DeviceBuffer>(src.scalar->device_copy(src.dtype, p.device)->payload()));
        break;
      case Source::Constant: inputs.push_back(src.constant); break;
    }
  }
  auto ready = std::make_shared<runtime::Completion>();
  runtime::BufferList outputs;
  outputs.reserve(p.outputs.size());
  std::vector<Tensor> made(p.outputs.size());
  for (std::size_t k = 0; k < p.outputs.size(); ++k) {
    const auto& sink = p.outputs[k];
    auto buf = std::make_shared<runtime::DeviceBuffer>();
    buf->dtype = sink.dtype;
    buf->shape = sink.shape;
    buf->ready = ready;
    switch (sink.kind) {
      case Sink::Arg: args.tensors[sink.arg].impl()->set_data(buf); break;
      case Sink::Persistent: sink.tensor.lock()->set_data(buf); break;
      case Sink::Grad:
        made[k] = Tensor(std::make_shared<TensorImpl>(buf, p.device));
        sink.tensor.lock()->set_grad(made[k]);
        break;
      case Sink::Result: made[k] = Tensor(std::make_shared<TensorImpl>(buf, p.device)); break;
    }
    outputs.push_back(std::move(buf));
  }
  results.clear();
  for (int out : p.results) {
    // An assigned tensor the function also returns is returned itself, as a trace returns it.
    const auto& sink = p.outputs[static_cast<std::size_t>(out)];
    if (sink.kind == Sink::Arg) results.push_back(args.tensors[sink.arg]);
    else if (sink.kind == Sink::Persistent) results.push_back(Tensor(sink.tensor.lock()));
    else results.push_back(made[out]);
  }
  lazy::queue_program(p.device, p.exe, std::move(inputs), std::move(outputs), std::move(ready));
  metrics::increment("CaptureReplay", p.device);
  metrics::record("ReplayHostTime", since_ns(start));
  lazy::mark_step_deferring_errors(s.site);  // the step's closures and back-pressure
  return &p.shape;
}

struct CaptureTrace::Impl {
  CaptureState& state;
  const CaptureArgs& args;
  Recorder recorder;
  Recorder* outer;
  EagerModeGuard eager_off{false};
  bool recording;
  // Set when this trace checks a captured plan (LOOM_CAPTURE_CHECK).
  std::optional<std::list<Plan>::iterator> checking;

  Impl(CaptureState& s, const CaptureArgs& a)
      : state(s), args(a), outer(lazy::capture::active),
        // A replay that ran the effects and then failed a guard (and may have given up) is
        // followed by a recorded trace, so that its every_call() updates are not run twice.
        recording(!s.lazy_forever || s.effects_ran),
        checking(std::exchange(s.checking, std::nullopt)) {
    if (!recording) return;
    recorder.entry_id = TensorImpl::next_id();
    recorder.suppress_effects = std::exchange(s.effects_ran, false);
    for (const auto& t : a.tensors) {
      recorder.arg_impls.push_back(t.impl());
      recorder.arg_buffers.push_back(t.defined() ? t.impl()->data() : nullptr);
    }
    if (a.is_opaque) recorder.refuse("an argument is of a type compile() cannot guard (see capture_visit)", true);
    lazy::capture::active = &recorder;
  }
  ~Impl() {
    if (recording) lazy::capture::active = outer;
  }
};

CaptureTrace::CaptureTrace(CaptureState& state, const CaptureArgs& args) {
  run_pending_work(state.site);
  impl_ = std::make_unique<Impl>(state, args);
}

CaptureTrace::~CaptureTrace() = default;

void CaptureTrace::finish(const CaptureArgs& results, std::any shape) {
  auto& s = impl_->state;
  if (!impl_->recording) {
    lazy::mark_step_deferring_errors(s.site);
    return;
  }
  auto& r = impl_->recorder;
  r.finishing = true;
  lazy::mark_step_deferring_errors(s.site);
  lazy::capture::active = impl_->outer;
  impl_->recording = false;
  if (s.lazy_forever) return;
  auto checking = impl_->checking;

  if (results.is_opaque) r.refuse("it returns a type compile() cannot rebuild (see capture_visit)", true);
  if (r.permanent) {
    s.give_up(r.refusal);
    return;
  }
  if (!r.has_program && r.refusal.empty()) return;  // nothing computed: nothing to capture
  std::string why = r.refusal;
  auto& p = r.plan;
  if (why.empty()) why = lazy::capture::resolve_outputs(r, results);
  r.owed.clear();
  if (why.empty()) {
    p.grad_enabled = is_grad_enabled();
    p.precision = autocast_precision();
    const auto& ts = impl_->args.tensors;
    for (std::size_t i = 0; i < ts.size(); ++i)
      p.arg_tensors.push_back({ts[i].dtype(), ts[i].shape(), ts[i].device(), ts[i].impl()->requires_grad(),
                               lazy::capture::same_tensor_before(ts, i)});
    p.integers = impl_->args.integers;
    p.numbers = impl_->args.numbers;
    p.texts = impl_->args.texts;
    p.host_guards = std::move(r.host_guards);
    p.effects = std::move(r.effects);
    p.scalars = std::move(r.scalars);
    for (auto& u : p.scalars) u.data.reset();
    p.shape = std::move(shape);
  }
  if (checking) {
    std::string diff = why.empty() ? lazy::capture::plan_difference(**checking, p, &runtime::backend(p.device)) : why;
    if (!diff.empty())
      throw Error("compile (" + s.site + "): LOOM_CAPTURE_CHECK: a fresh trace of the function differs from its "
                  "captured step: " + diff + ". Host code in the function took another path or value than when it "
                  "was captured; pass such values as arguments or HostScalars");
    metrics::increment("CaptureCheck");
    return;
  }
  if (!why.empty()) {
    s.candidate.reset();
    if (++s.unstable_in_row >= lazy::capture::kMaxFailuresInRow) s.give_up(why);
    return;
  }
  std::string diff = s.candidate ? lazy::capture::plan_difference(*s.candidate, p, &runtime::backend(p.device))
                                 : "first traced call";
  if (!diff.empty()) {
    s.candidate = std::move(p);
    if (++s.unstable_in_row >= lazy::capture::kMaxFailuresInRow)
      s.give_up("its step changed at each of " + std::to_string(s.unstable_in_row) + " calls (the last: " + diff + ")");
    return;
  }
  // Two calls in a row traced the same step: capture it.
  s.candidate.reset();
  s.unstable_in_row = 0;
  s.failures_in_row = 0;
  s.plans.push_front(std::move(p));
  if (static_cast<int>(s.plans.size()) > lazy::capture::kMaxPlans) s.plans.pop_back();
  metrics::increment("StepCaptured");
}

}  // namespace detail
}  // namespace loom
