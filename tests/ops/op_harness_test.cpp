// The op harness: every ir::Op, from 0 to Op::Count_, is checked or exempt with a reason.
//
// table() holds, per op, cases: a loom call that emits the op and the name of its inputs and
// PyTorch result in ops/fixtures/op_harness.txt (tests/reference/make_op_harness_fixtures.py).
// Each case is checked for
//   forward    float64 and float32 against PyTorch, and the traced graph holds the op;
//   gradient   where op_info(op).differentiable: against central finite differences in
//              float64, for every floating-point input;
//   modes      lazy, eager and compiled execution give the same bytes (float32, float64 and
//              bfloat16);
//   bfloat16   the case run on bfloat16 inputs against the float32 run on the same values
//              (the inputs rounded to bfloat16 first): relative error at most 1e-2.
// Adding an op to ir/op.h fails OpHarness.EveryOpHasCasesOrIsExempt until its cases are here;
// the exempt ops are listed in kExempt, each with its reason, and asserted.
// (ops_forward_test.cpp checks edge values per public function: NaN, ties, broadcasting.)
#include "ops/op_fixtures.h"
#include "test_util.h"

#include "ir/op.h"
#ifdef LOOM_WITH_CUDA
#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "lazy/tensor_impl.h"
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/cuda_target.h"
#include "runtime/cuda/nvrtc.h"

#include <cstdlib>
#endif
#include "lazy/ops_util.h"  // lazy::apply: ops the public API emits only inside others (erf)

