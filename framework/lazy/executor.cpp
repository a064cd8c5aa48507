#include "lazy/executor.h"

#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "lazy/capture.h"
#include "lazy/debug.h"
#include "runtime/registry.h"

#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/profiler.h>
#include <loom/testing.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
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

int64_t env_integer(const char* name, int64_t fallback, int64_t low, int64_t high) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v, &end, 10);
  if (*end || errno == ERANGE || n < low || n > high)
    throw Error(std::string(name) + ": expected an integer from " + std::to_string(low) + " to " +
                std::to_string(high) + ", got '" + v + "'");
  return n;
}

namespace {

// LOOM_MAX_STEPS_IN_FLIGHT, or 2: the host traces the next step while the device runs the
// current one and has the one after queued, and gets no further ahead.
int steps_in_flight_from_env() { return static_cast<int>(env_integer("LOOM_MAX_STEPS_IN_FLIGHT", 2, 1, 1000)); }

// LOOM_COMPILE_CACHE_SIZE, or 1024: programs kept per device before the least recently used
// is dropped (and recompiled if its graph comes back).
int cache_capacity_from_env() { return static_cast<int>(env_integer("LOOM_COMPILE_CACHE_SIZE", 1024, 1, 1'000'000)); }

// One device's compiled programs, most recently used first. An entry keeps its graph's
// structure (ir::GraphKey) so that a graph whose hash matches but whose structure does not is
// compiled anew instead of running another graph's program.
class CompileCache {
 public:
  struct Entry {
    uint64_t hash;
    ir::GraphKey key;
    std::shared_ptr<const runtime::Executable> exe;
  };

  // The entry for `g`, moved to the front; null when absent. A same-hash entry of another
  // structure is dropped and counted as CompileCacheCollision.
  const Entry* find(const ir::Graph& g, Device device) {
    auto it = index_.find(g.hash);
    if (it == index_.end()) return nullptr;
    if (!it->second->key.matches(g)) {
      metrics::increment("CompileCacheCollision", device);
      entries_.erase(it->second);
      index_.erase(it);
      return nullptr;
    }
    entries_.splice(entries_.begin(), entries_, it->second);
    return &entries_.front();
  }

  void insert(const ir::Graph& g, std::shared_ptr<const runtime::Executable> exe, int capacity, Device device) {
    entries_.push_front(Entry{g.hash, ir::GraphKey(g), std::move(exe)});
    index_[g.hash] = entries_.begin();
    while (static_cast<int>(entries_.size()) > capacity) {
      index_.erase(entries_.back().hash);
      entries_.pop_back();
      metrics::increment("CompileCacheEvict", device);
    }
  }

  std::size_t size() const { return entries_.size(); }
  void clear() {
    index_.clear();
    entries_.clear();
  }

 private:
  std::list<Entry> entries_;
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
};

// What the executor keeps per device.
struct DeviceState {
  Device device;
  CompileCache cache;                                // under Executor::mutex
  std::shared_ptr<runtime::Completion> last_queued;  // under Executor::mutex
  // Back-pressure: what each of the last steps queued last (its program, or its closures),
  // oldest first; mark_step waits for the oldest while more than max_in_flight are unfinished.
  std::deque<std::shared_ptr<runtime::Completion>> in_flight;  // under Executor::flight_mutex
  // Every program queued and not known to be finished, oldest first (they finish in order).
  std::deque<std::shared_ptr<runtime::Completion>> programs;   // under Executor::flight_mutex
};

struct Executor {
  std::mutex mutex;  // serializes tracing-side execution (host thread and closures)
  std::mutex closure_mutex;
  std::vector<std::function<void()>> closures;
  std::exception_ptr closure_error;
  std::mutex flight_mutex;
  std::atomic<int> max_in_flight{steps_in_flight_from_env()};
  std::atomic<int> cache_capacity{cache_capacity_from_env()};
  // The last step's closures, which may be queued on their device only after other
  // devices' work has run (mark_step): wait_device_ops waits for them first.
  std::shared_ptr<runtime::Completion> closures_done;  // under closure_mutex

  std::mutex devices_mutex;
  std::deque<DeviceState> devices;  // a deque: states never move once made

