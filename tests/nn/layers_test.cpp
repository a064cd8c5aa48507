// Layers: names, shapes, initialisation, train/eval behaviour and values computed by hand.
#include "nn/nn_test_util.h"

#include <loom/autograd.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>

namespace loom {
namespace {

using test::values;
using test::expect_near;

double mean_of(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

double var_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / v.size();
}

TEST(Linear, NamesShapesAndValues) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::Linear fc(3, 2);
  auto names = test::names_and_shapes(fc.named_parameters());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], (std::pair<std::string, Shape>{"weight", {2, 3}}));
  EXPECT_EQ(names[1], (std::pair<std::string, Shape>{"bias", {2}}));
  EXPECT_EQ(fc.weight.dtype(), DType::Float64);
  EXPECT_TRUE(fc.weight.requires_grad());

  fc.load_state_dict({{"weight", from_vector<double>({1, 2, 3, -1, 0, 1}, {2, 3})},
                      {"bias", from_vector<double>({0.5, -0.5}, {2})}});
  auto y = fc.forward(from_vector<double>({1, 1, 1, 2, 0, -1}, {2, 3}));
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  // [1,1,1]·W = [6, 0]; [2,0,-1]·W = [-1, -3]; plus bias.
  expect_near(values(y), {6.5, -0.5, -0.5, -3.5}, 1e-12);

  nn::Linear nobias(3, 2, false);
  EXPECT_EQ(nobias.named_parameters().size(), 1u);
  EXPECT_FALSE(nobias.bias.defined());
  EXPECT_NE(test::error_of([&] { fc.forward(zeros({2, 4}, DType::Float64)); }).find("[2,4]"), std::string::npos);
}

TEST(Init, LinearAndConvFollowPyTorchBounds) {
  nn::manual_seed(1);
  nn::Linear fc(100, 300);
  double bound = 1 / std::sqrt(100.0);
  auto w = values(fc.weight), b = values(fc.bias);
  for (double x : w) ASSERT_LE(std::abs(x), bound);
  for (double x : b) ASSERT_LE(std::abs(x), bound);
  // U(-a, a) has variance a²/3.
  EXPECT_NEAR(var_of(w), bound * bound / 3, 0.05 * bound * bound / 3);
  EXPECT_NEAR(mean_of(w), 0, 0.01);

  nn::Conv2d conv(nn::Conv2dOptions(8, 64, 3).groups(2));
  EXPECT_EQ(conv.weight.shape(), (Shape{64, 4, 3, 3}));
  double cbound = 1 / std::sqrt(4.0 * 9);  // fan_in = in/groups · kh · kw
  auto cw = values(conv.weight);
  for (double x : cw) ASSERT_LE(std::abs(x), cbound);
  EXPECT_NEAR(var_of(cw), cbound * cbound / 3, 0.1 * cbound * cbound / 3);
  for (double x : values(conv.bias)) ASSERT_LE(std::abs(x), cbound);

  nn::Embedding emb(100, 50);
  auto e = values(emb.weight);
  EXPECT_NEAR(mean_of(e), 0, 0.05);
  EXPECT_NEAR(var_of(e), 1, 0.06);
}

TEST(Init, ManualSeedMakesModelsReproducible) {
  nn::manual_seed(7);
  nn::Linear a(4, 5);
  nn::manual_seed(7);
  nn::Linear b(4, 5);
  nn::manual_seed(8);
  nn::Linear c(4, 5);
  EXPECT_EQ(values(a.weight), values(b.weight));
  EXPECT_EQ(values(a.bias), values(b.bias));
  EXPECT_NE(values(a.weight), values(c.weight));
  EXPECT_NE(values(a.weight), values(a.bias));  // each parameter draws its own seed
}

// A program that never calls manual_seed draws what manual_seed(0) gives (init.h). Checked in
// a fresh process ("threadsafe" runs the test again from the start), where no test has drawn
// from the generator yet.
TEST(Init, TheDefaultStateIsManualSeedZero) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const uint64_t first = nn::next_seed();
        const uint64_t second = nn::next_seed();
        nn::manual_seed(0);
        const bool same = nn::next_seed() == first && nn::next_seed() == second;
        std::exit(same ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Init, KaimingNormalFanOut) {
  nn::manual_seed(3);
  auto w = zeros({64, 32, 3, 3});
  nn::init::kaiming_normal_(w, 0, nn::init::FanMode::FanOut, nn::init::Nonlinearity::ReLU);
  auto v = values(w);
  EXPECT_NEAR(std::sqrt(var_of(v)), std::sqrt(2.0 / (64 * 9)), 0.02 * std::sqrt(2.0 / (64 * 9)));
  EXPECT_NE(test::error_of([] { nn::init::kaiming_normal_(zeros({3})); }).find("[3]"), std::string::npos);
}

