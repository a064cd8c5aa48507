// The %peak denominators on a device other than the CPU: loom's own matmul there, an
// 8192^3 product in float32 and in bfloat16 (float32 accumulation), timed in the same run.
// The CPU's FMA loop (hardware_peak.cpp) cannot run on the device, and a GPU's nominal peak
// is not something this run measured; the matmul is the fastest thing loom does there (the
// vendor's GEMM: cuBLASLt on CUDA), so %peak reads as a share of it. On CUDA the float32 row
// depends on LOOM_CUDA_TF32, which the row's label states.
#include "loom_bench.h"

#include <loom/error.h>
#include <loom/lazy.h>
#include <loom/tensor.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::bench {
namespace {

constexpr int64_t kDeviceMatmul = 8192;
constexpr int kCallsPerTiming = 10;  // queued back to back, so the host's work overlaps

// Seconds per matmul of `a` and `b`: the best of `reps` timings of kCallsPerTiming calls.
double matmul_seconds(const Options& o, const Tensor& a, const Tensor& b) {
  Tensor c;
  auto calls = [&] {
    for (int i = 0; i < kCallsPerTiming; ++i) {
      c = Tensor();  // the old result goes back to the allocator first
      c = matmul(a, b);
      mark_step();
    }
    wait_device_ops(o.device);
  };
  calls();  // compiles, and makes the library's plan
  double best = std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r < o.reps; ++r) {
    const double t0 = now_seconds();
    calls();
    best = std::min(best, (now_seconds() - t0) / kCallsPerTiming);
  }
  // A program that failed on the device says so only when its result is read.
  if (!std::isfinite(c.to(DType::Float32).sum().item<double>())) progress("warning: the matmul is not finite");
  return best;
}

}  // namespace

void measure_device_peak(const Options& o, Bounds& bounds, Table& t) {
  const std::string n = std::to_string(kDeviceMatmul);
  const std::string where = device_str(o.device);
  auto a = randn({kDeviceMatmul, kDeviceMatmul}, 1, DType::Float32, o.device);
  auto b = randn({kDeviceMatmul, kDeviceMatmul}, 2, DType::Float32, o.device);
  const double flops = 2.0 * static_cast<double>(kDeviceMatmul) * kDeviceMatmul * kDeviceMatmul;
  struct Case {
    const char* precision;
    DType dtype;
    double* gflops;
  };
  for (const Case& c : {Case{"fp32", DType::Float32, &bounds.fma_gflops},
                        Case{"bf16", DType::BFloat16, &bounds.bf16_gflops}}) {
    const std::string label = "loom matmul " + n + "^3 " + c.precision + " on " + where;
    progress(label);
    try {
      const Tensor x = a.to(c.dtype), y = b.to(c.dtype);
      mark_step();
      const double s = matmul_seconds(o, x, y);
      *c.gflops = flops / s / 1e9;
      const std::string peak = std::string(" = ") + (c.dtype == DType::Float32 ? "FP32" : "BF16") + " PEAK";
      const std::string note = c.dtype == DType::Float32 ? device_precision_note(o) : "";
      t.add({.section = "peak", .benchmark = label + peak + (note.empty() ? "" : " (" + note + ")"),
             .mode = "lazy", .precision = c.precision, .time = format_time(s),
             .gflops = format("%.1f", *c.gflops), .peak = "100%"});
    } catch (const Error& e) {
      // The %peak cells of this precision stay empty; the training rows still run.
      progress("warning: " + label + " failed: " + e.what());
      t.add({.section = "peak", .benchmark = label + ": failed (see stderr)", .precision = c.precision});
    }
  }
}

}  // namespace loom::bench
