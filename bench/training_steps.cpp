// Whole training steps on fake data (one fixed batch on the device), the three
// workloads, in the three execution modes; and the host's share of a step. Everything runs on
// --device: the model is moved there before its optimizer is made, and the fake batch is made
// there; --batch sets each model's batch.
//
// A step is zero_grad, forward, loss, backward, optimizer update:
//   captured  compile(step)() — traced until stable, then replayed without tracing
//   compiled  compile(step, {.capture = false})() — traced at every call, mark_step() at exit
//   lazy      step(); mark_step()
//   eager     step() with eager mode on (every op its own one-op program); mark_step()
// Each mode trains its own model. Warm-up steps are not timed (the first step also creates
// the optimizer state, so the steady graph is the second one). The timed steps run in two
// rounds, the modes in order and then in reverse, so that a load that drifts during the run
// (other jobs on the machine) weighs on every mode alike. A step closure stamps the time at
// which each step's program has finished on the device: a chunk of k timed steps follows
// one untimed step, and its time is from that step's end to the last one's, so the host
// traces each timed step while the device runs the previous one, as in a training loop. The
// device is idle for the part of that time not covered by the ExecuteTime of its programs.
//
// Host rows: the best of --host-steps lazy steps, each started on an idle device that is held
// until mark_step() returns (on two cores its threads would otherwise take the host's core),
// with the mark_step split by the metrics: trace = running the step's
// ops into IR, build + hash = the GraphBuildTime metric of the mark_step, lookup + launch =
// the rest of mark_step (live tensors, cache lookup, output buffers, queueing), compile =
// CompileTime of the steady graph's first (uncached) compile; replay = a captured call's
// host time (guards, binding, queueing; the ReplayHostTime metric), on an idle device too.
// A backend that launches on a thread of its own (CUDA's launch thread: binding, library ops,
// kernel launches or one graph launch) records its time per program as the LaunchThreadTime
// metric; its best per captured call is the second replay row. Each is put against the
// captured step's time in the train rows: the two threads run beside each other and the
// device, so while both shares stay well under 1 the host keeps ahead and that time is the
// device's (target 3 of issue 17: the host's share under 5% on the GPU at large batches).
//
// Inference rows (section infer): small-batch forward passes under NoGradGuard, where
// tracing is most of the host's work: lazy (forward; mark_step) against captured
// (compile(forward)), calls back to back, the time per call from the first timed call's
// start to the last one's end on the device.
#include "loom_bench.h"

#include <loom/autocast.h>
#include <loom/autograd.h>
#include <loom/debug.h>
#include <loom/error.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/models/decoder.h>
#include <loom/models/resnet.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/optim.h>
#include <loom/profiler.h>
#include <loom/testing.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>

