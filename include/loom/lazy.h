// Controlling the lazy engine: step barriers, eager mode, compile, step closures.
//
//   for (auto& [x, y] : batches) {
//     z += x + y;        // traced
//     loom::mark_step(); // hash, compile once, queue on the device, return at once
//   }
//   loom::wait_device_ops();
//
//   auto step = loom::compile([&] { w.assign(w - lr * grad(w)); });
//   step();              // traced with eager mode off; mark_step() at exit; captured once
//                        // stable and replayed without tracing (loom/compile.h)
#pragma once

#include <loom/dtype.h>

#include <loom/compile.h>

#include <exception>
#include <functional>
#include <source_location>
#include <utility>

namespace loom {

// Compiles (or finds in the cache) the graph of every live pending tensor, one per device,
// gives each its device buffer, queues the programs (and the step closures) on the device
// threads and returns
// without waiting for it, unless more than max_steps_in_flight() steps would then be
// unfinished on the device: it then waits for the oldest (counted as MarkStepWait), so the
// host stays a step or two ahead, never further. `site` (the caller's line) is what
// recompile causes and warnings name.
void mark_step(std::source_location site = std::source_location::current());
// The bound on unfinished steps (default 2, or the environment's LOOM_MAX_STEPS_IN_FLIGHT):
// 1 runs each step before the host traces the next; more lets a host with uneven steps run
// further ahead, at the cost of memory and of a later reaction to a signal. 1 to 1000.
void set_max_steps_in_flight(int steps);
int max_steps_in_flight();
// Waits until everything queued on every device (or on `device`) has run.
void wait_device_ops();
void wait_device_ops(Device device);
// Returns the device memory that no tensor holds (the caching allocator's free blocks) to
// the system; the next buffers are then fresh allocations. For freeing memory between phases
// of a program, like torch.cuda.empty_cache(); a training loop never needs it. Every device
// in use, or only `device`.
void empty_device_cache();
void empty_device_cache(Device device);

// Compiled programs kept per device (default 1024, or the environment's
// LOOM_COMPILE_CACHE_SIZE): past it the least recently used is dropped, counted as
// CompileCacheEvict, and compiled again if its graph returns. 1 to 1000000.
void set_compile_cache_size(int programs);
int compile_cache_size();

// Deterministic algorithms (off by default, or the environment's LOOM_DETERMINISTIC=1), as
// torch.use_deterministic_algorithms: every kernel then gives the same bits whatever the
// thread count. The CPU's conv weight gradient runs on loom's own kernels, which split their
// sums by the shapes only, instead of oneDNN's, which split the sum over images by the thread
// count (and are faster: README, "Benchmarks"). Either way a CPU run repeats bit for bit at a
// fixed thread count. On a GPU the conv gradients take cuDNN's first-ranked algorithms, as
// PyTorch does, and some of those sum with atomics: there runs repeat bit for bit only with
// this on. Read as the programs run: no recompilation (a CUDA program already run makes its
// library calls again at its next run).
void use_deterministic_algorithms(bool on);
bool are_deterministic_algorithms_enabled();

// In eager mode every op runs as soon as it is created (one-op graphs, same compile cache):
// it is queued on the device at once, so a failure in it (an index out of range) surfaces at
// the read that needs its value, as in lazy mode, not at the op.
void eager_mode(bool on);
bool is_eager_mode();

class EagerModeGuard {
 public:
  explicit EagerModeGuard(bool on) : previous_(is_eager_mode()) { eager_mode(on); }
  ~EagerModeGuard() { eager_mode(previous_); }
  EagerModeGuard(const EagerModeGuard&) = delete;
  EagerModeGuard& operator=(const EagerModeGuard&) = delete;

 private:
  bool previous_;
};

// Runs `fn` once the values of the current step exist (after the next mark_step's program
// has run), on the device thread, without tracing a new graph. Not inside a compiled function
// (it would not be captured): add it after the call, and it runs after that call's step.
// An exception `fn` throws is rethrown by the next mark_step(), wait_device_ops() or
// compiled call, at its start (before it runs anything). Capture the tensors `fn` reads as
// values: a handle to a tensor that a later step assigns (a parameter) would read that later
// value, which the device thread running `fn` cannot wait for, so the read is a loom::Error
// once that step is queued; t.detach() taken when adding the closure is this step's value.
// A mark_step() inside `fn` runs every pending tensor, the host's too: one that reads a later
// step's value (the host traced ahead) makes it a loom::Error, so mark steps from the host.
void add_step_closure(std::function<void()> fn);

}  // namespace loom
