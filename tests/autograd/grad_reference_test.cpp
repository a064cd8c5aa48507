// Gradients against PyTorch's (torch.autograd.grad), ties included.
//
// autograd/fixtures/grad_reference.txt (tests/reference/make_grad_fixtures.py) holds, per
// case, a function's inputs, the gradient g of its output and PyTorch's gradient of the input
// `wrt`. Finite differences (gradcheck_test.cpp, the op harness) cannot check a rule where
// the function has a kink or a tie; PyTorch's choice there is loom's documented rule, so the
// tie cases (maximum_ties, minimum_ties, amax_ties, max_pool2d_ties, relu_at_zero,
// abs_at_zero) assert it. Every case runs in float64 (rel 1e-10) and float32 (rel 1e-5).
#include "ops/op_fixtures.h"
#include "test_util.h"

#include "ir/op.h"
#include "lazy/ops_util.h"  // lazy::apply: erf has no public function

#include <loom/autograd.h>
#include <loom/lazy.h>
#include <loom/nn/functional.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace loom {
namespace {

using V = const std::vector<Tensor>&;
using Fn = std::function<Tensor(V)>;

const test::Fixtures& fixtures() {
  static const test::Fixtures f =
      test::read_fixtures(LOOM_TEST_DATA_DIR "/autograd/fixtures/grad_reference.txt");
  return f;
}

Fn unary(Tensor (*f)(const Tensor&)) { return [f](V x) { return f(x[0]); }; }
Fn binary(Tensor (*f)(const Tensor&, const Tensor&)) { return [f](V x) { return f(x[0], x[1]); }; }

const std::map<std::string, Fn>& table() {
  static const std::map<std::string, Fn> t = {
      {"exp", unary(exp)}, {"log", unary(log)}, {"sqrt", unary(sqrt)}, {"rsqrt", unary(rsqrt)},
      {"sigmoid", unary(sigmoid)}, {"tanh", unary(tanh)}, {"silu", unary(silu)},
      {"gelu", [](V x) { return gelu(x[0]); }},
      {"gelu_tanh", [](V x) { return gelu(x[0], true); }},
      {"erf", [](V x) { return lazy::apply(ir::Op::Erf, {x[0]}); }},
      {"sin", unary(sin)}, {"cos", unary(cos)}, {"neg", unary(neg)}, {"relu", unary(relu)},
      {"abs", unary(abs)},
      {"add", binary(add)}, {"sub", binary(sub)}, {"mul", binary(mul)}, {"div", binary(div)},
      {"pow", [](V x) { return pow(x[0], x[1]); }},
      {"maximum", binary(maximum)}, {"minimum", binary(minimum)},
      {"where", [](V x) { return where(x[0], x[1], x[2]); }},
      {"sum_02", [](V x) { return sum(x[0], {0, 2}); }},
      {"mean_1_keepdim", [](V x) { return mean(x[0], {1}, true); }},
      {"amax_1", [](V x) { return amax(x[0], {1}); }},
      {"amax_all", [](V x) { return amax(x[0], {}); }},
      {"softmax_1", [](V x) { return softmax(x[0], 1); }},
      {"log_softmax_1", [](V x) { return log_softmax(x[0], 1); }},
      {"logsumexp_1", [](V x) { return logsumexp(x[0], {1}); }},
      {"permute_201", [](V x) { return permute(x[0], {2, 0, 1}); }},
      {"slice_0_1_6_2", [](V x) { return slice(x[0], 0, 1, 6, 2); }},
      {"expand_234", [](V x) { return expand(x[0], {2, 3, 4}); }},
      {"pad_1201", [](V x) { return pad(x[0], {1, 2, 0, 1}, 0.5); }},
      {"concat_0", [](V x) { return concat({x[0], x[1]}, 0); }},
      {"cast_f32", [](V x) { return x[0].to(DType::Float32); }},
      {"matmul", binary(matmul)},
      {"conv2d_s2_p1_g2", [](V x) {
         return conv2d(x[0], x[1], {}, {.stride = {2, 2}, .padding = {1, 1}, .groups = 2}); }},
      {"conv2d_d2_p2", [](V x) {
         return conv2d(x[0], x[1], {}, {.padding = {2, 2}, .dilation = {2, 2}}); }},
      {"avg_pool2d_k3s2p1", [](V x) {
         return avg_pool2d(x[0], {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}); }},
      {"max_pool2d_k3s2p1", [](V x) {
         return max_pool2d(x[0], {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}); }},
      {"max_pool2d_k2s2", [](V x) { return max_pool2d(x[0], {.kernel = {2, 2}}); }},
      {"gather_1", [](V x) { return gather(x[0], 1, x[1]); }},
      {"index_select_0", [](V x) { return index_select(x[0], 0, x[1]); }},
      {"embedding", [](V x) { return embedding(x[0], x[1]); }},
      {"scatter_add_1", [](V x) { return scatter_add(x[0], 1, x[1], x[2]); }},
      {"cross_entropy", [](V x) { return nn::functional::cross_entropy(x[0], x[1]); }},
  };
  return t;
}

TEST(GradReference, FixturesLoadAndCoverTheTable) {
  const auto& f = fixtures();
  ASSERT_TRUE(f.error.empty()) << f.error;
  std::set<std::string> used;
  for (const auto& c : f.cases) {
    EXPECT_TRUE(table().count(c.op)) << c.name << ": no function " << c.op;
    used.insert(c.op);
  }
  for (const auto& [op, fn] : table()) EXPECT_TRUE(used.count(op)) << op << " has no case";
  // The ties this file exists for.
  for (const char* tie : {"maximum_ties_wrt0", "maximum_ties_wrt1", "minimum_ties_wrt0",
                          "amax_ties", "amax_all_ties", "max_pool2d_ties", "relu_at_zero",
                          "abs_at_zero"}) {
    bool found = false;
    for (const auto& c : f.cases) found |= c.name == tie;
    EXPECT_TRUE(found) << "no case " << tie;
  }
}

struct GradRun {
  std::size_t index;
  DType dtype;
};

void PrintTo(const GradRun& r, std::ostream* os) {
  *os << fixtures().cases.at(r.index).name << " " << dtype_name(r.dtype);
}

std::vector<GradRun> all_runs() {
  std::vector<GradRun> runs;
  for (std::size_t i = 0; i < fixtures().cases.size(); ++i)
    for (DType d : {DType::Float64, DType::Float32}) runs.push_back({i, d});
  return runs;
}

class GradReference : public ::testing::TestWithParam<GradRun> {};

TEST_P(GradReference, MatchesPyTorch) {
  const GradRun r = GetParam();
  const test::Case& c = fixtures().cases.at(r.index);
  const auto wrt = static_cast<std::size_t>(test::parse_number(c.params.at("wrt"), true));
  ASSERT_GE(c.inputs.size(), 2u);
  ASSERT_LT(wrt, c.inputs.size() - 1);
  std::vector<Tensor> in;
  for (std::size_t k = 0; k + 1 < c.inputs.size(); ++k) {
    in.push_back(test::make_tensor(c.inputs[k], r.dtype));
    if (k == wrt) in.back().requires_grad_();
  }
  const Tensor g = test::make_tensor(c.inputs.back(), r.dtype);
  Tensor y = table().at(c.op)(in);
  ASSERT_TRUE(y.requires_grad());
  y.backward(g.to(y.dtype()));
  const Tensor grad = in[wrt].grad();
  ASSERT_TRUE(grad.defined());
  const HostTensor got = grad.to_host();
  ASSERT_EQ(got.shape, c.output.shape);
  const test::Tolerance tol =
      r.dtype == DType::Float64 ? test::Tolerance{1e-10, 1e-12} : test::Tolerance{1e-5, 1e-6};
  int bad = 0;
  std::ostringstream report;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double want = c.output.values[static_cast<std::size_t>(i)];
    if (test::close(got.at(i), want, tol)) continue;
    if (++bad <= 8) report << "\n  [" << i << "] got " << got.at(i) << ", want " << want;
  }
  EXPECT_EQ(bad, 0) << bad << " of " << got.numel() << " elements differ" << report.str();
}

INSTANTIATE_TEST_SUITE_P(Fixture, GradReference, ::testing::ValuesIn(all_runs()),
                         [](const ::testing::TestParamInfo<GradRun>& info) {
                           return fixtures().cases.at(info.param.index).name + "_" +
                                  dtype_name(info.param.dtype);
                         });

}  // namespace
}  // namespace loom