namespace loom::bench {
namespace {

namespace F = nn::functional;

struct Workload {
  std::string label;  // the benchmark column
  std::string unit;   // "img/s", "tok/s"
  int64_t units_per_step = 0;
  double flops_per_unit = 0;  // the counts: 3x the forward conv/linear/attention FLOPs
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<optim::Optimizer> opt;
  std::function<Tensor()> loss;  // forward and loss on the fixed fake batch
};

Tensor fake_ints(const Shape& shape, int64_t high, uint64_t seed, Device device) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> pick(0, high - 1);
  std::vector<int64_t> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = pick(gen);
  return from_vector(v, shape, device);
}

// The model is made (and initialised) on the CPU, as every run makes it, then moved to the
// device before the optimizer is made, so that the optimizer's state is made there too.
Workload resnet_workload(const std::string& name, int64_t batch, Device device) {
  const bool r20 = name == "resnet20";
  // ResNet-18 in the CIFAR layout: the 3x3 stride-1 stem without max-pooling, 64..512 planes.
  auto config = r20 ? models::resnet_config("resnet20", 3, 10)
                    : models::ResNetConfig{models::BlockKind::Basic, {2, 2, 2, 2}, {64, 128, 256, 512},
                                           models::Stem::Cifar, 3, 10};
  auto net = std::make_shared<models::ResNet>(config);
  net->to(device);
  auto images = randn({batch, 3, 32, 32}, 11, DType::Float32, device);
  auto labels = fake_ints({batch}, 10, 12, device);
  Workload w{.label = (r20 ? "resnet20" : "resnet18-cifar") + std::string(" b") + std::to_string(batch),
             .unit = "img/s",
             .units_per_step = batch,
             .flops_per_unit = r20 ? 245e6 : 3.33e9,
             .model = net};
  w.opt = std::make_shared<optim::SGD>(net->parameters(),
                                       optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
  w.loss = [net, images, labels] { return F::cross_entropy(net->forward(images), labels); };
  return w;
}

Workload decoder_workload(int64_t batch, Device device) {
  models::DecoderConfig c{.vocab_size = 8192, .hidden_size = 512, .num_layers = 2, .num_heads = 8,
                          .num_kv_heads = 8, .intermediate_size = 1408, .max_seq_len = 256};
  const int64_t seq = 256;
  auto lm = std::make_shared<models::Decoder>(c);
  lm->to(device);
  auto tokens = fake_ints({batch, seq}, c.vocab_size, 21, device);
  auto targets = fake_ints({batch * seq}, c.vocab_size, 22, device);
  Workload w{.label = "decoder b" + std::to_string(batch) + "x" + std::to_string(seq), .unit = "tok/s",
             .units_per_step = batch * seq, .flops_per_unit = 66.8e6, .model = lm};
  w.opt = std::make_shared<optim::AdamW>(lm->parameters(), optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.1});
  w.loss = [lm, tokens, targets, v = c.vocab_size] {
    return F::cross_entropy(lm->forward(tokens).reshape({-1, v}), targets);
  };
  return w;
}

// The CPU's default batches; --batch overrides them.
constexpr int64_t kDefaultBatch[] = {128, 32, 8};  // resnet20, resnet18, decoder (sequences)

Workload make_workload(const std::string& name, const Options& o) {
  nn::manual_seed(0);
  auto w = name == "decoder"    ? decoder_workload(o.batch(name, kDefaultBatch[2]), o.device)
           : name == "resnet20" ? resnet_workload(name, o.batch(name, kDefaultBatch[0]), o.device)
                                : resnet_workload(name, o.batch(name, kDefaultBatch[1]), o.device);
  mark_step();  // parameters and the fake batch become device data before the first step
  wait_device_ops();
  return w;
}

Tensor step_ops(Workload& w) {
  w.opt->zero_grad();
  auto loss = w.loss();
  loss.backward();
  w.opt->step();
  return loss;
}

double stat_total(const char* name) { return metrics::stat(name).total; }
int64_t compiles() { return metrics::counter("UncachedCompile") + metrics::counter("EagerOpCompile"); }

// What one model's steps measured, across modes.
struct Measured {
  std::string label;
  int64_t nodes = 0;      // the steady step graph's node count
  double compile_s = 0;   // its uncached compile
  double trace_s = 0, build_s = 0, launch_s = 0;  // the best step, device idle (host rows)
  double buffers = 0, new_buffers = 0;            // device buffer allocations per lazy step
  double heap_allocs = -1;                        // the executor's heap allocations per lazy step
  double library_heap_allocs = -1;                // oneDNN's own, inside its execute calls
  double donated = 0;                             // results that took over an input's buffer
  double replay_s = 0;                            // a captured call's host time (best)
  double launch_thread_s = 0;  // the backend's launch thread per captured call (best), if it has one
  bool counted = false;        // the lazy steps' buffers and allocations were counted
};

// One mode's model, its steps and their timings.
class ModeRun {
 public:
  ModeRun(const std::string& model, std::string mode, std::string precision, const Options& o)
      : mode_(std::move(mode)),
        precision_name_(std::move(precision)),
        precision_(parse_precision(precision_name_)),
        device_(o.device),
        w_(make_workload(model, o)),
        compiled_(compile(std::function<Tensor()>([this] { return step_ops(w_); }), {.capture = false})),
        captured_(compile(std::function<Tensor()>([this] { return step_ops(w_); }))) {}
  ModeRun(const ModeRun&) = delete;
  ModeRun& operator=(const ModeRun&) = delete;

