// Step capture (loom/compile.h): a stable step is captured after two equal traces and replayed
// without tracing, bit-identical to lazy mode; guards name what changed; what capture cannot
// see is found by the checking mode or reported.
#include "test_util.h"

#include <loom/autograd.h>
#include <loom/debug.h>
#include <loom/models/decoder.h>
#include <loom/models/resnet.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>
#include <loom/optim.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

namespace loom {
namespace {

namespace F = nn::functional;
// A clean engine, and no causes or warnings left by another test.
void fresh() {
  test::fresh_engine();
  debug::reset();
}

std::vector<float> values(const Tensor& t) { return t.to(DType::Float32).to_vector<float>(); }

// Bitwise equality of two float vectors (EXPECT_EQ on floats would pass -0 == 0).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every recompile cause and guard failure so far, one per line.
std::string causes() {
  std::string all;
  for (const auto& c : debug::recompile_causes()) all += c.site + ": " + c.cause + "\n";
  return all;
}

bool warned(const std::string& text) {
  for (const auto& w : debug::warnings())
    if (w.find(text) != std::string::npos) return true;
  return false;
}

Tensor batch_of(int64_t n, int call) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>((i + 1) * (call + 2) % 7) - 0.5f;
  return from_vector(v, {n});
}

// w ← w − lr·x·w, returning the new w's sum of squares: a step that reads its argument, a
// tensor it updates in place and a HostScalar.
struct ToyStep {
  Tensor w = from_vector<float>({1, 2, 3, 4}, {4});
  HostScalar lr{0.5, "lr"};
  Tensor run(const Tensor& x) {
    w.assign(w - x * w * lr.tensor(w.dtype(), w.device()));
    return (w * w).sum();
  }
};

TEST(Capture, TwoEqualTracesCaptureTheStepAndLaterCallsReplayWithoutTracing) {
  fresh();
  ToyStep captured, lazy;
  auto step = compile([&](const Tensor& x) { return captured.run(x); });
  for (int call = 0; call < 6; ++call) {
    auto x = batch_of(4, call);
    mark_step();
    auto builds = metrics::stat("GraphBuildTime").count;
    auto loss = step(x);
    auto traced = metrics::stat("GraphBuildTime").count - builds;
    EXPECT_EQ(traced, call < 2 ? 1 : 0) << "call " << call + 1;  // calls 3.. build no graph
    EXPECT_EQ(step.captured(), call >= 1) << "call " << call + 1;
    auto want = lazy.run(x);
    mark_step();
    EXPECT_TRUE(same_bits(values(loss), values(want))) << "call " << call + 1;
    EXPECT_TRUE(same_bits(values(captured.w), values(lazy.w))) << "call " << call + 1;
    captured.lr.set(0.5 / (call + 2));  // a new LR: read by the next replay
    lazy.lr.set(0.5 / (call + 2));
  }
  EXPECT_EQ(metrics::counter("CaptureReplay"), 4);
  EXPECT_EQ(metrics::counter("StepCaptured"), 1);
  EXPECT_EQ(metrics::counter("GuardFail"), 0);
  EXPECT_EQ(metrics::stat("ReplayHostTime").count, 4);
}

// A function may return a tensor it assigned (a persistent one, or an argument): a replay
// returns that tensor, holding its new value, as the traced calls did.
TEST(Capture, AReturnedTensorThatWasAssignedIsReturnedByAReplay) {
  fresh();
  auto w = from_vector<float>({10, 20}, {2});
  auto a = from_vector<float>({1, 1}, {2});
  auto b = from_vector<float>({1, 1}, {2});
  mark_step();
  auto step = compile([&](const Tensor& x) {
    w.assign(w - x);
    return w;
  });
  auto twice = compile([](const Tensor& x) {
    x.assign(x * 2.0);
    return x;
  });
  for (int call = 1; call <= 5; ++call) {
    auto r = step(a);
    ASSERT_TRUE(r.defined()) << "call " << call;
    EXPECT_EQ(values(r), (std::vector<float>{10.0f - call, 20.0f - call})) << "call " << call;
    auto d = twice(b);
    ASSERT_TRUE(d.defined()) << "call " << call;
    EXPECT_EQ(values(d), (std::vector<float>{float(1 << call), float(1 << call)})) << "call " << call;
  }
  EXPECT_EQ(metrics::counter("CaptureReplay"), 6);  // calls 3 to 5 of each
}

// Which arguments are one tensor is part of what a plan was captured for: a call that passes
// the same tensor twice where the capture had two (or the other way round) traces.
TEST(Capture, ArgumentsThatAreOneTensorAreAGuard) {
  fresh();
  auto f = compile([](const Tensor& a, const Tensor& b) { return (a * 2.0 + b).sum(); });
  auto x = from_vector<float>({1, 2}, {2});
  auto y = from_vector<float>({100, 200}, {2});
  mark_step();
  for (int call = 0; call < 3; ++call) EXPECT_EQ(f(x, x).item<float>(), 9.0f);
  EXPECT_EQ(f(x, y).item<float>(), 306.0f);  // not (x*2 + x).sum()
  EXPECT_EQ(f(x, x).item<float>(), 9.0f);
  EXPECT_GE(metrics::counter("GuardFailArgument"), 1);
}

TEST(Capture, ANewBatchShapeFailsAGuardNamesItAndIsCapturedInTurn) {
  fresh();
  ToyStep captured, lazy;
  lazy.w = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {8});
  captured.w = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {8});
  auto step = compile([&](const Tensor& x) { return captured.run(slice(x, 0, 0, 8)); });
  for (int call = 0; call < 3; ++call) step(batch_of(8, call));
  ASSERT_TRUE(step.captured());
  auto before = metrics::counter("CaptureReplay");
  step(batch_of(16, 5));
  EXPECT_EQ(metrics::counter("CaptureReplay"), before);
  EXPECT_EQ(metrics::counter("GuardFailArgument"), 1);
  EXPECT_NE(causes().find("guard failed: argument tensor 0 changed from float32[8] on cpu:0 to float32[16] on cpu:0"),
            std::string::npos)
      << causes();
  // The new shape is traced twice, captured too, and the old one still replays.
  step(batch_of(16, 6));
  step(batch_of(16, 7));
  EXPECT_EQ(metrics::counter("CaptureReplay"), before + 1);
  step(batch_of(8, 8));
  EXPECT_EQ(metrics::counter("CaptureReplay"), before + 2);
  // And the values are lazy mode's throughout.
  for (auto [n, call] : {std::pair{8, 0}, {8, 1}, {8, 2}, {16, 5}, {16, 6}, {16, 7}, {8, 8}})
    lazy.run(slice(batch_of(n, call), 0, 0, 8));
  mark_step();
  EXPECT_TRUE(same_bits(values(captured.w), values(lazy.w)));
}