  DeviceState& state(Device d) {
    std::lock_guard lock(devices_mutex);
    for (auto& s : devices)
      if (s.device == d) return s;
    devices.emplace_back().device = d;
    return devices.back();
  }
  std::vector<DeviceState*> all_states() {
    std::lock_guard lock(devices_mutex);
    std::vector<DeviceState*> out;
    for (auto& s : devices) out.push_back(&s);
    return out;
  }
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

// A graph with bfloat16 matmuls or convolutions for a device that runs them in float32 (a CPU
// without AVX512_BF16; compiler/widen.h): said once per device, since bfloat16 there saves
// memory but not time (an AVX2 CPU's ResNet-20 step: 601 ms in bfloat16, 511 in float32).
void warn_if_widened(const ir::Graph& g, const ir::Target& target, Device device) {
  for (const auto& n : g.nodes) {
    const ir::Op op = n->op();
    if (op != ir::Op::Matmul && op != ir::Op::Conv2d && op != ir::Op::Conv2dGradInput &&
        op != ir::Op::Conv2dGradWeight)
      continue;
    if (n->dtype() != DType::BFloat16 || target.runs(op, DType::BFloat16)) continue;
    const std::string d = device_str(device);
    debug::warn_once("bfloat16 widened on " + d,
                     d + " has no bfloat16 matmul or convolution kernels (a CPU needs AVX512_BF16), "
                         "so it runs them in float32 on widened copies: bfloat16 (autocast, "
                         "--precision bf16) saves memory there, not time");
    return;
  }
}

// The program for `g` on `device`, from the cache or compiled; the caller holds ex.mutex.
std::shared_ptr<const runtime::Executable> lookup_locked(Executor& ex, const ir::Graph& g, Device device,
                                                         RunKind kind, const std::string& site) {
  auto& cache = ex.state(device).cache;
  if (auto* hit = cache.find(g, device)) {
    if (kind != RunKind::Eager) metrics::increment("CachedCompile", device);
    return hit->exe;
  }
  auto& be = runtime::backend(device);
  profiler::Trace span("compile");
  if (kind != RunKind::Eager) debug::note_compile(g, site);
  warn_if_widened(g, be.target(), device);
  auto start = std::chrono::steady_clock::now();
  auto program = compiler::compile(g, be.target());
  dump(g, program);
  auto exe = be.compile(std::move(program));
  metrics::increment(kind == RunKind::Eager ? "EagerOpCompile" : "UncachedCompile", device);
  metrics::record("CompileTime", since(start));
  metrics::record("GraphSize", static_cast<double>(g.nodes.size()));
  cache.insert(g, exe, ex.cache_capacity, device);
  return exe;
}

}  // namespace

std::shared_ptr<const runtime::Executable> lookup_or_compile(const ir::Graph& g, Device device,
                                                             RunKind kind, const std::string& site) {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  return lookup_locked(ex, g, device, kind, site);
}

std::size_t cached_programs(Device device) {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  return ex.state(device).cache.size();
}

namespace {

// The last step's closures, unless called from one (it would wait for itself).
void wait_for_closures() {
  if (debug::in_closure()) return;
  auto& ex = executor();
  std::shared_ptr<runtime::Completion> done;
  {
    std::lock_guard lock(ex.closure_mutex);
    done = ex.closures_done;
  }
  if (done) done->wait();
}

}  // namespace

void rethrow_closure_error() {
  auto& ex = executor();
  std::exception_ptr err;
  {
    std::lock_guard lock(ex.closure_mutex);
    std::swap(err, ex.closure_error);
  }
  if (err) std::rethrow_exception(err);
}

namespace {
void queue_locked(Executor& ex, Device device, std::shared_ptr<const runtime::Executable> exe,
                  runtime::BufferList inputs, runtime::BufferList outputs,
                  std::shared_ptr<runtime::Completion> ready);
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

  auto trace_start = std::chrono::steady_clock::now();
  ir::Graph g = [&] {
    profiler::Trace span("trace");
    return ir::build_graph(roots);
  }();
  metrics::record("GraphBuildTime", since(trace_start));
  auto exe = lookup_locked(ex, g, device, kind, site);
  if (capture::active) [[unlikely]]
    capture::note_program(device, g, exe, owed);