  const std::string& mode() const { return mode_; }
  const std::string& precision() const { return precision_name_; }
  const Workload& workload() const { return w_; }
  double step_seconds() const { return steps_ > 0 ? window_ / static_cast<double>(steps_) : 0; }

  // The whole step runs under the precision's Autocast scope (a captured call too: its
  // guards then see the precision it was captured with).
  void step() {
    Autocast scope(precision_);
    if (mode_ == "compiled") {
      loss_ = compiled_();
    } else if (mode_ == "captured") {
      loss_ = captured_();
    } else if (mode_ == "lazy") {
      loss_ = step_ops(w_);
      mark_step();
    } else {
      {
        EagerModeGuard eager(true);
        loss_ = step_ops(w_);
      }
      mark_step();
    }
  }

  // Untimed steps; notes the node count and compile time of the last graph compiled alone.
  void warm_up(int64_t steps, Measured& m) {
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t before = metrics::counter("UncachedCompile");
      const double compile_ns = stat_total("CompileTime"), nodes = stat_total("GraphSize");
      step();
      if (metrics::counter("UncachedCompile") == before + 1) {
        m.nodes = static_cast<int64_t>(stat_total("GraphSize") - nodes);
        m.compile_s = (stat_total("CompileTime") - compile_ns) * 1e-9;
      }
    }
    wait_device_ops();
  }

  // One untimed step, then `k` timed ones (see the top of the file).
  void timed_chunk(int64_t k) {
    if (k <= 0) return;
    wait_device_ops();
    std::vector<std::pair<double, double>> ends(static_cast<std::size_t>(k + 1));  // (time, ExecuteTime)
    const int64_t compiled_before = compiles();
    const double buffers = count("AllocatorCacheHit");
    const double new_buffers = count("AllocatorSystemAlloc");
    const double heap = count("ExecuteHeapAlloc");
    const double library = count("ExecuteHeapAllocLibrary");
    const double donated = count("DonatedBuffer");
    for (int64_t i = 0; i <= k; ++i) {
      add_step_closure([&ends, i] { ends[i] = {now_seconds(), stat_total("ExecuteTime")}; });
      step();
    }
    wait_device_ops();
    window_ += ends[k].first - ends[0].first;
    busy_ += (ends[k].second - ends[0].second) * 1e-9;
    steps_ += k;
    buffers_ += count("AllocatorCacheHit") - buffers;
    new_buffers_ += count("AllocatorSystemAlloc") - new_buffers;
    heap_ += count("ExecuteHeapAlloc") - heap;
    library_heap_ += count("ExecuteHeapAllocLibrary") - library;
    donated_ += count("DonatedBuffer") - donated;
    alloc_steps_ += k + 1;
    if (compiles() != compiled_before)
      progress("warning: " + w_.label + " " + mode_ + " compiled during the timed steps; raise --warmup");
  }

  Row row(const Bounds& bounds, double compiled_step_s) const {
    const double step_s = step_seconds();
    const double rate = static_cast<double>(w_.units_per_step) / step_s;
    const double gflops = rate * w_.flops_per_unit / 1e9;
    Row r{.section = "train", .benchmark = w_.label, .mode = mode_, .precision = precision_name_,
          .time = format_time(step_s),
          .rate = format("%.1f ", rate) + w_.unit, .gflops = format("%.1f", gflops)};
    // A backend that does not time its programs (ExecuteTime: the CPU's does, CUDA's not)
    // leaves the cell empty rather than claiming an idle device.
    if (busy_ > 0) r.idle = format("%.0f%%", 100 * std::max(0.0, 1 - busy_ / window_));
    if (const double peak = peak_gflops(bounds, precision_name_); peak > 0)
      r.peak = format("%.0f%%", 100 * gflops / peak);
    if (compiled_step_s > 0) {
      r.ratio = format("%.2f", compiled_step_s / step_s);
      r.vs = "speed/compiled fp32";
    }
    if (!std::isfinite(loss_.item<double>())) progress("warning: " + w_.label + " " + mode_ + " loss is not finite");
    return r;
  }

