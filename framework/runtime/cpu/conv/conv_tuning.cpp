// LOOM_CONV=tuned (conv_tuning.h): each conv pass's kernel timed once per shape.
#include "runtime/cpu/conv/conv_tuning.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/onednn.h"

#include <loom/lazy.h>
#include <loom/metrics.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <string>

namespace loom::runtime {
namespace {

// A candidate's timed calls: at least kMinTimedCalls, then more while they took under
// kTimedSeconds together, at most kMaxTimedCalls; its score is the fastest call (the
// machine's other work only ever adds time).
constexpr int kMinTimedCalls = 2;
constexpr int kMaxTimedCalls = 5;
constexpr double kTimedSeconds = 0.02;

using KeyFields = std::array<int64_t, 20>;

KeyFields fields(const ConvTuningKey& k) {
  const ConvGeometry& g = k.g;
  return {g.n,  g.c,  g.h,  g.w,  g.o,  g.kh, g.kw,
          g.oh, g.ow, g.sh, g.sw, g.ph, g.pw, g.dh,
          g.dw, g.groups, k.pass, static_cast<int64_t>(k.dtype), k.channels_last, k.epilogue};
}

struct Tuning {
  std::mutex mutex;                 // guards `chosen` and `records`
  std::map<KeyFields, ConvKernel> chosen;
  std::vector<ConvTuningRecord> records;
  std::mutex timing;                // held while one key's candidates run
};

Tuning& tuning() {
  static Tuning* t = new Tuning;  // never destroyed: kernels may run during static teardown
  return *t;
}

bool debug_on() {
  const char* v = std::getenv("LOOM_DEBUG");
  return v && *v && std::string(v) != "0";
}

// A candidate that throws (a library that refuses the shape) counts as declined: the rules'
// kernel, or another candidate, runs instead; an error of the chosen one surfaces when the
// caller runs it.
double best_seconds(ConvKernel kernel, ConvRunner run) try {
  constexpr double kDeclined = std::numeric_limits<double>::infinity();
  if (!run(kernel)) return kDeclined;  // untimed: primitives made, scratch grown, caches warm
  double best = kDeclined, total = 0;
  for (int call = 0; call < kMaxTimedCalls; ++call) {
    const auto start = std::chrono::steady_clock::now();
    if (!run(kernel)) return kDeclined;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, s);
    total += s;
    if (call + 1 >= kMinTimedCalls && total >= kTimedSeconds) break;
  }
  return best;
} catch (const std::exception&) {
  return std::numeric_limits<double>::infinity();
}

const char* pass_name(int pass) {
  switch (static_cast<ConvPass>(pass)) {
    case ConvPass::kForward: return "forward";
    case ConvPass::kGradInput: return "input gradient";
    case ConvPass::kGradWeight: return "weight gradient";
  }
  return "?";
}

}  // namespace

const char* conv_kernel_name(ConvKernel kernel) {
  switch (kernel) {
    case ConvKernel::kOneDnn: return "onednn";
    case ConvKernel::kOwn: return "own";
    case ConvKernel::kF32Winograd: return "f32_winograd";
    case ConvKernel::kMatmul: return "matmul";
    case ConvKernel::kBf16Winograd: return "bf16_winograd";
    case ConvKernel::kBf16WeightGrad: return "bf16_weight_grad";
    case ConvKernel::kWinogradWeightGrad: return "winograd_weight_grad";
  }
  return "?";
}

bool conv_tuning_enabled() {
  return conv_tuning_requested() && !are_deterministic_algorithms_enabled();
}

std::string conv_tuning_key_name(const ConvTuningKey& key) {
  const ConvGeometry& g = key.g;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s %s %s [N=%lld C=%lld %lldx%lld -> O=%lld %lldx%lld, %lldx%lld s%lld p%lld g%lld]%s",
                pass_name(key.pass), dtype_name(key.dtype),
                key.channels_last ? "channels-last" : "nchw", static_cast<long long>(g.n),
                static_cast<long long>(g.c), static_cast<long long>(g.h),
                static_cast<long long>(g.w), static_cast<long long>(g.o),
                static_cast<long long>(g.oh), static_cast<long long>(g.ow),
                static_cast<long long>(g.kh), static_cast<long long>(g.kw),
                static_cast<long long>(g.sh), static_cast<long long>(g.ph),
                static_cast<long long>(g.groups),
                key.epilogue ? " +epilogue" : "");
  return buf;
}

std::optional<ConvKernel> tuned_conv_choice(const ConvTuningKey& key,
                                            std::span<const ConvKernel> candidates,
                                            ConvRunner run) {
  Tuning& t = tuning();
  const KeyFields k = fields(key);
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (auto it = t.chosen.find(k); it != t.chosen.end()) return it->second;
  }
  if (candidates.size() == 1) return candidates[0];
  std::unique_lock<std::mutex> timing(t.timing, std::try_to_lock);
  if (!timing.owns_lock()) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(t.mutex);  // another thread may have just timed it
    if (auto it = t.chosen.find(k); it != t.chosen.end()) return it->second;
  }
  const auto start = std::chrono::steady_clock::now();
  ConvTuningRecord record{key, {}, candidates[0]};
  double best = std::numeric_limits<double>::infinity();
  for (const ConvKernel kernel : candidates) {
    const double s = best_seconds(kernel, run);
    record.seconds.emplace_back(kernel, s);
    if (s < best) best = s, record.chosen = kernel;
  }
  if (std::isinf(best)) return std::nullopt;  // every candidate declined: the rules' kernel
  metrics::increment("CpuConvTuned", Device{});
  metrics::record("CpuConvTuneSeconds",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (debug_on()) {
    std::string line = "loom: LOOM_CONV=tuned: " + conv_tuning_key_name(key) + ": " +
                       conv_kernel_name(record.chosen) + " (";
    for (std::size_t i = 0; i < record.seconds.size(); ++i) {
      char ms[64];
      std::snprintf(ms, sizeof ms, "%s%s %.3f ms", i ? ", " : "",
                    conv_kernel_name(record.seconds[i].first), record.seconds[i].second * 1e3);
      line += ms;
    }
    std::fprintf(stderr, "%s)\n", line.c_str());
  }
  std::lock_guard<std::mutex> lock(t.mutex);
  t.chosen.emplace(k, record.chosen);
  t.records.push_back(std::move(record));
  return t.records.back().chosen;
}

ConvKernel nchw_conv_kernel(const ConvGeometry& g, ConvPass pass, DType dtype, bool nonempty,
                            bool epilogue, ConvRunner run) {
  if (dtype == DType::Float64 || !nonempty) return ConvKernel::kOwn;
  const ConvKernel rule =
      conv_algorithm(g, pass, dtype) == ConvAlgorithm::kOneDnn ? ConvKernel::kOneDnn
                                                                : ConvKernel::kOwn;
  if (!conv_tuning_enabled() || (dtype == DType::BFloat16 && !onednn::bfloat16_supported()))
    return rule;
  static constexpr ConvKernel kCandidates[] = {ConvKernel::kOneDnn, ConvKernel::kOwn};
  const ConvTuningKey key{g, static_cast<int>(pass), dtype, false, epilogue};
  return tuned_conv_choice(key, kCandidates, run).value_or(rule);
}

std::vector<ConvTuningRecord> conv_tuning_records() {
  Tuning& t = tuning();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.records;
}

}  // namespace loom::runtime
