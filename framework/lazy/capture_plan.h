// What step capture keeps between the recording of a traced call and its replays: the Plan
// (where each input of the step's program comes from, where each output goes, what the trace
// depended on), the Recorder that builds it, and the checks run on it. Private to
// framework/lazy/capture*.cpp; the hooks the rest of the engine calls are in capture.h.
#pragma once

#include "lazy/capture.h"
#include "lazy/debug.h"

#include <loom/autocast.h>
#include <loom/compile.h>

#include <any>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom {

namespace detail {


// A HostScalar's value and its device copies (one per dtype and device, for the value they
// were made from).
struct HostScalarState {
  std::string name;
  std::mutex mutex;
  double value = 0;
  // A device copy: its buffer and the one DeviceData leaf that stands for it. Each use makes
  // a new tensor over them, so the copy is never a tensor that existed before a traced call.
  struct Copy {
    DType dtype;
    Device device;
    double value;
    ir::NodePtr leaf;
  };
  std::vector<Copy> copies;

  // The DeviceData leaf of the current value as `dtype` on `device` (copied there if stale).
  ir::NodePtr device_copy(DType dtype, Device device);
};


}  // namespace detail

namespace lazy::capture {

using detail::CaptureArgs;
using detail::HostScalarState;
using runtime::DeviceBuffer;

constexpr int kMaxPlans = 8;          // captured steps kept per function
constexpr int kMaxFailuresInRow = 8;  // guard failures (or unstable traces) before giving up

// How a scalar entered the graph: baked in as 0, as 1, or device data.
enum class ScalarClass { Zero, One, Data };
ScalarClass class_of(double v);

// Where an input of the captured program comes from at a replay.
struct Source {
  enum Kind { Arg, Persistent, Scalar, Constant } kind;
  int arg = -1;                                   // Arg: index among the arguments' tensors
  std::weak_ptr<TensorImpl> tensor;               // Persistent: its current buffer
  std::shared_ptr<HostScalarState> scalar;        // Scalar: its device copy
  DType dtype = DType::Float32;                   // Scalar
  std::shared_ptr<DeviceBuffer> constant;         // Constant: made from host data in the trace
};

// Where an output of the captured program goes.
struct Sink {
  enum Kind { Arg, Persistent, Grad, Result } kind;
  int arg = -1;                      // Arg: the argument tensor updated in place
  std::weak_ptr<TensorImpl> tensor;  // Persistent: its new buffer; Grad: its new .grad()
  // Grad: the traced call gave the tensor its first gradient, so a replay needs it to have none
  // at entry (it would be replaced, where the traced code would have added to it).
  bool fresh_grad = false;
  DType dtype;
  Shape shape;
};

// A tensor the step reads or writes that existed before the call.
struct Watched {
  std::weak_ptr<TensorImpl> tensor;
  bool requires_grad;
};

// Two tensors that held one buffer at the captured call's entry (one assign()ed from the
// other): the program reads them as one input, so a replay needs them to share it still.
// `arg` >= 0: the argument at that index and `tensor`; otherwise `other` and `tensor`.
struct SharedAtEntry {
  int arg = -1;
  std::weak_ptr<TensorImpl> other;
  std::weak_ptr<TensorImpl> tensor;
};

struct ScalarUse {
  std::shared_ptr<HostScalarState> state;
  DType dtype;
  ScalarClass cls;
  std::weak_ptr<DeviceBuffer> data;  // while recording: the buffer it gave (Data)
};

struct HostGuard {
  std::string what;
  std::function<int64_t()> fn;
  int64_t value;
};

struct ArgTensor {
  DType dtype;
  Shape shape;
  Device device;
  bool requires_grad;
  int same_as = -1;  // the first earlier argument that is this same tensor (-1: none)
};

// The first of tensors[0, i) that is tensors[i] itself (-1: none): a plan binds each argument
// on its own, so which arguments are one tensor is guarded.
int same_tensor_before(const std::vector<Tensor>& tensors, std::size_t i);

struct Plan {
  Device device;
  std::shared_ptr<const runtime::Executable> exe;
  uint64_t hash = 0;
  debug::GraphDesc desc;
  std::vector<Source> inputs;
  std::vector<Sink> outputs;
  std::vector<int> results;  // per returned tensor, its output
  std::vector<Watched> watched;
  std::vector<SharedAtEntry> shared;
  // Guards.
  bool grad_enabled = true;
  Precision precision = Precision::Float32;  // the Autocast scope's (include/loom/autocast.h)
  std::vector<ArgTensor> arg_tensors;
  std::vector<int64_t> integers;
  std::vector<double> numbers;
  std::vector<std::string> texts;
  std::vector<HostGuard> host_guards;
  std::vector<ScalarUse> scalars;
  std::vector<std::function<void()>> effects;
  std::any shape;  // the return value, tensors cleared
};

// What a traced call did, as far as capture is concerned.
class Recorder {
 public:
  uint64_t entry_id = 0;  // tensors with a smaller id existed before the call
  std::vector<std::shared_ptr<TensorImpl>> arg_impls;
  std::vector<std::shared_ptr<DeviceBuffer>> arg_buffers;  // at the call's entry
  bool finishing = false;   // inside the step barrier at the function's exit
  bool suppress_effects = false;
  std::string refusal;
  bool permanent = false;

  struct Seen {
    std::weak_ptr<TensorImpl> tensor;
    std::weak_ptr<DeviceBuffer> entry;  // its buffer when the call began
  };
  std::unordered_map<const TensorImpl*, Seen> persistent;
  // Per tensor that existed, from its first gradient change in the call: true when that
  // change gave a gradient where there was none (a replay must then find none at entry; a
  // step that clears the gradient first, or adds to it, does not care).
  std::unordered_map<const TensorImpl*, bool> fresh_grad;
  std::unordered_map<const DeviceBuffer*, std::weak_ptr<DeviceBuffer>> host_data;
  std::vector<ScalarUse> scalars;
  std::vector<HostGuard> host_guards;
  std::vector<std::function<void()>> effects;

  bool has_program = false;
  Plan plan;
  std::vector<std::shared_ptr<TensorImpl>> owed;

  void refuse(const std::string& why, bool forever) {
    if (!refusal.empty() && (permanent || !forever)) return;
    refusal = why;
    permanent = forever;
  }

  bool existed(const TensorImpl& t) const { return t.id() < entry_id; }
};

enum class GuardKind { Argument, Tensor, GradMode, Autocast, Host, Scalar };
// The metric a failure of this kind counts in.
const char* counter_of(GuardKind k);

struct Failure {
  GuardKind kind;
  std::string cause;
};

// The guards a replay checks before anything runs; the first that fails, if any.
std::optional<Failure> check_guards(const Plan& p, const CaptureArgs& a);
// The tensors the step reads and writes (alive, device, requires_grad); part of both checks.
std::optional<Failure> check_watched(const Plan& p);
// After the every_call() effects ran: the tensors again (an update may replace one), the
// guard_on() values and the HostScalars' classes.
std::optional<Failure> check_host_values(const Plan& p);
// How `b` differs from `a`, in words; empty when a replay of one would be the other. Compares
// constants' bytes through `backend` when given.
std::string plan_difference(const Plan& a, const Plan& b, runtime::Backend* backend);
// Resolves the outputs of the recorded program; the plan is complete after it. Returns the
// reason when a replay could not reproduce the call.
std::string resolve_outputs(Recorder& r, const CaptureArgs& results);

}  // namespace lazy::capture
}  // namespace loom