  runtime::BufferList inputs;
  inputs.reserve(g.inputs.size());
  for (auto i : g.inputs)
    inputs.push_back(std::static_pointer_cast<runtime::DeviceBuffer>(g.nodes[i]->payload()));
  // In a step closure (on the device thread, its step's work done) an input not yet computed
  // is a later step's, queued behind the closure: the program would wait for it for ever.
  if (debug::in_closure())
    for (const auto& b : inputs)
      if (!b->ready->done())
        throw Error("mark_step in a step closure: a pending tensor reads a value a later step computes (the host "
                    "traced and queued that step meanwhile); mark steps from the host, and read values captured "
                    "with t.detach() in the closure");

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
  owed.clear();
  queue_locked(ex, device, std::move(exe), std::move(inputs), std::move(outputs), std::move(ready));
  if (kind == RunKind::Eager) metrics::increment("EagerOpExecute", device);
}

void queue_program(Device device, std::shared_ptr<const runtime::Executable> exe, runtime::BufferList inputs,
                   runtime::BufferList outputs, std::shared_ptr<runtime::Completion> ready) {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  queue_locked(ex, device, std::move(exe), std::move(inputs), std::move(outputs), std::move(ready));
}

namespace {

// queue_program, for a caller that holds ex.mutex.
void queue_locked(Executor& ex, Device device, std::shared_ptr<const runtime::Executable> exe,
                  runtime::BufferList inputs, runtime::BufferList outputs,
                  std::shared_ptr<runtime::Completion> ready) {
  auto& state = ex.state(device);
  state.last_queued = ready;
  {
    std::lock_guard flight(ex.flight_mutex);
    while (!state.programs.empty() && state.programs.front()->done()) state.programs.pop_front();
    state.programs.push_back(std::move(ready));
  }
  runtime::backend(device).execute(std::move(exe), std::move(inputs), std::move(outputs));
}

}  // namespace

namespace {
std::atomic<int64_t> traced_ops{0};

int64_t max_graph_nodes() { return env_integer("LOOM_MAX_GRAPH_NODES", 1'000'000, 1, INT64_MAX); }
}  // namespace

void reset_traced_ops() { traced_ops = 0; }

void note_traced_op() {
  static thread_local bool cutting = false;
  // An eager op has run already: it grows no graph.
  if (cutting || is_eager_mode()) return;
  if (++traced_ops <= max_graph_nodes()) return;
  cutting = true;
  std::cerr << "loom: warning: " << traced_ops.load() << " ops were traced without a step barrier "
            << "(LOOM_MAX_GRAPH_NODES=" << max_graph_nodes() << "); cutting the graph with a mark_step(). "
            << "Call loom::mark_step() in your loop.\n";
  metrics::increment("GraphCut");
  try {
    // A closure's error waits for the user's next barrier: the op that cut is not lost to it.
    mark_step_deferring_errors(debug::site_of(std::source_location::current()));
  } catch (...) {
    cutting = false;
    throw;
  }
  cutting = false;
}

void limit_steps_in_flight(Device device, std::shared_ptr<runtime::Completion> last) {
  auto& ex = executor();
  // A closure that marks a step runs on the device thread, which must never wait for itself.
  if (debug::in_closure()) return;
  auto& state = ex.state(device);
  for (;;) {
    std::shared_ptr<runtime::Completion> oldest;
    {
      std::lock_guard lock(ex.flight_mutex);
      if (last) state.in_flight.push_back(std::move(last));
      while (!state.in_flight.empty() && state.in_flight.front()->done()) state.in_flight.pop_front();
      if (static_cast<int>(state.in_flight.size()) <= ex.max_in_flight) return;
      oldest = state.in_flight.front();
    }
    profiler::Trace span("wait_in_flight");
    auto start = std::chrono::steady_clock::now();
    oldest->wait();  // a failed program is done too: its error surfaces where it is read
    metrics::increment("MarkStepWait", device);
    metrics::record("MarkStepWaitTime", since(start));
  }
}

int unfinished_programs(Device device) {
  auto& ex = executor();
  auto& state = ex.state(device);
  std::lock_guard lock(ex.flight_mutex);
  while (!state.programs.empty() && state.programs.front()->done()) state.programs.pop_front();
  int n = 0;
  for (const auto& c : state.programs) n += !c->done();
  return n;
}

void clear_compile_cache() {
  auto& ex = executor();
  std::lock_guard lock(ex.mutex);
  for (auto* s : ex.all_states()) s->cache.clear();
}

}  // namespace lazy

void mark_step(std::source_location site) { lazy::mark_step_at(debug::site_of(site)); }

