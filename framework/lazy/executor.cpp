#include "lazy/executor.h"

#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "runtime/backend.h"

#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/testing.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <unordered_map>

namespace loom {
namespace lazy {
namespace {

struct Executor {
  std::mutex mutex;  // serializes tracing-side execution (host thread and closures)
  std::unordered_map<uint64_t, std::shared_ptr<const runtime::Executable>> cache;
  std::mutex closure_mutex;
  std::vector<std::function<void()>> closures;
  std::exception_ptr closure_error;
};

Executor& executor() {
  static auto* e = new Executor;  // leaked: used by the device thread until exit
  return *e;
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
}

std::shared_ptr<const runtime::Executable> lookup_or_compile(Executor& ex, const ir::Graph& g,
                                                             runtime::Backend& be, RunKind kind) {
  if (auto it = ex.cache.find(g.hash); it != ex.cache.end()) {
    if (kind != RunKind::Eager) metrics::increment("CachedCompile");
    return it->second;
  }
  auto start = std::chrono::steady_clock::now();
  auto exe = be.compile(compiler::compile(g));
  metrics::increment(kind == RunKind::Eager ? "EagerOpCompile" : "UncachedCompile");
  metrics::record("CompileTime", since(start));
  metrics::record("GraphSize", static_cast<double>(g.nodes.size()));
  ex.cache.emplace(g.hash, exe);
  return exe;
}

void rethrow_closure_error() {
  auto& ex = executor();
  std::exception_ptr err;
  {
    std::lock_guard lock(ex.closure_mutex);
    std::swap(err, ex.closure_error);
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace

void run_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors, RunKind kind) {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  std::vector<std::shared_ptr<TensorImpl>> owed;
  std::vector<ir::NodePtr> roots;
  for (const auto& t : tensors) {
    if (auto n = t->pending()) {
      owed.push_back(t);
      roots.push_back(std::move(n));
    }
  }
  if (roots.empty()) return;
  Device device = owed.front()->device();
  auto& be = runtime::backend(device);

  auto trace_start = std::chrono::steady_clock::now();
  ir::Graph g = ir::build_graph(roots);
  metrics::record("GraphBuildTime", since(trace_start));
  auto exe = lookup_or_compile(ex, g, be, kind);

  runtime::BufferList inputs;
  inputs.reserve(g.inputs.size());
  for (auto i : g.inputs)
    inputs.push_back(std::static_pointer_cast<runtime::DeviceBuffer>(g.nodes[i]->payload()));

  auto ready = std::make_shared<runtime::Completion>();
  runtime::BufferList outputs;
  for (std::size_t k = 0; k < owed.size(); ++k) {
    auto buf = std::make_shared<runtime::DeviceBuffer>();
    buf->dtype = owed[k]->dtype();
    buf->shape = owed[k]->shape();
    buf->ready = ready;
    owed[k]->set_data(buf);
    outputs.push_back(std::move(buf));
  }
  be.execute(std::move(exe), std::move(inputs), std::move(outputs));
  if (kind == RunKind::Eager) metrics::increment("EagerOpExecute");
}

void clear_compile_cache() {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  ex.cache.clear();
}

std::size_t compile_cache_size() {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  return ex.cache.size();
}

}  // namespace lazy

void mark_step() {
  lazy::rethrow_closure_error();
  metrics::increment("MarkStep");
  Device device{};
  auto live = lazy::live_pending(device);
  if (!live.empty()) lazy::run_graph(live, lazy::RunKind::Step);

  auto& ex = lazy::executor();
  std::vector<std::function<void()>> closures;
  {
    std::lock_guard lock(ex.closure_mutex);
    closures.swap(ex.closures);
  }
  if (closures.empty()) return;
  runtime::backend(device).enqueue_callback([closures = std::move(closures)] {
    for (const auto& fn : closures) {
      try {
        fn();
      } catch (...) {
        auto& e = lazy::executor();
        std::lock_guard lock(e.closure_mutex);
        if (!e.closure_error) e.closure_error = std::current_exception();
      }
    }
  });
}

void wait_device_ops() {
  runtime::backend(Device{}).synchronize();
  lazy::rethrow_closure_error();
}

void add_step_closure(std::function<void()> fn) {
  auto& ex = lazy::executor();
  std::lock_guard lock(ex.closure_mutex);
  ex.closures.push_back(std::move(fn));
}

namespace {
std::atomic<bool> eager{false};
}  // namespace

void eager_mode(bool on) { eager = on; }
bool is_eager_mode() { return eager; }

namespace testing {

DeviceQueueHold::DeviceQueueHold() { runtime::backend(Device{}).hold_queue(); }
DeviceQueueHold::~DeviceQueueHold() { runtime::backend(Device{}).release_queue(); }
int pending_device_programs() { return runtime::backend(Device{}).pending_programs(); }

}  // namespace testing
}  // namespace loom
