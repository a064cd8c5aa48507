// Acceptance 5: lazy, eager and compile(fn) give identical values; eager compiles once per
// distinct op signature.
#include "test_util.h"

#include <cmath>

namespace loom {
namespace {

using test::fresh_engine;

struct Inputs {
  Tensor image, weight, bias, tokens, table;
};

Inputs make_inputs(DType dtype) {
  Inputs in;
  in.image = uniform({2, 3, 8, 8}, -1, 1, 11, dtype);
  in.weight = normal({4, 3, 3, 3}, 0, 0.3, 12, dtype);
  in.bias = uniform({4}, -0.1, 0.1, 13, dtype);
  in.tokens = from_vector<int64_t>({0, 3, 5, 1, 2, 2}, {2, 3});
  in.table = randn({6, 5}, 14, dtype);
  mark_step();
  return in;
}

// A little of everything a ResNet or a decoder does.
Tensor forward(const Inputs& in) {
  auto h = relu(conv2d(in.image, in.weight, in.bias, {.stride = {1, 1}, .padding = {1, 1}}));
  h = max_pool2d(h, {.kernel = {2, 2}});
  auto pooled = mean(h, {2, 3});                           // [2,4]
  auto emb = embedding(in.table, in.tokens);               // [2,3,5]
  auto att = softmax(matmul(emb, transpose(emb, 1, 2)) * 0.3, -1);
  auto ctx = sum(matmul(att, emb), {1});                   // [2,5]
  auto feats = concat({pooled, silu(ctx)}, 1);             // [2,9]
  return log_softmax(feats, 1) + gelu(feats);
}

std::vector<double> run_lazy(const Inputs& in) {
  auto y = forward(in);
  mark_step();
  return y.to(DType::Float64).to_vector<double>();
}

std::vector<double> run_eager(const Inputs& in) {
  EagerModeGuard eager(true);
  auto y = forward(in);
  EXPECT_FALSE(y.is_pending());
  return y.to(DType::Float64).to_vector<double>();
}

std::vector<double> run_compiled(const Inputs& in) {
  Tensor y;
  auto step = compile([&] { y = forward(in); });
  {
    EagerModeGuard eager(true);  // compile turns eager off inside
    step();
  }
  EXPECT_FALSE(y.is_pending());
  return y.to(DType::Float64).to_vector<double>();
}

class Modes : public ::testing::TestWithParam<DType> {};

TEST_P(Modes, LazyEagerAndCompiledAgreeExactly) {
  fresh_engine();
  auto in = make_inputs(GetParam());
  auto lazy = run_lazy(in);
  auto eager = run_eager(in);
  auto compiled = run_compiled(in);
  ASSERT_EQ(lazy.size(), 18u);
  EXPECT_EQ(lazy, eager);
  EXPECT_EQ(lazy, compiled);
  for (double v : lazy) EXPECT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Modes, ::testing::Values(DType::Float32, DType::Float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Eager, CompilesOncePerDistinctOpSignature) {
  fresh_engine();
  auto a = from_vector<float>({1, 2, 3}, {3});
  auto b = from_vector<float>({4, 5, 6}, {3});
  auto c = from_vector<float>({1, 2, 3, 4}, {4});
  EagerModeGuard eager(true);
  auto s1 = a + b;
  auto s2 = b + a;   // same signature: add of two float32[3] inputs
  auto p = a * b;    // new op
  auto s3 = c + c;   // new shape, and one input read twice
  EXPECT_EQ(metrics::counter("EagerOpExecute"), 4);
  EXPECT_EQ(metrics::counter("EagerOpCompile"), 3);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 0);
  EXPECT_EQ(s2.to_vector<float>(), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{4, 10, 18}));
  EXPECT_EQ(s3.to_vector<float>(), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(s1.to_vector<float>(), s2.to_vector<float>());
}

TEST(Eager, RepeatingAComputationCompilesNothingNew) {
  fresh_engine();
  auto in = make_inputs(DType::Float32);
  run_eager(in);
  auto compiles = metrics::counter("EagerOpCompile");
  auto executes = metrics::counter("EagerOpExecute");
  EXPECT_GT(compiles, 10);
  run_eager(in);
  EXPECT_EQ(metrics::counter("EagerOpCompile"), compiles);
  EXPECT_EQ(metrics::counter("EagerOpExecute"), 2 * executes);
}

TEST(Compile, TracesWithEagerOffAndMarksTheStepAtExit) {
  fresh_engine();
  auto x = from_vector<double>({1, 2}, {2});
  Tensor inside;
  auto fn = compile([&](double s) {
    EXPECT_FALSE(is_eager_mode());
    inside = x * s;
    EXPECT_TRUE(inside.is_pending());
    return 7;
  });
  EagerModeGuard eager(true);
  EXPECT_EQ(fn(3.0), 7);
  EXPECT_TRUE(is_eager_mode());
  EXPECT_FALSE(inside.is_pending());
  EXPECT_EQ(metrics::counter("MarkStep"), 1);
  fn(4.0);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), 1);
  EXPECT_EQ(inside.to_vector<double>(), (std::vector<double>{4, 8}));
}

}  // namespace
}  // namespace loom