#include <loom/autograd.h>
#include <loom/lazy.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace loom {
namespace {

using ir::Op;
using V = const std::vector<Tensor>&;

struct OpCase {
  std::string fixture;  // the case's name in op_harness.txt
  // The loom call; `run` is the float dtype of the run (for ops that take a dtype).
  std::function<Tensor(V, DType run)> fn;
  double fd_step = 1e-6;  // finite-difference step
};

struct Entry {
  std::vector<OpCase> cases;
  std::string exempt;  // non-empty: why the op has no cases
};

// Ops with no cases, and why. Asserted: an op leaves this list only by getting cases.
const std::map<Op, std::string> kExempt = {
    {Op::DeviceData, "a leaf bound to a buffer: every case's inputs are device data"},
    {Op::RandUniform, "loom's generator has no PyTorch counterpart; RandomTest in "
                      "ops_forward_test.cpp checks its determinism and distribution"},
    {Op::RandNormal, "as RandUniform"},
};

Tensor grad_input(const Tensor& x, const std::function<Tensor(const Tensor&)>& f,
                  const Tensor& grad_out) {
  Tensor leaf = x.detach().requires_grad_();
  f(leaf).backward(grad_out);
  return leaf.grad();
}

const std::map<Op, Entry>& table() {
  const Conv2dParams pad1{.padding = {1, 1}};
  const Pool2dOptions max_pool{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  const Pool2dOptions avg_pool{.kernel = {2, 2}, .stride = {2, 2}, .padding = {1, 1}};
  auto unary = [](const char* fixture, Tensor (*f)(const Tensor&)) {
    return Entry{{{fixture, [f](V x, DType) { return f(x[0]); }}}};
  };
  auto binary = [](const char* fixture, Tensor (*f)(const Tensor&, const Tensor&)) {
    return Entry{{{fixture, [f](V x, DType) { return f(x[0], x[1]); }}}};
  };
  static const std::map<Op, Entry> t = {
      // 0 and 1 are baked in as constants (lazy::scalar); other values are device data.
      {Op::Constant, {{{"constant_ones", [](V, DType run) { return ones({2, 3}, run); }}}}},
      {Op::Iota, {{{"iota_dim1", [](V, DType run) { return iota({3, 4}, 1, run); }}}}},
      {Op::Neg, unary("neg_2d", neg)},
      {Op::Exp, unary("exp_2d", exp)},
      {Op::Log, unary("log_2d", log)},
      {Op::Sqrt, unary("sqrt_2d", sqrt)},
      {Op::Rsqrt, unary("rsqrt_2d", rsqrt)},
      {Op::Abs, unary("abs_2d", abs)},
      {Op::Relu, unary("relu_2d", relu)},
      {Op::Sigmoid, unary("sigmoid_2d", sigmoid)},
      {Op::Tanh, unary("tanh_2d", tanh)},
      {Op::Silu, unary("silu_2d", silu)},
      {Op::Gelu, {{{"gelu_2d", [](V x, DType) { return gelu(x[0]); }}}}},
      {Op::GeluTanh, {{{"gelu_tanh_2d", [](V x, DType) { return gelu(x[0], true); }}}}},
      // No public erf: gelu's gradient rule emits it.
      {Op::Erf, {{{"erf_2d", [](V x, DType) { return lazy::apply(Op::Erf, {x[0]}); }}}}},
      {Op::Sin, unary("sin_2d", sin)},
      {Op::Cos, unary("cos_2d", cos)},
      {Op::LogicalNot, unary("logical_not_2d", logical_not)},
      // Through float32 in the float64 run: a step on the inputs' 1/256 grid keeps x +- step
      // exact in float32, so the difference quotient of this line is exact.
      {Op::Cast, {{{"cast_to_other_float",
                    [](V x, DType run) {
                      return x[0].to(run == DType::Float64 ? DType::Float32 : DType::Float64);
                    },
                    0.125}}}},
      {Op::Add, binary("add_2d", add)},
      {Op::Sub, binary("sub_2d", sub)},
      {Op::Mul, binary("mul_2d", mul)},
      {Op::Div, binary("div_2d", div)},
      {Op::Pow, {{{"pow_2d", [](V x, DType) { return pow(x[0], x[1]); }}}}},
      {Op::Maximum, binary("maximum_2d", maximum)},
      {Op::Minimum, binary("minimum_2d", minimum)},
      {Op::Eq, binary("eq_2d", eq)},
      {Op::Ne, binary("ne_2d", ne)},
      {Op::Lt, binary("lt_2d", lt)},
      {Op::Le, binary("le_2d", le)},
      {Op::Gt, binary("gt_2d", gt)},
      {Op::Ge, binary("ge_2d", ge)},
      {Op::Where, {{{"where_2d", [](V x, DType) { return where(x[0], x[1], x[2]); }}}}},
      {Op::Sum, {{{"sum_axes02", [](V x, DType) { return sum(x[0], {0, 2}); }}}}},
      {Op::Mean, {{{"mean_axis1_keepdim", [](V x, DType) { return mean(x[0], {1}, true); }}}}},
      {Op::Max, {{{"amax_axis1", [](V x, DType) { return amax(x[0], {1}); }}}}},
      {Op::ArgMax, {{{"argmax_dim1", [](V x, DType) { return argmax(x[0], 1); }}}}},
      {Op::Reshape, {{{"reshape_2x6", [](V x, DType) { return reshape(x[0], {2, 6}); }}}}},
      {Op::Permute, {{{"permute_201", [](V x, DType) { return permute(x[0], {2, 0, 1}); }}}}},
      {Op::Slice, {{{"slice_step3", [](V x, DType) { return slice(x[0], 0, 1, 7, 3); }}}}},
      {Op::Expand, {{{"expand_3d", [](V x, DType) { return expand(x[0], {2, 3, 4}); }}}}},
      {Op::Pad, {{{"pad_value", [](V x, DType) { return pad(x[0], {1, 2, 0, 1}, 0.5); }}}}},
      {Op::Concat, {{{"concat_dim0", [](V x, DType) { return concat({x[0], x[1]}, 0); }}}}},
      {Op::Matmul, binary("matmul_2d", matmul)},
      {Op::Conv2d,
       {{{"conv2d_pad1", [pad1](V x, DType) { return conv2d(x[0], x[1], {}, pad1); }}}}},
      {Op::MaxPool2d,
       {{{"max_pool2d_k3s2p1", [max_pool](V x, DType) { return max_pool2d(x[0], max_pool); }}}}},
      {Op::AvgPool2d,
       {{{"avg_pool2d_k2s2p1", [avg_pool](V x, DType) { return avg_pool2d(x[0], avg_pool); }}}}},
      // The gradient ops, as backward emits them: inputs (x, w, grad_out) or (x, grad_out).
      {Op::Conv2dGradInput,
       {{{"conv2d_grad_input_pad1", [pad1](V x, DType) {
            return grad_input(x[0], [&](const Tensor& in) { return conv2d(in, x[1], {}, pad1); },
                              x[2]);
          }}}}},
      {Op::Conv2dGradWeight,
       {{{"conv2d_grad_weight_pad1", [pad1](V x, DType) {
            return grad_input(x[1], [&](const Tensor& w) { return conv2d(x[0], w, {}, pad1); },
                              x[2]);
          }}}}},
      {Op::MaxPool2dGrad,
       {{{"max_pool2d_grad_k3s2p1", [max_pool](V x, DType) {
            return grad_input(x[0], [&](const Tensor& in) { return max_pool2d(in, max_pool); },
                              x[1]);
          }}}}},
      {Op::AvgPool2dGrad,
       {{{"avg_pool2d_grad_k2s2p1", [avg_pool](V x, DType) {
            return grad_input(x[0], [&](const Tensor& in) { return avg_pool2d(in, avg_pool); },
                              x[1]);
          }}}}},
      {Op::Gather, {{{"gather_dim1", [](V x, DType) { return gather(x[0], 1, x[1]); }}}}},
      {Op::IndexSelect,
       {{{"index_select_dim0", [](V x, DType) { return index_select(x[0], 0, x[1]); }}}}},
      {Op::ScatterAdd,
       {{{"scatter_add_dim1", [](V x, DType) { return scatter_add(x[0], 1, x[1], x[2]); }}}}},
      {Op::OneHot, {{{"one_hot_4", [](V x, DType) { return one_hot(x[0], 4); }}}}},
      // Made by the compiler only (compiler/conv_im2col.h): a 3x2 window, stride (2, 1),
      // padding (1, 0), dilation (1, 2), over two images.
      {Op::Im2col, {{{"im2col_k3x2s2x1p1x0d1x2", [](V x, DType) {
            const ir::Conv2dAttr conv{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}};
            return lazy::apply(Op::Im2col, {x[0]}, ir::Conv2dGradAttr{conv, {3, 2}});
          }}}}},
  };
  return t;
}

const test::Fixtures& fixtures() {
  static const test::Fixtures f =
      test::read_fixtures(LOOM_TEST_DATA_DIR "/ops/fixtures/op_harness.txt");
  return f;
}

const test::Case* fixture(const std::string& name) {
  for (const auto& c : fixtures().cases)
    if (c.name == name) return &c;
  return nullptr;
}

// ---- coverage ----

TEST(OpHarness, EveryOpHasCasesOrIsExempt) {
  for (int i = 0; i < ir::kOpCount; ++i) {
    const auto op = static_cast<Op>(i);
    const char* name = ir::op_name(op);
    const bool exempt = kExempt.count(op) > 0;
    const auto it = table().find(op);
    if (exempt) {
      EXPECT_TRUE(it == table().end()) << name << " is exempt and has cases: drop the exemption";
      EXPECT_FALSE(kExempt.at(op).empty()) << name << ": an exemption needs its reason";
      continue;
    }
    ASSERT_TRUE(it != table().end())
        << "op " << name << " has no cases in the op harness (tests/ops/op_harness_test.cpp): "
        << "add a loom call and its PyTorch result (tests/reference/"
        << "make_op_harness_fixtures.py), or an exemption with its reason";
    EXPECT_FALSE(it->second.cases.empty()) << name;
  }
  const std::set<Op> want_exempt = {Op::DeviceData, Op::RandUniform, Op::RandNormal};
  std::set<Op> got_exempt;
  for (const auto& [op, why] : kExempt) got_exempt.insert(op);
  EXPECT_EQ(got_exempt, want_exempt) << "the exempt list changed: say why in kExempt and here";
}

TEST(OpHarness, FixturesMatchTheTableOneToOne) {
  const auto& f = fixtures();
  ASSERT_TRUE(f.error.empty()) << f.error;
  std::set<std::string> used;
  for (const auto& [op, entry] : table())
    for (const auto& c : entry.cases) {
      const test::Case* fx = fixture(c.fixture);
      ASSERT_NE(fx, nullptr) << "no fixture case " << c.fixture;
      EXPECT_EQ(fx->op, ir::op_name(op)) << "fixture " << c.fixture << " is for another op";
      EXPECT_TRUE(used.insert(c.fixture).second) << "fixture " << c.fixture << " used twice";
    }
  for (const auto& c : f.cases) EXPECT_TRUE(used.count(c.name)) << "unused fixture " << c.name;
}

// ---- per case ----

struct OpRun {
  Op op;
  std::size_t index;  // into table().at(op).cases
  const OpCase& c() const { return table().at(op).cases.at(index); }
};

void PrintTo(const OpRun& r, std::ostream* os) { *os << r.c().fixture; }

std::vector<OpRun> all_runs() {
  std::vector<OpRun> runs;
  for (const auto& [op, entry] : table())
    for (std::size_t i = 0; i < entry.cases.size(); ++i) runs.push_back({op, i});
  return runs;
}

std::vector<Tensor> inputs_of(const test::Case& fx, DType run) {
  std::vector<Tensor> in;
  for (const auto& spec : fx.inputs) in.push_back(test::make_tensor(spec, run));
  return in;
}

class OpCaseTest : public ::testing::TestWithParam<OpRun> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fixtures().error.empty()) << fixtures().error;
    fx_ = fixture(GetParam().c().fixture);
    ASSERT_NE(fx_, nullptr) << "no fixture case " << GetParam().c().fixture;
  }
  const test::Case* fx_ = nullptr;
};

