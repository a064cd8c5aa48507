// Every differentiable op's gradient against central finite differences, in float64.
#include "test_util.h"

#include <loom/autograd.h>

#include <cmath>
#include <pthread.h>
#include <functional>
#include <random>

namespace loom {
namespace {

struct Input {
  Shape shape;
  double low = -2, high = 2;  // sampling range (keeps log/sqrt/pow in their domains)
};

struct Case {
  std::string name;
  std::vector<Input> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

std::vector<double> sample(const Input& in, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(in.low, in.high);
  std::vector<double> v(shape_numel(in.shape));
  for (auto& x : v) x = u(rng);
  return v;
}

// loss = sum(f(x) * r) for a fixed random r, so every output element's gradient matters.
double loss_value(const Case& c, const std::vector<std::vector<double>>& xs, const std::vector<double>& r,
                  const Shape& out_shape) {
  std::vector<Tensor> ts;
  for (std::size_t i = 0; i < xs.size(); ++i) ts.push_back(from_vector(xs[i], c.inputs[i].shape));
  return sum(c.fn(ts) * from_vector(r, out_shape)).item<double>();
}

class GradCheck : public ::testing::TestWithParam<Case> {};

TEST_P(GradCheck, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  std::vector<std::vector<double>> xs;
  for (const auto& in : c.inputs) xs.push_back(sample(in, rng));

  std::vector<Tensor> ts;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ts.push_back(from_vector(xs[i], c.inputs[i].shape));
    ts.back().requires_grad_();
  }
  auto y = c.fn(ts);
  ASSERT_TRUE(y.requires_grad());
  std::vector<double> r = sample({y.shape(), -1, 1}, rng);
  sum(y * from_vector(r, y.shape())).backward();
  mark_step();

