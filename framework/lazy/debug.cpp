#include "lazy/debug.h"

#include <cstdlib>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

namespace loom::debug {
namespace {

constexpr std::size_t kMaxCauses = 100;
constexpr int kWarmupSteps = 3;
constexpr std::size_t kWindow = 10;

struct StepRecord {
  int compiles = 0;
  std::map<std::string, int> transfers;  // site -> count
};

struct State {
  std::mutex mutex;
  std::map<std::string, std::vector<NodeDesc>> last_graph;  // per call site
  std::deque<RecompileCause> causes;
  std::vector<std::string> warnings;
  std::set<std::string> warned;
  std::deque<StepRecord> steps{StepRecord{}};
  int steps_seen = 0;
};

State& state() {
  static auto* s = new State;  // leaked: the device thread may report until exit
  return *s;
}

thread_local bool closure_running = false;
thread_local int reads_expected = 0;  // ExpectedReads alive on this thread

}  // namespace

GraphDesc describe(const ir::Graph& g) {
  std::unordered_map<const ir::Node*, int> index;
  std::vector<NodeDesc> out;
  out.reserve(g.nodes.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto& n = *g.nodes[i];
    index[&n] = static_cast<int>(i);
    NodeDesc d{n.op(), n.dtype(), n.shape(), n.attr(), {}};
    for (const auto& o : n.operands()) d.operands.push_back(index.at(o.get()));
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

std::string type_str(const NodeDesc& d) { return std::string(dtype_name(d.dtype)) + shape_str(d.shape); }

std::vector<const NodeDesc*> of_op(const std::vector<NodeDesc>& g, ir::Op op) {
  std::vector<const NodeDesc*> out;
  for (const auto& d : g)
    if (d.op == op) out.push_back(&d);
  return out;
}

}  // namespace

std::string first_difference(const GraphDesc& was, const GraphDesc& now) {
  auto in_was = of_op(was, ir::Op::DeviceData);
  auto in_now = of_op(now, ir::Op::DeviceData);
  if (in_was.size() == in_now.size()) {
    for (std::size_t i = 0; i < in_now.size(); ++i)
      if (!(in_was[i]->dtype == in_now[i]->dtype && in_was[i]->shape == in_now[i]->shape))
        return "input " + std::to_string(i) + " changed from " + type_str(*in_was[i]) + " to " +
               type_str(*in_now[i]);
  }
  auto c_was = of_op(was, ir::Op::Constant).size();
  auto c_now = of_op(now, ir::Op::Constant).size();
  if (in_now.size() < in_was.size() && c_now > c_was)
    return "a scalar became a constant: 0 and 1 are baked into the graph (LOOM_NO_SPECIAL_SCALARS=1 "
           "keeps them device data)";
  if (in_now.size() > in_was.size() && c_now < c_was)
    return "a constant became a scalar input: a value changed from 0 or 1 to another";
  if (in_now.size() != in_was.size())
    return "the graph has " + std::to_string(in_now.size()) + " inputs, the last one " +
           std::to_string(in_was.size());
  std::size_t n = std::min(was.size(), now.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (was[i] == now[i]) continue;
    const auto& a = was[i];
    const auto& b = now[i];
    std::string where = "node %" + std::to_string(i) + ": ";
    if (a.op != b.op)
      return where + (now.size() > was.size() ? "an op was added: " : now.size() < was.size() ? "an op was removed: " : "") +
             "was " + ir::op_name(a.op) + ", now " + ir::op_name(b.op);
    if (!(a.shape == b.shape && a.dtype == b.dtype))
      return where + ir::op_name(b.op) + " changed from " + type_str(a) + " to " + type_str(b);
    if (!(a.attr == b.attr)) return where + "the attributes of " + ir::op_name(b.op) + " changed";
    return where + "the operands of " + ir::op_name(b.op) + " changed";
  }
  if (now.size() > was.size()) return "ops were added after node %" + std::to_string(n) + " (" + ir::op_name(now[n].op) + ")";
  if (now.size() < was.size()) return "ops were removed after node %" + std::to_string(n);
  return "the outputs changed";
}

namespace {

bool debug_on() {
  const char* v = std::getenv("LOOM_DEBUG");
  return v && *v && std::string(v) != "0";
}

void warn(State& s, const std::string& key, const std::string& message) {
  if (!s.warned.insert(key).second) return;
  s.warnings.push_back(message);
  std::cerr << "loom: warning: " << message << '\n';
}

}  // namespace

std::string site_of(const std::source_location& loc) {
  std::string file = loc.file_name();
  auto slash = file.find_last_of('/');
  if (slash != std::string::npos) file = file.substr(slash + 1);
  return file + ":" + std::to_string(loc.line());
}

std::string note_compile(const ir::Graph& g, const std::string& site) {
  auto desc = describe(g);
  auto& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.last_graph.find(site);
  std::string cause = it == s.last_graph.end() ? "first compile at this call site"
                                               : first_difference(it->second, desc);
  s.last_graph[site] = std::move(desc);
  s.causes.push_back({site, cause});
  if (s.causes.size() > kMaxCauses) s.causes.pop_front();
  if (!closure_running) ++s.steps.back().compiles;
  if (debug_on()) std::cerr << "loom: compiling graph of " << g.nodes.size() << " nodes at " << site << ": " << cause << '\n';
  return cause;
}

void note_guard_failure(const std::string& site, const std::string& cause) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  s.causes.push_back({site, "guard failed: " + cause});
  if (s.causes.size() > kMaxCauses) s.causes.pop_front();
  if (debug_on()) std::cerr << "loom: replay guard failed at " << site << ": " << cause << '\n';
}

void warn_once(const std::string& key, const std::string& message) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  warn(s, key, message);
}