  // The replay rows' figures: the best of `steps` captured calls, each on an idle device, on
  // the calling thread (ReplayHostTime) and, where the backend has one, on its launch thread
  // (LaunchThreadTime, recorded by CUDA's).
  void measure_replay(int64_t steps, Measured& m) {
    // Untimed calls until one replays (a host-only run has had only its warm-up calls, which
    // trace: the step is captured once two traced calls agree).
    for (int i = 0; i < 4; ++i) {
      const int64_t before = metrics::counter("CaptureReplay", device_);
      Autocast scope(precision_);
      loss_ = captured_();
      if (metrics::counter("CaptureReplay", device_) > before) break;
    }
    // Off the CPU, replays until the backend's programs settle: CUDA's runs a program as a
    // CUDA graph from its third run and records it again while it learns which inputs move
    // (graph_replay.h), each recording a launch per kernel on its launch thread.
    for (int i = 0; device_.type != DeviceType::CPU && i < 6; ++i) {
      Autocast scope(precision_);
      loss_ = captured_();
    }
    wait_device_ops();
    m.replay_s = m.launch_thread_s = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < steps; ++i) {
      wait_device_ops();
      const auto before = metrics::stat("ReplayHostTime");
      const auto launch_before = metrics::stat("LaunchThreadTime");
      {
        testing::DeviceQueueHold hold(device_);
        Autocast scope(precision_);
        loss_ = captured_();
      }
      const auto after = metrics::stat("ReplayHostTime");
      if (after.count != before.count + 1) {
        progress("warning: " + w_.label + ": the captured step did not replay; no replay row");
        m.replay_s = m.launch_thread_s = 0;
        break;
      }
      m.replay_s = std::min(m.replay_s, (after.total - before.total) * 1e-9);
      wait_device_ops();  // the launch thread has run the call's programs
      const auto launch_after = metrics::stat("LaunchThreadTime");
      if (launch_after.count > launch_before.count)
        m.launch_thread_s =
            std::min(m.launch_thread_s, (launch_after.total - launch_before.total) * 1e-9);
    }
    if (!std::isfinite(m.launch_thread_s)) m.launch_thread_s = 0;  // no launch thread (the CPU)
    wait_device_ops();
  }

  // Host rows' figures, the best of `steps` lazy steps (other jobs on the machine only ever
  // add time), each started on an idle device that is held until the step is measured.
  void measure_host(int64_t steps, Measured& m) {
    m.trace_s = m.build_s = m.launch_s = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < steps; ++i) {
      wait_device_ops();
      double t0, t1, t2, build0;
      {
        testing::DeviceQueueHold hold(device_);
        Autocast scope(precision_);
        build0 = stat_total("GraphBuildTime");
        t0 = now_seconds();
        loss_ = step_ops(w_);
        t1 = now_seconds();
        mark_step();
        t2 = now_seconds();
      }
      const double build = (stat_total("GraphBuildTime") - build0) * 1e-9;
      m.trace_s = std::min(m.trace_s, t1 - t0);
      m.build_s = std::min(m.build_s, build);
      m.launch_s = std::min(m.launch_s, t2 - t1 - build);
    }
    wait_device_ops();
    if (mode_ != "lazy") return;
    if (alloc_steps_ > 0) {
      m.counted = true;
      m.buffers = (buffers_ + new_buffers_) / static_cast<double>(alloc_steps_);
      m.new_buffers = new_buffers_ / static_cast<double>(alloc_steps_);
      m.heap_allocs = heap_ / static_cast<double>(alloc_steps_);
      m.library_heap_allocs = library_heap_ / static_cast<double>(alloc_steps_);
      m.donated = donated_ / static_cast<double>(alloc_steps_);
    }
  }

 private:
  // The device's share of a counter (loom/metrics.h), as a double for the per-step means.
  double count(const char* name) const { return static_cast<double>(metrics::counter(name, device_)); }

  std::string mode_;
  std::string precision_name_;  // fp32 or bf16
  Precision precision_;
  Device device_;
  Workload w_;
  Tensor loss_;
  Compiled<std::function<Tensor()>> compiled_, captured_;
  double window_ = 0, busy_ = 0;
  int64_t steps_ = 0;
  double buffers_ = 0, new_buffers_ = 0, heap_ = 0, library_heap_ = 0, donated_ = 0;
  int64_t alloc_steps_ = 0;
};

