// Every elementwise op gives the same bits alone (run_kernel, as an unfused instruction runs)
// and inside a fusion (fused_kernel). Lazy, eager and compiled execution all fuse float ops,
// so they cannot see a second implementation of an op drifting from the first (as sigmoid
// once did: std::exp alone, Eigen's logistic fused); this test can.
#include "ir/program.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kernels_fused.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

using ir::Op;

constexpr int64_t kN = 1500;  // several blocks and a ragged tail

// The elementwise ops but Cast: cast_kernel converts between dtypes; a fusion's Cast is a copy.
bool same_dtype_elementwise(Op op) { return ir::is_elementwise(op) && op != Op::Cast; }

template <class T>
std::vector<T> operand(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-8, 8);
  std::vector<T> v(kN);
  for (auto& x : v) x = static_cast<T>(u(rng));
  // Values where approximations part ways: saturation, zeros, infinities, NaN, ties.
  const T special[] = {T(0), -T(0), T(30), T(-30), T(100), T(-100), T(1e-6),
                       std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                       std::numeric_limits<T>::quiet_NaN(), T(1), T(-1)};
  for (std::size_t i = 0; i < std::size(special); ++i) v[i * 7] = special[i];
  return v;
}

template <class T>
void check_op(Op op, DType dtype) {
  std::mt19937_64 rng(static_cast<uint64_t>(op) * 31 + sizeof(T));
  const int arity = ir::op_info(op).arity;
  std::vector<std::vector<T>> data;
  std::vector<uint8_t> cond(kN);
  for (auto& c : cond) c = rng() % 2;
  for (int k = 0; k < arity; ++k) data.push_back(operand<T>(rng));
  // Ties for the comparisons, maximum and minimum.
  if (arity >= 2)
    for (int64_t i = 0; i < kN; i += 5) data[1][i] = data[0][i];

  const bool tests = op == Op::Eq || op == Op::Ne || op == Op::Lt || op == Op::Le ||
                     op == Op::Gt || op == Op::Ge || op == Op::LogicalNot;
  const DType out_dtype = tests ? DType::Bool : dtype;
  std::vector<TensorView> in;
  for (int k = 0; k < arity; ++k) {
    const bool is_cond = op == Op::Where && k == 0;
    in.push_back({is_cond ? static_cast<void*>(cond.data()) : data[k].data(),
                  is_cond ? DType::Bool : dtype, Shape{kN}});
  }
  const std::size_t bytes = kN * dtype_size(out_dtype);
  std::vector<unsigned char> alone(bytes, 0xAB), fused(bytes, 0xCD);
  run_kernel(op, ir::Attr{}, in, TensorView{alone.data(), out_dtype, Shape{kN}});

  // The same op as a one-step fusion, every operand loaded into a register.
  ir::Fusion f;
  f.compute = dtype;
  f.shape = {kN};
  ir::FusedStep step{op, -1, -1, -1, 0, out_dtype};
  int* operands[] = {&step.a, &step.b, &step.c};
  for (int k = 0; k < arity; ++k) {
    f.loads.push_back({k, in[k].dtype, {kN}, {1}});
    *operands[k] = k;
  }
  f.steps.push_back(step);
  f.num_registers = arity + 1;
  for (int v = 0; v <= arity; ++v) f.register_of.push_back(v);
  fused_kernel(f, in, TensorView{fused.data(), out_dtype, Shape{kN}});

  int differ = 0;
  const std::size_t width = dtype_size(out_dtype);
  for (int64_t i = 0; i < kN; ++i)
    if (std::memcmp(alone.data() + i * width, fused.data() + i * width, width) != 0 &&
        ++differ <= 3)
      ADD_FAILURE() << ir::op_name(op) << " " << dtype_name(dtype) << ": element " << i
                    << " differs alone and fused";
  EXPECT_EQ(differ, 0) << ir::op_name(op) << " " << dtype_name(dtype);
}

TEST(ElementwiseKernels, AloneAndFusedAgreeBitForBit) {
  int ops = 0;
  for (int i = 0; i < ir::kOpCount; ++i) {
    const auto op = static_cast<Op>(i);
    if (!same_dtype_elementwise(op)) continue;
    check_op<float>(op, DType::Float32);
    check_op<double>(op, DType::Float64);
    ++ops;
  }
  EXPECT_GE(ops, 30);  // every unary, binary and ternary op but Cast
}

