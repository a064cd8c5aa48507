// ResNet: torchvision-compatible names, shapes and parameter counts; gradients reach every
// parameter; a steady training step compiles nothing and allocates nothing on the device.
#include "nn/nn_test_util.h"

#include <loom/autograd.h>
#include <loom/models/resnet.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>

#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>

namespace loom {
namespace {

namespace F = nn::functional;
using test::values;

// torchvision-style CIFAR ResNet-20 with projection shortcuts, 10 classes: every parameter
// with its shape, in PyTorch's state_dict order.
const std::vector<std::pair<std::string, Shape>> kResNet20Parameters{
      {"conv1.weight", {16, 3, 3, 3}}, {"bn1.weight", {16}}, {"bn1.bias", {16}},
      {"layer1.0.conv1.weight", {16, 16, 3, 3}}, {"layer1.0.bn1.weight", {16}},
      {"layer1.0.bn1.bias", {16}}, {"layer1.0.conv2.weight", {16, 16, 3, 3}},
      {"layer1.0.bn2.weight", {16}}, {"layer1.0.bn2.bias", {16}},
      {"layer1.1.conv1.weight", {16, 16, 3, 3}}, {"layer1.1.bn1.weight", {16}},
      {"layer1.1.bn1.bias", {16}}, {"layer1.1.conv2.weight", {16, 16, 3, 3}},
      {"layer1.1.bn2.weight", {16}}, {"layer1.1.bn2.bias", {16}},
      {"layer1.2.conv1.weight", {16, 16, 3, 3}}, {"layer1.2.bn1.weight", {16}},
      {"layer1.2.bn1.bias", {16}}, {"layer1.2.conv2.weight", {16, 16, 3, 3}},
      {"layer1.2.bn2.weight", {16}}, {"layer1.2.bn2.bias", {16}},
      {"layer2.0.conv1.weight", {32, 16, 3, 3}}, {"layer2.0.bn1.weight", {32}},
      {"layer2.0.bn1.bias", {32}}, {"layer2.0.conv2.weight", {32, 32, 3, 3}},
      {"layer2.0.bn2.weight", {32}}, {"layer2.0.bn2.bias", {32}},
      {"layer2.0.downsample.0.weight", {32, 16, 1, 1}}, {"layer2.0.downsample.1.weight", {32}},
      {"layer2.0.downsample.1.bias", {32}}, {"layer2.1.conv1.weight", {32, 32, 3, 3}},
      {"layer2.1.bn1.weight", {32}}, {"layer2.1.bn1.bias", {32}},
      {"layer2.1.conv2.weight", {32, 32, 3, 3}}, {"layer2.1.bn2.weight", {32}},
      {"layer2.1.bn2.bias", {32}}, {"layer2.2.conv1.weight", {32, 32, 3, 3}},
      {"layer2.2.bn1.weight", {32}}, {"layer2.2.bn1.bias", {32}},
      {"layer2.2.conv2.weight", {32, 32, 3, 3}}, {"layer2.2.bn2.weight", {32}},
      {"layer2.2.bn2.bias", {32}}, {"layer3.0.conv1.weight", {64, 32, 3, 3}},
      {"layer3.0.bn1.weight", {64}}, {"layer3.0.bn1.bias", {64}},
      {"layer3.0.conv2.weight", {64, 64, 3, 3}}, {"layer3.0.bn2.weight", {64}},
      {"layer3.0.bn2.bias", {64}}, {"layer3.0.downsample.0.weight", {64, 32, 1, 1}},
      {"layer3.0.downsample.1.weight", {64}}, {"layer3.0.downsample.1.bias", {64}},
      {"layer3.1.conv1.weight", {64, 64, 3, 3}}, {"layer3.1.bn1.weight", {64}},
      {"layer3.1.bn1.bias", {64}}, {"layer3.1.conv2.weight", {64, 64, 3, 3}},
      {"layer3.1.bn2.weight", {64}}, {"layer3.1.bn2.bias", {64}},
      {"layer3.2.conv1.weight", {64, 64, 3, 3}}, {"layer3.2.bn1.weight", {64}},
      {"layer3.2.bn1.bias", {64}}, {"layer3.2.conv2.weight", {64, 64, 3, 3}},
      {"layer3.2.bn2.weight", {64}}, {"layer3.2.bn2.bias", {64}}, {"fc.weight", {10, 64}},
      {"fc.bias", {10}},

};

void sgd_step(nn::Module& m, double lr) {
  NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.assign(p - p.grad() * lr);
  m.zero_grad();
}

TEST(ResNet20, ParameterNamesAndShapesMatchTorchvisionLayout) {
  auto net = models::resnet("resnet20", 3, 10);
  EXPECT_EQ(test::names_and_shapes(net->named_parameters()), kResNet20Parameters);
  // 269,722 for He et al.'s identity shortcuts, plus two projections: 16·32 + 2·32 and
  // 32·64 + 2·64.
  EXPECT_EQ(net->num_parameters(), 269722 + 576 + 2176);
  int64_t total = 0;
  for (const auto& [name, shape] : kResNet20Parameters) total += shape_numel(shape);
  EXPECT_EQ(total, 272474);
}

TEST(ResNet20, StateDictHasBatchNormBuffersInPyTorchOrder) {
  auto net = models::resnet("resnet20", 3, 10);
  auto sd = test::names_and_shapes(net->state_dict());
  // 65 parameters + 3 buffers for each of the 21 BatchNorm layers.
  ASSERT_EQ(sd.size(), 65u + 3 * 21);
  std::vector<std::pair<std::string, Shape>> head{
      {"conv1.weight", {16, 3, 3, 3}}, {"bn1.weight", {16}}, {"bn1.bias", {16}},
      {"bn1.running_mean", {16}}, {"bn1.running_var", {16}}, {"bn1.num_batches_tracked", {}},
      {"layer1.0.conv1.weight", {16, 16, 3, 3}}};
  EXPECT_EQ(std::vector(sd.begin(), sd.begin() + 7), head);
  std::vector<std::pair<std::string, Shape>> down{
      {"layer2.0.downsample.0.weight", {32, 16, 1, 1}}, {"layer2.0.downsample.1.weight", {32}},
      {"layer2.0.downsample.1.bias", {32}}, {"layer2.0.downsample.1.running_mean", {32}},
      {"layer2.0.downsample.1.running_var", {32}}, {"layer2.0.downsample.1.num_batches_tracked", {}}};
  auto at = std::find(sd.begin(), sd.end(), down[0]);
  ASSERT_NE(at, sd.end());
  EXPECT_EQ(std::vector(at, at + 6), down);
  EXPECT_EQ(sd.back(), (std::pair<std::string, Shape>{"fc.bias", {10}}));
}

TEST(ResNet, ImageNetParameterCountsAreTorchvisions) {
  EXPECT_EQ(models::resnet("resnet18", 3, 1000)->num_parameters(), 11689512);
  EXPECT_EQ(models::resnet("resnet34", 3, 1000)->num_parameters(), 21797672);
  auto r50 = models::resnet("resnet50", 3, 1000);
  EXPECT_EQ(r50->num_parameters(), 25557032);
  auto sd = r50->state_dict();
  auto shape_of = [&](const std::string& key) {
    for (const auto& [n, t] : sd)
      if (n == key) return t.shape();
    ADD_FAILURE() << "no key " << key;
    return Shape{};
  };
  EXPECT_EQ(shape_of("conv1.weight"), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(shape_of("layer1.0.downsample.0.weight"), (Shape{256, 64, 1, 1}));
  EXPECT_EQ(shape_of("layer2.0.conv2.weight"), (Shape{128, 128, 3, 3}));  // v1.5: stride on the 3x3
  EXPECT_EQ(shape_of("layer4.2.conv3.weight"), (Shape{2048, 512, 1, 1}));
  EXPECT_EQ(shape_of("layer4.2.bn3.running_var"), (Shape{2048}));
  EXPECT_EQ(shape_of("fc.weight"), (Shape{1000, 2048}));

  // Other input channels and classes change only conv1 and fc.
  EXPECT_EQ(models::resnet("resnet18", 1, 10)->num_parameters(),
            11689512 - 64 * 3 * 49 + 64 * 1 * 49 - (512 * 1000 + 1000) + (512 * 10 + 10));
}

TEST(ResNet, FactoryListsValidNames) {
  auto msg = test::error_of([] { models::resnet("resnet19", 3, 10); });
  EXPECT_NE(msg.find("resnet19"), std::string::npos) << msg;
  for (const char* n : {"resnet18", "resnet34", "resnet50", "resnet20", "resnet32", "resnet56"})
    EXPECT_NE(msg.find(n), std::string::npos) << msg;
  EXPECT_GT(models::resnet("resnet32", 3, 10)->num_parameters(), models::resnet("resnet20", 3, 10)->num_parameters());
  models::ResNetConfig bad;
  bad.widths = {64, 128};
  EXPECT_NE(test::error_of([&] { models::ResNet r(bad); }).find("width"), std::string::npos);
}

TEST(ResNet, ConvsUseKaimingNormalFanOut) {
  nn::manual_seed(0);
  auto net = models::resnet("resnet20", 3, 10);
  for (const auto& [name, t] : net->named_parameters()) {
    if (name == "layer3.1.conv1.weight") {
      auto v = values(t);
      double m = 0, s = 0;
      for (double x : v) m += x / v.size();
      for (double x : v) s += (x - m) * (x - m) / v.size();
      EXPECT_NEAR(std::sqrt(s), std::sqrt(2.0 / (64 * 9)), 0.03 * std::sqrt(2.0 / (64 * 9)));
    }
    if (name == "layer3.1.bn1.weight") test::expect_near(values(t), std::vector<double>(64, 1), 0);
  }
}

TEST(ResNet20, ForwardBackwardReachesEveryParameter) {
  nn::manual_seed(1);
  auto net = models::resnet("resnet20", 3, 10);
  auto x = randn({2, 3, 8, 8}, 5);
  auto y = from_vector<int64_t>({3, 7}, {2});
  auto logits = net->forward(x);
  EXPECT_EQ(logits.shape(), (Shape{2, 10}));
  auto loss = F::cross_entropy(logits, y);
  loss.backward();
  mark_step();
  EXPECT_TRUE(std::isfinite(loss.item<float>()));
  for (const auto& [name, p] : net->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().shape(), p.shape()) << name;
    double norm = 0;
    for (double g : values(p.grad())) {
      ASSERT_TRUE(std::isfinite(g)) << name;
      norm += g * g;
    }
    EXPECT_GT(norm, 0) << name;
  }
  for (const auto& [name, b] : net->named_buffers()) {
    if (name.ends_with("num_batches_tracked")) {
      EXPECT_EQ(b.item<int64_t>(), 1) << name;
    }
  }

  net->eval();
  auto eval_logits = net->forward(x);
  EXPECT_EQ(eval_logits.shape(), (Shape{2, 10}));
  for (double v : values(eval_logits)) EXPECT_TRUE(std::isfinite(v));
}

TEST(ResNet20, EagerAndLazyGiveTheSameNumbers) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::manual_seed(4);
  auto net = models::resnet("resnet20", 3, 10);
  auto x = randn({2, 3, 8, 8}, 6, DType::Float64);
  auto lazy_logits = values(net->forward(x));
  std::vector<double> eager_logits;
  {
    EagerModeGuard eager(true);
    eager_logits = values(net->forward(x));
  }
  test::expect_near(eager_logits, lazy_logits, 1e-10);
}

TEST(ResNet18, TinyImageForwardBackward) {
  auto net = models::resnet("resnet18", 3, 10);
  auto loss = F::cross_entropy(net->forward(randn({2, 3, 32, 32}, 9)), from_vector<int64_t>({1, 2}, {2}));
  loss.backward();
  mark_step();
  EXPECT_TRUE(std::isfinite(loss.item<float>()));
  for (const auto& [name, p] : net->named_parameters()) ASSERT_TRUE(p.grad().defined()) << name;
}

TEST(ResNet20, SteadyTrainingStepCompilesNothing) {
  test::fresh_engine();
  // One thread, so the allocation count is deterministic: with more, which thread first runs
  // a given kernel's task (and grows its scratch to that task's size) depends on scheduling,
  // and a late first visit could fall in a measured step. loom_bench counts with every thread.
  tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  auto net = models::resnet("resnet20", 3, 10);
  auto x = randn({2, 3, 8, 8}, 5);
  auto y = from_vector<int64_t>({3, 7}, {2});
  mark_step();
  std::vector<float> losses;
  for (int step = 0; step < 5; ++step) {
    auto loss = F::cross_entropy(net->forward(x), y);
    loss.backward();
    sgd_step(*net, 0.05);
    mark_step();
    losses.push_back(loss.item<float>());
    // The first step compiles its graph and the second the steady one; the third still
    // warms up (the allocator's cache and the threads' scratch reach their steady sizes).
    if (step == 2) metrics::reset();
  }
  EXPECT_EQ(metrics::counter("UncachedCompile"), 0);
  // The steady steps' programs allocated nothing on the device side (heap_count.h): buffers
  // come from the caching allocator or are donated, intermediates live in the arena, scratch
  // is kept; and the old parameters' buffers went to the new ones (memory_plan.h).
  EXPECT_EQ(metrics::counter("ExecuteProgram"), 2);
  EXPECT_EQ(metrics::counter("ExecuteHeapAlloc"), 0);
  EXPECT_GT(metrics::counter("DonatedBuffer"), 0);
  EXPECT_LT(losses[4], losses[0]);  // the same batch five times: the loss goes down
}

}  // namespace
}  // namespace loom
