// Optimizers against PyTorch (fixtures from tests/reference/make_optim_fixtures.py), the
// compile behaviour of optimizer_step, schedules and gradient clipping.
#include "test_util.h"

#include <gmock/gmock.h>

#include <loom/autograd.h>
#include <loom/compile.h>
#include <loom/optim.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

namespace loom {
namespace {

struct OptimCase {
  std::string name, optimizer;
  std::map<std::string, std::string> params;
  std::vector<double> p0, c, lrs;
  std::vector<double> losses;
  std::vector<std::vector<double>> after;  // parameters after each step
};

std::vector<double> numbers(std::istringstream& in) {
  std::vector<double> v;
  double x;
  while (in >> x) v.push_back(x);
  return v;
}

std::vector<OptimCase> load_cases() {
  std::ifstream f(std::string(LOOM_TEST_DATA_DIR) + "/optim/fixtures/optim_reference.txt");
  std::vector<OptimCase> cases;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "case") {
      cases.emplace_back();
      in >> cases.back().name >> cases.back().optimizer;
      std::string kv;
      while (in >> kv) {
        auto eq = kv.find('=');
        cases.back().params[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    } else if (tag == "p0") {
      cases.back().p0 = numbers(in);
    } else if (tag == "c") {
      cases.back().c = numbers(in);
    } else if (tag == "lrs") {
      cases.back().lrs = numbers(in);
    } else if (tag == "step") {
      int k;
      std::string w;
      double loss;
      in >> k >> w >> loss >> w;
      cases.back().losses.push_back(loss);
      cases.back().after.push_back(numbers(in));
    }
  }
  return cases;
}

double param(const OptimCase& c, const std::string& key, double fallback) {
  auto it = c.params.find(key);
  return it == c.params.end() ? fallback : std::stod(it->second);
}

std::pair<double, double> betas(const OptimCase& c) {
  auto it = c.params.find("betas");
  if (it == c.params.end()) return {0.9, 0.999};
  auto comma = it->second.find(',');
  return {std::stod(it->second.substr(0, comma)), std::stod(it->second.substr(comma + 1))};
}

std::unique_ptr<optim::Optimizer> make(const OptimCase& c, const Tensor& p) {
  if (c.optimizer == "SGD")
    return std::make_unique<optim::SGD>(
        std::vector<Tensor>{p},
        optim::SGDOptions{.lr = param(c, "lr", 0.1), .momentum = param(c, "momentum", 0),
                          .dampening = param(c, "dampening", 0),
                          .weight_decay = param(c, "weight_decay", 0),
                          .nesterov = c.params.count("nesterov") > 0});
  auto [b1, b2] = betas(c);
  // A case without weight_decay leaves it unset: each optimizer's own default (Adam 0, AdamW
  // 1e-2) must be PyTorch's, which made the fixture.
  optim::AdamOptions o{.lr = param(c, "lr", 1e-3), .beta1 = b1, .beta2 = b2, .eps = param(c, "eps", 1e-8)};
  if (c.params.count("weight_decay")) o.weight_decay = param(c, "weight_decay", 0);
  if (c.optimizer == "Adam") return std::make_unique<optim::Adam>(std::vector<Tensor>{p}, o);
  return std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, o);
}

TEST(Optimizers, MatchPyTorchOverThreeStepsWithAChangingLearningRate) {
  auto cases = load_cases();
  ASSERT_EQ(cases.size(), 8u) << "fixture missing or incomplete";
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(c.after.size(), 3u);
    auto n = static_cast<int64_t>(c.p0.size());
    auto p = from_vector(c.p0, {n}).requires_grad_();
    auto coef = from_vector(c.c, {n});
    auto opt = make(c, p);
    for (int k = 0; k < 3; ++k) {
      opt->set_lr(c.lrs[k]);
      opt->zero_grad();
      auto loss = sum(coef * p * p) + sum(p * p * p) / 10.0;
      loss.backward();
      optim::optimizer_step(*opt, /*barrier=*/true);
      EXPECT_NEAR(loss.item<double>(), c.losses[k], 1e-12 * std::abs(c.losses[k]));
      auto got = p.to_vector<double>();
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(got[i], c.after[k][i], 1e-12 * std::abs(c.after[k][i]) + 1e-15) << "step " << k << " element " << i;
    }
  }
}

