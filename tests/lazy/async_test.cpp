// Acceptance 3 and 4: mark_step does not wait for the device; a read runs only its subgraph
// and counts one transfer.
#include "test_util.h"

#include <loom/testing.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace loom {
namespace {

using test::fresh_engine;
using test::graph_of;

TEST(Async, MarkStepReturnsBeforeTheDeviceHasRun) {
  fresh_engine();
  auto x = from_vector<float>({1, 2, 3, 4}, {4});
  auto y = exp(x) * 2.0;
  std::shared_ptr<runtime::DeviceBuffer> buf;
  {
    testing::DeviceQueueHold hold;  // the device thread starts nothing until released
    mark_step();                     // returns although its program cannot have run
    EXPECT_FALSE(y.is_pending());    // y already owns its (future) buffer
    buf = y.impl()->data();
    ASSERT_NE(buf, nullptr);
    EXPECT_FALSE(buf->ready->done());
    EXPECT_EQ(testing::pending_device_programs(), 1);
  }
  // Released: the read waits for the value.
  auto v = y.to_vector<float>();
  EXPECT_TRUE(buf->ready->done());
  EXPECT_FLOAT_EQ(v[1], 2 * std::exp(2.0f));
  wait_device_ops();
  EXPECT_EQ(testing::pending_device_programs(), 0);
}

// The backends and their device threads live until the process ends: exit must let a step
// still queued or running finish before the libraries it runs on are torn down (before,
// such a step ran on into TBB's teardown and aborted with "pure virtual method called").
// The child is a fresh process (threadsafe style), so its device thread is its own.
TEST(Async, ExitLetsTheQueuedStepsFinish) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        fresh_engine();
        auto x = from_vector<float>({1, 2, 3, 4}, {4});
        auto y = (x * 2.0).sum();
        mark_step();
        add_step_closure([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::fputs("the last step's closure ran\n", stderr);
        });
        mark_step();
        std::exit(0);  // nothing waited for the device
      },
      ::testing::ExitedWithCode(0), "the last step's closure ran");
}

// The same when the libraries made statics of their own after the hook was first registered:
// oneDNN makes its AMX tile configuration's code the first time a bfloat16 conv runs, and
// frees it at exit before anything registered earlier; a conv still queued then faulted in
// the freed code (segfault on a CPU with AMX). The backend registers the hook again after each
// program's first run (renew_exit_hook).
TEST(Async, ExitLetsQueuedStepsFinishAfterTheLibrariesMadeTheirStatics) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        fresh_engine();
        auto x = randn({1, 64, 4, 4}, 1).to(DType::BFloat16);
        auto w = randn({64, 64, 3, 3}, 2).to(DType::BFloat16);
        auto y = conv2d(x, w, {}, {.padding = {1, 1}});
        mark_step();
        wait_device_ops();  // the first run: oneDNN makes its statics
        for (int i = 0; i < 3; ++i)
          y = conv2d(y, w, {}, {.padding = {1, 1}}).to(DType::Float32).to(DType::BFloat16);
        mark_step();
        add_step_closure([] { std::fputs("the last step's closure ran\n", stderr); });
        mark_step();
        std::exit(0);  // nothing waited for the device
      },
      ::testing::ExitedWithCode(0), "the last step's closure ran");
}

TEST(Async, WaitDeviceOpsWaitsForEverythingQueued) {
  fresh_engine();
  auto x = from_vector<double>({1, 2}, {2});
  std::vector<Tensor> outs;
  for (int i = 0; i < 5; ++i) {
    outs.push_back(x * static_cast<double>(i + 2));
    mark_step();
  }
  wait_device_ops();
  EXPECT_EQ(testing::pending_device_programs(), 0);
  for (auto& t : outs) EXPECT_TRUE(t.impl()->data()->ready->done());
}

TEST(Read, ItemRunsOnlyItsSubgraphAndCountsOneTransfer) {
  fresh_engine();
  auto x = from_vector<float>({1, 2, 3, 4}, {2, 2});
  auto big = matmul(x, x);
  for (int i = 0; i < 20; ++i) big = tanh(big) + x;
  auto small = sum(x * x);
  auto want_nodes = graph_of(small).nodes.size();
  ASSERT_LT(want_nodes, graph_of(big).nodes.size());

  float v = small.item<float>();
  EXPECT_FLOAT_EQ(v, 30.0f);
  EXPECT_EQ(metrics::counter("TransferFromDevice"), 1);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::stat("GraphSize").max, static_cast<double>(want_nodes));
  EXPECT_TRUE(big.is_pending());  // not run by the read
  EXPECT_FALSE(small.is_pending());
}

TEST(StepClosure, RunsAfterTheStepsValuesExistWithoutANewGraph) {
  fresh_engine();
  auto x = from_vector<float>({1, 2, 3}, {3});
  auto loss = sum(x * x);
  float seen = -1;
  add_step_closure([&] { seen = loss.item<float>(); });
  EXPECT_EQ(seen, -1);  // not before the step
  mark_step();
  wait_device_ops();
  EXPECT_FLOAT_EQ(seen, 14.0f);
  EXPECT_EQ(metrics::counter("UncachedCompile") + metrics::counter("CachedCompile"), 1);
}

TEST(StepClosure, AnErrorInAClosureSurfacesOnTheHost) {
  fresh_engine();
  add_step_closure([] { throw Error("closure: deliberate"); });
  mark_step();
  EXPECT_THROW(wait_device_ops(), Error);
  wait_device_ops();  // reported once
}

}  // namespace
}  // namespace loom
