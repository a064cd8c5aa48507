// Forward values of every op against PyTorch.
//
// The reference values live in ops/fixtures/op_forward.txt, written by
// tests/reference/make_op_fixtures.py (PyTorch, float64); the format is described there.
// Each fixture case runs twice: with its float inputs as float64 (rel 1e-10, abs 1e-12) and
// as float32 (rel 1e-4, abs 1e-5); integer and bool results must match exactly. A case with
// no float tensor and no float dtype parameter runs once (both runs would do the same work). The
// result's dtype and shape are checked both as traced (before running) and as computed.
//
// A case whose op has no entry in op_table() fails, as does an op with no case, a missing or
// truncated fixture file, or a parameter the op's lambda never reads, so the suite cannot
// pass by skipping work.
//
// loom's random generator has no PyTorch counterpart; RandomTest checks its properties.

#include "ops/op_fixtures.h"

#include <loom/lazy.h>
#include <loom/tensor.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using loom::DType;
using loom::Shape;
using loom::Tensor;
using namespace loom::test;  // the fixture reader (op_fixtures.h)

constexpr const char* kFixturePath = LOOM_TEST_DATA_DIR "/ops/fixtures/op_forward.txt";

const Fixtures& fixtures() {
  static const Fixtures f = read_fixtures(kFixturePath);
  return f;
}

// ---- op parameters ----

class Params {
 public:
  Params(const std::map<std::string, std::string>& kv, DType run) : kv_(kv), run_(run) {}

  int64_t i(const std::string& key) { return static_cast<int64_t>(parse_number(get(key), true)); }
  double f(const std::string& key) { return parse_number(get(key), false); }
  bool b(const std::string& key) { return i(key) != 0; }
  DType dtype(const std::string& key) { return resolve_dtype(get(key), run_); }
  std::vector<int64_t> ints(const std::string& key) {
    const std::string& text = get(key);
    std::vector<int64_t> out;
    if (text == "none") return out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(static_cast<int64_t>(parse_number(item, true)));
    return out;
  }
  std::array<int64_t, 2> pair(const std::string& key) {
    auto v = ints(key);
    if (v.size() != 2) throw std::runtime_error("param " + key + " needs two values");
    return {v[0], v[1]};
  }

  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : kv_) {
      if (!used_.count(k)) out.push_back(k);
    }
    return out;
  }

 private:
  const std::string& get(const std::string& key) {
    used_.insert(key);
    auto it = kv_.find(key);
    if (it == kv_.end()) throw std::runtime_error("fixture lacks param '" + key + "'");
    return it->second;
  }

  const std::map<std::string, std::string>& kv_;
  DType run_;
  std::set<std::string> used_;
};

// ---- the op table: fixture op name -> loom call ----

using Inputs = std::vector<Tensor>;
using OpFn = std::function<Tensor(const Inputs&, Params&)>;