// `captured_step_s`: the captured step's time in the train rows (0 when not timed); `cpu`: the
// rows that only the CPU's backend counts (heap allocations, oneDNN's) are shown.
void host_rows(const Measured& m, double compiled_step_s, double captured_step_s, bool cpu, std::vector<Row>& out) {
  const double nodes = static_cast<double>(std::max<int64_t>(m.nodes, 1));
  // `per_node` formats the time per node in the unit `scale` converts seconds to.
  auto add = [&](const std::string& what, double seconds, const char* per_node, double scale) {
    Row r{.section = "host", .benchmark = m.label + ": " + what, .mode = "lazy", .time = format_time(seconds),
          .rate = format(per_node, seconds / nodes * scale)};
    if (compiled_step_s > 0) {
      r.ratio = format("%.2g", seconds / compiled_step_s);
      r.vs = "time/compiled step";
    }
    out.push_back(r);
  };
  add("trace, " + std::to_string(m.nodes) + " nodes", m.trace_s, "%.0f ns/node", 1e9);
  add("graph build + hash", m.build_s, "%.0f ns/node", 1e9);
  add("trace + build + hash", m.trace_s + m.build_s, "%.0f ns/node", 1e9);
  add("lookup + launch", m.launch_s, "%.0f ns/node", 1e9);
  if (m.compile_s > 0) add("compile (uncached)", m.compile_s, "%.2f us/node", 1e6);
  if (m.replay_s > 0) {
    Row r{.section = "host", .benchmark = m.label + ": replay (guards, bind, launch)", .mode = "captured",
          .time = format_time(m.replay_s), .rate = format("%.0f ns/node", m.replay_s / nodes * 1e9),
          .ratio = format("%.3f", m.replay_s / (m.trace_s + m.build_s)), .vs = "time/(trace+build+hash)"};
    out.push_back(r);
    // Against the captured step's time: the share of a step each host thread needs (target 3).
    auto of_step = [&](const std::string& what, double seconds) {
      Row row{.section = "host", .benchmark = m.label + ": " + what, .mode = "captured",
              .time = format_time(seconds), .rate = format("%.0f ns/node", seconds / nodes * 1e9)};
      if (captured_step_s > 0) {
        row.ratio = format("%.3f", seconds / captured_step_s);
        row.vs = "time/captured step";
      }
      out.push_back(row);
    };
    if (captured_step_s > 0) of_step("replay / captured step", m.replay_s);
    if (m.launch_thread_s > 0) of_step("launch thread / captured step", m.launch_thread_s);
  }
  if (m.buffers > 0)
    out.push_back({.section = "host", .benchmark = m.label + ": device buffers allocated per step", .mode = "lazy",
                   .rate = format("%.0f", m.buffers) + format(" (%.0f new)", m.new_buffers)});
  if (m.counted)
    out.push_back({.section = "host", .benchmark = m.label + ": results written over a donated input", .mode = "lazy",
                   .rate = format("%.0f", m.donated)});
  if (!cpu) return;  // other backends do not count the heap allocations of their runs
  if (m.heap_allocs >= 0)
    out.push_back({.section = "host", .benchmark = m.label + ": executor heap allocations per step", .mode = "lazy",
                   .rate = format("%.1f", m.heap_allocs)});
  if (m.library_heap_allocs >= 0)
    out.push_back({.section = "host", .benchmark = m.label + ": oneDNN heap allocations per step", .mode = "lazy",
                   .rate = format("%.1f", m.library_heap_allocs)});
}

