// A small model trained on the guarded device gives the losses it gives on the CPU: the
// engine's path from parameters to update is device-neutral. (The PyTorch training reference,
// tests/models/training_reference_test.cpp, runs ResNet-20 and the decoder on both too.)
#include "backend/guarded_backend.h"
#include "nn/nn_test_util.h"
#include "test_util.h"

#include <loom/autograd.h>
#include <loom/nn/functional.h>
#include <loom/nn/layers.h>
#include <loom/optim.h>

#include <cmath>

namespace loom {
namespace {

namespace F = nn::functional;

struct Run {
  std::vector<double> losses;
  int64_t cpu_compiles = 0;  // while training (the module's random init runs on the CPU)
};

// Twelve steps of a two-layer MLP with SGD momentum on fixed data, on `device`.
Run train_mlp(Device device) {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(6, 16));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(16, 3));
  int64_t k = 0;
  nn::NamedTensors state;
  for (const auto& [name, t] : net->state_dict()) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(0.3 * std::sin(0.7 * static_cast<double>(i) + static_cast<double>(++k)));
    state.emplace_back(name, from_vector(v, t.shape()));
  }
  net->to(device);
  net->load_state_dict(state);
  std::vector<float> xs(8 * 6);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(std::cos(0.37 * static_cast<double>(i)));
  auto x = from_vector(xs, {8, 6}).to(device);
  auto y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 1, 0}, {8}).to(device);
  optim::SGD opt(net->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  std::vector<double> losses;
  const int64_t cpu_compiles = metrics::counter("UncachedCompile", Device{});
  for (int step = 0; step < 12; ++step) {
    opt.zero_grad();
    auto loss = F::cross_entropy(net->forward(x), y);
    loss.backward();
    optim::optimizer_step(opt, /*barrier=*/true);
    losses.push_back(loss.item<float>());
  }
  for (const auto& p : net->parameters()) EXPECT_EQ(p.device(), device);
  return {losses, metrics::counter("UncachedCompile", Device{}) - cpu_compiles};
}

TEST(GuardedTraining, SameLossesAsOnTheCpu) {
  test::fresh_engine();
  const Device g = test::guarded_device();
  const int64_t violations = test::guard_violations();
  auto cpu_run = train_mlp(Device{});
  auto guarded_run = train_mlp(g);
  const auto& on_cpu = cpu_run.losses;
  const auto& on_guarded = guarded_run.losses;
  ASSERT_EQ(on_cpu.size(), on_guarded.size());
  for (std::size_t i = 0; i < on_cpu.size(); ++i)
    EXPECT_NEAR(on_guarded[i], on_cpu[i], 1e-6 * std::abs(on_cpu[i])) << "step " << i;
  EXPECT_LT(on_cpu.back(), 0.6 * on_cpu.front());  // it trained (1.20 to 0.60)
  wait_device_ops();
  EXPECT_EQ(test::guard_violations(), violations);
  // The guarded run compiled and ran its own programs; the CPU's cache saw none of them.
  EXPECT_GT(metrics::counter("UncachedCompile", g), 0);
  EXPECT_GT(metrics::counter("ExecuteProgram", g), 0);
  EXPECT_GT(cpu_run.cpu_compiles, 0);
  EXPECT_EQ(guarded_run.cpu_compiles, 0);
}

}  // namespace
}  // namespace loom
