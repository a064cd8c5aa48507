// Host overhead of the lazy engine: tracing, graph hashing + cache lookup, and a whole
// cached step, next to the same work in eager mode.
//
//   build/bench/engine_bench
#include <loom/lazy.h>
#include <loom/tensor.h>

#include <benchmark/benchmark.h>

namespace {

// Traces a chain of `n` elementwise ops, without running it.
void BM_Trace(benchmark::State& state) {
  auto x = loom::ones({64});
  for (auto _ : state) {
    auto y = x;
    for (int64_t i = 0; i < state.range(0); ++i) y = loom::sin(y);
    benchmark::DoNotOptimize(y);
    state.PauseTiming();
    y = {};
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Trace)->Arg(100)->Arg(1000);

// One cached step: trace, hash, look up, queue, run (waits for the device).
void BM_CachedStep(benchmark::State& state) {
  auto z = loom::zeros({state.range(0)});
  auto x = loom::ones({state.range(0)});
  for (auto _ : state) {
    for (int i = 0; i < 8; ++i) z = loom::sin(z) + x;
    loom::mark_step();
    loom::wait_device_ops();
  }
  state.SetItemsProcessed(state.iterations() * 16 * state.range(0));
}
BENCHMARK(BM_CachedStep)->Arg(1 << 10)->Arg(1 << 20);

// The same step with every op run at once.
void BM_EagerStep(benchmark::State& state) {
  loom::EagerModeGuard eager(true);
  auto z = loom::zeros({state.range(0)});
  auto x = loom::ones({state.range(0)});
  for (auto _ : state) {
    for (int i = 0; i < 8; ++i) z = loom::sin(z) + x;
    loom::wait_device_ops();
  }
  state.SetItemsProcessed(state.iterations() * 16 * state.range(0));
}
BENCHMARK(BM_EagerStep)->Arg(1 << 10)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