TEST(Conv2d, OptionsAndValidation) {
  auto o = nn::Conv2dOptions(3, 16, 3).stride(2).padding({1, 0}).bias(false);
  EXPECT_EQ(o.stride(), (std::array<int64_t, 2>{2, 2}));
  EXPECT_EQ(o.padding(), (std::array<int64_t, 2>{1, 0}));
  nn::Conv2d conv(o);
  EXPECT_EQ(conv.named_parameters().size(), 1u);
  auto y = conv.forward(zeros({2, 3, 9, 8}));
  EXPECT_EQ(y.shape(), (Shape{2, 16, 5, 3}));

  EXPECT_NE(test::error_of([] { nn::Conv2d(nn::Conv2dOptions(3, 16, 3).groups(2)); }).find("groups=2"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { nn::Conv2d(nn::Conv2dOptions(3, 16, 0)); }).find("kernel_size"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { nn::Conv2d(nn::Conv2dOptions(3, 16, 3).stride(0)); }).find("stride"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { conv.forward(zeros({2, 4, 9, 9})); }).find("[2,4,9,9]"), std::string::npos);
  EXPECT_NE(test::error_of([&] { conv.forward(zeros({3, 9, 9})); }).find("4-D"), std::string::npos);
}

TEST(Conv2d, MatchesHandComputedValues) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::Conv2d conv(nn::Conv2dOptions(1, 1, 2));
  conv.load_state_dict({{"weight", from_vector<double>({1, 0, 0, -1}, {1, 1, 2, 2})},
                        {"bias", from_vector<double>({10}, {1})}});
  // x = 0..8 as 3x3: out[i][j] = x[i][j] - x[i+1][j+1] + 10 = -4 + 10.
  auto y = conv.forward(arange(0, 9, 1, DType::Float64).reshape({1, 1, 3, 3}));
  expect_near(values(y), {6, 6, 6, 6}, 1e-12);
}

// x [2, 2, 1, 2]: channel 0 holds {1, 3, 5, 7}, channel 1 holds {2, 2, 4, 0}.
Tensor bn_input() { return from_vector<double>({1, 3, 2, 2, 5, 7, 4, 0}, {2, 2, 1, 2}); }

TEST(BatchNorm2d, NamesAndBuffers) {
  nn::BatchNorm2d bn(4);
  auto sd = test::names_and_shapes(bn.state_dict());
  std::vector<std::pair<std::string, Shape>> want{{"weight", {4}},       {"bias", {4}},
                                                  {"running_mean", {4}}, {"running_var", {4}},
                                                  {"num_batches_tracked", {}}};
  EXPECT_EQ(sd, want);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::Int64);
  EXPECT_EQ(bn.named_parameters().size(), 2u);
  expect_near(values(bn.weight), {1, 1, 1, 1}, 0);
  expect_near(values(bn.bias), {0, 0, 0, 0}, 0);
  expect_near(values(bn.running_var), {1, 1, 1, 1}, 0);
}

TEST(BatchNorm2d, TrainUsesBatchStatsAndUpdatesRunningStats) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::BatchNorm2d bn(2);
  auto y = bn.forward(bn_input());
  // Channel 0: mean 4, biased var 5; channel 1: mean 2, biased var 2.
  const double s0 = 1 / std::sqrt(5 + 1e-5), s1 = 1 / std::sqrt(2 + 1e-5);
  expect_near(values(y), {-3 * s0, -1 * s0, 0, 0, 1 * s0, 3 * s0, 2 * s1, -2 * s1}, 1e-12);
  // Running stats: momentum 0.1, unbiased variance 20/3 and 8/3.
  expect_near(values(bn.running_mean), {0.4, 0.2}, 1e-12);
  expect_near(values(bn.running_var), {0.9 + 0.1 * 20 / 3.0, 0.9 + 0.1 * 8 / 3.0}, 1e-12);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);

  bn.forward(bn_input());
  mark_step();
  expect_near(values(bn.running_mean), {0.9 * 0.4 + 0.4, 0.9 * 0.2 + 0.2}, 1e-12);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
}

