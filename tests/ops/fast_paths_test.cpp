// The CPU backend's fast paths against PyTorch: convolutions at ResNet shapes (Winograd, the
// direct kernels, oneDNN and the strided weight gradient; forward and both gradients), elementwise ops over
// several tasks, chunked reductions, a GEMM split in tasks, and non-finite inputs.
//
// The values are in ops/fixtures/fast_paths_conv.txt.gz and fast_paths.txt.gz, written by
// tests/reference/make_fast_path_fixtures.py, whose docstring says which threshold each case
// crosses. Each case states `reduce`, the number of products or terms summed into one output
// element; the tolerance comes from it:
//   |got - want| <= c * eps * sqrt(reduce) * (|want| + rms(want))
// with eps the run's machine epsilon and c = kUlps: rounding errors of a sum of `reduce` terms
// grow like sqrt(reduce) ulps of its magnitude, and c leaves room for the transforms of
// Winograd and Eigen's vectorised transcendental functions. A kernel that is 0.1% wrong fails
// every case here (c * eps * sqrt(reduce) stays below 1e-3 / 2 up to reduce = 70001).
// The convolutions run in float32 (their fast paths are float32 only); the other cases in both
// float types (the outputs are stored to 9 digits, so float64 gets a floor of 1e-8).
#include "ops/op_fixtures.h"
#include "test_util.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/conv/conv_direct.h"