#define LOOM_UNARY(fn) {#fn, [](const Inputs& in, Params&) { return loom::fn(in.at(0)); }}
#define LOOM_BINARY(fn) \
  {#fn, [](const Inputs& in, Params&) { return loom::fn(in.at(0), in.at(1)); }}

loom::Pool2dOptions pool_options(Params& p) {
  loom::Pool2dOptions o;
  o.kernel = p.pair("kernel");
  o.stride = p.pair("stride");
  o.padding = p.pair("padding");
  return o;
}

const std::map<std::string, OpFn>& op_table() {
  static const std::map<std::string, OpFn> table = {
      // elementwise, unary
      LOOM_UNARY(neg), LOOM_UNARY(exp), LOOM_UNARY(log), LOOM_UNARY(sqrt), LOOM_UNARY(rsqrt),
      LOOM_UNARY(abs), LOOM_UNARY(relu), LOOM_UNARY(sigmoid), LOOM_UNARY(tanh),
      LOOM_UNARY(silu), LOOM_UNARY(sin), LOOM_UNARY(cos), LOOM_UNARY(logical_not),
      {"gelu", [](const Inputs& in, Params& p) { return loom::gelu(in.at(0), p.b("approximate")); }},
      {"neg_operator", [](const Inputs& in, Params&) { return -in.at(0); }},
      {"cast", [](const Inputs& in, Params& p) { return in.at(0).to(p.dtype("to")); }},
      // elementwise, binary and ternary
      LOOM_BINARY(add), LOOM_BINARY(sub), LOOM_BINARY(mul), LOOM_BINARY(div),
      LOOM_BINARY(maximum), LOOM_BINARY(minimum), LOOM_BINARY(eq), LOOM_BINARY(ne),
      LOOM_BINARY(lt), LOOM_BINARY(le), LOOM_BINARY(gt), LOOM_BINARY(ge),
      {"pow", [](const Inputs& in, Params&) { return loom::pow(in.at(0), in.at(1)); }},
      {"pow_scalar",
       [](const Inputs& in, Params& p) { return loom::pow(in.at(0), p.f("exponent")); }},
      {"where",
       [](const Inputs& in, Params&) { return loom::where(in.at(0), in.at(1), in.at(2)); }},
      {"add_scalar", [](const Inputs& in, Params& p) { return in.at(0) + p.f("scalar"); }},
      {"radd_scalar", [](const Inputs& in, Params& p) { return p.f("scalar") + in.at(0); }},
      {"sub_scalar", [](const Inputs& in, Params& p) { return in.at(0) - p.f("scalar"); }},
      {"rsub_scalar", [](const Inputs& in, Params& p) { return p.f("scalar") - in.at(0); }},
      {"mul_scalar", [](const Inputs& in, Params& p) { return in.at(0) * p.f("scalar"); }},
      {"rmul_scalar", [](const Inputs& in, Params& p) { return p.f("scalar") * in.at(0); }},
      {"div_scalar", [](const Inputs& in, Params& p) { return in.at(0) / p.f("scalar"); }},
      {"rdiv_scalar", [](const Inputs& in, Params& p) { return p.f("scalar") / in.at(0); }},
      {"iadd", [](const Inputs& in, Params&) { Tensor a = in.at(0); a += in.at(1); return a; }},
      {"isub", [](const Inputs& in, Params&) { Tensor a = in.at(0); a -= in.at(1); return a; }},
      {"imul", [](const Inputs& in, Params&) { Tensor a = in.at(0); a *= in.at(1); return a; }},
      // reductions
      {"sum", [](const Inputs& in, Params& p) {
         return loom::sum(in.at(0), p.ints("axes"), p.b("keepdim")); }},
      {"mean", [](const Inputs& in, Params& p) {
         return loom::mean(in.at(0), p.ints("axes"), p.b("keepdim")); }},
      {"amax", [](const Inputs& in, Params& p) {
         return loom::amax(in.at(0), p.ints("axes"), p.b("keepdim")); }},
      {"tensor_sum", [](const Inputs& in, Params& p) {
         return in.at(0).sum(p.ints("axes"), p.b("keepdim")); }},
      {"tensor_mean", [](const Inputs& in, Params& p) {
         return in.at(0).mean(p.ints("axes"), p.b("keepdim")); }},
      {"tensor_max", [](const Inputs& in, Params& p) {
         return in.at(0).max(p.ints("axes"), p.b("keepdim")); }},
      {"argmax", [](const Inputs& in, Params& p) {
         return loom::argmax(in.at(0), p.i("dim"), p.b("keepdim")); }},
      {"tensor_argmax", [](const Inputs& in, Params& p) {
         return in.at(0).argmax(p.i("dim"), p.b("keepdim")); }},
      {"softmax", [](const Inputs& in, Params& p) { return loom::softmax(in.at(0), p.i("dim")); }},
      {"log_softmax",
       [](const Inputs& in, Params& p) { return loom::log_softmax(in.at(0), p.i("dim")); }},
      {"logsumexp", [](const Inputs& in, Params& p) {
         return loom::logsumexp(in.at(0), p.ints("axes"), p.b("keepdim")); }},
      // movement
      {"reshape", [](const Inputs& in, Params& p) { return loom::reshape(in.at(0), p.ints("shape")); }},
      {"tensor_reshape", [](const Inputs& in, Params& p) { return in.at(0).reshape(p.ints("shape")); }},
      {"flatten", [](const Inputs& in, Params& p) {
         return loom::flatten(in.at(0), p.i("start"), p.i("end")); }},
      {"permute", [](const Inputs& in, Params& p) { return loom::permute(in.at(0), p.ints("perm")); }},
      {"tensor_permute", [](const Inputs& in, Params& p) { return in.at(0).permute(p.ints("perm")); }},
      {"transpose", [](const Inputs& in, Params& p) {
         return loom::transpose(in.at(0), p.i("d0"), p.i("d1")); }},
      {"tensor_transpose", [](const Inputs& in, Params& p) {
         return in.at(0).transpose(p.i("d0"), p.i("d1")); }},
      {"slice", [](const Inputs& in, Params& p) {
         return loom::slice(in.at(0), p.i("dim"), p.i("start"), p.i("end"), p.i("step")); }},
      {"concat", [](const Inputs& in, Params& p) { return loom::concat(in, p.i("dim")); }},
      {"expand", [](const Inputs& in, Params& p) { return loom::expand(in.at(0), p.ints("shape")); }},
      {"tensor_expand", [](const Inputs& in, Params& p) { return in.at(0).expand(p.ints("shape")); }},
      {"broadcast_to",
       [](const Inputs& in, Params& p) { return loom::broadcast_to(in.at(0), p.ints("shape")); }},
      {"pad", [](const Inputs& in, Params& p) {
         return loom::pad(in.at(0), p.ints("pads"), p.f("value")); }},
      {"unsqueeze", [](const Inputs& in, Params& p) { return loom::unsqueeze(in.at(0), p.i("dim")); }},
      {"squeeze", [](const Inputs& in, Params& p) { return loom::squeeze(in.at(0), p.i("dim")); }},
      // linear algebra, convolution, pooling
      LOOM_BINARY(matmul),
      {"conv2d", [](const Inputs& in, Params& p) {
         loom::Conv2dParams o;
         o.stride = p.pair("stride");
         o.padding = p.pair("padding");
         o.dilation = p.pair("dilation");
         o.groups = p.i("groups");
         return loom::conv2d(in.at(0), in.at(1), in.size() > 2 ? in.at(2) : Tensor{}, o); }},
      {"max_pool2d",
       [](const Inputs& in, Params& p) { return loom::max_pool2d(in.at(0), pool_options(p)); }},
      {"avg_pool2d", [](const Inputs& in, Params& p) {
         loom::Pool2dOptions o = pool_options(p);
         o.count_include_pad = p.b("count_include_pad");
         return loom::avg_pool2d(in.at(0), o); }},
      // indexing
      {"gather", [](const Inputs& in, Params& p) { return loom::gather(in.at(0), p.i("dim"), in.at(1)); }},
      {"index_select", [](const Inputs& in, Params& p) {
         return loom::index_select(in.at(0), p.i("dim"), in.at(1)); }},
      {"embedding", [](const Inputs& in, Params&) { return loom::embedding(in.at(0), in.at(1)); }},
      {"scatter_add", [](const Inputs& in, Params& p) {
         return loom::scatter_add(in.at(0), p.i("dim"), in.at(1), in.at(2)); }},
      {"one_hot",
       [](const Inputs& in, Params& p) { return loom::one_hot(in.at(0), p.i("num_classes")); }},
      // creation
      {"iota", [](const Inputs&, Params& p) {
         return loom::iota(p.ints("shape"), p.i("dim"), p.dtype("dtype")); }},
      {"arange", [](const Inputs&, Params& p) {
         return loom::arange(p.f("start"), p.f("end"), p.f("step"), p.dtype("dtype")); }},
      {"arange_end", [](const Inputs&, Params& p) { return loom::arange(p.i("end"), p.dtype("dtype")); }},
      {"full", [](const Inputs&, Params& p) {
         return loom::full(p.ints("shape"), p.f("value"), p.dtype("dtype")); }},
      {"zeros", [](const Inputs&, Params& p) { return loom::zeros(p.ints("shape"), p.dtype("dtype")); }},
      {"ones", [](const Inputs&, Params& p) { return loom::ones(p.ints("shape"), p.dtype("dtype")); }},
      {"scalar_tensor",
       [](const Inputs&, Params& p) { return loom::scalar_tensor(p.f("value"), p.dtype("dtype")); }},
      // composites: several ops in one lazy graph
      {"composite_relu_affine_sum",
       [](const Inputs& in, Params&) { return loom::relu(in.at(0) * 2.0 - 3.0).sum(); }},
      {"composite_manual_softmax", [](const Inputs& in, Params&) {
         const Tensor& x = in.at(0);
         Tensor e = loom::exp(x - loom::amax(x, {1}, true));
         return e / loom::sum(e, {1}, true); }},
      {"composite_transpose_matmul", [](const Inputs& in, Params&) {
         return loom::matmul(loom::transpose(in.at(0), 0, 1), in.at(1)); }},
      {"composite_slice_sum", [](const Inputs& in, Params&) {
         return loom::sum(loom::slice(in.at(0), 0, 1, 6, 2), {1}); }},
      {"composite_permute_reshape", [](const Inputs& in, Params&) {
         return loom::reshape(loom::permute(in.at(0), {1, 0, 2}), {3, -1}); }},
      {"composite_pad_conv", [](const Inputs& in, Params&) {
         return loom::conv2d(loom::pad(in.at(0), {1, 1, 1, 1}, 0.5), in.at(1)); }},
      {"composite_self_square",
       [](const Inputs& in, Params&) { return in.at(0) * in.at(0) + in.at(0); }},
      {"composite_where_compare", [](const Inputs& in, Params&) {
         const Tensor& a = in.at(0);
         const Tensor& b = in.at(1);
         return loom::where(loom::gt(a, b), a * 2.5, b - 1.5); }},
      {"composite_softmax_transposed", [](const Inputs& in, Params&) {
         return loom::softmax(loom::transpose(in.at(0), 0, 1), -1); }},
      {"composite_layer_norm", [](const Inputs& in, Params&) {
         Tensor centered = in.at(0) - loom::mean(in.at(0), {1}, true);
         Tensor var = loom::mean(centered * centered, {1}, true);
         return centered * loom::rsqrt(var + 1e-5); }},
      {"composite_concat_of_ops", [](const Inputs& in, Params&) {
         return loom::concat({loom::exp(in.at(0)), loom::neg(in.at(1))}, 0); }},
  };
  return table;
}

#undef LOOM_UNARY
#undef LOOM_BINARY

// ---- the parameterized forward test ----

struct CaseRun {
  std::size_t index;
  DType dtype;  // what the fixture's "float" means in this run
};

void PrintTo(const CaseRun& run, std::ostream* os) {
  *os << fixtures().cases.at(run.index).name << " as " << loom::dtype_name(run.dtype);
}

// Whether the run's float type changes anything in the case: a float tensor, or a dtype
// parameter naming the run's float type. Integer- and bool-only cases run once.
bool depends_on_float_type(const Case& c) {
  auto floating = [](const std::string& t) { return t == "float" || t == "float_other"; };
  if (floating(c.output.dtype)) return true;
  for (const TensorSpec& t : c.inputs)
    if (floating(t.dtype)) return true;
  for (const auto& [k, v] : c.params)
    if (floating(v)) return true;
  return false;
}

std::vector<CaseRun> all_runs() {
  std::vector<CaseRun> runs;
  for (std::size_t i = 0; i < fixtures().cases.size(); ++i) {
    runs.push_back({i, DType::Float64});
    if (depends_on_float_type(fixtures().cases[i])) runs.push_back({i, DType::Float32});
  }
  return runs;
}

class OpForward : public ::testing::TestWithParam<CaseRun> {};

TEST_P(OpForward, MatchesPyTorch) {
  const CaseRun run = GetParam();
  const Case& c = fixtures().cases.at(run.index);
  SCOPED_TRACE("case " + c.name + " (op " + c.op + ", " + loom::dtype_name(run.dtype) +
               ", fixture line " + std::to_string(c.line) + ")");

  auto fn = op_table().find(c.op);
  ASSERT_NE(fn, op_table().end()) << "no entry in op_table() for op '" << c.op << "'";

  const DType want_dtype = resolve_dtype(c.output.dtype, run.dtype);
  Params params(c.params, run.dtype);
  loom::HostTensor got;
  try {
    Inputs inputs;
    for (const TensorSpec& spec : c.inputs) inputs.push_back(make_tensor(spec, run.dtype));
    const Tensor result = fn->second(inputs, params);
    ASSERT_TRUE(result.defined());
    EXPECT_EQ(result.dtype(), want_dtype) << "traced dtype " << loom::dtype_name(result.dtype());
    EXPECT_EQ(result.shape(), c.output.shape)
        << "traced shape " << loom::shape_str(result.shape()) << ", want "
        << loom::shape_str(c.output.shape);
    got = result.to_host();
  } catch (const std::exception& e) {
    FAIL() << "threw: " << e.what();
  }
  EXPECT_TRUE(params.unused().empty())
      << "fixture param '" << params.unused().front() << "' is not read by the op table";

  ASSERT_EQ(got.dtype, want_dtype) << "got " << loom::dtype_name(got.dtype) << ", want "
                                   << loom::dtype_name(want_dtype);
  ASSERT_EQ(got.shape, c.output.shape) << "got " << loom::shape_str(got.shape) << ", want "
                                       << loom::shape_str(c.output.shape);
  ASSERT_EQ(got.bytes.size(), c.output.values.size() * loom::dtype_size(want_dtype));

  const bool floating = loom::is_floating(want_dtype);
  const bool single = run.dtype == DType::Float32 || want_dtype == DType::Float32;
  const Tolerance tol = !floating ? Tolerance{0, 0}
                        : single  ? Tolerance{1e-4, 1e-5}
                                  : Tolerance{1e-10, 1e-12};
  int mismatches = 0;
  std::ostringstream report;
  report.precision(17);
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.at(i);
    const double w = c.output.values[static_cast<std::size_t>(i)];
    if (close(g, w, tol)) continue;
    if (++mismatches <= 8) {
      report << "\n  [" << i << "] got " << g << ", want " << w << " (diff " << g - w << ")";
    }
  }
  EXPECT_EQ(mismatches, 0) << mismatches << " of " << got.numel()
                           << " elements outside rel " << tol.rel << " / abs " << tol.abs
                           << report.str();
}