TEST(BatchNorm2d, EvalUsesRunningStatsAndLeavesThemAlone) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::BatchNorm2d bn(2);
  bn.load_state_dict({{"weight", from_vector<double>({2, 1}, {2})},
                      {"bias", from_vector<double>({0, 1}, {2})},
                      {"running_mean", from_vector<double>({1, -1}, {2})},
                      {"running_var", from_vector<double>({4, 9}, {2})},
                      {"num_batches_tracked", scalar_tensor(5, DType::Int64)}});
  bn.eval();
  EXPECT_FALSE(bn.is_training());
  auto y = bn.forward(bn_input());
  auto a = [](double x) { return 2 * (x - 1) / std::sqrt(4 + 1e-5); };
  auto b = [](double x) { return (x + 1) / std::sqrt(9 + 1e-5) + 1; };
  expect_near(values(y), {a(1), a(3), b(2), b(2), a(5), a(7), b(4), b(0)}, 1e-12);
  expect_near(values(bn.running_mean), {1, -1}, 0);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 5);
}

TEST(BatchNorm2d, GradientFlowsToInputWeightAndBias) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::BatchNorm2d bn(2);
  auto x = bn_input();
  x.requires_grad_();
  (bn.forward(x) * from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 1, 2})).sum().backward();
  ASSERT_TRUE(bn.weight.grad().defined());
  ASSERT_TRUE(bn.bias.grad().defined());
  ASSERT_TRUE(x.grad().defined());
  // d/dbias = sum of the upstream gradient per channel.
  expect_near(values(bn.bias.grad()), {1 + 2 + 5 + 6, 3 + 4 + 7 + 8}, 1e-12);
  // Normalised values sum to zero per channel, so a constant upstream gradient gives a zero
  // input gradient; here the input gradient per channel must still sum to zero.
  auto gx = values(x.grad());
  EXPECT_NEAR(gx[0] + gx[1] + gx[4] + gx[5], 0, 1e-10);
  EXPECT_NEAR(gx[2] + gx[3] + gx[6] + gx[7], 0, 1e-10);
}

TEST(GradCheck, NormLayers) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::BatchNorm2d bn(2);
  bn.load_state_dict({{"weight", from_vector<double>({1.5, -0.5}, {2})},
                      {"bias", from_vector<double>({0.1, 0.2}, {2})},
                      {"running_mean", zeros({2}, DType::Float64)},
                      {"running_var", ones({2}, DType::Float64)},
                      {"num_batches_tracked", zeros({}, DType::Int64)}});
  auto r = from_vector(test::random_vector(2 * 2 * 2 * 3, 30), {2, 2, 2, 3});
  test::expect_gradient_matches([&](const Tensor& x) { return (bn.forward(x) * r).sum(); },
                                test::random_vector(2 * 2 * 2 * 3, 31), {2, 2, 2, 3});
  nn::LayerNorm ln({3});
  nn::RMSNorm rms(3);
  auto r2 = from_vector(test::random_vector(4 * 3, 32), {4, 3});
  test::expect_gradient_matches([&](const Tensor& x) { return (ln.forward(x) * r2).sum(); },
                                test::random_vector(4 * 3, 33), {4, 3});
  test::expect_gradient_matches([&](const Tensor& x) { return (rms.forward(x) * r2).sum(); },
                                test::random_vector(4 * 3, 34), {4, 3});
}

TEST(LayerNorm, NormalisesTrailingDims) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::LayerNorm ln({2, 2});
  EXPECT_EQ(test::names_and_shapes(ln.named_parameters()),
            (std::vector<std::pair<std::string, Shape>>{{"weight", {2, 2}}, {"bias", {2, 2}}}));
  auto y = ln.forward(from_vector<double>({1, 2, 3, 4, 0, 0, 0, 4}, {2, 2, 2}));
  // Row 0: mean 2.5, var 1.25. Row 1: mean 1, var 3.
  const double s0 = 1 / std::sqrt(1.25 + 1e-5), s1 = 1 / std::sqrt(3 + 1e-5);
  expect_near(values(y), {-1.5 * s0, -0.5 * s0, 0.5 * s0, 1.5 * s0, -s1, -s1, -s1, 3 * s1}, 1e-12);
  nn::LayerNorm plain({2}, 1e-5, false);
  EXPECT_EQ(plain.named_parameters().size(), 0u);
  EXPECT_NE(test::error_of([&] { ln.forward(zeros({2, 3}, DType::Float64)); }).find("[2,3]"), std::string::npos);
}