#include <loom/autograd.h>
#include <loom/lazy.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace loom {
namespace {

constexpr double kUlps = 16;

const test::Fixtures& conv_fixtures() {
  static const test::Fixtures f =
      test::read_fixtures(LOOM_TEST_DATA_DIR "/ops/fixtures/fast_paths_conv.txt.gz");
  return f;
}

const test::Fixtures& other_fixtures() {
  static const test::Fixtures f =
      test::read_fixtures(LOOM_TEST_DATA_DIR "/ops/fixtures/fast_paths.txt.gz");
  return f;
}

using V = const std::vector<Tensor>&;

Tensor grad_of(const Tensor& x, const std::function<Tensor(const Tensor&)>& f, const Tensor& g) {
  Tensor leaf = x.detach().requires_grad_();
  f(leaf).backward(g);
  return leaf.grad();
}

Conv2dParams conv_params(int64_t stride) { return {.stride = {stride, stride}, .padding = {1, 1}}; }

const std::map<std::string, std::function<Tensor(V)>>& op_table() {
  static const std::map<std::string, std::function<Tensor(V)>> t = {
      {"conv2d_s1", [](V x) { return conv2d(x[0], x[1], {}, conv_params(1)); }},
      {"conv2d_s2", [](V x) { return conv2d(x[0], x[1], {}, conv_params(2)); }},
      {"conv2d_grad_input_s1", [](V x) {
         return grad_of(x[0], [&](const Tensor& in) { return conv2d(in, x[1], {}, conv_params(1)); },
                        x[2]); }},
      {"conv2d_grad_input_s2", [](V x) {
         return grad_of(x[0], [&](const Tensor& in) { return conv2d(in, x[1], {}, conv_params(2)); },
                        x[2]); }},
      {"conv2d_grad_weight_s1", [](V x) {
         return grad_of(x[1], [&](const Tensor& w) { return conv2d(x[0], w, {}, conv_params(1)); },
                        x[2]); }},
      {"conv2d_grad_weight_s2", [](V x) {
         return grad_of(x[1], [&](const Tensor& w) { return conv2d(x[0], w, {}, conv_params(2)); },
                        x[2]); }},
      {"fused_chain", [](V x) { return x[0] * sigmoid(x[1]) + tanh(x[0]); }},
      {"div", [](V x) { return x[0] / x[1]; }},
      {"relu", [](V x) { return relu(x[0]); }},
      {"abs", [](V x) { return abs(x[0]); }},
      {"exp", [](V x) { return exp(x[0]); }},
      {"sigmoid", [](V x) { return sigmoid(x[0]); }},
      {"tanh", [](V x) { return tanh(x[0]); }},
      {"sqrt", [](V x) { return sqrt(x[0]); }},
      {"rsqrt", [](V x) { return rsqrt(x[0]); }},
      {"log", [](V x) { return log(x[0]); }},
      {"maximum", [](V x) { return maximum(x[0], x[1]); }},
      {"minimum", [](V x) { return minimum(x[0], x[1]); }},
      {"lt", [](V x) { return lt(x[0], x[1]); }},
      {"eq", [](V x) { return eq(x[0], x[1]); }},
      {"sum_all", [](V x) { return sum(x[0]); }},
      {"sum_0", [](V x) { return sum(x[0], {0}); }},
      {"sum_1", [](V x) { return sum(x[0], {1}); }},
      {"mean_023", [](V x) { return mean(x[0], {0, 2, 3}); }},
      {"amax_1", [](V x) { return amax(x[0], {1}); }},
      {"argmax_1", [](V x) { return argmax(x[0], 1); }},
      {"logsumexp_1", [](V x) { return logsumexp(x[0], {1}); }},
      {"softmax_1", [](V x) { return softmax(x[0], 1); }},
      {"matmul", [](V x) { return matmul(x[0], x[1]); }},
  };
  return t;
}

struct FastRun {
  bool conv;          // from fast_paths_conv.txt.gz
  std::size_t index;  // into its file's cases
  DType dtype;
  const test::Case& c() const { return (conv ? conv_fixtures() : other_fixtures()).cases.at(index); }
};

void PrintTo(const FastRun& r, std::ostream* os) { *os << r.c().name << " " << dtype_name(r.dtype); }

std::vector<FastRun> all_runs() {
  std::vector<FastRun> runs;
  for (std::size_t i = 0; i < conv_fixtures().cases.size(); ++i)
    runs.push_back({true, i, DType::Float32});
  for (std::size_t i = 0; i < other_fixtures().cases.size(); ++i)
    for (DType d : {DType::Float32, DType::Float64}) runs.push_back({false, i, d});
  return runs;
}

TEST(FastPathFixtures, LoadedAndCoverTheTable) {
  for (const test::Fixtures* f : {&conv_fixtures(), &other_fixtures()}) {
    ASSERT_TRUE(f->error.empty()) << f->error;
    ASSERT_FALSE(f->cases.empty());
  }
  std::set<std::string> used;
  for (const test::Fixtures* f : {&conv_fixtures(), &other_fixtures()})
    for (const auto& c : f->cases) {
      EXPECT_TRUE(op_table().count(c.op)) << c.name << ": no entry for op " << c.op;
      EXPECT_TRUE(c.params.count("reduce")) << c.name << " states no reduction length";
      used.insert(c.op);
    }
  for (const auto& [op, fn] : op_table()) EXPECT_TRUE(used.count(op)) << op << " has no case";
}

// The conv cases reach the algorithm their names say (conv_algorithm.h's choice, in every
// pass): loom's Winograd and direct kernels for the stride-1 ones, and for the strided one
// oneDNN in the forward and input gradient and loom's strided kernel in the weight gradient.
// The direct kernels need AVX-512, and Winograd is chosen only with it; without it those cases
// run im2col + GEMM. (Forced with LOOM_CONV, these cases run on the forced algorithm instead.)
TEST(FastPathFixtures, ConvCasesReachTheirAlgorithm) {
  if (std::getenv("LOOM_CONV")) GTEST_SKIP() << "LOOM_CONV forces the choice";
  using runtime::ConvAlgorithm;
  using runtime::ConvPass;
  auto geometry = [](int64_t n, int64_t c, int64_t o, int64_t hw, int64_t stride) {
    const int64_t out = (hw - 1) / stride + 1;
    return runtime::ConvGeometry{n, c, hw, hw, o, 3, 3, out, out, stride, stride, 1, 1, 1, 1, 1};
  };
  const ConvAlgorithm direct = runtime::direct_applies(geometry(2, 32, 32, 8, 1))
                                   ? ConvAlgorithm::kDirect
                                   : ConvAlgorithm::kGemm;
#ifdef __AVX512F__
  EXPECT_EQ(direct, ConvAlgorithm::kDirect) << "an AVX-512 build runs the direct kernels";
  const ConvAlgorithm winograd = ConvAlgorithm::kWinograd;
#else
  // Winograd's plain loops lose to im2col + GEMM there (conv_algorithm.cpp's winograd_wins).
  const ConvAlgorithm winograd = ConvAlgorithm::kGemm;
#endif
  const DType f32 = DType::Float32;
  for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput, ConvPass::kGradWeight}) {
    EXPECT_EQ(runtime::conv_algorithm(geometry(2, 64, 64, 8, 1), pass, f32), winograd);
    EXPECT_EQ(runtime::conv_algorithm(geometry(2, 32, 32, 8, 1), pass, f32), direct);
  }
  const auto strided = geometry(2, 16, 32, 16, 2);
  EXPECT_EQ(runtime::conv_algorithm(strided, ConvPass::kForward, f32), ConvAlgorithm::kOneDnn);
  EXPECT_EQ(runtime::conv_algorithm(strided, ConvPass::kGradInput, f32), ConvAlgorithm::kOneDnn);
  EXPECT_EQ(runtime::conv_algorithm(strided, ConvPass::kGradWeight, f32), ConvAlgorithm::kGemm)
      << "loom's strided kernel runs inside the im2col + GEMM path's entry";
}