TEST(Capture, AParameterAddedToTheOptimizerFailsAGuard) {
  fresh();
  Tensor a = from_vector<float>({0.5f, -1.0f}, {2}), b = from_vector<float>({2.0f, 1.0f}, {2});
  Tensor ra = from_vector<float>({0.5f, -1.0f}, {2}), rb = from_vector<float>({2.0f, 1.0f}, {2});
  for (auto* t : {&a, &b, &ra, &rb}) t->requires_grad_(true);
  optim::SGD opt({a}, {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref({ra}, {.lr = 0.1, .momentum = 0.9});
  auto loss_of = [](const Tensor& p, const Tensor& q, const Tensor& x) { return (p * x).sum() + (q * q * x).sum(); };
  auto step = compile([&](const Tensor& x) {
    opt.zero_grad();
    b.set_grad({});  // as a model's zero_grad would: b's gradient never accumulates
    auto loss = loss_of(a, b, x);
    loss.backward();
    opt.step();
    return loss;
  });
  auto lazy_step = [&](const Tensor& x) {
    ref.zero_grad();
    rb.set_grad({});
    loss_of(ra, rb, x).backward();
    ref.step();
    mark_step();
  };
  for (int call = 0; call < 4; ++call) {
    auto x = batch_of(2, call);
    step(x);
    lazy_step(x);
  }
  ASSERT_TRUE(step.captured());
  opt.add_param_group({b});
  ref.add_param_group({rb});
  auto x = batch_of(2, 9);
  step(x);
  lazy_step(x);
  EXPECT_EQ(metrics::counter("GuardFailHost"), 1);
  EXPECT_NE(causes().find("guard failed: SGD's parameter count changed from 1 to 2"), std::string::npos)
      << causes();
  for (int call = 10; call < 14; ++call) {
    step(batch_of(2, call));
    lazy_step(batch_of(2, call));
  }
  EXPECT_TRUE(same_bits(values(a), values(ra)));
  EXPECT_TRUE(same_bits(values(b), values(rb)));  // b is trained since it was added
  EXPECT_NE(values(b), (std::vector<float>{2.0f, 1.0f}));
  EXPECT_EQ(opt.steps(), ref.steps());
}

// An every_call() update that replaces a tensor the step reads (rather than assigning it)
// fails a guard at that replay: the call is traced again, reading the new tensor, and the
// update is not run twice.
TEST(Capture, AnEveryCallUpdateThatReplacesATensorTheStepReadsTracesAgain) {
  fresh();
  auto w = from_vector<float>({1, 2}, {2});
  auto x = from_vector<float>({1, 1}, {2});
  int updates = 0;
  mark_step();
  auto step = compile([&](const Tensor& x) {
    every_call([&] {
      if (++updates == 4) w = from_vector<float>({5, 6}, {2});
    });
    return (w * x).sum();
  });
  for (int call = 1; call <= 6; ++call) {
    EXPECT_EQ(step(x).item<float>(), call < 4 ? 3.0f : 11.0f) << "call " << call;
    EXPECT_EQ(updates, call) << "call " << call;
  }
  EXPECT_GE(metrics::counter("GuardFailTensor"), 1);
  EXPECT_NE(causes().find("a tensor the step reads or writes no longer exists"), std::string::npos) << causes();
  EXPECT_TRUE(step.captured());  // the step that reads the new tensor, captured in turn
}

// A step closure's error surfaces at the start of a later call, before that call runs or
// queues anything: a call either returns its step's result or changes nothing, traced or
// replayed.
void closure_error_leaves_no_step_without_its_result(bool capture) {
  fresh();
  ToyStep compiled, lazy;
  auto step = compile([&](const Tensor& x) { return compiled.run(x); }, {.capture = capture});
  int call = 0;
  for (; call < 3; ++call) {
    EXPECT_TRUE(same_bits(values(step(batch_of(4, call))), values(lazy.run(batch_of(4, call))))) << "call " << call;
    mark_step();
  }
  add_step_closure([] { throw Error("the closure failed"); });  // runs after the next call's step
  bool thrown = false;
  for (; call < 200 && !thrown; ++call) {
    try {
      auto loss = step(batch_of(4, call));
      EXPECT_TRUE(same_bits(values(loss), values(lazy.run(batch_of(4, call))))) << "call " << call;
      values(lazy.w);  // read, so that nothing is left pending for the next call to run first
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the closure failed"), std::string::npos) << e.what();
      thrown = true;
    }
  }
  ASSERT_TRUE(thrown);
  EXPECT_TRUE(same_bits(values(compiled.w), values(lazy.w)));  // the call that threw did not step
  auto loss = step(batch_of(4, call));
  EXPECT_TRUE(same_bits(values(loss), values(lazy.run(batch_of(4, call)))));
  EXPECT_TRUE(same_bits(values(compiled.w), values(lazy.w)));
}

TEST(Capture, AClosureErrorSurfacesBeforeAReplayedCallStepsNotAfter) { closure_error_leaves_no_step_without_its_result(true); }
TEST(Capture, AClosureErrorSurfacesBeforeATracedCallStepsNotAfter) { closure_error_leaves_no_step_without_its_result(false); }

// Dropout's p is read into the captured step: a change traces again (p = 0 passes the input
// through, as the traced call does).
TEST(Capture, DropoutsPIsAGuard) {
  fresh();
  nn::Dropout drop(0.5, 7);
  auto x = ones({64});
  auto step = compile([&](const Tensor& x) { return drop.forward(x).sum(); });
  for (int call = 0; call < 3; ++call) step(x);
  ASSERT_TRUE(step.captured());
  drop.p = 0;
  EXPECT_EQ(step(x).item<float>(), 64.0f);
  EXPECT_NE(causes().find("Dropout's p changed"), std::string::npos) << causes();
}

// A layer's settings are read into the captured step: changing one between calls traces the
// step again, as Dropout's p does (a replay went on with the captured eps, momentum, GELU
// form, stride: silently the old layer).
TEST(Capture, LayerSettingsAreGuards) {
  fresh();
  nn::BatchNorm2d bn(2), reference(2);
  auto x = from_vector<float>({0.5f, -1, 2, 3, 0.25f, 4, -2, 1}, {1, 2, 2, 2});
  auto step = compile([&](const Tensor& in) { return bn.forward(in).sum(); });
  for (int call = 0; call < 3; ++call) {
    step(x);
    reference.forward(x);
  }
  ASSERT_TRUE(step.captured());
  bn.momentum = reference.momentum = 0.9;
  step(x);
  reference.forward(x);
  EXPECT_TRUE(same_bits(values(bn.running_mean), values(reference.running_mean)));
  EXPECT_NE(causes().find("BatchNorm2d's eps and momentum changed"), std::string::npos) << causes();

  nn::GELU layer;
  auto act = compile([&](const Tensor& in) { return layer.forward(in); });
  for (int call = 0; call < 3; ++call) act(x);
  ASSERT_TRUE(act.captured());
  layer.approximate = true;
  EXPECT_TRUE(same_bits(values(act(x)), values(gelu(x, true))));

  nn::Conv2d conv(nn::Conv2dOptions(2, 1, 1));
  auto convolve = compile([&](const Tensor& in) { return conv.forward(in); });
  for (int call = 0; call < 3; ++call) convolve(x);
  ASSERT_TRUE(convolve.captured());
  conv.options.stride(2);
  EXPECT_EQ(convolve(x).shape(), (Shape{1, 1, 1, 1}));
  EXPECT_NE(causes().find("Conv2d's options changed"), std::string::npos) << causes();

  // A layer gone since the capture (replaced in its holder) fails its guard: the replay read
  // the freed layer's settings.
  struct Holder : nn::Module {
    std::shared_ptr<nn::Module> act = std::make_shared<nn::GELU>();
  } holder;
  auto through = compile([&](const Tensor& in) { return holder.act->forward(in); });
  for (int call = 0; call < 3; ++call) through(x);
  ASSERT_TRUE(through.captured());
  holder.act = std::make_shared<nn::ReLU>();
  EXPECT_TRUE(same_bits(values(through(x)), values(relu(x))));

  nn::Sequential seq{std::make_shared<nn::Flatten>()};
  auto run = compile([&](const Tensor& in) { return seq.forward(in); });
  for (int call = 0; call < 3; ++call) run(x);
  ASSERT_TRUE(run.captured());
  seq.push_back(std::make_shared<nn::ReLU>());  // the replay ran without it
  EXPECT_TRUE(same_bits(values(run(x)), values(relu(x.reshape({1, 8})))));
  EXPECT_NE(causes().find("Sequential's modules changed"), std::string::npos) << causes();
}

// A step captured while its parameter had no gradient at entry (zero_grad() outside it) gives
// the gradient afresh; once calls start with a gradient there (accumulation over calls), the
// traced code would add to it, so the replay may not replace it: it traces again. (The replay
// overwrote the accumulated gradient.)
TEST(Capture, AGradientAtEntryWhereTheCapturedStepHadNoneTracesAgain) {
  std::vector<float> grads[2];
  for (bool compiled : {false, true}) {
    fresh();
    nn::manual_seed(7);  // the same layer both times
    nn::Linear layer(3, 2);
    auto body = [&](const Tensor& x) {
      auto y = layer.forward(x);
      auto loss = (y * y).sum();
      loss.backward();
      return loss;
    };
    auto step = compile(body);
    for (int call = 0; call < 8; ++call) {
      if (call < 5) layer.zero_grad();  // then three calls accumulate
      if (compiled) {
        step(batch_of(3, call));
      } else {
        body(batch_of(3, call));
        mark_step();  // as the compiled call ends
      }
      if (compiled && call == 4) {
        EXPECT_TRUE(step.captured());
      }
    }
    grads[compiled] = values(layer.weight.grad());
  }
  EXPECT_TRUE(same_bits(grads[0], grads[1])) << grads[0][0] << " " << grads[1][0] << "\n" << causes();
  EXPECT_NE(causes().find("has one already"), std::string::npos) << causes();
}

// Two tensors that hold one buffer at entry (a target copy assign()ed from the weights at every
// call for a while, then no more) are not captured as one input: the replay read the weights
// for both after they parted. Against the same calls uncompiled.
TEST(Capture, TensorsSharingABufferAtEntryAreNotBoundAsOne) {
  std::vector<float> losses[2], weights[2];
  for (bool compiled : {false, true}) {
    fresh();
    auto w = from_vector<float>({1, 2, 3, 4}, {4});
    auto target = from_vector<float>({0, 0, 0, 0}, {4});
    auto body = [&](const Tensor& x) {
      auto d = w - target;
      auto loss = (d * d).sum();
      w.assign(w - x * w * 0.1);
      return loss;
    };
    auto step = compile(body);
    for (int call = 0; call < 9; ++call) {
      if (call < 5) target.assign(w);  // shares w's buffer
      Tensor loss = compiled ? step(batch_of(4, call)) : body(batch_of(4, call));
      if (!compiled) mark_step();  // as the compiled call ends
      losses[compiled].push_back(loss.item<float>());
    }
    weights[compiled] = values(w);
  }
  EXPECT_TRUE(same_bits(losses[0], losses[1]));
  EXPECT_TRUE(same_bits(weights[0], weights[1]));
  EXPECT_NE(causes().find("two tensors the step reads shared one buffer when it was captured, and no longer do"),
            std::string::npos) << causes();
  // Sharing that the step itself keeps up (the copy synced inside it) is still captured.
  fresh();
  auto w = from_vector<float>({1, 2, 3, 4}, {4});
  auto target = from_vector<float>({0, 0, 0, 0}, {4});
  auto sync = compile([&](const Tensor& x) {
    auto loss = ((w - target) * x).sum();
    target.assign(w);
    return loss;
  });
  for (int call = 0; call < 5; ++call) sync(batch_of(4, call));
  EXPECT_TRUE(sync.captured());
  EXPECT_EQ(sync(batch_of(4, 5)).item<float>(), 0.0f);
}

// A HostScalar set to -0.0 after the step was captured with +0.0 (both would be baked in as
// 0): -0.0 is data, so the replay's result has the sign eager mode gives.
TEST(Capture, AHostScalarOfMinusZeroKeepsItsSign) {
  fresh();
  auto w = from_vector<float>({-1, 2}, {2});
  HostScalar s(0.0, "s");
  auto step = compile([&] { return w * s.tensor(DType::Float32, Device{}); });
  for (int call = 0; call < 3; ++call) step();
  ASSERT_TRUE(step.captured());
  s.set(-0.0);
  const auto got = step().to_vector<float>();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_FALSE(std::signbit(got[0])) << "-1 * -0 is +0";
  EXPECT_TRUE(std::signbit(got[1])) << "2 * -0 is -0";
}

TEST(Capture, AScalarThatBecomesZeroOrOneFailsAGuard) {
  fresh();
  ToyStep captured, lazy;
  auto step = compile([&](const Tensor& x) { return captured.run(x); });
  for (int call = 0; call < 3; ++call) {
    step(batch_of(4, call));
    lazy.run(batch_of(4, call));
  }
  ASSERT_TRUE(step.captured());
  captured.lr.set(1);  // baked into the graph as 1: another graph
  lazy.lr.set(1);
  auto loss = step(batch_of(4, 3));
  auto want = lazy.run(batch_of(4, 3));
  mark_step();
  EXPECT_EQ(metrics::counter("GuardFailScalar"), 1);
  EXPECT_NE(causes().find("HostScalar 'lr' is now 1.000000 (baked in as 1); the captured step read it device data"),
            std::string::npos)
      << causes();
  EXPECT_TRUE(same_bits(values(loss), values(want)));
  EXPECT_TRUE(same_bits(values(captured.w), values(lazy.w)));
}

TEST(Capture, GradModeIsAGuard) {
  fresh();
  auto w = from_vector<float>({1, 2}, {2}).detach();
  w.requires_grad_(true);
  auto fwd = compile([&](const Tensor& x) { return (w * x).sum(); });
  for (int call = 0; call < 3; ++call) {
    NoGradGuard no_grad;
    fwd(batch_of(2, call));
  }
  ASSERT_TRUE(fwd.captured());
  fwd(batch_of(2, 4));
  EXPECT_EQ(metrics::counter("GuardFailGradMode"), 1);
  EXPECT_NE(causes().find("grad mode is on"), std::string::npos) << causes();
}

TEST(Capture, TheCheckingModeCatchesAValueDependentBranch) {
  fresh();
  ::setenv("LOOM_CAPTURE_CHECK", "1", 1);
  bool doubled = false;  // host state the function branches on
  auto w = from_vector<float>({1, 2, 3}, {3});
  auto step = compile([&](const Tensor& x) { return doubled ? (x * w).sum() : (x + w).sum(); });
  ::unsetenv("LOOM_CAPTURE_CHECK");
  for (int call = 0; call < 3; ++call) step(batch_of(3, call));  // call 3: checked, equal
  ASSERT_TRUE(step.captured());
  EXPECT_EQ(metrics::counter("CaptureCheck"), 1);
  doubled = true;
  auto msg = test::error_of([&] { step(batch_of(3, 4)); });
  EXPECT_NE(msg.find("LOOM_CAPTURE_CHECK: a fresh trace of the function differs from its captured step: the graph "
                     "changed: node %"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("was add, now mul"), std::string::npos) << msg;

  // Without the check, the branch is frozen: the replay still adds.
  fresh();
  doubled = false;
  auto frozen = compile([&](const Tensor& x) { return doubled ? (x * w).sum() : (x + w).sum(); });
  for (int call = 0; call < 3; ++call) frozen(batch_of(3, call));
  doubled = true;
  auto x = batch_of(3, 4);
  EXPECT_EQ(values(frozen(x)), values((x + w).sum()));
}

TEST(Capture, AReadInsideTheFunctionIsReportedAndItStaysTraced) {
  fresh();
  auto w = from_vector<float>({1, 2, 3}, {3});
  float seen = 0;
  auto step = compile([&](const Tensor& x) {
    seen = (x * w).sum().item<float>();
    return (x + w).sum();
  });
  for (int call = 0; call < 4; ++call) {
    auto x = batch_of(3, call);
    auto y = step(x);
    EXPECT_EQ(values(y), values((x + w).sum()));
    EXPECT_EQ(seen, values((x * w).sum())[0]);
  }
  EXPECT_FALSE(step.captured());
  EXPECT_TRUE(step.stays_lazy());
  EXPECT_EQ(metrics::counter("CaptureReplay"), 0);
  EXPECT_TRUE(warned("is traced at every call: it reads a value inside (item at capture_test.cpp:")) << [] {
    std::string all;
    for (const auto& w : debug::warnings()) all += w + "\n";
    return all;
  }();
}

TEST(Capture, AStepClosureAddedInsideIsReported) {
  fresh();
  auto w = from_vector<float>({1, 2, 3}, {3});
  int runs = 0;
  auto step = compile([&](const Tensor& x) {
    add_step_closure([&] { ++runs; });
    return (x + w).sum();
  });
  for (int call = 0; call < 3; ++call) step(batch_of(3, call));
  wait_device_ops();
  EXPECT_EQ(runs, 3);
  EXPECT_TRUE(step.stays_lazy());
  EXPECT_TRUE(warned("it adds a step closure inside"));
}

TEST(Capture, ATensorKeptOutsideOrAChangingHostValueIsNeverCaptured) {
  fresh();
  auto w = from_vector<float>({1, 2, 3}, {3});
  Tensor kept;
  auto keeps = compile([&](const Tensor& x) { kept = x * w; });
  for (int call = 0; call < 9; ++call) {
    auto x = batch_of(3, call);
    keeps(x);
    EXPECT_EQ(values(kept), values(x * w));
  }
  EXPECT_FALSE(keeps.captured());
  EXPECT_TRUE(keeps.stays_lazy());
  EXPECT_TRUE(warned("a tensor its step computes is kept outside it"));

  int count = 0;  // a host number turned into a tensor inside: frozen if captured
  auto counts = compile([&](const Tensor& x) { return x * from_vector<float>({static_cast<float>(++count)}, {}); });
  for (int call = 0; call < 9; ++call) {
    auto x = batch_of(3, call);
    auto y = counts(x);  // increments count
    EXPECT_EQ(values(y), values(x * static_cast<float>(count)));
  }
  EXPECT_FALSE(counts.captured());
  EXPECT_TRUE(warned("is a value made from host data inside the function"));
}

TEST(Capture, DropoutDrawsANewMaskAtEveryReplay) {
  fresh();
  nn::Dropout captured(0.5, 17), lazy(0.5, 17);
  auto step = compile([&](const Tensor& x) { return captured.forward(x); });
  std::vector<std::vector<float>> masks;
  for (int call = 0; call < 5; ++call) {
    auto x = full({64}, 1.0);
    auto y = step(x);
    auto want = lazy.forward(x);
    mark_step();
    EXPECT_TRUE(same_bits(values(y), values(want))) << "call " << call + 1;
    masks.push_back(values(y));
  }
  EXPECT_EQ(metrics::counter("CaptureReplay"), 2);
  EXPECT_NE(masks[3], masks[4]);  // two replays, two masks
  EXPECT_NE(masks[2], masks[3]);
}

// ---- whole training steps: captured and lazy are bit-identical ----

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

// 20 steps of `loss_of` with clipping and an LR schedule, the step compiled (captured) or
// lazy (a mark_step per step).
Run train(nn::Module& net, optim::Optimizer& opt, optim::Schedule& sched, const std::vector<Tensor>& inputs,
          const std::vector<Tensor>& targets, const std::function<Tensor(const Tensor&, const Tensor&)>& loss_of,
          bool compiled) {
  auto body = [&](const Tensor& input, const Tensor& target) {
    opt.zero_grad();
    auto loss = loss_of(input, target);
    loss.backward();
    optim::clip_grad_norm(opt.params(), 1.0);
    opt.step();
    return loss;
  };
  auto step = compile(body);
  Run run;
  std::vector<Tensor> losses;
  for (int i = 0; i < 20; ++i) {
    const auto& input = inputs[i % inputs.size()];  // the batches, in turn
    const auto& target = targets[i % targets.size()];
    if (compiled) {
      losses.push_back(step(input, target));
    } else {
      losses.push_back(body(input, target));
      mark_step();
    }
    sched.step();
  }
  if (compiled) {
    EXPECT_GE(metrics::counter("CaptureReplay"), 14);
  }
  for (auto& l : losses) run.losses.push_back(values(l)[0]);
  for (auto& p : net.parameters()) run.params.push_back(values(p));
  for (auto& [name, b] : net.named_buffers()) run.params.push_back(values(b));
  return run;
}

void expect_same(const Run& a, const Run& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_TRUE(same_bits({a.losses[i]}, {b.losses[i]})) << "step " << i + 1 << ": " << a.losses[i] << " vs " << b.losses[i];
  ASSERT_EQ(a.params.size(), b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(same_bits(a.params[i], b.params[i])) << "tensor " << i;
}

Run train_resnet20(bool compiled) {
  fresh();
  nn::manual_seed(5);
  auto net = models::resnet("resnet20", 3, 10);
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  optim::CosineSchedule sched(opt, {.base_lr = 0.1, .warmup_steps = 3, .total_steps = 20});
  std::vector<Tensor> images{randn({4, 3, 16, 16}, 21), randn({4, 3, 16, 16}, 22)};
  std::vector<Tensor> labels{from_vector<int64_t>({1, 7, 3, 0}, {4}), from_vector<int64_t>({9, 2, 2, 5}, {4})};
  mark_step();
  return train(*net, opt, sched, images, labels,
               [&](const Tensor& x, const Tensor& y) { return F::cross_entropy(net->forward(x), y, 0.1); }, compiled);
}

Run train_decoder(bool compiled) {
  fresh();
  nn::manual_seed(6);
  models::DecoderConfig cfg{.vocab_size = 64, .hidden_size = 32, .num_layers = 2, .num_heads = 4,
                            .num_kv_heads = 2, .intermediate_size = 48, .max_seq_len = 16};
  auto net = std::make_shared<models::Decoder>(cfg);
  optim::AdamW opt(net->parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  optim::WarmupSchedule sched(opt, {.base_lr = 3e-3, .warmup_steps = 5});
  std::mt19937_64 gen(9);
  std::vector<Tensor> inputs, targets;
  for (int b = 0; b < 3; ++b) {
    std::vector<int64_t> v(2 * 17);
    for (auto& t : v) t = static_cast<int64_t>(gen() % 64);
    auto window = from_vector(v, {2, 17});
    inputs.push_back(slice(window, 1, 0, 16));
    targets.push_back(slice(window, 1, 1, 17).reshape({-1}));
  }
  mark_step();
  return train(*net, opt, sched, inputs, targets,
               [&](const Tensor& x, const Tensor& y) {
                 return F::cross_entropy(net->forward(x).reshape({-1, 64}), y);
               },
               compiled);
}

TEST(Capture, TwentyResNet20StepsAreBitIdenticalToLazyMode) { expect_same(train_resnet20(true), train_resnet20(false)); }

TEST(Capture, TwentyDecoderStepsAreBitIdenticalToLazyMode) { expect_same(train_decoder(true), train_decoder(false)); }

TEST(Capture, InferenceUnderNoGradIsCapturedAndReplays) {
  fresh();
  nn::manual_seed(8);
  auto net = models::resnet("resnet20", 3, 10);
  net->eval();
  NoGradGuard no_grad;
  auto forward = compile([&](const Tensor& x) { return net->forward(x); });
  for (int call = 0; call < 4; ++call) {
    auto x = randn({1, 3, 16, 16}, 30 + call);
    mark_step();
    auto y = forward(x);
    EXPECT_TRUE(same_bits(values(y), values(net->forward(x)))) << "call " << call + 1;
  }
  EXPECT_EQ(metrics::counter("CaptureReplay"), 2);
}

}  // namespace
}  // namespace loom