TEST(RMSNorm, LlamaFormula) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::RMSNorm norm(2, 1e-6);
  norm.load_state_dict({{"weight", from_vector<double>({1, 2}, {2})}});
  auto y = norm.forward(from_vector<double>({3, 4, 1, -1}, {2, 2}));
  const double r0 = 1 / std::sqrt(12.5 + 1e-6), r1 = 1 / std::sqrt(1 + 1e-6);
  expect_near(values(y), {3 * r0, 8 * r0, r1, -2 * r1}, 1e-12);
}

TEST(Embedding, LooksUpRows) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::Embedding emb(4, 2);
  emb.load_state_dict({{"weight", from_vector<double>({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2})}});
  auto y = emb.forward(from_vector<int64_t>({3, 0, 1, 3}, {2, 2}));
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  expect_near(values(y), {30, 31, 0, 1, 10, 11, 30, 31}, 0);
  EXPECT_NE(test::error_of([&] { emb.forward(zeros({2})); }).find("int64"), std::string::npos);
}

TEST(Dropout, ReproduciblePerSeedAndIdentityInEval) {
  auto x = ones({1000});
  nn::Dropout a(0.25, 11), b(0.25, 11);
  auto a1 = values(a.forward(x)), a2 = values(a.forward(x));
  auto b1 = values(b.forward(x));
  EXPECT_EQ(a1, b1);   // one seed, one mask
  EXPECT_NE(a1, a2);   // the seed advances per call
  int kept = 0;
  for (double v : a1) {
    ASSERT_TRUE(v == 0 || std::abs(v - 1 / 0.75) < 1e-6) << v;
    kept += v != 0;
  }
  EXPECT_NEAR(kept / 1000.0, 0.75, 0.05);

  a.eval();
  auto e = a.forward(x);
  EXPECT_EQ(e.impl(), x.impl());  // the identity: the same tensor
  nn::Dropout none(0.0);
  EXPECT_EQ(none.forward(x).impl(), x.impl());
  EXPECT_NE(test::error_of([] { nn::Dropout(1.5); }).find("1.5"), std::string::npos);
}

TEST(Dropout, NewSeedsDoNotRecompile) {
  test::fresh_engine();
  nn::Dropout d(0.5, 1);
  auto x = ones({64});
  mark_step();  // x becomes device data
  auto y1 = d.forward(x);
  mark_step();
  auto before = metrics::counter("UncachedCompile");
  auto y2 = d.forward(x);
  mark_step();
  EXPECT_EQ(metrics::counter("UncachedCompile"), before);
  EXPECT_NE(values(y1), values(y2));
}

TEST(Activations, Modules) {
  test::DefaultDTypeGuard f64(DType::Float64);
  auto x = from_vector<double>({-1, 0, 2}, {3});
  expect_near(values(nn::ReLU().forward(x)), {0, 0, 2}, 0);
  expect_near(values(nn::SiLU().forward(x)), {-1 / (1 + std::exp(1.0)), 0, 2 / (1 + std::exp(-2.0))}, 1e-12);
  expect_near(values(nn::GELU().forward(x)),
              {-0.5 * (1 + std::erf(-1 / std::sqrt(2.0))), 0, 2 * 0.5 * (1 + std::erf(2 / std::sqrt(2.0)))}, 1e-9);
}