// sqrt and rsqrt are correctly rounded, as PyTorch's and the fused code's (vsqrtps): the
// libm square root (exact in IEEE) for every element, 1 / sqrt with each step rounded,
// and the special values (-0, +Inf, negatives).
template <class T>
void check_square_roots(DType dtype) {
  std::mt19937_64 rng(11);
  std::vector<T> x = operand<T>(rng);
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = std::abs(x[i]) * T(1e3);
  x[1] = std::numeric_limits<T>::denorm_min();
  x[2] = std::numeric_limits<T>::max();
  std::vector<TensorView> in{{x.data(), dtype, Shape{kN}}};
  std::vector<T> root(kN), inverse(kN);
  run_kernel(Op::Sqrt, ir::Attr{}, in, TensorView{root.data(), dtype, Shape{kN}});
  run_kernel(Op::Rsqrt, ir::Attr{}, in, TensorView{inverse.data(), dtype, Shape{kN}});
  int differ = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const T want = std::sqrt(x[i]), want_inverse = T(1) / std::sqrt(x[i]);
    const bool ok = std::memcmp(&root[i], &want, sizeof(T)) == 0 &&
                    std::memcmp(&inverse[i], &want_inverse, sizeof(T)) == 0;
    const bool both_nan = std::isnan(want) && std::isnan(root[i]) && std::isnan(inverse[i]);
    if (!ok && !both_nan && ++differ <= 3)
      ADD_FAILURE() << dtype_name(dtype) << ": sqrt(" << x[i] << ") = " << root[i] << ", rsqrt "
                    << inverse[i] << "; want " << want << ", " << want_inverse;
  }
  EXPECT_EQ(differ, 0) << dtype_name(dtype);
  const T inf = std::numeric_limits<T>::infinity();
  std::vector<T> special{inf, T(0), -T(0), T(-4)};
  std::vector<T> r(4), q(4);
  std::vector<TensorView> sv{{special.data(), dtype, Shape{4}}};
  run_kernel(Op::Sqrt, ir::Attr{}, sv, TensorView{r.data(), dtype, Shape{4}});
  run_kernel(Op::Rsqrt, ir::Attr{}, sv, TensorView{q.data(), dtype, Shape{4}});
  EXPECT_EQ(r[0], inf);
  EXPECT_EQ(q[0], T(0));
  EXPECT_EQ(q[1], inf);
  EXPECT_TRUE(std::signbit(r[2]) && r[2] == T(0));
  EXPECT_EQ(q[2], -inf);
  EXPECT_TRUE(std::isnan(r[3]) && std::isnan(q[3]));
}

TEST(ElementwiseKernels, SquareRootsAreCorrectlyRounded) {
  check_square_roots<float>(DType::Float32);
  check_square_roots<double>(DType::Float64);
}

// Integer and bool operands run the same steps (fusions compute in floating point only).
TEST(ElementwiseKernels, IntegerAndBoolOperands) {
  std::vector<int64_t> a{-3, 0, 5, 7}, b{2, 0, -5, 9};
  std::vector<int64_t> out(4);
  std::vector<TensorView> in{{a.data(), DType::Int64, {4}}, {b.data(), DType::Int64, {4}}};
  run_kernel(Op::Maximum, {}, in, {out.data(), DType::Int64, {4}});
  EXPECT_EQ(out, (std::vector<int64_t>{2, 0, 5, 9}));
  run_kernel(Op::Sub, {}, in, {out.data(), DType::Int64, {4}});
  EXPECT_EQ(out, (std::vector<int64_t>{-5, 0, 10, -2}));
  run_kernel(Op::Relu, {}, {in.data(), 1}, {out.data(), DType::Int64, {4}});
  EXPECT_EQ(out, (std::vector<int64_t>{0, 0, 5, 7}));

  std::vector<uint8_t> lt(4), cond{1, 0, 1, 0}, not_cond(4);
  run_kernel(Op::Lt, {}, in, {lt.data(), DType::Bool, {4}});
  EXPECT_EQ(lt, (std::vector<uint8_t>{1, 0, 0, 1}));
  std::vector<int32_t> x{1, 2, 3, 4}, y{-1, -2, -3, -4}, picked(4);
  std::vector<TensorView> where_in{{cond.data(), DType::Bool, {4}},
                                   {x.data(), DType::Int32, {4}},
                                   {y.data(), DType::Int32, {4}}};
  run_kernel(Op::Where, {}, where_in, {picked.data(), DType::Int32, {4}});
  EXPECT_EQ(picked, (std::vector<int32_t>{1, -2, 3, -4}));
  run_kernel(Op::LogicalNot, {}, {where_in.data(), 1}, {not_cond.data(), DType::Bool, {4}});
  EXPECT_EQ(not_cond, (std::vector<uint8_t>{0, 1, 0, 1}));
  std::vector<uint8_t> same(4);
  std::vector<TensorView> bools{{cond.data(), DType::Bool, {4}}, {lt.data(), DType::Bool, {4}}};
  run_kernel(Op::Eq, {}, bools, {same.data(), DType::Bool, {4}});
  EXPECT_EQ(same, (std::vector<uint8_t>{1, 1, 0, 0}));
}

