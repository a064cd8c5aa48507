// The Trainer on a device that is not the CPU: the test suite's "guarded" backend, which
// reaches the CPU's kernels only through the backend contract, as a GPU backend does. The
// same losses and evaluation as on the CPU in lazy and compiled mode, exact resumption from a
// checkpoint on that device (the optimizer's state goes back to it), a checkpoint moving
// between devices, and clear errors when the model and the loaders are on different devices.
#include "backend/guarded_backend.h"
#include "test_util.h"
#include "training/blob_trainer.h"

#include <loom/metrics.h>

#include <gmock/gmock.h>

namespace loom {
namespace {

using namespace training_test;
using ::testing::HasSubstr;

struct DeviceRun {
  std::vector<double> losses;
  std::map<std::string, double> eval;
};

// Two epochs of the blobs on `device`, evaluated over a padded last batch (real_rows() on the
// device).
DeviceRun train_on(Device device, TrainerOptions o, uint64_t init_seed = 7) {
  auto train = loader(64, device);
  auto test = data::DeviceLoader(blobs(36), {.batch_size = 8, .last_batch = data::LastBatch::Pad, .device = device});
  auto net = fresh_model(init_seed);
  net->to(device);
  o.epochs = 2;
  o.quiet = true;
  BlobTrainer t(net, o);
  t.mask_padding = true;
  t.fit(train, &test);
  for (const auto& [name, p] : net->state_dict()) EXPECT_EQ(p.device(), device) << name;
  return {t.losses(), t.last_eval()};
}

void expect_near(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << "step " << i + 1;
}

TEST(TrainerOnADevice, TrainsAndEvaluatesAsOnTheCpu) {
  test::fresh_engine();
  const Device g = test::guarded_device();
  const int64_t violations = test::guard_violations();
  const auto cpu = train_on(Device{}, {});
  ASSERT_EQ(cpu.losses.size(), 16u);
  EXPECT_LT(cpu.losses.back(), 0.5 * cpu.losses.front());
  const int64_t programs = metrics::counter("ExecuteProgram", g);
  for (auto mode : {ExecutionMode::Lazy, ExecutionMode::Compiled}) {
    const auto on_g = train_on(g, {.mode = mode});
    expect_near(on_g.losses, cpu.losses);
    EXPECT_NEAR(on_g.eval.at("accuracy"), cpu.eval.at("accuracy"), 1e-12);
    EXPECT_EQ(on_g.eval.at("rows"), 1.0);  // every real row counted once, no padding
  }
  EXPECT_GT(metrics::counter("ExecuteProgram", g), programs);
  wait_device_ops();
  EXPECT_EQ(test::guard_violations(), violations);
}

TEST(TrainerOnADevice, ResumesExactlyOnTheDeviceAndMovesBetweenDevices) {
  const Device g = test::guarded_device();
  const auto whole = train_on(g, {}).losses;
  const auto ck = temp_checkpoint("loom_device_resume_");
  auto first = train_on(g, {.max_steps = 5, .checkpoint = ck}).losses;
  ASSERT_EQ(first.size(), 5u);
  // A different initialisation, overwritten by the checkpoint; the momentum comes back too.
  auto rest = train_on(g, {.checkpoint = ck, .resume = true, .mode = ExecutionMode::Compiled}, 99).losses;
  first.insert(first.end(), rest.begin(), rest.end());
  ASSERT_EQ(first.size(), whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(first[i], whole[i]) << "step " << i + 1;

  // The checkpoint of step 5 written on the guarded device, resumed on the CPU.
  auto part = train_on(g, {.max_steps = 5, .checkpoint = ck}).losses;
  auto on_cpu = train_on(Device{}, {.checkpoint = ck, .resume = true}, 99).losses;
  part.insert(part.end(), on_cpu.begin(), on_cpu.end());
  expect_near(part, whole);
  std::filesystem::remove(ck);
}

TEST(TrainerOnADevice, AModelAndALoaderOnDifferentDevicesAreAClearError) {
  const Device g = test::guarded_device();
  auto net = fresh_model();
  net->to(g);
  BlobTrainer t(net, quiet({}));
  auto on_cpu = loader();
  auto on_g = loader(64, g);
  EXPECT_THAT(test::error_of([&] { t.fit(on_cpu); }),
              HasSubstr("the training loader delivers batches on cpu:0, the model is on guarded:0"));
  EXPECT_THAT(test::error_of([&] { t.fit(on_g, &on_cpu); }),
              HasSubstr("the evaluation loader delivers batches on cpu:0, the model is on guarded:0"));
  EXPECT_THAT(test::error_of([&] { t.evaluate(on_cpu); }), HasSubstr("DeviceLoaderOptions{.device = guarded:0}"));
  EXPECT_EQ(t.step(), 0);  // nothing trained

  auto half = fresh_model();
  half->fc2->to(g);
  BlobTrainer split(half, quiet({}));
  EXPECT_THAT(test::error_of([&] { split.fit(on_cpu); }), HasSubstr("parameters are on more than one device"));
}

}  // namespace
}  // namespace loom
