#include "lazy/executor.h"

#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "lazy/debug.h"
#include "runtime/cpu/allocator.h"
#include "runtime/backend.h"

#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/profiler.h>
#include <loom/testing.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <mutex>
#include <unordered_map>

namespace loom {
namespace lazy {
namespace {

// LOOM_MAX_STEPS_IN_FLIGHT, or 2: the host traces the next step while the device runs the
// current one and has the one after queued, and gets no further ahead.
int steps_in_flight_from_env() {
  const char* v = std::getenv("LOOM_MAX_STEPS_IN_FLIGHT");
  if (!v || !*v) return 2;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end || n < 1 || n > 1000)
    throw Error(std::string("LOOM_MAX_STEPS_IN_FLIGHT: expected an integer from 1 to 1000, got '") + v + "'");
  return static_cast<int>(n);
}

struct Executor {
  std::mutex mutex;  // serializes tracing-side execution (host thread and closures)
  std::unordered_map<uint64_t, std::shared_ptr<const runtime::Executable>> cache;
  std::mutex closure_mutex;
  std::vector<std::function<void()>> closures;
  std::exception_ptr closure_error;
  // Back-pressure: what each of the last steps queued last (its program, or its closures),
  // oldest first; mark_step waits for the oldest while more than max_in_flight are unfinished.
  std::shared_ptr<runtime::Completion> last_queued;  // under `mutex`
  std::mutex flight_mutex;
  std::deque<std::shared_ptr<runtime::Completion>> in_flight;
  std::atomic<int> max_in_flight{steps_in_flight_from_env()};
};

Executor& executor() {
  static auto* e = new Executor;  // leaked: used by the device thread until exit
  return *e;
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
}

// LOOM_DUMP_GRAPHS=dir: every compiled graph as text and Graphviz dot, named by its hash,
// before the compiler passes, and the Program they produce.
void dump(const ir::Graph& g, const ir::Program& p) {
  const char* dir = std::getenv("LOOM_DUMP_GRAPHS");
  if (!dir || !*dir) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ostringstream name;
  name << dir << "/graph_" << std::hex << g.hash;
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream f(path);
    if (!(f << text)) std::cerr << "loom: warning: cannot write graph dump '" << path << "'\n";
  };
  write(name.str() + ".before.txt", ir::to_text(g));
  write(name.str() + ".before.dot", ir::to_dot(g));
  write(name.str() + ".after.txt", ir::to_text(p));
}

std::shared_ptr<const runtime::Executable> lookup_or_compile(Executor& ex, const ir::Graph& g,
                                                             runtime::Backend& be, RunKind kind,
                                                             const std::string& site) {
  if (auto it = ex.cache.find(g.hash); it != ex.cache.end()) {
    if (kind != RunKind::Eager) metrics::increment("CachedCompile");
    return it->second;
  }
  profiler::Trace span("compile");
  if (kind != RunKind::Eager) debug::note_compile(g, site);
  auto start = std::chrono::steady_clock::now();
  auto program = compiler::compile(g);
  dump(g, program);
  auto exe = be.compile(std::move(program));
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

void run_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors, RunKind kind,
               const std::string& site) {
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
  ir::Graph g = [&] {
    profiler::Trace span("trace");
    return ir::build_graph(roots);
  }();
  metrics::record("GraphBuildTime", since(trace_start));
  auto exe = lookup_or_compile(ex, g, be, kind, site);

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
  // The graph's leaves hold its input buffers; let go of them before the program is queued,
  // so that an input the step overwrote (an old parameter) is held by the program alone and
  // can be donated to its result (memory_plan.h).
  roots.clear();
  g = ir::Graph{};
  ex.last_queued = ready;
  be.execute(std::move(exe), std::move(inputs), std::move(outputs));
  if (kind == RunKind::Eager) metrics::increment("EagerOpExecute");
}

namespace {
std::atomic<int64_t> traced_ops{0};

int64_t max_graph_nodes() {
  const char* v = std::getenv("LOOM_MAX_GRAPH_NODES");
  if (!v || !*v) return 1'000'000;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  if (*end || n <= 0) throw Error(std::string("LOOM_MAX_GRAPH_NODES: expected a positive integer, got '") + v + "'");
  return n;
}
}  // namespace

void reset_traced_ops() { traced_ops = 0; }

void note_traced_op() {
  static thread_local bool cutting = false;
  if (cutting) return;
  if (++traced_ops <= max_graph_nodes()) return;
  cutting = true;
  std::cerr << "loom: warning: " << traced_ops.load() << " ops were traced without a step barrier "
            << "(LOOM_MAX_GRAPH_NODES=" << max_graph_nodes() << "); cutting the graph with a mark_step(). "
            << "Call loom::mark_step() in your loop.\n";
  metrics::increment("GraphCut");
  try {
    mark_step();
  } catch (...) {
    cutting = false;
    throw;
  }
  cutting = false;
}

void limit_steps_in_flight(std::shared_ptr<runtime::Completion> last) {
  auto& ex = executor();
  // A closure that marks a step runs on the device thread, which must never wait for itself.
  if (debug::in_closure()) return;
  for (;;) {
    std::shared_ptr<runtime::Completion> oldest;
    {
      std::lock_guard lock(ex.flight_mutex);
      if (last) ex.in_flight.push_back(std::move(last));
      while (!ex.in_flight.empty() && ex.in_flight.front()->done()) ex.in_flight.pop_front();
      if (static_cast<int>(ex.in_flight.size()) <= ex.max_in_flight) return;
      oldest = ex.in_flight.front();
    }
    profiler::Trace span("wait_in_flight");
    auto start = std::chrono::steady_clock::now();
    oldest->wait();  // a failed program is done too: its error surfaces where it is read
    metrics::increment("MarkStepWait");
    metrics::record("MarkStepWaitTime", since(start));
  }
}

void clear_compile_cache() {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  ex.cache.clear();
}


}  // namespace lazy