void lazy::mark_step_at(const std::string& site) {
  lazy::rethrow_closure_error();
  lazy::mark_step_deferring_errors(site);
}

void lazy::mark_step_deferring_errors(const std::string& site) {
  metrics::increment("MarkStep");
  lazy::reset_traced_ops();
  // One program per device that has pending tensors.
  for (auto& [device, live] : lazy::live_pending_by_device())
    lazy::run_graph(live, lazy::RunKind::Step, site);
  debug::note_step();

  auto& ex = lazy::executor();
  // What each device queued last since the previous step: its program, or its last eager op.
  std::vector<std::pair<Device, std::shared_ptr<runtime::Completion>>> lasts;
  {
    std::lock_guard lock(ex.mutex);
    for (auto* s : ex.all_states())
      if (s->last_queued) lasts.emplace_back(s->device, std::move(s->last_queued));
  }
  std::vector<std::function<void()>> closures;
  {
    std::lock_guard lock(ex.closure_mutex);
    closures.swap(ex.closures);
  }
  if (!closures.empty()) {
    // The closures run on the thread of the first device that queued work, once every
    // device's work of this step has run. No device thread waits for another: a callback on
    // each other device, run after that device's work, passes the closures on to the next,
    // and the last hop queues them on the first device. (A backend may need another device's
    // thread to finish its own work, as the test suite's does.) A step that queued nothing
    // (the barrier after a compiled step, which marked its own) has closures that read what
    // earlier steps queued: they pass through every device in use.
    std::vector<Device> route;
    for (const auto& [d, last] : lasts) route.push_back(d);
    if (route.empty()) route = runtime::devices_in_use();
    Device device = route.empty() ? Device{} : route.front();
    auto done = std::make_shared<runtime::Completion>();
    std::function<void()> hop = [device, closures = std::move(closures), done] {
      runtime::backend(device).enqueue_callback([closures, done] {
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
        done->set_done();
      });
    };
    for (std::size_t i = route.size(); i-- > 1;)
      hop = [other = route[i], next = std::move(hop)] { runtime::backend(other).enqueue_callback(next); };
    {
      std::lock_guard lock(ex.closure_mutex);
      ex.closures_done = done;
    }
    hop();
    if (lasts.empty()) lasts.emplace_back(device, done);
    else lasts.front().second = done;
  }
  for (auto& [device, last] : lasts) lazy::limit_steps_in_flight(device, std::move(last));
}

void empty_device_cache() {
  for (auto device : runtime::devices_in_use()) runtime::backend(device).empty_cache();
}

void empty_device_cache(Device device) { runtime::backend(device).empty_cache(); }

void wait_device_ops() {
  lazy::wait_for_closures();
  for (auto device : runtime::devices_in_use()) runtime::backend(device).synchronize();
  lazy::rethrow_closure_error();
}

void wait_device_ops(Device device) {
  lazy::wait_for_closures();
  runtime::backend(device).synchronize();
  lazy::rethrow_closure_error();
}

void add_step_closure(std::function<void()> fn) {
  lazy::capture::refuse("it adds a step closure inside; add it after the call (it then runs after that step)");
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

void set_compile_cache_size(int programs) {
  if (programs < 1 || programs > 1'000'000)
    throw Error("set_compile_cache_size: expected 1 to 1000000 programs, got " + std::to_string(programs));
  lazy::executor().cache_capacity = programs;
}

int compile_cache_size() { return lazy::executor().cache_capacity; }
bool is_eager_mode() { return eager; }

namespace testing {
namespace {

struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
};

}  // namespace

// A callback that blocks the device thread until the hold ends: nothing queued after it runs
// before then, on any backend, with no hook in the backend contract.
DeviceQueueHold::DeviceQueueHold(Device device) {
  auto gate = std::make_shared<Gate>();
  runtime::backend(device).enqueue_callback([gate] {
    std::unique_lock lock(gate->mutex);
    gate->cv.wait(lock, [&] { return gate->open; });
  });
  gate_ = gate;
}

DeviceQueueHold::~DeviceQueueHold() {
  auto gate = std::static_pointer_cast<Gate>(gate_);
  {
    std::lock_guard lock(gate->mutex);
    gate->open = true;
  }
  gate->cv.notify_all();
}

int pending_device_programs(Device device) { return lazy::unfinished_programs(device); }

}  // namespace testing
}  // namespace loom
