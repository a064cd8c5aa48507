// The hardware's arithmetic peak, measured in the same run: a loop that does nothing but
// independent fused multiply-adds on every thread, in float32 and, on a CPU with AVX512_BF16,
// in bfloat16 dot products (vdpbf16ps: two products per float32 lane). It is the denominator
// of every %peak cell, so a figure reads as a share of what the cores can do, not of a
// library's GEMM.
#include "loom_bench.h"

#include <tbb/parallel_for.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <limits>

namespace loom::bench {
namespace {

// Independent accumulators: enough to cover the FMA latency on two pipes (2 x 4-5 cycles).
constexpr int kChains = 12;
constexpr int64_t kIterations = int64_t{1} << 24;  // per thread, per measurement

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float lane0(Vec v) { return _mm512_cvtss_f32(v); }
#elif defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float lane0(Vec v) { return _mm256_cvtss_f32(v); }
#endif

// Seconds for `threads` threads each running the loop once; the slowest thread counts.
template <class Loop>
double timed_on_all_threads(int threads, Loop loop) {
  std::atomic<float> sink{0};
  const double t0 = now_seconds();
  tbb::parallel_for(0, threads, [&](int) { sink.store(sink.load() + loop()); }, tbb::static_partitioner());
  return now_seconds() - t0;
}

template <class Loop>
double best_gflops(const Options& o, double flops_per_thread, Loop loop) {
  const int threads = thread_count();
  double best = std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r <= o.reps; ++r) {  // the first is a warm-up (clocks, thread start)
    const double s = timed_on_all_threads(threads, loop);
    if (r > 0) best = std::min(best, s);
  }
  return flops_per_thread * threads / best / 1e9;
}

}  // namespace

double peak_gflops(const Bounds& b, const std::string& precision) {
  const double hw = precision == "bf16" ? b.bf16_gflops : b.fma_gflops;
  return hw > 0 ? hw : b.sgemm_gflops;
}

void measure_hardware_peak(const Options& o, Bounds& bounds, Table& t) {
  progress("hardware peak: float32 FMA loop");
#if defined(__AVX512F__) || defined(__FMA__)
  auto fp32_loop = [] {
    Vec acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = splat(1.0f + 0.001f * c);
    const Vec m = splat(0.99999f), a = splat(1e-5f);
    for (int64_t i = 0; i < kIterations; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], m, a);
    float s = 0;
    for (int c = 0; c < kChains; ++c) s += lane0(acc[c]);
    return s;
  };
  bounds.fma_gflops = best_gflops(o, 2.0 * kLanes * kChains * static_cast<double>(kIterations), fp32_loop);
  t.add({.section = "peak", .benchmark = "float32 FMA loop (" + std::to_string(kLanes * 32) + "-bit vectors) = FP32 PEAK",
         .precision = "fp32", .gflops = format("%.1f", bounds.fma_gflops), .peak = "100%"});
#else
  t.add({.section = "peak", .benchmark = "float32 FMA loop: not measured (built without FMA; see LOOM_NATIVE)",
         .precision = "fp32"});
#endif

#if defined(__AVX512BF16__)
  progress("hardware peak: bfloat16 dot-product loop");
  auto bf16_loop = [] {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.001f * c);
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
    for (int64_t i = 0; i < kIterations; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
    float s = 0;
    for (int c = 0; c < kChains; ++c) s += _mm512_cvtss_f32(acc[c]);
    return s;
  };
  bounds.bf16_gflops = best_gflops(o, 4.0 * 16 * kChains * static_cast<double>(kIterations), bf16_loop);
  t.add({.section = "peak", .benchmark = "bfloat16 dot-product loop (vdpbf16ps) = BF16 PEAK", .precision = "bf16",
         .gflops = format("%.1f", bounds.bf16_gflops), .peak = "100%"});
#else
  // Without bfloat16 instructions the widened float32 kernels run bf16 (compiler/widen.h):
  // its rows are measured against the float32 peak.
  bounds.bf16_gflops = bounds.fma_gflops;
  t.add({.section = "peak", .benchmark = "bfloat16: no AVX512_BF16 on this CPU; bf16 rows use the FP32 PEAK",
         .precision = "bf16"});
#endif
}

}  // namespace loom::bench