  constexpr double eps = 1e-6;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ASSERT_TRUE(ts[i].grad().defined()) << "input " << i;
    auto analytic = ts[i].grad().to_vector<double>();
    for (std::size_t k = 0; k < xs[i].size(); ++k) {
      auto plus = xs, minus = xs;
      plus[i][k] += eps;
      minus[i][k] -= eps;
      double numeric = (loss_value(c, plus, r, y.shape()) - loss_value(c, minus, r, y.shape())) / (2 * eps);
      EXPECT_NEAR(analytic[k], numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << c.name << ": input " << i << " element " << k;
    }
  }
}

std::vector<Case> cases() {
  using V = const std::vector<Tensor>&;
  Input m{{3, 4}};
  Input pos{{3, 4}, 0.5, 2};
  return {
      {"neg", {m}, [](V x) { return -x[0]; }},
      {"exp", {m}, [](V x) { return exp(x[0]); }},
      {"log", {pos}, [](V x) { return log(x[0]); }},
      {"sqrt", {pos}, [](V x) { return sqrt(x[0]); }},
      {"rsqrt", {pos}, [](V x) { return rsqrt(x[0]); }},
      {"abs", {m}, [](V x) { return abs(x[0]); }},
      {"relu", {m}, [](V x) { return relu(x[0]); }},
      {"sigmoid", {m}, [](V x) { return sigmoid(x[0]); }},
      {"tanh", {m}, [](V x) { return tanh(x[0]); }},
      {"silu", {m}, [](V x) { return silu(x[0]); }},
      {"gelu", {m}, [](V x) { return gelu(x[0]); }},
      {"gelu_tanh", {m}, [](V x) { return gelu(x[0], true); }},
      {"sin", {m}, [](V x) { return sin(x[0]); }},
      {"cos", {m}, [](V x) { return cos(x[0]); }},
      {"add_broadcast", {m, {{4}}}, [](V x) { return x[0] + x[1]; }},
      {"sub_broadcast", {{{3, 1}}, m}, [](V x) { return x[0] - x[1]; }},
      {"mul", {m, m}, [](V x) { return x[0] * x[1]; }},
      {"mul_self", {m}, [](V x) { return x[0] * x[0]; }},
      {"div", {m, pos}, [](V x) { return x[0] / x[1]; }},
      {"pow", {pos, m}, [](V x) { return pow(x[0], x[1]); }},
      {"pow_scalar", {pos}, [](V x) { return pow(x[0], 2.5); }},
      {"maximum", {m, m}, [](V x) { return maximum(x[0], x[1]); }},
      {"minimum", {m, m}, [](V x) { return minimum(x[0], x[1]); }},
      {"where", {m, m}, [](V x) { return where(gt(x[0], x[1]), x[0] * 2.0, x[1]); }},
      {"sum_axes", {{{2, 3, 4}}}, [](V x) { return sum(x[0], {0, 2}); }},
      {"mean_keepdim", {{{2, 3, 4}}}, [](V x) { return mean(x[0], {1}, true); }},
      {"amax", {{{3, 5}}}, [](V x) { return amax(x[0], {1}); }},
      {"softmax", {{{3, 5}}}, [](V x) { return softmax(x[0], 1); }},
      {"log_softmax", {{{3, 5}}}, [](V x) { return log_softmax(x[0], -1); }},
      {"logsumexp", {{{3, 5}}}, [](V x) { return logsumexp(x[0], {0}); }},
      {"reshape", {m}, [](V x) { return reshape(x[0], {2, 6}) * 1.5; }},
      {"permute", {{{2, 3, 4}}}, [](V x) { return permute(x[0], {2, 0, 1}); }},
      {"slice_step", {{{7, 3}}}, [](V x) { return slice(x[0], 0, 1, 7, 3); }},
      {"slice_neg", {{{5, 6}}}, [](V x) { return slice(x[0], 1, -4, 5, 2); }},
      {"expand", {{{3, 1}}}, [](V x) { return expand(x[0], {2, 3, 4}); }},
      {"pad", {{{2, 3}}}, [](V x) { return pad(x[0], {1, 2, 0, 1}, 0.5); }},
      {"concat", {{{2, 3}}, {{1, 3}}}, [](V x) { return concat({x[0], x[1] * 2.0}, 0); }},
      {"matmul", {{{3, 4}}, {{4, 2}}}, [](V x) { return matmul(x[0], x[1]); }},
      {"matmul_batched", {{{2, 3, 4}}, {{4, 5}}}, [](V x) { return matmul(x[0], x[1]); }},
      {"matmul_vec", {{{4}}, {{4, 3}}}, [](V x) { return matmul(x[0], x[1]); }},
      {"conv2d", {{{2, 3, 6, 6}}, {{4, 3, 3, 3}}, {{4}}},
       [](V x) { return conv2d(x[0], x[1], x[2], {.stride = {1, 1}, .padding = {1, 1}}); }},
      {"conv2d_stride_dil", {{{1, 2, 7, 7}}, {{3, 2, 2, 3}}},
       [](V x) { return conv2d(x[0], x[1], {}, {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}}); }},
      {"conv2d_groups", {{{1, 4, 5, 5}}, {{6, 2, 3, 3}}},
       [](V x) { return conv2d(x[0], x[1], {}, {.stride = {2, 2}, .padding = {1, 1}, .groups = 2}); }},
      {"max_pool2d", {{{1, 2, 6, 6}}},
       [](V x) { return max_pool2d(x[0], {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}); }},
      {"avg_pool2d", {{{1, 2, 5, 5}}},
       [](V x) { return avg_pool2d(x[0], {.kernel = {2, 2}, .stride = {2, 2}, .padding = {1, 1}}); }},
      {"avg_pool2d_exclude_pad", {{{1, 1, 5, 5}}},
       [](V x) { return avg_pool2d(x[0], {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = false}); }},
      {"gather", {{{3, 4}}},
       [](V x) { return gather(x[0], 1, from_vector<int64_t>({0, 3, 3, 1, 2, 0}, {3, 2})); }},
      {"gather_one_per_row", {{{3, 4}}},  // the elementwise rule (grad_rules.cpp)
       [](V x) { return gather(x[0], 1, from_vector<int64_t>({3, 0, 2}, {3, 1})); }},
      {"gather_one_per_column", {{{3, 4}}},
       [](V x) { return gather(x[0], 0, from_vector<int64_t>({2, 0, 1, 2}, {1, 4})); }},
      {"index_select", {{{4, 3}}},
       [](V x) { return index_select(x[0], 0, from_vector<int64_t>({2, 0, 2}, {3})); }},
      {"embedding", {{{5, 3}}},
       [](V x) { return embedding(x[0], from_vector<int64_t>({4, 1, 1, 0}, {2, 2})); }},
      {"scatter_add", {{{3, 4}}, {{3, 2}}},
       [](V x) { return scatter_add(x[0], 1, from_vector<int64_t>({0, 3, 3, 3, 2, 0}, {3, 2}), x[1]); }},
      {"chain", {{{2, 4}}, {{4, 4}}},
       [](V x) { auto h = tanh(matmul(x[0], x[1])); return log_softmax(h * h + h, 1); }},
  };
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Finite differences cannot see through float32 rounding, so casts are checked exactly.
TEST(Autograd, CastPassesTheGradientBackInTheInputsDtype) {
  auto x = from_vector<double>({1, -2, 3}, {3}).requires_grad_();
  sum(x.to(DType::Float32) * 2.0).backward();
  EXPECT_EQ(x.grad().dtype(), DType::Float64);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2, 2}));
}