INSTANTIATE_TEST_SUITE_P(
    Fixture, OpForward, ::testing::ValuesIn(all_runs()),
    [](const ::testing::TestParamInfo<CaseRun>& info) {
      const Case& c = fixtures().cases.at(info.param.index);
      if (!depends_on_float_type(c)) return c.name;
      return c.name + (info.param.dtype == DType::Float64 ? "_f64" : "_f32");
    });

// The fixture file exists, parses, and covers the op table one to one.
TEST(OpFixtures, LoadedAndComplete) {
  const Fixtures& f = fixtures();
  ASSERT_TRUE(f.error.empty()) << f.error;
  ASSERT_FALSE(f.cases.empty()) << kFixturePath << " holds no cases";

  std::set<std::string> names;
  std::set<std::string> ops;
  for (const Case& c : f.cases) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
    for (char ch : c.name) {
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')
          << "case name " << c.name << " is not a valid test name";
    }
    EXPECT_TRUE(op_table().count(c.op)) << "case " << c.name << ": no lambda for op " << c.op;
    ops.insert(c.op);
  }
  for (const auto& [op, fn] : op_table()) {
    EXPECT_TRUE(ops.count(op)) << "op " << op << " has no fixture case";
  }
}

// ---- loom's own random generator ----

std::vector<double> values(const Tensor& t) {
  const loom::HostTensor h = t.to_host();
  std::vector<double> out(static_cast<std::size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) out[static_cast<std::size_t>(i)] = h.at(i);
  return out;
}

