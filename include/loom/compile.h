// compile(fn): a step function traced while it changes, then captured once and replayed
// without tracing.
//
//   loom::HostScalar scale(0.5, "scale");  // a host number the step reads (a learning rate)
//   auto step = loom::compile([&](const loom::Tensor& x) {
//     w.assign(w - x * scale.tensor(w.dtype(), w.device()));
//     return (w * w).sum();
//   });
//   for (auto& [x, y] : batches) {
//     loom::Tensor loss = step(x);  // calls 1-2 trace; from call 3 the step is replayed
//     scale.set(scale.value() * 0.9);
//   }
//
// A call runs `fn` with eager mode off and marks the step at its exit (one program). Once
// two traced calls give the same step (the same graph, reading and writing the same tensors),
// the step is captured: later calls do not run `fn` at all. They check the guards, bind the
// new inputs to the captured program and queue it: no IR nodes, no graph build, no hash.
//
// What a replay binds, and how it knows it (docs/architecture.md, "Step capture"):
//   - the tensors in fn's arguments, by position (a data::Batch, vectors and maps of
//     tensors, pairs and tuples are walked; see capture_visit below);
//   - tensors that existed before the call and that the step reads or updates in place with
//     Tensor::assign (parameters, optimizer state, batch-norm statistics): their current
//     buffers, by identity; a tensor the step updates gets its new buffer;
//   - each parameter's .grad() the step computes; the tensors fn returns (without autograd
//     history: call backward inside fn);
//   - HostScalar values, read at every replay (0 and 1 are baked into the graph as for any
//     scalar, so a change to or from 0 or 1 fails a guard and traces again);
//   - host state registered with every_call() (re-run at each replay) and guard_on().
// Guards, checked at every replay: the arguments' dtypes, shapes and devices, which of them
// are one tensor, their numbers and strings by value; the tensors read and written (alive,
// device, requires_grad); grad mode; the autocast precision; guard_on values; HostScalars
// baked in as 0 or 1. A failed guard traces the call again (recompiling only if the graph is
// new), names the cause in loom::debug::recompile_causes() and counts it (metrics
// GuardFail<Cause>); after 8 failures in a row the function stays lazy with a warning. Up to 8
// captured steps are kept, so alternating shapes replay too.
//
// What capture cannot see: host code in fn runs only when fn is traced. A branch on a host
// value, or a number computed on the host and turned into a tensor inside fn, is frozen into
// the captured step; pass such numbers as arguments or HostScalars. LOOM_CAPTURE_CHECK=N
// traces every Nth replay again and throws a loom::Error naming the first node (or input)
// that differs from the captured step. A function that reads a value inside (item(),
// to_host(), printing), moves a tensor between devices, adds a step closure or marks a step
// inside is never captured: it is traced at every call, with a warning naming the reason.
// Tensors fn makes and keeps elsewhere (neither returned, nor a gradient, nor assigned in
// place) also keep it traced. A tensor passed as an argument is that argument everywhere in
// the captured step, also where fn reads it through a capture (f(w) for a fn that reads w
// itself replays f(v) as reading v twice): pass a tensor always as an argument or never.
// A step closure's error is rethrown at the start of the next call, before it runs anything;
// a call whose step was queued returns its result. A compiled function is called from one
// thread at a time.
#pragma once

#include <loom/tensor.h>

#include <any>
#include <cstdlib>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
struct HostScalarState;
}

// A host number read by traced steps as a 0-d tensor: set() it between calls (a learning-rate
// schedule) and a captured step reads the new value at its next replay. Copies share the value;
// assigning another HostScalar over one makes it that other one, which a step captured before
// does not read (it keeps the one it was captured with): set() the value instead.
class HostScalar {
 public:
  explicit HostScalar(double value = 0, std::string name = "scalar");
  void set(double value);
  double value() const;
  const std::string& name() const;
  // The value as a 0-d tensor of `dtype` on `device`, as scalar_tensor() makes it (0 and 1
  // baked in, other values device data). A value is copied to a device once, at its first use.
  Tensor tensor(DType dtype, Device device) const;