TEST_P(OpCaseTest, ForwardMatchesPyTorch) {
  const OpRun r = GetParam();
  for (DType run : {DType::Float64, DType::Float32}) {
    SCOPED_TRACE(dtype_name(run));
    const Tensor y = r.c().fn(inputs_of(*fx_, run), run);
    ASSERT_TRUE(y.is_pending());
    EXPECT_GT(test::count_ops(test::graph_of(y), r.op), 0)
        << "the call does not emit " << ir::op_name(r.op) << ":\n"
        << ir::to_text(test::graph_of(y));
    const DType want_dtype = test::resolve_dtype(fx_->output.dtype, run);
    const HostTensor got = y.to_host();
    ASSERT_EQ(got.dtype, want_dtype);
    ASSERT_EQ(got.shape, fx_->output.shape);
    const bool single = run == DType::Float32 || want_dtype == DType::Float32;
    const test::Tolerance tol = !is_floating(want_dtype) ? test::Tolerance{0, 0}
                                : single ? test::Tolerance{1e-4, 1e-5}
                                         : test::Tolerance{1e-10, 1e-12};
    for (int64_t i = 0; i < got.numel(); ++i)
      EXPECT_TRUE(test::close(got.at(i), fx_->output.values[i], tol))
          << "[" << i << "] got " << got.at(i) << ", want " << fx_->output.values[i];
  }
}