TEST(Pooling, MaxAvgAdaptive) {
  test::DefaultDTypeGuard f64(DType::Float64);
  auto x = arange(0, 16, 1, DType::Float64).reshape({1, 1, 4, 4});
  expect_near(values(nn::MaxPool2d(2).forward(x)), {5, 7, 13, 15}, 0);
  expect_near(values(nn::AvgPool2d(2).forward(x)), {2.5, 4.5, 10.5, 12.5}, 1e-12);
  auto pooled = nn::AdaptiveAvgPool2d(1).forward(x);
  EXPECT_EQ(pooled.shape(), (Shape{1, 1, 1, 1}));
  expect_near(values(pooled), {7.5}, 1e-12);
  expect_near(values(nn::AdaptiveAvgPool2d(2).forward(x)), {2.5, 4.5, 10.5, 12.5}, 1e-12);
  // 5x5 -> 2x2: PyTorch's windows are rows/cols {0,1,2} and {2,3,4}.
  auto y = arange(0, 25, 1, DType::Float64).reshape({1, 1, 5, 5});
  auto a = nn::AdaptiveAvgPool2d(2).forward(y);
  EXPECT_EQ(a.shape(), (Shape{1, 1, 2, 2}));
  expect_near(values(a), {6, 8, 16, 18}, 1e-12);
  EXPECT_NE(test::error_of([] { nn::MaxPool2d(2, 2, 2); }).find("padding"), std::string::npos);
}

TEST(Flatten, KeepsBatchDim) {
  EXPECT_EQ(nn::Flatten().forward(zeros({2, 3, 4, 5})).shape(), (Shape{2, 60}));
  EXPECT_EQ(nn::Flatten(0).forward(zeros({2, 3})).shape(), (Shape{6}));
}

TEST(Sequential, NamesChildrenByPositionAndChains) {
  test::DefaultDTypeGuard f64(DType::Float64);
  nn::Sequential seq{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Linear>(4, 2)};
  auto names = test::names_and_shapes(seq.named_parameters());
  std::vector<std::pair<std::string, Shape>> want{
      {"0.weight", {4, 3}}, {"0.bias", {4}}, {"2.weight", {2, 4}}, {"2.bias", {2}}};
  EXPECT_EQ(names, want);
  EXPECT_EQ(seq.size(), 3u);
  auto x = from_vector<double>({1, -2, 3}, {1, 3});
  auto fc0 = std::dynamic_pointer_cast<nn::Linear>(seq[0]);
  auto fc2 = std::dynamic_pointer_cast<nn::Linear>(seq[2]);
  ASSERT_TRUE(fc0 && fc2);
  auto want_y = fc2->forward(relu(fc0->forward(x)));
  expect_near(values(seq.forward(x)), values(want_y), 1e-12);
  EXPECT_NE(test::error_of([&] { seq[3]; }).find("3"), std::string::npos);
}

TEST(Module, TheDefaultDtypeIsFloat32OrFloat64) {
  for (DType bad : {DType::BFloat16, DType::Int64}) {
    const auto message = test::error_of([&] { nn::set_default_dtype(bad); });
    EXPECT_NE(message.find("set_default_dtype: expected float32 or float64, got " + std::string(dtype_name(bad))),
              std::string::npos) << message;
  }
  EXPECT_EQ(nn::default_dtype(), DType::Float32);  // unchanged by the refusals
}