ExpectedReads::ExpectedReads() { ++reads_expected; }
ExpectedReads::~ExpectedReads() { --reads_expected; }

void note_transfer(const std::string& site) {
  if (closure_running || reads_expected > 0) return;
  auto& s = state();
  std::lock_guard lock(s.mutex);
  ++s.steps.back().transfers[site];
}

void note_step() {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  ++s.steps_seen;
  if (s.steps_seen == kWarmupSteps) s.steps.clear();  // the window starts after the warm-up
  if (s.steps_seen > kWarmupSteps && s.steps.size() >= kWindow) {
    std::size_t compiling = 0;
    std::map<std::string, std::size_t> reading;  // site -> steps with a read there
    for (const auto& st : s.steps) {
      compiling += st.compiles > 0;
      for (const auto& [site, n] : st.transfers) reading[site] += 1;
    }
    if (compiling * 2 > s.steps.size()) {
      std::string last = s.causes.empty() ? "" : s.causes.back().site + ": " + s.causes.back().cause;
      warn(s, "compile", "graphs were compiled in " + std::to_string(compiling) + " of the last " +
                             std::to_string(s.steps.size()) + " steps; the last cause: " + last +
                             " (see loom::debug::recompile_causes())");
    }
    for (const auto& [site, n] : reading)
      if (n * 2 > s.steps.size())
        warn(s, "transfer " + site, "a value was read from the device (TransferFromDevice) in " +
                                        std::to_string(n) + " of the last " + std::to_string(s.steps.size()) +
                                        " steps at " + site +
                                        "; each read waits for the device. Read it in a step closure "
                                        "(loom::add_step_closure) instead.");
  }
  s.steps.emplace_back();
  if (s.steps.size() > kWindow) s.steps.pop_front();
}

void set_in_closure(bool on) { closure_running = on; }
bool in_closure() { return closure_running; }

std::vector<RecompileCause> recompile_causes() {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  return {s.causes.begin(), s.causes.end()};
}

std::vector<std::string> warnings() {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  return s.warnings;
}

void reset() {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  s.last_graph.clear();
  s.causes.clear();
  s.warnings.clear();
  s.warned.clear();
  s.steps.assign(1, StepRecord{});
  s.steps_seen = 0;
}

}  // namespace loom::debug
