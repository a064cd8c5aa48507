// Engine metrics: counters and timers, with a text report.
//
//   loom::metrics::reset();
//   ... train ...
//   std::cout << loom::metrics::report();
//   int64_t n = loom::metrics::counter("UncachedCompile");
//
// Counters: MarkStep, CachedCompile, UncachedCompile, EagerOpCompile, EagerOpExecute,
// TransferToDevice, TransferFromDevice, ExecuteProgram, AllocatorCacheHit, ...
// Timers (nanoseconds): CompileTime, ExecuteTime, TransferToDeviceTime,
// TransferFromDeviceTime, GraphSize (a distribution of node counts per compile).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::metrics {

struct Stat {
  int64_t count = 0;
  double total = 0;
  double min = 0;
  double max = 0;
};

void increment(const std::string& counter, int64_t by = 1);
int64_t counter(const std::string& name);           // 0 when never incremented
void record(const std::string& stat, double value);  // timers and distributions
Stat stat(const std::string& name);                  // zeros when never recorded
std::vector<std::string> counter_names();
std::vector<std::string> stat_names();
std::string report();
void reset();

}  // namespace loom::metrics
