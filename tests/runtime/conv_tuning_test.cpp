// LOOM_CONV=tuned (runtime/cpu/conv/conv_tuning.h): the tuner picks the fastest candidate,
// times each key once, never picks a kernel that declined or threw, and gives way (nullopt) while
// another choice is being timed; the conv kernels tune each pass once when LOOM_CONV=tuned
// (ctest's Conv2dKernels.Forced_tuned and ConvTuning.* entries run this file so), never under
// deterministic algorithms, and not at all otherwise, with results that match float64 sums.
#include "runtime/cpu/conv/conv_tuning.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/conv/conv_winograd_f32.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kernels_impl.h"
#include "runtime/conv3x3_reference.h"
#include "runtime/expect_near.h"

#include <loom/error.h>
#include <loom/lazy.h>
#include <loom/metrics.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <thread>
#include <vector>

namespace loom::runtime {
namespace {

// A key no conv kernel makes (batch -1), distinct per test through `tag`.
ConvTuningKey fake_key(int64_t tag) {
  return {{-1, tag, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 0, DType::Float32, true, false};
}

std::size_t records_for(const ConvTuningKey& key) {
  std::size_t n = 0;
  for (const auto& r : conv_tuning_records())
    if (conv_tuning_key_name(r.key) == conv_tuning_key_name(key)) ++n;
  return n;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(ConvTuning, ChoosesTheFastestCandidateAndRemembersIt) {
  const ConvTuningKey key = fake_key(1);
  const std::map<ConvKernel, int> ms{
      {ConvKernel::kOneDnn, 12}, {ConvKernel::kMatmul, 1}, {ConvKernel::kF32Winograd, 25}};
  std::map<ConvKernel, int> calls;
  const auto run = [&](ConvKernel k) {
    ++calls[k];
    sleep_ms(ms.at(k));
    return true;
  };
  const ConvKernel candidates[] = {ConvKernel::kOneDnn, ConvKernel::kMatmul,
                                   ConvKernel::kF32Winograd};
  const int64_t tuned_before = metrics::counter("CpuConvTuned", Device{});
  EXPECT_EQ(tuned_conv_choice(key, candidates, run), ConvKernel::kMatmul);
  EXPECT_EQ(metrics::counter("CpuConvTuned", Device{}), tuned_before + 1);
  for (const ConvKernel k : candidates)  // one untimed call, then at least two timed ones
    EXPECT_GE(calls[k], 3) << conv_kernel_name(k);
  EXPECT_LE(calls[ConvKernel::kF32Winograd], 6);
  ASSERT_EQ(records_for(key), 1u);
  for (const auto& r : conv_tuning_records()) {
    if (conv_tuning_key_name(r.key) != conv_tuning_key_name(key)) continue;
    EXPECT_EQ(r.chosen, ConvKernel::kMatmul);
    ASSERT_EQ(r.seconds.size(), 3u);
    for (const auto& [kernel, seconds] : r.seconds)
      EXPECT_GE(seconds, ms.at(kernel) * 1e-3) << conv_kernel_name(kernel);
  }
  // Remembered: the second call runs nothing and times nothing.
  calls.clear();
  EXPECT_EQ(tuned_conv_choice(key, candidates, run), ConvKernel::kMatmul);
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(records_for(key), 1u);
  EXPECT_EQ(metrics::counter("CpuConvTuned", Device{}), tuned_before + 1);
}

TEST(ConvTuning, AKernelThatDeclinesIsNeverChosen) {
  const ConvTuningKey key = fake_key(2);
  const auto run = [&](ConvKernel k) {
    if (k == ConvKernel::kWinogradWeightGrad) return false;  // declines at once: "fastest"
    sleep_ms(2);
    return true;
  };
  const ConvKernel candidates[] = {ConvKernel::kWinogradWeightGrad, ConvKernel::kOneDnn};
  EXPECT_EQ(tuned_conv_choice(key, candidates, run), ConvKernel::kOneDnn);
  ASSERT_EQ(records_for(key), 1u);
  for (const auto& r : conv_tuning_records())
    if (conv_tuning_key_name(r.key) == conv_tuning_key_name(key)) {
      ASSERT_EQ(r.seconds.size(), 2u);
      EXPECT_TRUE(std::isinf(r.seconds[0].second));
      EXPECT_FALSE(std::isinf(r.seconds[1].second));
    }
  // A kernel that throws (a library refusing the shape) is declined too; when every candidate
  // declines nothing is chosen or remembered: the caller runs the rules' kernel.
  const auto throws = [](ConvKernel k) -> bool {
    if (k == ConvKernel::kMatmul) throw Error("refused");
    sleep_ms(1);
    return true;
  };
  const ConvKernel two[] = {ConvKernel::kMatmul, ConvKernel::kOneDnn};
  EXPECT_EQ(tuned_conv_choice(fake_key(5), two, throws), ConvKernel::kOneDnn);
  const auto none = [](ConvKernel) { return false; };
  EXPECT_EQ(tuned_conv_choice(fake_key(6), two, none), std::nullopt);
  EXPECT_EQ(records_for(fake_key(6)), 0u);
}

TEST(ConvTuning, GivesWayWhileAnotherChoiceIsTimed) {
  // A conv reached again while candidates run (a TBB task stolen by the waiting thread, or
  // another thread) gets nullopt, runs the rules' kernel, and is tuned at a later call.
  const ConvTuningKey outer = fake_key(3), inner = fake_key(4);
  const ConvKernel candidates[] = {ConvKernel::kOneDnn, ConvKernel::kMatmul};
  int nested = 0, gave_way = 0;
  const auto quick = [](ConvKernel) { return true; };
  const auto run = [&](ConvKernel) {
    ++nested;
    if (!tuned_conv_choice(inner, candidates, quick)) ++gave_way;
    return true;
  };
  ASSERT_TRUE(tuned_conv_choice(outer, candidates, run).has_value());
  EXPECT_GT(nested, 0);
  EXPECT_EQ(gave_way, nested);
  EXPECT_EQ(records_for(inner), 0u);
  EXPECT_TRUE(tuned_conv_choice(inner, candidates, quick).has_value());  // now it is tuned
  EXPECT_EQ(records_for(inner), 1u);
}

// The three passes of the channels-last float32 3x3 conv `k` through the kernels, against
// float64 sums, within the least precise candidate's tolerance (the float32 Winograd in 4x4
// tiles); returns how many tuned choices they added.
std::size_t run_passes(const Conv3x3Case& k) {
  constexpr double kTolerance = kF32WinogradTolerance4x4;
  const ConvGeometry g = geometry(k);
  const std::size_t before = conv_tuning_records().size();
  std::vector<float> x = random_floats(g.n * g.h * g.w * g.c, 1);
  std::vector<float> w = random_floats(g.o * g.c * 9, 2);
  std::vector<float> grad = random_floats(g.n * g.oh * g.ow * g.o, 3);
  const ir::Conv2dAttr conv{.stride = {1, 1}, .padding = {g.ph, g.pw}, .channels_last = true};
  const TensorView tx{x.data(), DType::Float32, {g.n, g.h, g.w, g.c}};
  const TensorView tw{w.data(), DType::Float32, {g.o, g.c, 3, 3}};
  const TensorView tgrad{grad.data(), DType::Float32, {g.n, g.oh, g.ow, g.o}};
  for (int round = 0; round < 2; ++round) {  // the second round: the choices remembered
    std::vector<float> out(static_cast<std::size_t>(g.n * g.oh * g.ow * g.o));
    run_kernel(ir::Op::Conv2d, conv, std::vector<TensorView>{tx, tw},
               {out.data(), DType::Float32, {g.n, g.oh, g.ow, g.o}});
    expect_near(values(out), forward_reference(g, x, w, {}, false), kTolerance,
                name(g, ConvPass::kForward));
    std::vector<float> gi(static_cast<std::size_t>(g.n * g.h * g.w * g.c));
    run_kernel(ir::Op::Conv2dGradInput, ir::Conv2dGradAttr{conv, {g.h, g.w}},
               std::vector<TensorView>{tgrad, tw}, {gi.data(), DType::Float32, tx.shape});
    expect_near(values(gi), grad_input_reference(g, grad, w), kTolerance,
                name(g, ConvPass::kGradInput));
    std::vector<float> gw(static_cast<std::size_t>(g.o * g.c * 9));
    run_kernel(ir::Op::Conv2dGradWeight, ir::Conv2dGradAttr{conv, {3, 3}},
               std::vector<TensorView>{tx, tgrad}, {gw.data(), DType::Float32, tw.shape});
    expect_near(values(gw), grad_weight_reference(g, x, grad), kTolerance,
                name(g, ConvPass::kGradWeight));
  }
  return conv_tuning_records().size() - before;
}

TEST(ConvTuning, ConvKernelsTuneEachPassOnceOnlyWhenAsked) {
  // Two shapes where oneDNN and at least one other kernel apply on any x86 CPU with AVX2.
  const std::size_t added = run_passes({4, 32, 8, 8, 64, 1, 1});
  if (!conv_tuning_requested()) {
    EXPECT_EQ(added, 0u) << "without LOOM_CONV=tuned nothing is timed";
    EXPECT_FALSE(conv_tuning_enabled());
    return;
  }
  EXPECT_TRUE(conv_tuning_enabled());
  EXPECT_EQ(added, 3u) << "one choice per pass, made at its first call";
  const auto records = conv_tuning_records();
  for (std::size_t i = records.size() - added; i < records.size(); ++i) {
    const ConvTuningRecord& r = records[i];
    EXPECT_TRUE(r.key.channels_last);
    EXPECT_GE(r.seconds.size(), 2u) << conv_tuning_key_name(r.key);  // oneDNN and another
    bool timed_chosen = false;
    for (const auto& [kernel, seconds] : r.seconds)
      if (kernel == r.chosen) timed_chosen = std::isfinite(seconds);
    EXPECT_TRUE(timed_chosen) << conv_tuning_key_name(r.key);
  }
  // Deterministic algorithms: the rules' choices, nothing timed, the same sums.
  use_deterministic_algorithms(true);
  EXPECT_FALSE(conv_tuning_enabled());
  const std::size_t deterministic = run_passes({3, 16, 6, 6, 64, 1, 1});
  use_deterministic_algorithms(false);
  EXPECT_EQ(deterministic, 0u);
}

}  // namespace
}  // namespace loom::runtime