TEST(Autograd, GradientsAccumulateAndZeroGradResets) {
  auto w = from_vector<double>({1, 2}, {2}).requires_grad_();
  sum(w * w).backward();
  sum(w * 3.0).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{5, 7}));
  w.set_grad({});
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, NoGradAndDetachRecordNothing) {
  auto w = from_vector<double>({1, 2}, {2}).requires_grad_();
  {
    NoGradGuard no_grad;
    EXPECT_FALSE((w * 2.0).requires_grad());
  }
  EXPECT_FALSE(w.detach().requires_grad());
  EXPECT_TRUE((w * 2.0).requires_grad());
  auto msg = test::error_of([&] { sum(w.detach()).backward(); });
  EXPECT_NE(msg.find("backward: expected a tensor that requires grad"), std::string::npos) << msg;
}

TEST(Autograd, ASecondBackwardThroughAFreedGraphIsAnError) {
  auto w = from_vector<double>({1, 2}, {2}).requires_grad_();
  auto loss = sum(w * w);
  loss.backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{2, 4}));
  auto msg = test::error_of([&] { loss.backward(); });
  EXPECT_NE(msg.find("already run by an earlier backward"), std::string::npos) << msg;
  sum(w * w).backward();  // a new forward has its own tape
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{4, 8}));
}

// pow's gradients where PyTorch defines them by convention: none to the base where the
// exponent is 0, none to the exponent where the base is 0 and the exponent >= 0 (values from
// torch 1.13: a = [0, 0, -2, 3], b = [0, 2, 0, 0.5]).
TEST(Autograd, PowAtAZeroBaseOrExponent) {
  auto a = from_vector<double>({0, 0, -2, 3}, {4}).requires_grad_();
  auto b = from_vector<double>({0, 2, 0, 0.5}, {4}).requires_grad_();
  sum(pow(a, b)).backward();
  const auto ga = a.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
  EXPECT_EQ(ga[0], 0);
  EXPECT_EQ(ga[1], 0);  // 2·0^1
  EXPECT_EQ(ga[2], 0);
  EXPECT_NEAR(ga[3], 0.5 / std::sqrt(3.0), 1e-15);
  EXPECT_EQ(gb[0], 0);
  EXPECT_EQ(gb[1], 0);
  EXPECT_TRUE(std::isnan(gb[2]));  // log of a negative base, as in PyTorch
  EXPECT_NEAR(gb[3], std::sqrt(3.0) * std::log(3.0), 1e-15);
}

// loom::grad() checks its inputs before it runs (and frees) the tape: a call with a wrong
// input can be made again with the right one.
TEST(Autograd, GradChecksItsInputsBeforeRunningTheTape) {
  auto x = from_vector<double>({1, 2}, {2}).requires_grad_();
  auto y = sum(x * x);
  EXPECT_NE(test::error_of([&] { grad(y, {x * 2.0}); }).find("expected leaf tensors"), std::string::npos);
  EXPECT_EQ(grad(y, {x})[0].to_vector<double>(), (std::vector<double>{2, 4}));
}

// A tape tens of thousands of ops deep is freed without recursing once per op (on a thread
// with a 512 KiB stack, which that recursion overflows).
TEST(Autograd, ADeepTapeIsFreedWithoutDeepRecursion) {
  static bool done = false;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 512 * 1024);
  pthread_t thread;
  auto body = [](void*) -> void* {
    auto x = from_vector<float>({1, 2}, {2}).requires_grad_();
    Tensor y = x;
    for (int i = 0; i < 50000; ++i) y = -y;
    y = Tensor();  // the tape (and the graph) go here
    done = true;
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, body, nullptr), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_TRUE(done);
}

TEST(Autograd, BackwardJoinsTheStepGraph) {
  test::fresh_engine();
  auto w = from_vector<double>({1, 2, 3}, {3}).requires_grad_();
  auto x = from_vector<double>({4, 5, 6}, {3});
  // The same four steps of gradient descent on the host: d/dw sum(tanh(w*x)) = x (1 - tanh²).
  std::vector<double> hw{1, 2, 3}, hx{4, 5, 6};
  for (int step = 0; step < 4; ++step)
    for (int i = 0; i < 3; ++i) {
      const double t = std::tanh(hw[i] * hx[i]);
      hw[i] -= 0.1 * hx[i] * (1 - t * t);
    }
  for (int step = 0; step < 4; ++step) {
    auto loss = sum(tanh(w * x));
    loss.backward();
    {
      NoGradGuard no_grad;
      w.assign(w - w.grad() * 0.1);
      w.set_grad({});
    }
    mark_step();
  }
  // Forward, backward and update are one graph, compiled once.
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), 3);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_FALSE(w.is_pending());
  const auto got = w.to_vector<double>();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], hw[i], 1e-12) << "w[" << i << "] after four steps";
}

TEST(Autograd, AssigningHistoryToALeafThatRequiresGradIsAnError) {
  auto w = from_vector<double>({1, 2}, {2}).requires_grad_();
  auto msg = test::error_of([&] { w.assign(w * 2.0); });
  EXPECT_NE(msg.find("assign: a leaf tensor that requires grad"), std::string::npos) << msg;
}

}  // namespace
}  // namespace loom