// A tiny two-layer model trained with raw tensors.
struct Tiny {
  Tensor w1 = normal({8, 16}, 0, 0.3, 1, DType::Float32).requires_grad_();
  Tensor w2 = normal({16, 4}, 0, 0.3, 2, DType::Float32).requires_grad_();
  Tensor loss(const Tensor& x, const Tensor& y) { return mean(pow(matmul(tanh(matmul(x, w1)), w2) - y, 2.0)); }
};

TEST(OptimizerStep, ASteadyLoopCompilesNothingAfterTheSecondStep) {
  test::fresh_engine();
  Tiny m;
  mark_step();  // materializes the initial weights (one graph of its own)
  wait_device_ops();
  metrics::reset();
  optim::SGD opt({m.w1, m.w2}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  optim::CosineSchedule sched(opt, {.base_lr = 0.1, .warmup_steps = 3, .total_steps = 20});
  std::vector<int64_t> compiles;
  float first = 0, last = 0;
  for (int step = 0; step < 12; ++step) {
    auto x = rand({32, 8}, 100 + step);
    auto y = sin(matmul(x, ones({8, 4})));
    opt.zero_grad();
    auto loss = m.loss(x, y);
    loss.backward();
    optim::optimizer_step(opt, /*barrier=*/true);
    sched.step();  // a new LR every step
    add_step_closure([&, loss, step] { (step == 0 ? first : last) = loss.item<float>(); });
    compiles.push_back(metrics::counter("UncachedCompile"));
  }
  wait_device_ops();
  // Step 1 differs from step 2 only because momentum buffers appear; after that, nothing.
  EXPECT_LE(compiles[1], 2);
  for (std::size_t i = 2; i < compiles.size(); ++i) EXPECT_EQ(compiles[i], compiles[1]) << "step " << i;
  // One graph per step holds forward, backward and update.
  EXPECT_EQ(metrics::counter("UncachedCompile") + metrics::counter("CachedCompile"), 12);
  EXPECT_LT(last, first);
}

TEST(Schedules, LearningRates) {
  auto p = zeros({1}).requires_grad_();
  optim::SGD opt({p}, {.lr = 1});
  optim::StepSchedule step(opt, {.base_lr = 1, .step_size = 2, .gamma = 0.5});
  EXPECT_DOUBLE_EQ(step.lr_at(0), 1);
  EXPECT_DOUBLE_EQ(step.lr_at(3), 0.5);
  EXPECT_DOUBLE_EQ(step.lr_at(4), 0.25);
  optim::CosineSchedule cos(opt, {.base_lr = 1, .warmup_steps = 4, .total_steps = 14, .min_lr = 0.1});
  EXPECT_DOUBLE_EQ(cos.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(cos.lr_at(3), 1);
  EXPECT_NEAR(cos.lr_at(9), 0.55, 1e-12);
  EXPECT_NEAR(cos.lr_at(14), 0.1, 1e-12);
  EXPECT_NEAR(cos.lr_at(100), 0.1, 1e-12);
  optim::WarmupSchedule warm(opt, {.base_lr = 2, .warmup_steps = 4});
  EXPECT_DOUBLE_EQ(opt.lr(), 0.5);
  warm.step();
  EXPECT_DOUBLE_EQ(opt.lr(), 1);
  EXPECT_DOUBLE_EQ(warm.lr_at(10), 2);
  // A step schedule warms up too: linearly over its first steps, decaying as without.
  optim::StepSchedule warm_step(opt, {.base_lr = 1, .step_size = 4, .gamma = 0.5, .warmup_steps = 2});
  EXPECT_DOUBLE_EQ(warm_step.lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(warm_step.lr_at(1), 1);
  EXPECT_DOUBLE_EQ(warm_step.lr_at(4), 0.5);
  // Options that would make a negative or growing LR later in the run fail now.
  EXPECT_THAT(test::error_of([&] { optim::StepSchedule(opt, {.gamma = -0.5}); }),
              ::testing::HasSubstr("StepSchedule: expected gamma in (0, 1], got -0.5"));
  EXPECT_THAT(test::error_of([&] { optim::StepSchedule(opt, {.warmup_steps = -1}); }),
              ::testing::HasSubstr("StepSchedule: expected warmup_steps >= 0, got -1"));
  EXPECT_THAT(test::error_of([&] { optim::CosineSchedule(opt, {.base_lr = 1, .total_steps = 5, .min_lr = -1}); }),
              ::testing::HasSubstr("CosineSchedule: expected 0 <= min_lr <= base_lr, got -1 and 1"));
  EXPECT_THAT(test::error_of([&] { optim::CosineSchedule(opt, {.base_lr = 1, .total_steps = 5, .min_lr = 2}); }),
              ::testing::HasSubstr("CosineSchedule: expected 0 <= min_lr <= base_lr, got 2 and 1"));
}

TEST(ClipGradNorm, ScalesToTheMaxNorm) {
  auto a = from_vector<double>({3, 0}, {2}).requires_grad_();
  auto b = from_vector<double>({0, 4}, {2}).requires_grad_();
  sum(a * a / 2.0).backward();  // grad a = a
  sum(b * b / 2.0).backward();
  auto norm = optim::clip_grad_norm({a, b}, 1.0);
  EXPECT_NEAR(norm.item<double>(), 5.0, 1e-12);
  auto ga = a.grad().to_vector<double>();
  auto gb = b.grad().to_vector<double>();
  EXPECT_NEAR(ga[0], 3 / (5 + 1e-6), 1e-12);
  EXPECT_NEAR(gb[1], 4 / (5 + 1e-6), 1e-12);
  // Below the max norm: unchanged.
  optim::clip_grad_norm({a, b}, 10.0);
  EXPECT_NEAR(a.grad().to_vector<double>()[0], 3 / (5 + 1e-6), 1e-12);
  // Gradients of two dtypes: one norm over both, each gradient scaled in its own dtype.
  auto c = from_vector<float>({0, 12}, {2}).requires_grad_();
  sum(c * c / 2.0).backward();
  a.set_grad(from_vector<double>({5, 0}, {2}));
  auto mixed = optim::clip_grad_norm({a, c}, 1.0);
  EXPECT_NEAR(mixed.item<double>(), 13.0, 1e-9);
  EXPECT_EQ(c.grad().dtype(), DType::Float32);
  EXPECT_NEAR(c.grad().to_vector<float>()[1], 12 / 13.0, 1e-6);
}

TEST(Optimizers, BadOptionsAreClearErrors) {
  auto p = zeros({2}).requires_grad_();
  EXPECT_THROW(optim::SGD({p}, {.lr = -1}), Error);
  EXPECT_THROW(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(optim::Adam({p}, {.beta1 = 1.0}), Error);
  EXPECT_THROW(optim::SGD({}, {}), Error);
  EXPECT_THROW(optim::CosineSchedule(*std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions{}),
                                     {.warmup_steps = 5, .total_steps = 5}), Error);
}

// A captured step traces again after load_state(): it went on reading and updating the state
// tensors it was captured with while something still held them (a checkpoint's copy of
// state()), and the loaded state was never used. Against the same calls uncompiled.
TEST(OptimizerState, LoadStateReachesACapturedStepWhileTheOldStateIsHeld) {
  for (bool adam : {false, true}) {
    std::vector<double> got[2];
    for (bool compiled : {false, true}) {
      test::fresh_engine();
      auto w = from_vector<double>({1.0, -2.0}, {2});
      w.requires_grad_();
      std::unique_ptr<optim::Optimizer> opt;
      if (adam) opt = std::make_unique<optim::Adam>(std::vector<Tensor>{w}, optim::AdamOptions{.lr = 0.1});
      else opt = std::make_unique<optim::SGD>(std::vector<Tensor>{w}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      auto body = [&] {
        opt->zero_grad();
        auto loss = (w * w).sum();
        loss.backward();
        opt->step();
        return loss;
      };
      auto step = compile(body);
      auto call = [&] {
        if (compiled) {
          step();
        } else {
          body();
          mark_step();  // as the compiled call ends
        }
      };
      for (int i = 0; i < 4; ++i) call();
      if (compiled) {
        EXPECT_TRUE(step.captured());
      }
      const auto held = opt->state();  // still held, as a checkpoint in scope holds it
      std::vector<std::pair<std::string, Tensor>> fresh;
      for (const auto& [name, t] : held)
        fresh.emplace_back(name, name.ends_with("step") ? t : zeros(t.shape(), t.dtype()));
      opt->load_state(fresh, opt->steps());
      w.assign(from_vector<double>({1.0, -2.0}, {2}));
      for (int i = 0; i < 2; ++i) call();
      got[compiled] = w.to_vector<double>();
    }
    EXPECT_EQ(got[0], got[1]) << (adam ? "Adam" : "SGD");
  }
}

// load_state() takes only what state() writes: "<param index>.<name>" with the name of the
// optimizer's buffer and the parameter's shape; anything else is a loom::Error naming it.
TEST(Optimizers, LoadStateChecksNamesAndShapes) {
  auto a = zeros({2, 3}).requires_grad_(), b = zeros({4}).requires_grad_();
  optim::SGD sgd({a, b}, {.lr = 0.1, .momentum = 0.9});
  optim::Adam adam({a, b}, {});
  using State = std::vector<std::pair<std::string, Tensor>>;
  // What each writes is what each reads back.
  sgd.load_state({{"1.momentum_buffer", ones({4})}}, 3);
  EXPECT_EQ(sgd.steps(), 3);
  ASSERT_EQ(sgd.state().size(), 1u);
  EXPECT_EQ(sgd.state()[0].first, "1.momentum_buffer");
  EXPECT_EQ(sgd.state()[0].second.to_vector<float>(), std::vector<float>(4, 1.f));
  adam.load_state({{"0.exp_avg", ones({2, 3})}, {"0.exp_avg_sq", ones({2, 3})},
                   {"0.step", scalar_tensor(5, DType::Int64)}}, 5);
  EXPECT_EQ(adam.steps(), 5);
  EXPECT_EQ(adam.state().size(), 3u);

  const std::pair<State, std::string> sgd_bad[] = {
      {{{"0.exp_avg", ones({2, 3})}}, "SGD: unexpected optimizer state '0.exp_avg'"},
      {{{"2.momentum_buffer", ones({4})}}, "SGD: unexpected optimizer state '2.momentum_buffer'"},
      {{{"momentum_buffer", ones({4})}}, "SGD: unexpected optimizer state 'momentum_buffer'"},
      {{{"x.momentum_buffer", ones({4})}}, "SGD: unexpected optimizer state 'x.momentum_buffer'"},
      {{{"1.momentum_buffer", ones({2, 3})}},
       "SGD: state '1.momentum_buffer' expects shape [4], got [2,3]"},
  };
  for (const auto& [state, want] : sgd_bad)
    EXPECT_EQ(test::error_of([&] { sgd.load_state(state, 1); }), want);
  const std::pair<State, std::string> adam_bad[] = {
      {{{"0.momentum_buffer", ones({2, 3})}}, "Adam: unexpected optimizer state '0.momentum_buffer'"},
      {{{"7.exp_avg", ones({2, 3})}}, "Adam: unexpected optimizer state '7.exp_avg'"},
      {{{"0.exp_avg_sq", ones({3, 2})}}, "Adam: state '0.exp_avg_sq' expects shape [2,3], got [3,2]"},
  };
  for (const auto& [state, want] : adam_bad)
    EXPECT_EQ(test::error_of([&] { adam.load_state(state, 1); }), want);
}


// SGD's momentum buffer is a value of its own (torch clones the first gradient): two
// parameters whose gradients are one tensor (autograd's rule for a + b gives both the same
// gradient) keep two buffers, and a step does not change the gradient it read.
TEST(Optimizers, SgdMomentumBuffersAreTheirOwnValues) {
  auto a = zeros({2}).requires_grad_(), b = zeros({2}).requires_grad_();
  auto c = from_vector<float>({1, 2}, {2});
  optim::SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    sum((a + b) * c).backward();
    opt.step();
    mark_step();
  }
  // buffers g, 1.9g, 2.71g: each parameter moved by 0.1·(1 + 1.9 + 2.71)·c
  for (const auto* p : {&a, &b}) {
    auto v = p->to_vector<float>();
    EXPECT_NEAR(v[0], -0.561f, 1e-6f);
    EXPECT_NEAR(v[1], -1.122f, 1e-6f);
  }
  // Steps without a new backward read the same gradient again.
  opt.step();
  opt.step();
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{1, 2}));
}

// A parameter given twice would be updated twice a step: an error, in one group or across
// groups (torch.optim: add_param_group raises on it).
TEST(Optimizers, AParameterGivenTwiceIsAClearError) {
  auto a = zeros({2}).requires_grad_(), b = zeros({3}).requires_grad_();
  EXPECT_EQ(test::error_of([&] { optim::SGD({a, b, a}, {}); }), "SGD: parameter 2 is parameter 0 again");
  optim::Adam adam({a}, {});
  EXPECT_EQ(test::error_of([&] { adam.add_param_group({b, a}); }),
            "Adam: add_param_group: parameter 1 is already optimized (parameter 0)");
  EXPECT_EQ(adam.params().size(), 1u);  // nothing added
}

// Adam's state for a parameter is its two moments and its step count, all or none, in the
// parameter's dtype (a checkpoint read as float32 into float64 parameters is converted).
TEST(Optimizers, AdamLoadStateNeedsTheWholeStateOfAParameter) {
  auto a = zeros({2}, DType::Float64).requires_grad_();
  optim::Adam adam({a}, {});
  auto step = [](int64_t n) { return scalar_tensor(static_cast<double>(n), DType::Int64); };
  EXPECT_EQ(test::error_of([&] { adam.load_state({{"0.exp_avg", ones({2})}, {"0.step", step(3)}}, 3); }),
            "Adam: the state of parameter 0 has no exp_avg_sq (a parameter's state is exp_avg, exp_avg_sq and step)");
  EXPECT_EQ(test::error_of([&] { adam.load_state({{"0.exp_avg", ones({2})}, {"0.exp_avg_sq", ones({2})}}, 3); }),
            "Adam: the state of parameter 0 has no step (a parameter's state is exp_avg, exp_avg_sq and step)");
  EXPECT_EQ(test::error_of([&] {
              adam.load_state({{"0.exp_avg", ones({2})}, {"0.exp_avg_sq", ones({2})}, {"0.step", step(0)}}, 3);
            }),
            "Adam: state '0.step' is 0; expected a step count >= 1");
  adam.load_state({{"0.exp_avg", ones({2})}, {"0.exp_avg_sq", ones({2})}, {"0.step", step(3)}}, 3);
  ASSERT_EQ(adam.state().size(), 3u);
  EXPECT_EQ(adam.state()[0].second.dtype(), DType::Float64);
  sum(a * a).backward();
  adam.step();  // float64 state: the step runs
  EXPECT_TRUE(std::isfinite(a.to_vector<double>()[0]));
}

}  // namespace
}  // namespace loom