 private:
  std::shared_ptr<detail::HostScalarState> state_;
};

// Inside a compiled function: host state that every call must update, such as an optimizer's
// step count. Runs `fn` now; once the step is captured, each replay runs it again before the
// program's inputs are bound. Outside a compiled function it only runs `fn`.
void every_call(std::function<void()> fn);
// Inside a compiled function: a host value the trace depends on (how many parameters an
// optimizer updates, a branch's condition). A replay checks, after the every_call() updates,
// that `fn` returns what it returned when the step was traced; otherwise the call is traced
// again (its every_call() updates not repeated), and `what` names the cause.
void guard_on(std::string_view what, std::function<int64_t()> fn);
// True while a compiled function is being traced on this thread (when every_call() and
// guard_on() record), so code can skip building what they would record otherwise.
bool capturing();

// How compile() walks a value: calls v.tensor(t) for each tensor and v.integer / v.number /
// v.text for what guards compare. Overload capture_visit(V&, const YourType&) in YourType's
// namespace to pass your own types; loom::data::Batch has one.
template <class V>
void capture_visit(V& v, const Tensor& t);
template <class V, class T>
  requires std::is_arithmetic_v<T> || std::is_enum_v<T>
void capture_visit(V& v, const T& x);
template <class V>
void capture_visit(V& v, const std::string& s);
template <class V, class T, class A>
void capture_visit(V& v, const std::vector<T, A>& xs);
template <class V, class K, class T, class C, class A>
void capture_visit(V& v, const std::map<K, T, C, A>& m);
template <class V, class A, class B>
void capture_visit(V& v, const std::pair<A, B>& p);
template <class V, class... T>
void capture_visit(V& v, const std::tuple<T...>& t);
template <class V, class T>
void capture_visit(V& v, const T&);

template <class V>
void capture_visit(V& v, const Tensor& t) {
  v.tensor(t);
}
template <class V, class T>
  requires std::is_arithmetic_v<T> || std::is_enum_v<T>
void capture_visit(V& v, const T& x) {
  if constexpr (std::is_floating_point_v<T>) v.number(static_cast<double>(x));
  else v.integer(static_cast<int64_t>(x));
}
template <class V>
void capture_visit(V& v, const std::string& s) {
  v.text(s);
}
template <class V, class T, class A>
void capture_visit(V& v, const std::vector<T, A>& xs) {
  v.integer(static_cast<int64_t>(xs.size()));
  for (const auto& x : xs) capture_visit(v, x);
}
template <class V, class K, class T, class C, class A>
void capture_visit(V& v, const std::map<K, T, C, A>& m) {
  v.integer(static_cast<int64_t>(m.size()));
  for (const auto& [k, x] : m) {
    capture_visit(v, k);
    capture_visit(v, x);
  }
}
template <class V, class A, class B>
void capture_visit(V& v, const std::pair<A, B>& p) {
  capture_visit(v, p.first);
  capture_visit(v, p.second);
}
template <class V, class... T>
void capture_visit(V& v, const std::tuple<T...>& t) {
  std::apply([&](const auto&... x) { (capture_visit(v, x), ...); }, t);
}
// Any other type: compile() cannot guard it, so the function is never captured.
template <class V, class T>
void capture_visit(V& v, const T&) {
  v.opaque();
}

namespace detail {

class CaptureState;

// What compile() learns from a call's arguments (or return value).
struct CaptureArgs {
  std::vector<Tensor> tensors;
  std::vector<int64_t> integers;
  std::vector<double> numbers;
  std::vector<std::string> texts;
  bool is_opaque = false;  // a part compile() cannot guard