// A fusion over [N, C, plane] whose values each have their own register.
ir::Fusion fusion_over(int64_t n, std::vector<ir::FusedLoad> loads, std::vector<ir::FusedStep> steps) {
  ir::Fusion f;
  f.compute = DType::Float32;
  f.shape = {n};
  f.loads = std::move(loads);
  f.steps = std::move(steps);
  f.num_registers = static_cast<int>(f.loads.size() + f.steps.size());
  for (int v = 0; v < f.num_registers; ++v) f.register_of.push_back(v);
  return f;
}

// A per-channel operand ([1, C, 1] over [N, C, plane]) is read as one value per plane, or
// copied where a block holds several planes; steps on such values alone are computed once. Each
// element is still what the operand written out in full gives, bit for bit, for planes shorter
// and longer than a block and not dividing it.
TEST(ElementwiseKernels, BroadcastOperandsGiveTheMaterialisedBits) {
  const Op binary[] = {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Pow, Op::Maximum, Op::Minimum, Op::Lt};
  // Batch 9 spans enough periods (channels x plane) for the short planes' operands to be
  // written out once per thread and read in place (pattern_period in kernels_fused.cpp).
  for (int64_t batch : {3, 9})
  for (int64_t plane : {1, 3, 30, 64, 100, 200, 700, 1030}) {
    const int64_t channels = 5, n = batch * channels * plane;
    std::mt19937_64 rng(static_cast<uint64_t>(plane));
    std::uniform_real_distribution<double> u(0.1, 4);
    std::vector<float> x(n), per_channel(channels), full(n);
    for (auto& v : x) v = static_cast<float>(u(rng)) - 2;
    for (auto& v : per_channel) v = static_cast<float>(u(rng));
    for (int64_t i = 0; i < n; ++i) full[i] = per_channel[i / plane % channels];
    const ir::FusedLoad x_load{0, DType::Float32, {n}, {1}};
    const ir::FusedLoad broadcast{1, DType::Float32, {batch, channels, plane}, {0, 1, 0}};
    const ir::FusedLoad materialised{2, DType::Float32, {n}, {1}};
    const std::vector<TensorView> in{{x.data(), DType::Float32, {n}},
                                     {per_channel.data(), DType::Float32, {1, channels, 1}},
                                     {full.data(), DType::Float32, {n}}};
    auto expect_same = [&](const std::vector<ir::FusedStep>& steps, DType out_dtype, const std::string& what) {
      const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(out_dtype);
      std::vector<unsigned char> want(bytes, 0xAB), got(bytes, 0xCD);
      fused_kernel(fusion_over(n, {x_load, materialised}, steps), in, {want.data(), out_dtype, {n}});
      fused_kernel(fusion_over(n, {x_load, broadcast}, steps), in, {got.data(), out_dtype, {n}});
      EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0) << what << ", batch " << batch << ", plane " << plane;
    };
    for (Op op : binary) {
      const DType out = op == Op::Lt ? DType::Bool : DType::Float32;
      expect_same({{op, 0, 1, -1, 0, out}}, out, std::string(ir::op_name(op)) + "(x, c)");
      expect_same({{op, 1, 0, -1, 0, out}}, out, std::string(ir::op_name(op)) + "(c, x)");
    }
    // A batch-norm-like chain: rsqrt(c + 0.5) once per plane, then per element.
    const std::vector<ir::FusedStep> chain{
        {Op::Constant, -1, -1, -1, 0.5, DType::Float32},  // v2
        {Op::Add, 1, 2, -1, 0, DType::Float32},           // v3 = c + 0.5
        {Op::Rsqrt, 3, -1, -1, 0, DType::Float32},        // v4
        {Op::Mul, 0, 4, -1, 0, DType::Float32},           // v5 = x * v4
        {Op::Gt, 5, 2, -1, 0, DType::Bool},               // v6
        {Op::Where, 6, 5, 2, 0, DType::Float32}};         // v7
    expect_same(chain, DType::Float32, "chain");
    // A result that is one value throughout.
    expect_same({{Op::Mul, 1, 1, -1, 0, DType::Float32}}, DType::Float32, "c * c");
  }
}

// A result written over its operand (a donated buffer) is still right.
TEST(ElementwiseKernels, ResultOverItsOperand) {
  std::vector<double> x{-1.5, -0.25, 0.5, 2};
  std::vector<double> want(4);
  const double k = 0.79788456080286535588;
  for (int i = 0; i < 4; ++i)
    want[i] = 0.5 * x[i] * (1 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  TensorView v{x.data(), DType::Float64, {4}};
  run_kernel(Op::GeluTanh, {}, {&v, 1}, v);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], want[i], 1e-12) << i;
}

}  // namespace
}  // namespace loom::runtime
