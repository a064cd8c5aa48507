// The hardware's arithmetic peak, measured in the same run: a loop that does nothing but
// independent fused multiply-adds on every thread, in float32 and, on a CPU with AVX512_BF16,
// in bfloat16 dot products (vdpbf16ps: two products per float32 lane), and on a CPU with AMX
// in tile dot products (tdpbf16ps: a 16x32 by 32x16 bfloat16 product per instruction, the
// unit oneDNN's bfloat16 convs and matmuls run on there). It is the denominator of every %peak
// cell, so a figure reads as a share of what the cores can do, not of a library's GEMM: the
// bfloat16 peak is the faster of the two bfloat16 loops.
#include "loom_bench.h"

#include <tbb/parallel_for.h>

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

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

#if defined(__x86_64__) && defined(__AVX512BF16__)  // used by the bfloat16 peak only
// AMX: the CPU has tiles and bfloat16 tile products (CPUID leaf 7: EDX bits 24 and 22), and
// Linux lets this process use the tile data (ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18;
// oneDNN asks the same before its AMX kernels).
bool amx_usable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

constexpr int64_t kTileIterations = int64_t{1} << 20;  // per thread: 4 products each
constexpr double kTileFlops = 2.0 * 16 * 16 * 32;       // per tdpbf16ps

// Four independent 16x16 float32 accumulators (tiles 0 to 3), each the product of one of two
// A tiles (4, 5) and one of two B tiles (6, 7), loaded once: only the tile unit works.
__attribute__((target("amx-tile,amx-bf16"))) float amx_loop() {
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
  alignas(64) uint16_t operand[16 * 32];
  std::fill_n(operand, 16 * 32, uint16_t{0x3A83});  // bfloat16 0.001: no zeros to skip
  alignas(64) float result[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (int64_t i = 0; i < kTileIterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, result, 64);
  _tile_release();
  return result[0];
}
#endif

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
#if defined(__x86_64__)
  if (amx_usable()) {
    progress("hardware peak: bfloat16 AMX tile loop");
    const double amx = best_gflops(o, 4 * kTileFlops * static_cast<double>(kTileIterations),
                                   amx_loop);
    t.add({.section = "peak", .benchmark = "bfloat16 dot-product loop (vdpbf16ps)",
           .precision = "bf16", .gflops = format("%.1f", bounds.bf16_gflops),
           .peak = format("%.0f%%", 100 * bounds.bf16_gflops / amx)});
    bounds.bf16_gflops = std::max(bounds.bf16_gflops, amx);
    t.add({.section = "peak", .benchmark = "bfloat16 AMX tile loop (tdpbf16ps) = BF16 PEAK",
           .precision = "bf16", .gflops = format("%.1f", amx), .peak = "100%"});
  } else
#endif
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
