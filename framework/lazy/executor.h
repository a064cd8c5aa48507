// The graph executor: turns pending tensors into one queued program (compile cache,
// buffers handed out at once), and runs step closures. See DESIGN.md, "The step barrier".
#pragma once

#include "lazy/tensor_impl.h"
#include "runtime/buffer.h"

#include <memory>
#include <vector>

namespace loom::lazy {

enum class RunKind { Step, Read, Eager };

// Compiles (or finds) the graph of the tensors' pending values, gives each tensor its device
// buffer and queues the program; returns without waiting. Tensors no longer pending are
// skipped.
// `site` names the caller in recompile causes.
void run_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors, RunKind kind,
               const std::string& site);
// Counts a traced op; past LOOM_MAX_GRAPH_NODES ops without a barrier, cuts the graph with a
// warning (an automatic mark_step) so a loop with no barrier cannot grow a huge graph.
void note_traced_op();
void reset_traced_ops();

// Back-pressure, called by mark_step with what its step queued last: waits (counted as
// MarkStepWait) until at most max_steps_in_flight() steps are unfinished on the device.
void limit_steps_in_flight(std::shared_ptr<runtime::Completion> last);

// Removes every cached program (for tests of compile counts).
void clear_compile_cache();

}  // namespace loom::lazy