// For the traced runs below: x times a 1 that is device data (a scalar 1 is baked, and
// simplify drops x * 1), so the op is a step of a fusion, which the x86 code computes in
// float32; and a tensor's values as doubles, read in its own dtype (a cast to float64 would
// join the fusion and keep it off that code).
// `values` as device data of `dtype` (float32 or float64): no cast for the fusion to take in.
Tensor data_of(const std::vector<double>& values, const Shape& shape, DType dtype) {
  if (dtype == DType::Float64) return loom::from_vector<double>(values, shape);
  return loom::from_vector<float>(std::vector<float>(values.begin(), values.end()), shape);
}
Tensor in_a_fusion(const Tensor& x) { return x * data_of({1.0}, {}, x.dtype()); }
std::vector<double> read_values(const Tensor& t) {
  if (t.dtype() == DType::Float64) return t.to_vector<double>();
  const auto v = t.to(DType::Float32).to_vector<float>();
  return {v.begin(), v.end()};
}

// exp where it underflows, against PyTorch 1.13's values (torch.exp, sigmoid, silu and softmax
// of these inputs): exp(-Inf) and softmax's masked -Inf lanes are exactly 0 (Eigen's
// vectorised exp clamps its argument and gave exp(-88.7), about 3e-39, there), sigmoid(-Inf)
// is 0 and silu(-Inf) = -Inf * 0 is NaN; below the clamp, exp is within float32's smallest
// normal number of PyTorch's subnormals. In both float types, traced (fused, and the x86 code
// where it computes exp in float32) and eagerly (one op alone).
TEST(OpUnderflow, ExpOfMinusInfinityIsZeroAsInPyTorch) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> x{-inf, -1000.0, -100.0, -88.8, -88.0, 0.0};
  const std::vector<double> exp_f32{0.0, 0.0, 3.783505853677006e-44, 2.7205004568187004e-39,
                                    6.054601485195952e-39, 1.0};
  const std::vector<double> sigmoid_f32{0.0, 0.0, 0.0, 0.0, 6.054601485195952e-39, 0.5};
  const std::vector<double> exp_f64{0.0, 0.0, 3.720075976020836e-44, 2.720507997802789e-39,
                                    6.054601895401186e-39, 1.0};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (bool eager : {false, true}) {
      const std::string what = std::string(loom::dtype_name(dtype)) + (eager ? " eager" : " traced");
      loom::EagerModeGuard mode(eager);
      const Tensor t = data_of(x, {6}, dtype);
      const Tensor in = eager ? t : in_a_fusion(t);  // eagerly each op runs alone
      const std::vector<double> e = read_values(loom::exp(in));
      const std::vector<double> sg = read_values(loom::sigmoid(in));
      const std::vector<double> si = read_values(loom::silu(in));
      const auto& want = dtype == DType::Float32 ? exp_f32 : exp_f64;
      // Float32's smallest normal number: PyTorch's subnormal results may flush to 0.
      const double floor = dtype == DType::Float32 ? 1.2e-38 : 0.0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        SCOPED_TRACE(what + ", x = " + std::to_string(x[i]));
        if (dtype == DType::Float64 && std::abs(x[i]) < 100) {  // far above double's clamp
          EXPECT_NEAR(e[i], want[i], 1e-15 * want[i]);
        } else {
          EXPECT_NEAR(e[i], want[i], floor + 1e-6 * want[i]);
        }
        EXPECT_GE(e[i], 0.0);
        if (dtype == DType::Float32) {
          EXPECT_NEAR(sg[i], sigmoid_f32[i], floor + 1e-6 * sigmoid_f32[i]);
        }
      }
      EXPECT_EQ(e[0], 0.0) << what << ": exp(-Inf)";
      EXPECT_EQ(e[1], 0.0) << what << ": exp(-1000)";
      EXPECT_EQ(sg[0], 0.0) << what << ": sigmoid(-Inf)";
      EXPECT_TRUE(std::isnan(si[0])) << what << ": silu(-Inf) = -Inf * sigmoid(-Inf) is NaN, got " << si[0];
      EXPECT_EQ(si[1], 0.0) << what << ": silu(-1000)";
      EXPECT_TRUE(std::signbit(si[1])) << what << ": silu(-1000) is -0, as in PyTorch";
      EXPECT_EQ(si[5], 0.0) << what << ": silu(0)";
      // A causal mask's row: the masked lanes' weights are exactly 0.
      const Tensor row = data_of({-inf, 0.0, 1.0, -inf}, {4}, dtype);
      const std::vector<double> p = read_values(loom::softmax(eager ? row : in_a_fusion(row), 0));
      EXPECT_EQ(p[0], 0.0) << what << ": a masked lane";
      EXPECT_EQ(p[3], 0.0) << what << ": a masked lane";
      EXPECT_NEAR(p[1], 0.2689414322376251, 1e-6) << what;
      EXPECT_NEAR(p[2], 0.7310585975646973, 1e-6) << what;
    }
  }
}