// Where the infer section's profile goes: the --profile file with ".infer" before its extension
// (trace.json -> trace.infer.json), so that it never overwrites the training steps' trace.
std::string infer_profile_path(const std::string& path) {
  const auto dot = path.find_last_of('.');
  const auto slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return path + ".infer";
  return path.substr(0, dot) + ".infer" + path.substr(dot);
}

// One small-batch forward pass, lazy or captured: the time per call over `calls` calls.
double forward_seconds(const std::function<Tensor()>& forward, bool captured, int64_t calls) {
  auto compiled = compile(forward);
  auto call = [&] {
    if (captured) return compiled();
    auto y = forward();
    mark_step();
    return y;
  };
  for (int i = 0; i < 3; ++i) call();  // traced until captured (and compiled)
  wait_device_ops();
  const double start = now_seconds();
  Tensor y;
  for (int64_t i = 0; i < calls; ++i) y = call();
  wait_device_ops();
  const double s = (now_seconds() - start) / static_cast<double>(calls);
  if (captured && !compiled.captured()) progress("warning: the captured forward was not captured");
  if (!std::isfinite(y.to(DType::Float64).sum().item<double>())) progress("warning: a forward is not finite");
  return s;
}

}  // namespace

void bench_inference(const Options& o, Table& t) {
  NoGradGuard no_grad;
  struct Case {
    std::string label;
    std::function<Tensor()> forward;
  };
  std::vector<Case> cases;
  if (o.has(o.models, "resnet18")) {
    nn::manual_seed(0);
    auto w = resnet_workload("resnet18", 1, o.device);
    w.model->eval();
    auto net = std::static_pointer_cast<models::ResNet>(w.model);
    auto image = randn({1, 3, 32, 32}, 31, DType::Float32, o.device);
    cases.push_back({"resnet18-cifar b1 eval", [net, image] { return net->forward(image); }});
  }
  if (o.has(o.models, "decoder")) {
    nn::manual_seed(0);
    auto w = decoder_workload(1, o.device);
    w.model->eval();
    auto lm = std::static_pointer_cast<models::Decoder>(w.model);
    auto tokens = fake_ints({1, 32}, lm->config.vocab_size, 32, o.device);
    cases.push_back({"decoder b1x32 forward", [lm, tokens] { return lm->forward(tokens); }});
  }
  mark_step();
  wait_device_ops();
  const int64_t calls = std::max<int64_t>(10, 4 * o.steps);
  for (const auto& c : cases) {
    progress(c.label + ": lazy and captured");
    // In turn, twice, so that a load that drifts weighs on both alike; the best of each.
    double lazy = std::numeric_limits<double>::infinity(), captured = lazy;
    for (int round = 0; round < 2; ++round) {
      lazy = std::min(lazy, forward_seconds(c.forward, false, calls));
      captured = std::min(captured, forward_seconds(c.forward, true, calls));
    }
    if (!o.profile.empty()) {  // a few captured calls, each kernel a span (not timed above)
      auto compiled = compile(c.forward);
      for (int i = 0; i < 3; ++i) compiled();
      wait_device_ops();
      loom::profiler::start();
      for (int i = 0; i < 5; ++i) compiled();
      wait_device_ops();
      loom::profiler::stop();
    }
    t.add({.section = "infer", .benchmark = c.label, .mode = "lazy", .time = format_time(lazy),
           .rate = format("%.1f calls/s", 1 / lazy)});
    t.add({.section = "infer", .benchmark = c.label, .mode = "captured", .time = format_time(captured),
           .rate = format("%.1f calls/s", 1 / captured), .ratio = format("%.2f", lazy / captured),
           .vs = "speed/lazy"});
  }
  if (!o.profile.empty() && !cases.empty()) {
    const std::string path = infer_profile_path(o.profile);
    loom::profiler::save(path);
    progress("wrote five captured calls of each forward to " + path);
  }
}

