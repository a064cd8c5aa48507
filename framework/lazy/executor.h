// The graph executor: turns pending tensors into one queued program (compile cache,
// buffers handed out at once), and runs step closures. See DESIGN.md, "The step barrier".
#pragma once

#include "ir/graph.h"
#include "lazy/tensor_impl.h"
#include "runtime/backend.h"

#include <memory>
#include <string>
#include <vector>

namespace loom::lazy {

enum class RunKind { Step, Read, Eager };

// The integer in environment variable `name`, or `fallback` when it is unset or empty; a
// loom::Error naming the variable and the range for anything else.
int64_t env_integer(const char* name, int64_t fallback, int64_t low, int64_t high);

// Compiles (or finds) the graph of the tensors' pending values, gives each tensor its device
// buffer and queues the program; returns without waiting. Tensors no longer pending are
// skipped.
// `site` names the caller in recompile causes.
void run_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors, RunKind kind,
               const std::string& site);
// Queues `exe` on `device` over `inputs`, writing `outputs` (fresh buffers that share the
// Completion `ready`): what run_graph does once it has the program, and what a replayed step
// does with its captured one.
void queue_program(Device device, std::shared_ptr<const runtime::Executable> exe, runtime::BufferList inputs,
                   runtime::BufferList outputs, std::shared_ptr<runtime::Completion> ready);
// mark_step() with the site already named.
void mark_step_at(const std::string& site);
// mark_step_at(), except that an error a step closure raised is left for the next barrier
// that rethrows (mark_step, wait_device_ops, the start of a compiled call): the barrier at a
// compiled call's end (a call whose step ran returns) and a graph cut (the op that cut runs).
void mark_step_deferring_errors(const std::string& site);
// Rethrows the first error a step closure raised since the last rethrow, if any.
void rethrow_closure_error();

// Counts a traced op; past LOOM_MAX_GRAPH_NODES ops without a barrier, cuts the graph with a
// warning (an automatic mark_step) so a loop with no barrier cannot grow a huge graph.
void note_traced_op();
void reset_traced_ops();

// Back-pressure, called by mark_step with what its step queued last: waits (counted as
// MarkStepWait) until at most max_steps_in_flight() steps are unfinished on the device.
void limit_steps_in_flight(Device device, std::shared_ptr<runtime::Completion> last);
// Programs queued on `device` and not yet finished.
int unfinished_programs(Device device);

// The program for `g` on `device`: from the device's compile cache (least recently used
// out past set_compile_cache_size(); a same-hash graph of another structure never hits), or
// compiled for the device's target and cached.
std::shared_ptr<const runtime::Executable> lookup_or_compile(const ir::Graph& g, Device device,
                                                             RunKind kind, const std::string& site);
// Programs in `device`'s compile cache.
std::size_t cached_programs(Device device);

// Removes every cached program (for tests of compile counts).
void clear_compile_cache();

}  // namespace loom::lazy