TEST_P(OpCaseTest, LazyEagerAndCompiledAgreeExactly) {
  const OpCase& c = GetParam().c();
  for (DType run : {DType::Float64, DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(run));
    const auto in = inputs_of(*fx_, run);
    Tensor lazy = c.fn(in, run);
    mark_step();
    Tensor eager;
    {
      EagerModeGuard on(true);
      eager = c.fn(in, run);
      EXPECT_FALSE(eager.is_pending());
    }
    Tensor compiled;
    compile([&] { compiled = c.fn(in, run); })();
    const HostTensor l = lazy.to_host(), e = eager.to_host(), k = compiled.to_host();
    EXPECT_EQ(l.shape, e.shape);
    EXPECT_EQ(l.shape, k.shape);
    EXPECT_TRUE(l.bytes == e.bytes) << "lazy and eager differ";
    EXPECT_TRUE(l.bytes == k.bytes) << "lazy and compiled differ";
  }
}

// bfloat16 arithmetic is float32 arithmetic rounded once per op (the compiler widens it where
// the device has no bfloat16 kernel: compiler/widen.h), so the reference is the float32 run on
// the very values the bfloat16 run reads. A floating-point result is compared as bfloat16
// precision allows: |got - want| <= 1e-2 |want|, with a floor of 1e-3 of the result's largest
// magnitude for the elements a sum cancels to near zero; other results exactly.
TEST_P(OpCaseTest, BFloat16MatchesFloat32OnTheSameValues) {
  const OpRun r = GetParam();
  const auto bf16 = inputs_of(*fx_, DType::BFloat16);
  std::vector<Tensor> f32;
  for (const auto& t : bf16) f32.push_back(t.dtype() == DType::BFloat16 ? t.to(DType::Float32) : t);
  const Tensor got = r.c().fn(bf16, DType::BFloat16);
  const Tensor want = r.c().fn(f32, DType::Float32);
  EXPECT_GT(test::count_ops(test::graph_of(got), r.op), 0)
      << "the bfloat16 call does not emit " << ir::op_name(r.op);
  const HostTensor w = want.to_host();
  if (w.dtype == DType::Float32) {
    ASSERT_EQ(got.dtype(), DType::BFloat16) << "a float result of bfloat16 inputs is bfloat16";
  }
  const HostTensor g = (got.dtype() == DType::BFloat16 ? got.to(DType::Float32) : got).to_host();
  ASSERT_EQ(g.shape, w.shape);
  double largest = 0;
  for (int64_t i = 0; i < w.numel(); ++i)
    if (std::isfinite(w.at(i))) largest = std::max(largest, std::abs(w.at(i)));
  const bool exact = !is_floating(w.dtype);
  const test::Tolerance tol = exact ? test::Tolerance{0, 0} : test::Tolerance{1e-2, 1e-3 * largest};
  double worst = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    EXPECT_TRUE(test::close(g.at(i), w.at(i), tol))
        << "[" << i << "] bfloat16 gives " << g.at(i) << ", float32 " << w.at(i);
    if (std::isfinite(w.at(i)) && std::abs(w.at(i)) > tol.abs)
      worst = std::max(worst, std::abs(g.at(i) - w.at(i)) / std::abs(w.at(i)));
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST_P(OpCaseTest, GradientMatchesFiniteDifferences) {
  const OpRun r = GetParam();
  if (!ir::op_info(r.op).differentiable) {
    // Not differentiable per the op table: the output carries no gradient.
    std::vector<Tensor> in = inputs_of(*fx_, DType::Float64);
    for (auto& t : in)
      if (is_floating(t.dtype())) t.requires_grad_();
    EXPECT_FALSE(r.c().fn(in, DType::Float64).requires_grad());
    return;
  }
  const DType f64 = DType::Float64;
  std::vector<std::vector<double>> values;
  std::vector<bool> is_float;
  for (const auto& spec : fx_->inputs) {
    values.push_back(spec.values);
    is_float.push_back(spec.dtype == "float");
  }
  auto build = [&](const std::vector<std::vector<double>>& vs, bool track) {
    std::vector<Tensor> in;
    for (std::size_t k = 0; k < vs.size(); ++k) {
      if (!is_float[k]) {
        in.push_back(test::make_tensor(fx_->inputs[k], f64));
        continue;
      }
      // On the test device, as make_tensor puts the other inputs: a leaf there.
      in.push_back(test::on_test_device(from_vector(vs[k], fx_->inputs[k].shape)));
      if (track) in.back().requires_grad_();
    }
    return in;
  };
  // loss = sum(f(x) * w) with fixed weights, so every output element's gradient counts.
  const Shape out_shape = fx_->output.shape;
  std::vector<double> w(static_cast<std::size_t>(shape_numel(out_shape)));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + 0.125 * static_cast<double>(i % 7);
  auto loss = [&](const std::vector<Tensor>& in) {
    return sum(r.c().fn(in, f64).to(f64) * test::on_test_device(from_vector(w, out_shape)));
  };

  auto in = build(values, true);
  int checked = 0;
  loss(in).backward();
  mark_step();
  for (std::size_t k = 0; k < values.size(); ++k) {
    if (!is_float[k]) continue;
    ASSERT_TRUE(in[k].grad().defined()) << "input " << k << " got no gradient";
    const auto analytic = in[k].grad().to_vector<double>();
    for (std::size_t e = 0; e < values[k].size(); ++e) {
      auto plus = values, minus = values;
      plus[k][e] += r.c().fd_step;
      minus[k][e] -= r.c().fd_step;
      const double numeric = (loss(build(plus, false)).item<double>() -
                              loss(build(minus, false)).item<double>()) /
                             (2 * r.c().fd_step);
      EXPECT_NEAR(analytic[e], numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << "input " << k << " element " << e;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "a differentiable op's case needs a floating-point input";
}

#ifdef LOOM_WITH_CUDA
// Without a GPU: every case, forward in float64, float32 and bfloat16 and backward where the
// op is differentiable (float64, float32), generated as CUDA C and compiled by NVRTC for the
// H100 (sm_90) as the CUDA backend compiles a step: one program per dtype holding every case,
// so that a GPU session finds no kernel that fails to compile (Cuda.OpHarness runs them there).
TEST(OpHarness, EveryCaseCompilesForTheGpu) {
  ::setenv("LOOM_CUDA_CACHE_DIR", LOOM_TEST_KERNEL_CACHE, 0);
  for (DType run : {DType::Float64, DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(run));
    std::vector<Tensor> keep;  // the step's results: every case's output and gradients
    std::set<Op> ops;
    for (const auto& r : all_runs()) {
      const test::Case* fx = fixture(r.c().fixture);
      ASSERT_NE(fx, nullptr) << r.c().fixture;
      auto in = inputs_of(*fx, run);
      const bool backward = ir::op_info(r.op).differentiable && run != DType::BFloat16;
      if (backward)
        for (auto& t : in)
          if (is_floating(t.dtype())) t.requires_grad_();
      Tensor y = r.c().fn(in, run);
      keep.push_back(y);
      ops.insert(r.op);
      if (backward && y.requires_grad()) {
        sum(y.to(DType::Float64)).backward();
        for (auto& t : in)
          if (t.requires_grad() && t.grad().defined()) keep.push_back(t.grad());
      }
    }
    std::vector<ir::NodePtr> roots;
    for (auto& [device, live] : lazy::live_pending_by_device())
      for (auto& t : live) roots.push_back(t->pending());
    const auto program = compiler::compile(ir::build_graph(roots), runtime::cuda::cuda_target());
    runtime::cuda::ProgramCode code;
    ASSERT_NO_THROW(code = runtime::cuda::generate_program(program));
    EXPECT_NO_THROW(runtime::cuda::nvrtc::compile(code.source, 90));
    EXPECT_GT(code.kernels(), static_cast<int>(ops.size()) / 2);  // most ops are kernels of their own
    keep.clear();  // nothing pending is left to run on the CPU
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(Ops, OpCaseTest, ::testing::ValuesIn(all_runs()),
                         [](const ::testing::TestParamInfo<OpRun>& info) {
                           return info.param.c().fixture;
                         });

}  // namespace
}  // namespace loom
