// The engine side of step capture (loom/compile.h): while a compiled function is traced, a
// Recorder on the tracing thread learns where each input of the step's program comes from
// and where each output goes; the tensor and executor code report to it through the hooks
// below, which cost one thread-local load when nothing is recorded.
#pragma once

#include "ir/graph.h"
#include "lazy/tensor_impl.h"
#include "runtime/backend.h"

#include <memory>
#include <string>
#include <vector>

namespace loom::lazy::capture {

class Recorder;
extern constinit thread_local Recorder* active;

// Hooks, called with a recorder active.
// `t`'s buffer `data` becomes an operand (TensorImpl::node of a tensor on the device).
void note_read(TensorImpl& t, const std::shared_ptr<runtime::DeviceBuffer>& data);
// `t` is about to take a new value; `data` is the buffer it holds before (null when pending).
void note_assign(TensorImpl& t, const std::shared_ptr<runtime::DeviceBuffer>& data);
// `t` takes a new gradient (`had` and `has`: defined before and after).
void note_set_grad(TensorImpl& t, bool had, bool has);
// A buffer copied from the host inside the function (from_host, a scalar): a constant of the
// captured step.
void note_host_data(const std::shared_ptr<runtime::DeviceBuffer>& data);
// Something the function does that a replay cannot repeat; the function stays traced.
void refuse(const std::string& why);
// run_graph, about to queue `exe` for `g`: true when it is the traced step's program (the
// recorder takes note of its inputs and outputs), false when the function ran a graph before
// its end (refused).
bool note_program(Device device, const ir::Graph& g, const std::shared_ptr<const runtime::Executable>& exe,
                  const std::vector<std::shared_ptr<TensorImpl>>& owed);

}  // namespace loom::lazy::capture
