// Back-pressure: mark_step lets at most max_steps_in_flight() steps be unfinished on the
// device, so the host cannot trace ahead without limit (memory grows with every queued step,
// and a signal would act only when the host next waits).
#include "test_util.h"

#include <loom/testing.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace loom {
namespace {

using test::error_of;
using test::fresh_engine;

// Sets the bound for one test and restores the previous one.
class InFlightBound {
 public:
  explicit InFlightBound(int steps) : previous_(max_steps_in_flight()) { set_max_steps_in_flight(steps); }
  ~InFlightBound() { set_max_steps_in_flight(previous_); }

 private:
  int previous_;
};

// Polls `ready` for up to five seconds.
template <class Fn>
bool eventually(Fn ready) {
  for (int i = 0; i < 500 && !ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return ready();
}

TEST(InFlight, MarkStepWaitsOnceTheBoundIsReached) {
  fresh_engine();
  InFlightBound bound(2);
  auto hold = std::make_unique<testing::DeviceQueueHold>();  // no step can finish
  std::atomic<int> returned{0};
  std::thread host([&] {
    auto x = from_vector<float>({1, 2, 3}, {3});
    std::vector<Tensor> kept;
    for (int i = 0; i < 4; ++i) {
      kept.push_back(x * static_cast<float>(i + 1));
      mark_step();
      ++returned;
    }
  });
  ASSERT_TRUE(eventually([&] { return returned == 2; }));
  // The third step is queued, but its mark_step waits for the first.
  ASSERT_TRUE(eventually([&] { return testing::pending_device_programs() == 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(returned, 2);
  EXPECT_EQ(metrics::counter("MarkStepWait"), 0);  // counted when the wait ends
  hold.reset();
  host.join();
  EXPECT_EQ(returned, 4);
  EXPECT_GE(metrics::counter("MarkStepWait"), 1);
  EXPECT_GT(metrics::stat("MarkStepWaitTime").total, 0);
}

// In lazy mode a step is one program; in eager mode each op is one, and mark_step bounds the
// step by its last op.
TEST(InFlight, WithABoundOfOneEachStepHasRunWhenTheNextMarkStepReturns) {
  for (bool eager_ops : {false, true}) {
    fresh_engine();
    InFlightBound bound(1);
    EagerModeGuard eager(eager_ops);
    auto w = from_vector<float>({1, 2, 3, 4}, {4});
    std::shared_ptr<runtime::DeviceBuffer> previous;
    for (int i = 0; i < 8; ++i) {
      w = reshape(tanh(matmul(reshape(w, {2, 2}), reshape(w, {2, 2}))) + 1.0f, {4});
      mark_step();
      if (previous) {
        EXPECT_TRUE(previous->ready->done()) << (eager_ops ? "eager" : "lazy") << " step " << i;
      }
      previous = w.impl()->data();
    }
    wait_device_ops();
  }
}

TEST(InFlight, AClosureThatMarksAStepDoesNotWaitForItself) {
  fresh_engine();
  InFlightBound bound(1);
  auto x = from_vector<float>({1, 2}, {2});
  float seen = 0;
  add_step_closure([&] {
    auto y = x * 3.0f;
    mark_step();  // on the device thread: runs inline, must not wait for its own step
    seen = y.to_vector<float>()[0];
  });
  mark_step();
  wait_device_ops();
  EXPECT_FLOAT_EQ(seen, 3.0f);
}

// A closure sees its step's values: one that reads a tensor a later step assigned (a handle
// captured by reference) gets an error naming the way out, where it waited for ever for work
// queued behind it; the value captured with t.detach() is its step's.
TEST(InFlight, AClosureReadingALaterStepsValueIsAnErrorNotAHang) {
  fresh_engine();
  auto w = from_vector<float>({1, 2}, {2});
  mark_step();
  std::string error;
  std::vector<float> snapshot_seen;
  {
    testing::DeviceQueueHold hold;  // both steps are queued before anything runs
    w.assign(w + 1.0f);
    add_step_closure([&, snapshot = w.detach()] {
      snapshot_seen = snapshot.to_vector<float>();
      error = error_of([&] { w.to_vector<float>(); });
    });
    mark_step();
    w.assign(w * 10.0f);
    mark_step();
  }
  wait_device_ops();
  EXPECT_EQ(snapshot_seen, (std::vector<float>{2, 3}));
  EXPECT_NE(error.find("a step closure read a tensor whose value a later step computes"), std::string::npos) << error;
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{20, 30}));
}

// A closure's mark_step() runs every pending tensor, the host's too: one that reads a later
// step's value would wait for work queued behind the closure. It is an error instead.
TEST(InFlight, AClosureMarkingAStepOverALaterStepsValueIsAnErrorNotAHang) {
  fresh_engine();
  auto x = from_vector<float>({1, 2}, {2});
  mark_step();
  std::string error;
  Tensor y, z;
  {
    testing::DeviceQueueHold hold;
    add_step_closure([&] { error = error_of([] { mark_step(); }); });
    mark_step();
    y = x * 2.0f;
    mark_step();   // queued behind the closure
    z = y + 1.0f;  // pending when the closure runs
  }
  wait_device_ops();
  EXPECT_NE(error.find("mark_step in a step closure: a pending tensor reads a value a later step computes"),
            std::string::npos)
      << error;
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{3, 5}));
}

TEST(InFlight, TheBoundIsChecked) {
  EXPECT_NE(error_of([] { set_max_steps_in_flight(0); }).find("set_max_steps_in_flight: expected 1 to 1000"),
            std::string::npos);
  EXPECT_GE(max_steps_in_flight(), 1);
}

}  // namespace
}  // namespace loom
