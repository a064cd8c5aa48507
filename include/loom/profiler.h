// Profiler: spans of time on every thread, exported as Chrome trace JSON (open it in
// https://ui.perfetto.dev or chrome://tracing).
//
//   loom::profiler::start();
//   for (int step = 0; step < 100; ++step) {
//     loom::profiler::Trace span("train_step");   // user span, until the scope ends
//     train_step();
//   }
//   loom::profiler::stop();
//   loom::profiler::save("trace.json");
//
// loom records its own spans while the profiler runs: "trace" (building a step's graph),
// "compile", "execute" (device thread), inside it one span per kernel named by its op
// ("conv2d", "conv2d_grad_weight", ...; "fused" for a fused elementwise kernel),
// "transfer_to_device", "transfer_from_device", "wait" (a read waiting for the device) and
// the data loader's stages. On a CUDA device the host threads show "launch" (queuing a
// program) and "execute" (waiting for it), and the kernel spans, timed on the GPU with CUDA
// events, have a row of their own ("cuda:0 stream") on the same time axis. A span costs a
// clock read and nothing is recorded while the profiler is stopped.
#pragma once

#include <cstdint>
#include <string>

namespace loom::profiler {

void start();
void stop();
bool is_running();
// Writes the recorded spans as Chrome trace JSON; throws loom::Error if the file cannot be
// written (written to a temporary file, then renamed).
void save(const std::string& path);
// Drops every recorded span.
void clear();
std::size_t span_count();

// Names the calling thread in traces ("host", "device", "loader worker", ...).
void set_thread_name(const std::string& name);

// A span from construction to destruction, when the profiler is running. `name` is kept as a
// pointer until save(): a string literal, or a string that lives as long (null: "").
class Trace {
 public:
  explicit Trace(const char* name);
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

 private:
  const char* name_;
  int64_t start_ns_;
};

}  // namespace loom::profiler