  void tensor(const Tensor& t) { tensors.push_back(t); }
  void integer(int64_t x) { integers.push_back(x); }
  void number(double x) { numbers.push_back(x); }
  void text(const std::string& s) { texts.push_back(s); }
  void opaque() { is_opaque = true; }
};

// Writes the replayed tensors into a copy of the return value captured with the step.
struct CaptureRefill {
  const std::vector<Tensor>& with;
  std::size_t next = 0;
  void tensor(const Tensor& t) { const_cast<Tensor&>(t) = with.at(next++); }
  void integer(int64_t) {}
  void number(double) {}
  void text(const std::string&) {}
  void opaque() {}
};

std::shared_ptr<CaptureState> make_capture_state(const std::source_location& site, bool capture);
// Replays a captured step when the guards hold: fills `results` (the returned tensors, in
// visit order) and returns the captured return value to refill (an empty std::any for void);
// returns null when the call must be traced.
const std::any* try_replay(CaptureState& state, const CaptureArgs& args, std::vector<Tensor>& results);
bool is_captured(const CaptureState& state);
bool stays_lazy(const CaptureState& state);

// One traced call: records what the step reads and writes while `fn` runs (eager mode off);
// finish() marks the step and learns the plan. Destroyed without finish() (fn threw), it
// leaves nothing behind.
class CaptureTrace {
 public:
  CaptureTrace(CaptureState& state, const CaptureArgs& args);
  ~CaptureTrace();
  CaptureTrace(const CaptureTrace&) = delete;
  CaptureTrace& operator=(const CaptureTrace&) = delete;
  // `results`: the returned tensors in visit order; `shape`: the return value with its
  // tensors cleared, kept to rebuild it at replays.
  void finish(const CaptureArgs& results, std::any shape);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace detail

struct CompileOptions {
  // false: trace every call, as before step capture (for comparisons and debugging).
  bool capture = true;
};

// The callable that compile() returns.
template <class Fn>
class Compiled {
 public:
  Compiled(Fn fn, CompileOptions options, const std::source_location& site)
      : fn_(std::move(fn)), state_(detail::make_capture_state(site, options.capture)) {}

  template <class... Args>
  auto operator()(Args&&... args) {
    using R = std::decay_t<std::invoke_result_t<Fn&, Args&&...>>;
    detail::CaptureArgs in;
    (capture_visit(in, std::as_const(args)), ...);
    std::vector<Tensor> replayed;
    if (const std::any* shape = detail::try_replay(*state_, in, replayed)) {
      if constexpr (std::is_void_v<R>) {
        return;
      } else if constexpr (std::is_copy_constructible_v<R>) {
        R out = std::any_cast<const R&>(*shape);
        detail::CaptureRefill refill{replayed};
        capture_visit(refill, std::as_const(out));
        return out;
      } else {
        std::abort();  // never captured: finish() refuses a return value it cannot copy
      }
    }
    detail::CaptureTrace trace(*state_, in);
    if constexpr (std::is_void_v<R>) {
      fn_(std::forward<Args>(args)...);
      trace.finish({}, {});
    } else {
      R out = fn_(std::forward<Args>(args)...);
      detail::CaptureArgs results;
      capture_visit(results, std::as_const(out));
      std::any shape;
      if constexpr (std::is_copy_constructible_v<R>) {
        R cleared = out;
        std::vector<Tensor> none(results.tensors.size());
        detail::CaptureRefill refill{none};
        capture_visit(refill, std::as_const(cleared));
        shape = std::move(cleared);
      } else {
        results.is_opaque = true;  // nothing to rebuild the return value from
      }
      trace.finish(results, std::move(shape));
      return out;
    }
  }

  // Whether later calls replay a captured step.
  bool captured() const { return detail::is_captured(*state_); }
  // Whether the function gave up on capture and is traced at every call.
  bool stays_lazy() const { return detail::stays_lazy(*state_); }

 private:
  Fn fn_;
  std::shared_ptr<detail::CaptureState> state_;
};

// Returns a callable that runs `fn` with eager mode off, calls mark_step() at its exit, and
// captures the step once it is stable (above). `site` names it in causes and warnings.
template <class Fn>
Compiled<Fn> compile(Fn fn, CompileOptions options = {}, std::source_location site = std::source_location::current()) {
  return Compiled<Fn>(std::move(fn), options, site);
}

}  // namespace loom
