// Engine metrics: counters and timers, with a text report.
//
//   loom::metrics::reset();
//   train();                                  // your training loop
//   std::cout << loom::metrics::report();
//   int64_t n = loom::metrics::counter("UncachedCompile");
//
// Counters: MarkStep, CachedCompile, UncachedCompile, EagerOpCompile, EagerOpExecute,
// TransferToDevice, TransferFromDevice, ExecuteProgram, AllocatorCacheHit,
// AllocatorSystemAlloc, DonatedBuffer (a result written over an input the step overwrote),
// ExecuteHeapAlloc (heap allocations while programs ran: 0 in a steady step), MarkStepWait
// (mark_step waited for the device: more than max_steps_in_flight() steps, the one just
// queued included, were unfinished), ...
// Timers (nanoseconds): CompileTime, ExecuteTime, TransferToDeviceTime,
// TransferFromDeviceTime, MarkStepWaitTime, GraphSize (a distribution of node counts per
// compile).
#pragma once

#include <loom/dtype.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::metrics {

struct Stat {
  int64_t count = 0;
  double total = 0;
  double min = 0;
  double max = 0;
};

// Recording a metric that already exists allocates nothing, so the executor can count and
// time its steps without touching the heap.
void increment(std::string_view counter, int64_t by = 1);
int64_t counter(std::string_view name);           // 0 when never incremented
// Counted for `device` as well: counter(name) is the sum over devices, counter(name, device)
// that device's share. The engine counts compiles, executions, transfers, waits and
// allocations per device; report() shows the shares where a device other than cpu:0 counted.
void increment(std::string_view counter, Device device, int64_t by = 1);
int64_t counter(std::string_view name, Device device);
void record(std::string_view stat, double value);  // timers and distributions
Stat stat(std::string_view name);                  // zeros when never recorded
std::vector<std::string> counter_names();
std::vector<std::string> stat_names();
std::string report();
void reset();

}  // namespace loom::metrics