// A module or tensor reached twice (a block reused, tied weights) is one parameter: listed
// once by parameters() and counted once (an optimizer would update it twice a step), while
// state_dict() keeps every name, as in PyTorch.
TEST(Module, ASharedModuleIsOneSetOfParameters) {
  auto fc = std::make_shared<nn::Linear>(3, 4);
  nn::Sequential seq{fc, std::make_shared<nn::ReLU>(), fc};
  EXPECT_EQ(seq.parameters().size(), 2u);
  EXPECT_EQ(seq.num_parameters(), 16);
  std::vector<std::string> names;
  for (const auto& [n, t] : seq.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_EQ(seq.state_dict().size(), 4u);
  seq.load_state_dict(seq.state_dict());
  // named_modules() lists the shared block once too (a model's init loop over it would
  // otherwise draw its weights twice), each child before its own children.
  nn::Sequential outer{std::make_shared<nn::Sequential>(seq), fc};
  std::vector<std::string> modules;
  for (const auto& [n, m] : outer.named_modules()) modules.push_back(n);
  EXPECT_EQ(modules, (std::vector<std::string>{"0", "0.0", "0.1"}));
  struct Empty : nn::Module {
    Empty() { register_buffer("stats", Tensor()); }
  };
  EXPECT_EQ(test::error_of([] { Empty(); }), "register_buffer: 'stats' is an undefined tensor");
}

// A normalisation layer names itself and both dtypes when its input has another dtype than its
// parameters (the error came from an add inside it).
TEST(Module, ANormalisationLayerNamesAnInputOfAnotherDtype) {
  nn::BatchNorm2d bn(2);
  auto x = zeros({2, 2, 3, 3}, DType::Float64);
  for (bool training : {true, false}) {
    bn.train(training);
    EXPECT_EQ(test::error_of([&] { bn.forward(x); }),
              "BatchNorm2d: expected a float32 input (the layer's dtype), got float64; convert the input (x.to(...)) or "
              "the layer");
  }
  nn::RMSNorm rms(3);
  EXPECT_NE(test::error_of([&] { rms.forward(zeros({2, 3}, DType::Float64)); }).find("RMSNorm: expected a float32 input"),
            std::string::npos);
}

TEST(Module, TrainEvalReachesChildren) {
  nn::Sequential seq{std::make_shared<nn::BatchNorm2d>(2), std::make_shared<nn::Dropout>(0.5)};
  seq.eval();
  for (auto& m : seq) EXPECT_FALSE(m->is_training());
  seq.train();
  for (auto& m : seq) EXPECT_TRUE(m->is_training());
}

// A state dict from before BatchNorm counted its batches (PyTorch < 0.4.1) loads, the count
// starting from 0, as in PyTorch; any other missing key is an error.
TEST(LoadStateDict, ABatchNormWithoutItsBatchCountLoads) {
  nn::Sequential seq{std::make_shared<nn::BatchNorm2d>(2)};
  auto sd = seq.state_dict();
  std::erase_if(sd, [](const auto& kv) { return kv.first == "0.num_batches_tracked"; });
  ASSERT_EQ(sd.size(), 4u);
  for (auto& [n, t] : sd)
    if (n == "0.running_mean") t = from_vector<float>({3, 4}, {2});
  seq.load_state_dict(sd);
  auto bn = std::dynamic_pointer_cast<nn::BatchNorm2d>(seq[0]);
  EXPECT_EQ(values(bn->running_mean), (std::vector<double>{3, 4}));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 0);
  std::erase_if(sd, [](const auto& kv) { return kv.first == "0.running_var"; });
  EXPECT_NE(test::error_of([&] { seq.load_state_dict(sd); }).find("missing key '0.running_var'"), std::string::npos);
}

TEST(LoadStateDict, ErrorsNameTheKeyAndShapes) {
  nn::Sequential seq{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::BatchNorm2d>(4)};
  auto sd = seq.state_dict();
  auto before = values(std::dynamic_pointer_cast<nn::Linear>(seq[0])->weight);

  auto missing = sd;
  missing.erase(missing.begin() + 1);  // 0.bias
  auto msg = test::error_of([&] { seq.load_state_dict(missing); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0.bias"), std::string::npos) << msg;

  auto extra = sd;
  extra.emplace_back("2.weight", zeros({1}));
  msg = test::error_of([&] { seq.load_state_dict(extra); });
  EXPECT_NE(msg.find("unexpected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2.weight"), std::string::npos) << msg;

  auto wrong = sd;
  wrong[0].second = zeros({4, 5});
  msg = test::error_of([&] { seq.load_state_dict(wrong); });
  EXPECT_NE(msg.find("0.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4,3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4,5]"), std::string::npos) << msg;

  // A failed load changes nothing; a good one copies values in place.
  EXPECT_EQ(values(std::dynamic_pointer_cast<nn::Linear>(seq[0])->weight), before);
  // In place: the module's parameter is the same tensor (its impl, which optimizers hold)
  // before and after, and a handle taken before the load sees the new values.
  const Tensor held = std::dynamic_pointer_cast<nn::Linear>(seq[0])->weight;
  const auto* impl_before = held.impl().get();
  auto good = sd;
  good[0].second = ones({4, 3});
  seq.load_state_dict(good);
  EXPECT_EQ(std::dynamic_pointer_cast<nn::Linear>(seq[0])->weight.impl().get(), impl_before);
  EXPECT_EQ(seq.named_parameters()[0].second.impl().get(), impl_before);
  expect_near(values(held), std::vector<double>(12, 1), 0);
}

}  // namespace
}  // namespace loom