// float32 sigmoid and silu are 1 / (1 + exp(-x)) and x / (1 + exp(-x)), as PyTorch's CPU
// kernels compute them: within a few float32 ulps of the float64 value over [-80, 80]
// (Eigen's logistic, a rational polynomial plus 0.5, cancelled for negative x: 4e-4 relative
// error near -8). Traced (fused, and the x86 code where it computes exp) and eagerly.
TEST(OpAccuracy, SigmoidAndSiluAreWithinAFewUlps) {
  std::vector<double> x;
  for (double v = -80; v <= 80; v += 0.0625) x.push_back(v);
  const auto n = static_cast<int64_t>(x.size());
  for (bool eager : {false, true}) {
    loom::EagerModeGuard mode(eager);
    const Tensor t = data_of(x, {n}, DType::Float32);
    const Tensor in = eager ? t : in_a_fusion(t);
    const auto sg = read_values(loom::sigmoid(in));
    const auto si = read_values(loom::silu(in));
    double worst_sg = 0, worst_si = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = 1 / (1 + std::exp(-x[i]));
      if (want < 1e-37) continue;  // float32's subnormals
      worst_sg = std::max(worst_sg, std::abs(sg[i] - want) / want);
      if (x[i] != 0) worst_si = std::max(worst_si, std::abs(si[i] - x[i] * want) / std::abs(x[i] * want));
    }
    EXPECT_LT(worst_sg, 4 * 0x1p-24) << (eager ? "eager" : "traced");
    EXPECT_LT(worst_si, 4 * 0x1p-24) << (eager ? "eager" : "traced");
  }
}