class FastPath : public ::testing::TestWithParam<FastRun> {};

TEST_P(FastPath, MatchesPyTorch) {
  const FastRun r = GetParam();
  const test::Case& c = r.c();
  SCOPED_TRACE("case " + c.name + " (" + dtype_name(r.dtype) + ")");
  std::vector<Tensor> in;
  for (const auto& spec : c.inputs) in.push_back(test::make_tensor(spec, r.dtype));
  const Tensor y = op_table().at(c.op)(in);
  const HostTensor got = y.to_host();
  const DType want_dtype = test::resolve_dtype(c.output.dtype, r.dtype);
  ASSERT_EQ(got.dtype, want_dtype);
  ASSERT_EQ(got.shape, c.output.shape);

  const double reduce = test::parse_number(c.params.at("reduce"), true);
  const double eps = r.dtype == DType::Float32 ? std::numeric_limits<float>::epsilon()
                                               : std::numeric_limits<double>::epsilon();
  double tol = kUlps * eps * std::sqrt(reduce);
  if (r.dtype == DType::Float64) tol += 1e-8;  // the fixture's 9 significant digits
  if (!is_floating(want_dtype)) tol = 0;
  double squares = 0;
  int64_t finite = 0;
  for (double w : c.output.values)
    if (std::isfinite(w)) squares += w * w, ++finite;
  const double rms = finite ? std::sqrt(squares / static_cast<double>(finite)) : 0;

  int bad = 0;
  double worst = 0;  // the largest |got - want| / (|want| + rms), in units of tol
  std::ostringstream report;
  report.precision(9);
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.at(i), w = c.output.values[static_cast<std::size_t>(i)];
    bool ok = false;
    if (std::isnan(w)) ok = std::isnan(g);
    else if (std::isinf(w)) ok = g == w;
    else {
      const double err = std::fabs(g - w) / (std::fabs(w) + rms);
      if (tol > 0) worst = std::max(worst, err / tol);
      ok = std::fabs(g - w) <= tol * (std::fabs(w) + rms);
    }
    if (!ok && ++bad <= 8) report << "\n  [" << i << "] got " << g << ", want " << w;
  }
  // LOOM_TEST_SHOW_ERRORS=1 prints the headroom: the worst error in units of the tolerance.
  if (std::getenv("LOOM_TEST_SHOW_ERRORS")) std::printf("%-45s %-8s %.4f\n", c.name.c_str(), dtype_name(r.dtype), worst);
  EXPECT_EQ(bad, 0) << bad << " of " << got.numel() << " elements outside " << tol
                    << " x (|want| + " << rms << ") (reduce " << reduce << "; worst "
                    << worst << " tolerances)" << report.str();
}

INSTANTIATE_TEST_SUITE_P(Fixture, FastPath, ::testing::ValuesIn(all_runs()),
                         [](const ::testing::TestParamInfo<FastRun>& info) {
                           return info.param.c().name + "_" + dtype_name(info.param.dtype);
                         });

}  // namespace
}  // namespace loom
