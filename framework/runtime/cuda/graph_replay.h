// A program's run as one CUDA graph launch, once its addresses have settled (issue 17: "a
// replayed captured step runs as a CUDA graph").
//
// A run's kernels take the addresses of their operands as parameters, so a graph replays
// only where every address is the one it was captured with. The arena is the executable's
// own; parameters and optimizer state come back in the buffers they were donated, so they
// settle after a step or two. Two kinds of buffers never settle, and in graph mode go
// through fixed buffers of the executable instead:
//   - an input whose buffer differs from the previous run's ("moving": each batch, each new
//     learning-rate scalar) is copied into a fixed buffer before the graph;
//   - a result that takes no donor is written into a fixed buffer and copied out after the
//     graph to the buffer handed to the engine.
// Both copies are device-to-device on the compute stream: a few per step, against the
// hundreds of launches the graph replaces. A moving input may still be donated: its result is
// written into a fixed buffer and copied out into the input's own buffer, so a parameter that
// moved once (an early step that could not donate) comes back in the same buffer from then on.
// An input that keeps one address for kSettleRuns runs in a row settles: it is read where it
// is again and its result written over it inside the graph (one capture more), so a step
// whose parameters moved while it warmed up loses its copies.
//
// The graph is captured on the third run of an executable (the first two show which inputs
// move), on a stream no other thread uses (the allocator records free events on the compute
// stream from any thread, which would break a capture there), then launched on the compute
// stream. A run whose addresses differ from the graph's (a donation that did not happen, a
// workspace that grew) captures again and updates the graph in place (cudaGraphExecUpdate),
// or instantiates it anew. A program whose capture fails (a library call that cannot be
// captured) or whose addresses keep changing gives graphs up and runs as launches. Runs with
// the profiler on are launched kernel by kernel, so that each is timed.
#pragma once

#include "runtime/storage.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom::runtime::cuda {

// Whether graphs are on: LOOM_CUDA_GRAPHS=0 turns them off; the tests switch them.
bool graphs_enabled();
void set_graphs_enabled(bool on);

// Which buffers of a run go through fixed buffers, and when a graph is worth capturing. Plain
// bookkeeping, no CUDA: tested on its own.
class GraphPlan {
 public:
  // Once per run, before binding: notes each input's address (null: an input with no
  // storage), marks as moving an input whose address differs from the last run's, and
  // settles a moving one that kept its address for kSettleRuns runs. Returns whether this
  // run goes through a graph.
  bool begin_run(const std::vector<const void*>& inputs);
  bool moving(std::size_t input) const { return input < moving_.size() && moving_[input]; }
  // After binding, in graph mode: whether the graph captured for `addresses` (every slot's
  // address, as the kernels see it, and the library workspace's) is the one to launch. When
  // it is not, the caller captures again and calls captured(addresses).
  bool matches(const std::vector<const void*>& addresses) const { return has_graph_ && addresses == key_; }
  void captured(const std::vector<const void*>& addresses);
  // The run's work changed at the same addresses (its library ops were made again): the next
  // graph run captures anew, as if its addresses had changed.
  void forget() { has_graph_ = false; }
  // Graphs are given up for this program: its runs are launched kernel by kernel from now on.
  void give_up(std::string why);
  bool given_up() const { return given_up_; }
  const std::string& why_given_up() const { return why_; }
  int64_t runs() const { return runs_; }
  int64_t captures() const { return captures_; }

  // The run from which a program may go through a graph, and how many captures it may take
  // beyond its first before graphs are given up: one per 8 runs, and 4 more.
  static constexpr int64_t kFirstGraphRun = 3;
  static constexpr int64_t kSpareCaptures = 4;
  // Runs in a row at one address after which a moving input settles: more than a batch that
  // happens to reuse the last batch's buffer once.
  static constexpr int kSettleRuns = 3;

 private:
  std::vector<const void*> last_inputs_;
  std::vector<bool> moving_;
  std::vector<int> kept_;  // per moving input: runs in a row at its last address
  std::vector<const void*> key_;
  bool has_graph_ = false;
  bool given_up_ = false;
  std::string why_;
  int64_t runs_ = 0;
  int64_t captures_ = 0;
};

// The executable's graph and its fixed buffers. Only the launch thread touches it.
class GraphReplay {
 public:
  GraphReplay() = default;
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;
  ~GraphReplay();

  GraphPlan plan;

  // The fixed buffer of slot `slot` (at least `bytes`), made on first use by `allocate`.
  void* fixed(std::size_t slot, std::size_t bytes,
              const std::function<std::shared_ptr<Storage>(std::size_t)>& allocate);

  // Launches the graph for `addresses` on `stream`, capturing it first (on `capture_stream`,
  // where `launch_all` queues the run's work) unless plan.matches(addresses). Returns false,
  // having queued nothing and given graphs up, when the capture or the instantiation fails:
  // the caller then launches the run itself.
  bool launch(const std::vector<const void*>& addresses, cudaStream_t stream, cudaStream_t capture_stream,
              const std::function<void(cudaStream_t)>& launch_all);
  // Destroys the graph (before the module holding its kernels is unloaded).
  void drop();

 private:
  std::vector<std::shared_ptr<Storage>> fixed_;  // per slot
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace loom::runtime::cuda