// logsumexp over rows with an infinite maximum, against PyTorch 1.13 (torch.logsumexp and
// log_softmax of these rows, float64): -Inf for a row of -Inf, +Inf for a row holding +Inf
// (the shift by the maximum gave Inf - Inf = NaN), and log_softmax NaN there, as in PyTorch.
TEST(OpNonFinite, LogsumexpOfRowsWithAnInfiniteMaximum) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> rows{-inf, -inf, inf, 1, inf, inf, 1, 2, -inf, 0, inf, -inf};
  const std::vector<double> lse{-inf, inf, inf, 2.313261687518223, 0.0, inf};
  const std::vector<double> log_p{nan, nan, nan, nan, nan, nan, -1.3132616875182228,
                                  -0.31326168751822286, -inf, 0.0, nan, nan};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (bool eager : {false, true}) {
      const std::string what = std::string(loom::dtype_name(dtype)) + (eager ? " eager" : " traced");
      loom::EagerModeGuard mode(eager);
      const Tensor x = loom::from_vector<double>(rows, {6, 2}).to(dtype);
      const auto got = loom::logsumexp(x, {1}).to(DType::Float64).to_vector<double>();
      const auto got_p = loom::log_softmax(x, 1).to(DType::Float64).to_vector<double>();
      for (std::size_t i = 0; i < lse.size(); ++i) {
        if (std::isinf(lse[i])) {
          EXPECT_EQ(got[i], lse[i]) << what << ", row " << i;
        } else {
          EXPECT_NEAR(got[i], lse[i], 1e-6) << what << ", row " << i;
        }
      }
      for (std::size_t i = 0; i < log_p.size(); ++i) {
        if (std::isnan(log_p[i])) {
          EXPECT_TRUE(std::isnan(got_p[i])) << what << ", element " << i << ": " << got_p[i];
        } else if (std::isinf(log_p[i])) {
          EXPECT_EQ(got_p[i], log_p[i]) << what << ", element " << i;
        } else {
          EXPECT_NEAR(got_p[i], log_p[i], 1e-6) << what << ", element " << i;
        }
      }
    }
  }
}

