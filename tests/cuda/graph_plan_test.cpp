// When a CUDA program run goes through a graph, and which of its inputs are copied into fixed
// buffers first (runtime/cuda/graph_replay.h). Plain bookkeeping: no GPU needed.
#include "runtime/cuda/graph_replay.h"

#include <gtest/gtest.h>

#include <vector>

namespace loom::runtime::cuda {
namespace {

using Addresses = std::vector<const void*>;

const void* at(std::size_t k) {
  static char block[64];
  return block + k;
}

TEST(GraphPlan, TheThirdRunGoesThroughAGraphAndMovingInputsAreFound) {
  GraphPlan plan;
  // Input 0 a parameter (donated back into the same buffer), 1 the batch (a new buffer each
  // run), 2 an input with no storage.
  EXPECT_FALSE(plan.begin_run({at(0), at(1), nullptr}));
  EXPECT_FALSE(plan.moving(0));
  EXPECT_FALSE(plan.moving(1));  // nothing to compare with yet
  EXPECT_FALSE(plan.begin_run({at(0), at(2), nullptr}));
  EXPECT_FALSE(plan.moving(0));
  EXPECT_TRUE(plan.moving(1));
  EXPECT_FALSE(plan.moving(2));
  EXPECT_TRUE(plan.begin_run({at(0), at(1), nullptr}));
  EXPECT_EQ(plan.runs(), GraphPlan::kFirstGraphRun);
  // Still moving when a later batch happens to reuse the last batch's buffer once.
  EXPECT_TRUE(plan.begin_run({at(0), at(1), nullptr}));
  EXPECT_TRUE(plan.moving(1));
  // A parameter that moves later (no donation this time) moves from then on.
  EXPECT_TRUE(plan.begin_run({at(5), at(3), nullptr}));
  EXPECT_TRUE(plan.moving(0));
  EXPECT_FALSE(plan.moving(7));  // no such input
}

// A run whose library ops were made again (use_deterministic_algorithms changed) captures
// anew at the same addresses.
TEST(GraphPlan, AForgottenGraphIsCapturedAgain) {
  GraphPlan plan;
  const Addresses addresses{at(0), at(1)};
  for (int run = 0; run < GraphPlan::kFirstGraphRun - 1; ++run) EXPECT_FALSE(plan.begin_run({at(0)}));
  EXPECT_TRUE(plan.begin_run({at(0)}));
  EXPECT_FALSE(plan.matches(addresses));
  plan.captured(addresses);
  EXPECT_TRUE(plan.matches(addresses));
  plan.forget();
  EXPECT_FALSE(plan.matches(addresses));
  EXPECT_TRUE(plan.begin_run({at(0)}));  // still a graph run, captured again
  plan.captured(addresses);
  EXPECT_TRUE(plan.matches(addresses));
  EXPECT_EQ(plan.captures(), 2);
}

TEST(GraphPlan, AMovingInputThatKeepsItsBufferSettles) {
  GraphPlan plan;
  // Input 0 a parameter whose first steps took new buffers (no donation yet), then donated
  // back into one buffer at every run; input 1 a batch, new at every run.
  plan.begin_run({at(0), at(1)});
  plan.begin_run({at(2), at(3)});
  plan.begin_run({at(4), at(5)});
  EXPECT_TRUE(plan.moving(0));
  for (int run = 1; run < GraphPlan::kSettleRuns; ++run) {
    plan.begin_run({at(4), at(static_cast<std::size_t>(6 + run % 2))});
    EXPECT_TRUE(plan.moving(0)) << "after " << run << " runs at one address";
  }
  plan.begin_run({at(4), at(8)});
  EXPECT_FALSE(plan.moving(0));  // kSettleRuns runs at one address
  EXPECT_TRUE(plan.moving(1));
  plan.begin_run({at(4), at(9)});
  EXPECT_FALSE(plan.moving(0));
  plan.begin_run({at(10), at(11)});  // moves again: moving again
  EXPECT_TRUE(plan.moving(0));
}

TEST(GraphPlan, AGraphIsLaunchedOnlyForTheAddressesItWasCapturedWith) {
  GraphPlan plan;
  const Addresses key{at(0), at(8), at(16)};
  EXPECT_FALSE(plan.matches(key));  // nothing captured yet
  plan.captured(key);
  EXPECT_TRUE(plan.matches(key));
  EXPECT_FALSE(plan.matches({at(0), at(8), at(24)}));
  EXPECT_FALSE(plan.matches({at(0), at(8)}));
  EXPECT_EQ(plan.captures(), 1);
  plan.captured({at(0), at(8), at(24)});  // captured again for the new addresses
  EXPECT_TRUE(plan.matches({at(0), at(8), at(24)}));
  EXPECT_FALSE(plan.matches(key));
}

TEST(GraphPlan, AProgramWhoseAddressesKeepChangingGivesGraphsUp) {
  GraphPlan plan;
  int64_t graphed = 0;
  for (std::size_t run = 0; run < 40; ++run) {
    if (!plan.begin_run({at(0)})) continue;
    ++graphed;
    const Addresses key{at(run % 32)};  // a result's buffer differs at every run
    if (!plan.matches(key)) plan.captured(key);
  }
  EXPECT_TRUE(plan.given_up());
  EXPECT_NE(plan.why_given_up().find("addresses changed"), std::string::npos) << plan.why_given_up();
  // Captures allowed: kSpareCaptures + runs / 8 (4 + 0 at the first graphed run, 4 + 1 from run 8).
  EXPECT_LE(plan.captures(), GraphPlan::kSpareCaptures + 2);
  EXPECT_LT(graphed, 8);
  EXPECT_FALSE(plan.begin_run({at(0)}));  // for good
}

TEST(GraphPlan, ASteadyProgramKeepsItsGraph) {
  GraphPlan plan;
  for (std::size_t run = 0; run < 200; ++run) {
    if (!plan.begin_run({at(0), at(1 + run % 3)})) continue;
    const Addresses key{at(0), at(40)};  // the batch through its fixed buffer
    if (!plan.matches(key)) plan.captured(key);
  }
  EXPECT_FALSE(plan.given_up());
  EXPECT_EQ(plan.captures(), 1);
}

TEST(GraphPlan, GivingUpIsForGoodAndSaysWhy) {
  GraphPlan plan;
  plan.begin_run({});
  plan.give_up("cudaStreamEndCapture: operation not permitted when stream is capturing");
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(plan.begin_run({}));
  EXPECT_EQ(plan.why_given_up(), "cudaStreamEndCapture: operation not permitted when stream is capturing");
  EXPECT_FALSE(plan.matches({}));
}

}  // namespace
}  // namespace loom::runtime::cuda