void mark_step(std::source_location site) {
  lazy::rethrow_closure_error();
  metrics::increment("MarkStep");
  lazy::reset_traced_ops();
  Device device{};
  auto live = lazy::live_pending(device);
  if (!live.empty()) lazy::run_graph(live, lazy::RunKind::Step, debug::site_of(site));
  debug::note_step();

  auto& ex = lazy::executor();
  std::vector<std::function<void()>> closures;
  {
    std::lock_guard lock(ex.closure_mutex);
    closures.swap(ex.closures);
  }
  std::shared_ptr<runtime::Completion> last;
  if (!closures.empty()) {
    last = std::make_shared<runtime::Completion>();
    runtime::backend(device).enqueue_callback([closures = std::move(closures), last] {
      debug::set_in_closure(true);
      for (const auto& fn : closures) {
        try {
          profiler::Trace span("step_closure");
          fn();
        } catch (...) {
          auto& e = lazy::executor();
          std::lock_guard lock(e.closure_mutex);
          if (!e.closure_error) e.closure_error = std::current_exception();
        }
      }
      debug::set_in_closure(false);
      last->set_done();
    });
  } else {
    std::lock_guard lock(ex.mutex);
    last = std::move(ex.last_queued);  // the step's program, or the last eager op's
  }
  if (last) lazy::limit_steps_in_flight(std::move(last));
}

void empty_device_cache() { runtime::empty_cache(); }

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

void set_max_steps_in_flight(int steps) {
  if (steps < 1 || steps > 1000)
    throw Error("set_max_steps_in_flight: expected 1 to 1000 steps, got " + std::to_string(steps));
  lazy::executor().max_in_flight = steps;
}

int max_steps_in_flight() { return lazy::executor().max_in_flight; }
bool is_eager_mode() { return eager; }

namespace testing {

DeviceQueueHold::DeviceQueueHold() { runtime::backend(Device{}).hold_queue(); }
DeviceQueueHold::~DeviceQueueHold() { runtime::backend(Device{}).release_queue(); }
int pending_device_programs() { return runtime::backend(Device{}).pending_programs(); }

}  // namespace testing
}  // namespace loom