// A bfloat16 softmax, log_softmax and logsumexp are computed in float32 and rounded once, as
// PyTorch 1.13's kernels (to within one bfloat16 step of its values, here checked against the
// float64 value): built from bfloat16 ops, every step rounded, log_softmax([40, 39, 38])[0]
// was -0.5 (the value is -0.4076; PyTorch gives -0.40625) and softmax weights were up to a few
// percent off. Traced and eagerly.
TEST(OpBFloat16, TheSoftmaxFamilyRoundsOnce) {
  const std::vector<double> row{0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5};
  double total = 0;
  for (double v : row) total += std::exp(v);
  for (bool eager : {false, true}) {
    loom::EagerModeGuard mode(eager);
    const Tensor x = loom::from_vector<double>(row, {8}).to(DType::BFloat16);
    const auto p = loom::softmax(x, 0).to(DType::Float64).to_vector<double>();
    const auto lp = loom::log_softmax(x, 0).to(DType::Float64).to_vector<double>();
    const double lse = loom::logsumexp(x, {0}).to(DType::Float64).item<double>();
    for (std::size_t i = 0; i < row.size(); ++i) {
      const double want = std::exp(row[i]) / total;
      EXPECT_NEAR(p[i], want, want * 0x1p-8) << (eager ? "eager" : "traced") << ", softmax " << i;
      const double want_log = row[i] - std::log(total);
      EXPECT_NEAR(lp[i], want_log, std::abs(want_log) * 0x1p-8) << (eager ? "eager" : "traced") << ", log_softmax " << i;
    }
    EXPECT_NEAR(lse, std::log(total), std::log(total) * 0x1p-8) << (eager ? "eager" : "traced");
    const Tensor z = loom::from_vector<double>({40, 39, 38}, {3}).to(DType::BFloat16);
    EXPECT_NEAR(loom::log_softmax(z, 0).to(DType::Float64).to_vector<double>()[0], -0.40760596444438, 0x1p-9)
        << (eager ? "eager" : "traced");
  }
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

class RandomTest : public ::testing::TestWithParam<DType> {};

TEST_P(RandomTest, SameSeedGivesSameValues) {
  const DType dt = GetParam();
  EXPECT_EQ(loom::rand({1000}, 42, dt).to_host().bytes, loom::rand({1000}, 42, dt).to_host().bytes);
  EXPECT_EQ(loom::randn({1000}, 42, dt).to_host().bytes,
            loom::randn({1000}, 42, dt).to_host().bytes);
}

TEST_P(RandomTest, DifferentSeedsDiffer) {
  const DType dt = GetParam();
  for (bool normal : {false, true}) {
    auto a = values(normal ? loom::randn({1000}, 1, dt) : loom::rand({1000}, 1, dt));
    auto b = values(normal ? loom::randn({1000}, 2, dt) : loom::rand({1000}, 2, dt));
    int equal = 0;
    for (std::size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
    EXPECT_LT(equal, 10) << (normal ? "randn" : "rand") << ": seeds 1 and 2 agree on " << equal
                         << " of 1000 elements";
  }
}

TEST_P(RandomTest, ElementDependsOnlyOnSeedAndIndex) {
  const DType dt = GetParam();
  auto flat = values(loom::rand({200}, 7, dt));
  auto grid = values(loom::rand({10, 20}, 7, dt));
  auto prefix = values(loom::rand({50}, 7, dt));
  EXPECT_EQ(flat, grid);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), flat.begin()));
}