void bench_training(const Options& o, const Bounds& bounds, Table& t) {
  std::vector<Row> host;
  for (const auto& name : o.models) {
    Measured m;
    std::vector<std::unique_ptr<ModeRun>> runs;
    // Timed runs: every (precision, mode); the host rows come from the first precision's lazy
    // and captured runs, made untimed when those modes are not timed.
    const std::string& host_precision = o.precisions.front();
    std::vector<std::pair<std::string, std::string>> plan;  // (mode, precision)
    if (o.section("train"))
      for (const auto& precision : o.precisions)
        for (const auto& mode : o.modes) plan.emplace_back(mode, precision);
    for (const char* mode : {"lazy", "captured"})
      if (o.section("host") && !(o.section("train") && o.has(o.modes, mode)))
        plan.emplace_back(mode, host_precision);
    for (const auto& [mode, precision] : plan) {
      progress(name + ", " + mode + " mode, " + precision + ": warm-up");
      runs.push_back(std::make_unique<ModeRun>(name, mode, precision, o));
      runs.back()->warm_up(o.warmup, m);
    }
    debug::reset();  // the warm-up compiles are done; a steady step compiles nothing
    m.label = runs.front()->workload().label;
    if (o.section("train")) {
      if (!o.profile.empty()) loom::profiler::start();
      const auto timed = static_cast<std::ptrdiff_t>(o.modes.size() * o.precisions.size());
      for (auto it = runs.begin(); it != runs.begin() + timed; ++it) {
        progress(name + ", " + (*it)->mode() + " mode, " + (*it)->precision() + ": timed steps");
        (*it)->timed_chunk((o.steps + 1) / 2);
      }
      for (auto it = runs.rend() - timed; it != runs.rend(); ++it) (*it)->timed_chunk(o.steps / 2);
      if (!o.profile.empty()) loom::profiler::stop();
    }
    // Each row's ratio: against the compiled fp32 step (the reference of every mode and precision).
    // The host rows' captured step: the captured run of their precision, where it was timed.
    double compiled_s = 0, captured_s = 0;
    for (const auto& r : runs) {
      if (r->mode() == "compiled" && r->precision() == "fp32" && o.section("train")) compiled_s = r->step_seconds();
      if (r->mode() == "captured" && r->precision() == host_precision && o.section("train"))
        captured_s = r->step_seconds();
    }
    const auto timed = o.section("train") ? static_cast<std::ptrdiff_t>(o.modes.size() * o.precisions.size()) : 0;
    for (auto it = runs.begin(); it != runs.end(); ++it) {
      const auto& r = *it;
      if (it - runs.begin() < timed) t.add(r->row(bounds, compiled_s));
      if (r->precision() != host_precision || !o.section("host")) continue;
      if (r->mode() == "lazy") r->measure_host(o.host_steps, m);
      if (r->mode() == "captured") r->measure_replay(o.host_steps, m);
    }
    if (o.section("host")) host_rows(m, compiled_s, captured_s, o.on_cpu(), host);
  }
  for (auto& r : host) t.add(std::move(r));
  if (!o.profile.empty()) {
    loom::profiler::save(o.profile);
    progress("wrote the timed steps' trace to " + o.profile +
             " (summary: recipes/profile_summary.py " + o.profile + ")");
  }
}

}  // namespace loom::bench
