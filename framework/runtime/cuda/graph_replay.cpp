#include "runtime/cuda/graph_replay.h"

#include "runtime/cuda/cuda_check.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace loom::runtime::cuda {

namespace {

std::atomic<bool>& graphs_on() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("LOOM_CUDA_GRAPHS");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

}  // namespace

bool graphs_enabled() { return graphs_on().load(std::memory_order_relaxed); }
void set_graphs_enabled(bool on) { graphs_on().store(on); }

bool GraphPlan::begin_run(const std::vector<const void*>& inputs) {
  ++runs_;
  if (last_inputs_.size() != inputs.size()) {  // the first run
    last_inputs_ = inputs;
    moving_.assign(inputs.size(), false);
    kept_.assign(inputs.size(), 0);
  } else {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i] != last_inputs_[i]) {
        moving_[i] = true;
        kept_[i] = 0;
      } else if (moving_[i] && ++kept_[i] >= kSettleRuns) {
        moving_[i] = false;  // settled: read where it is again (one capture more)
        kept_[i] = 0;
      }
    }
    last_inputs_ = inputs;
  }
  if (given_up_ || runs_ < kFirstGraphRun) return false;
  if (captures_ > kSpareCaptures + runs_ / 8) {
    give_up("its buffers' addresses changed at " + std::to_string(captures_) + " of " + std::to_string(runs_) +
            " runs");
    return false;
  }
  return true;
}

void GraphPlan::captured(const std::vector<const void*>& addresses) {
  key_ = addresses;
  has_graph_ = true;
  ++captures_;
}

void GraphPlan::give_up(std::string why) {
  given_up_ = true;
  has_graph_ = false;
  why_ = std::move(why);
}

GraphReplay::~GraphReplay() { drop(); }

void GraphReplay::drop() {
  if (exec_) cudaGraphExecDestroy(exec_);  // freed once an in-flight launch completes
  exec_ = nullptr;
}

void* GraphReplay::fixed(std::size_t slot, std::size_t bytes,
                         const std::function<std::shared_ptr<Storage>(std::size_t)>& allocate) {
  if (fixed_.size() <= slot) fixed_.resize(slot + 1);
  auto& f = fixed_[slot];
  if (!f || f->bytes() < bytes) f = allocate(bytes);
  return f->data();
}

bool GraphReplay::launch(const std::vector<const void*>& addresses, cudaStream_t stream,
                         cudaStream_t capture_stream, const std::function<void(cudaStream_t)>& launch_all) {
  if (!plan.matches(addresses)) {
    std::string failure;
    cudaGraph_t graph = nullptr;
    if (const auto s = cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal); s != cudaSuccess) {
      failure = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(s);
    } else {
      try {
        launch_all(capture_stream);  // recorded, not run
      } catch (const std::exception& e) {
        failure = e.what();
      }
      const auto ended = cudaStreamEndCapture(capture_stream, &graph);
      if (failure.empty() && ended != cudaSuccess)
        failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
    }
    if (failure.empty() && exec_) {
      // The same kernels with other addresses: updated in place. Launches already queued keep
      // the addresses they were queued with.
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(exec_, graph, &info) != cudaSuccess) {
        cudaGetLastError();
        cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
      }
    }
    if (failure.empty() && !exec_)
      if (const auto s = cudaGraphInstantiate(&exec_, graph, 0); s != cudaSuccess) {
        failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(s);
        exec_ = nullptr;
      }
    if (graph) cudaGraphDestroy(graph);
    if (!failure.empty()) {
      cudaGetLastError();  // a failed capture leaves no sticky error; clear what it reported
      plan.give_up(failure);
      return false;
    }
    plan.captured(addresses);
  }
  check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  return true;
}

}  // namespace loom::runtime::cuda