TEST_P(RandomTest, RandIsUniformOnUnitInterval) {
  const DType dt = GetParam();
  const Tensor t = loom::rand({100, 100}, 123, dt);
  EXPECT_EQ(t.dtype(), dt);
  EXPECT_EQ(t.shape(), (Shape{100, 100}));
  auto v = values(t);
  ASSERT_EQ(v.size(), 10000u);
  for (double x : v) {
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
  }
  EXPECT_NEAR(mean_of(v), 0.5, 0.02);
  EXPECT_NEAR(std_of(v), std::sqrt(1.0 / 12.0), 0.02);
  std::set<double> distinct(v.begin(), v.end());
  EXPECT_GT(distinct.size(), 9900u);
}

TEST_P(RandomTest, RandnIsStandardNormal) {
  const DType dt = GetParam();
  const Tensor t = loom::randn({10000}, 99, dt);
  EXPECT_EQ(t.dtype(), dt);
  auto v = values(t);
  ASSERT_EQ(v.size(), 10000u);
  for (double x : v) ASSERT_TRUE(std::isfinite(x));
  EXPECT_NEAR(mean_of(v), 0.0, 0.05);
  EXPECT_NEAR(std_of(v), 1.0, 0.05);
  int within_one = 0;
  for (double x : v) within_one += std::fabs(x) < 1.0;
  EXPECT_NEAR(within_one / 10000.0, 0.6827, 0.03);
}

TEST_P(RandomTest, UniformAndNormalScale) {
  const DType dt = GetParam();
  auto u = values(loom::uniform({10000}, -2.0, 3.0, 5, dt));
  for (double x : u) {
    ASSERT_GE(x, -2.0);
    ASSERT_LE(x, 3.0);  // float32 rounding may reach the bound, as in PyTorch
  }
  EXPECT_NEAR(mean_of(u), 0.5, 0.1);
  auto n = values(loom::normal({10000}, 4.0, 0.5, 5, dt));
  EXPECT_NEAR(mean_of(n), 4.0, 0.05);
  EXPECT_NEAR(std_of(n), 0.5, 0.03);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RandomTest, ::testing::Values(DType::Float32, DType::Float64),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(loom::dtype_name(info.param));
                         });

}  // namespace
