// bfloat16 and mixed precision: the conversion (loom/bfloat16.h), the compiler's widening of
// bfloat16 arithmetic (compiler/widen.h) and its fusion, the Autocast scope (loom/autocast.h)
// forward and backward, its capture guard, and the Trainer's --precision.
// (op_harness_test.cpp checks every op in bfloat16 against float32 on the same values.)
#include "test_util.h"

#include <loom/autocast.h>
#include <loom/autograd.h>
#include <loom/bfloat16.h>
#include <loom/compile.h>
#include <loom/nn/layers.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace loom {
namespace {

uint16_t bits_of(float f) { return bfloat16(f).bits; }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// ---- the conversion ----

TEST(BFloat16, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1.
  EXPECT_EQ(bits_of(1.0f + 0x1p-8f), bits_of(1.0f));
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  // Just above half: up; just below: down.
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 0x1p-8f - 0x1p-20f)), 1.0f);
  EXPECT_EQ(static_cast<float>(bfloat16(-2.5f)), -2.5f);
  EXPECT_EQ(static_cast<float>(bfloat16(3.14159f)), 3.140625f);
}

TEST(BFloat16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(static_cast<float>(bfloat16(inf)), inf);
  EXPECT_EQ(static_cast<float>(bfloat16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(std::nanf("")))));
  // A NaN whose payload sits in the low half only must not round to infinity.
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::signbit(static_cast<float>(bfloat16(from_bits(0xff800001u)))));
  // Beyond the largest bfloat16 (0x7f7f): infinity, as PyTorch rounds it.
  EXPECT_EQ(static_cast<float>(bfloat16(std::numeric_limits<float>::max())), inf);
  EXPECT_EQ(bits_of(-0.0f), 0x8000);
  // Subnormals round like any other value.
  EXPECT_EQ(bits_of(from_bits(0x00008000u)), 0x0000);  // a tie, to even (0)
  EXPECT_EQ(bits_of(from_bits(0x00018000u)), 0x0002);  // a tie, to even (2)
}

TEST(BFloat16, EveryBFloat16RoundTripsExactly) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = from_bits(b << 16);
    if (std::isnan(f)) continue;
    ASSERT_EQ(bits_of(f), b) << std::hex << b;
  }
}

// Random floats and every kind of tie, through the device's cast (a fusion's rounding step
// and cast_kernel), against the host's conversion: the same bits.
std::vector<float> awkward_floats() {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> any;
  std::vector<float> v;
  for (int i = 0; i < 40000; ++i) {
    const float f = from_bits(any(gen));
    if (!std::isnan(f)) v.push_back(f);
  }
  for (int i = 0; i < 10000; ++i) v.push_back(from_bits((any(gen) & 0xffff0000u) | 0x8000u));  // ties
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(-0.0f);
  return v;
}

TEST(BFloat16, DeviceCastsRoundAsTheHostDoes) {
  test::fresh_engine();
  const auto v = awkward_floats();
  const int64_t n = static_cast<int64_t>(v.size());
  const Tensor x = from_vector(v, {n});
  // Lazy (the cast heads a fusion that stores bfloat16), then eager (cast_kernel alone), then
  // a cast inside a chain (a rounding step in a float32 fusion).
  const Tensor lazy = x.to(DType::BFloat16);
  Tensor eager, chained;
  {
    EagerModeGuard on(true);
    eager = x.to(DType::BFloat16);
  }
  chained = (x * 1.0).to(DType::BFloat16).to(DType::Float32);
  const HostTensor l = lazy.to_host(), e = eager.to_host();
  const auto c = chained.to_vector<float>();
  ASSERT_EQ(l.bytes.size(), v.size() * 2);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t lb, eb;
    std::memcpy(&lb, l.bytes.data() + 2 * i, 2);
    std::memcpy(&eb, e.bytes.data() + 2 * i, 2);
    ASSERT_EQ(lb, bits_of(v[i])) << "lazy, element " << i << " = " << v[i];
    ASSERT_EQ(eb, bits_of(v[i])) << "eager, element " << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(c[i]), uint32_t{bits_of(v[i])} << 16) << "chained, element " << i;
  }
}

// ---- the compiler ----

TEST(Widen, BFloat16ArithmeticRunsInFloat32AndFusesWithItsCasts) {
  test::fresh_engine();
  const Tensor a = from_vector(std::vector<float>{1.5f, -2.25f, 3.0f, 0.1f}, {4}).to(DType::BFloat16);
  const Tensor b = from_vector(std::vector<float>{0.5f, 4.0f, -1.0f, 0.2f}, {4}).to(DType::BFloat16);
  mark_step();
  const Tensor y = exp(a * b + a);  // three bfloat16 ops, each rounded
  const ir::Program p = test::compile_for_cpu(test::graph_of(y));
  ASSERT_EQ(p.instrs.size(), 1u) << "one fusion loads bfloat16 and stores it:\n" << ir::to_text(p);
  const auto& f = *p.instrs[0].fusion;
  EXPECT_EQ(f.compute, DType::Float32);
  EXPECT_EQ(p.instrs[0].dtype, DType::BFloat16);
  int rounding = 0;
  for (const auto& s : f.steps) rounding += s.op == ir::Op::Cast && s.dtype == DType::BFloat16;
  EXPECT_EQ(rounding, 3) << "each op's result is rounded:\n" << ir::to_text(p);
  // The value: each op in float32 on the bfloat16 values, rounded after each.
  const auto av = a.to(DType::Float32).to_vector<float>(), bv = b.to(DType::Float32).to_vector<float>();
  const auto got = y.to(DType::Float32).to_vector<float>();
  for (int i = 0; i < 4; ++i) {
    const float m = round_to_bfloat16(av[i] * bv[i]);
    const float s = round_to_bfloat16(m + av[i]);
    const float want = round_to_bfloat16(static_cast<float>(
        exp(from_vector(std::vector<float>{s}, {1})).to_vector<float>()[0]));
    EXPECT_EQ(got[i], want) << i;
  }
}

TEST(Widen, ReductionsOfBFloat16AccumulateInFloat32) {
  test::fresh_engine();
  // 4096 ones and one 1/256: a bfloat16 accumulator would stop growing at 256.
  std::vector<float> v(4097, 1.0f);
  const Tensor x = from_vector(v, {4097}).to(DType::BFloat16);
  const Tensor s = sum(x);
  EXPECT_EQ(s.dtype(), DType::BFloat16);
  EXPECT_EQ(s.to(DType::Float32).item<float>(), 4096.0f);  // 4097 rounds to 4096 once
}

// ---- autocast ----

std::vector<float> grid(int64_t n, int64_t seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + seed * 11) % 29 - 14) / 7.0f + 0.013f * static_cast<float>(i % 5);
  return v;
}

TEST(Autocast, MatmulComputesInBFloat16AndReturnsFloat32) {
  test::fresh_engine();
  const int64_t m = 5, k = 64, n = 7;
  const auto av = grid(m * k, 1), bv = grid(k * n, 2);
  const Tensor a = from_vector(av, {m, k}), b = from_vector(bv, {k, n});
  Tensor y;
  {
    Autocast bf16;
    EXPECT_EQ(autocast_precision(), Precision::BFloat16);
    y = matmul(a, b);
    {
      Autocast off(Precision::Float32);
      EXPECT_EQ(matmul(a, b).dtype(), DType::Float32);
      EXPECT_EQ(test::count_ops(test::graph_of(matmul(a, b)), ir::Op::Cast), 0) << "no autocast inside fp32";
    }
  }
  EXPECT_EQ(autocast_precision(), Precision::Float32);
  EXPECT_EQ(y.dtype(), DType::Float32);
  bool bf16_matmul = false;
  for (const auto& node : test::graph_of(y).nodes)
    bf16_matmul = bf16_matmul || (node->op() == ir::Op::Matmul && node->dtype() == DType::BFloat16);
  EXPECT_TRUE(bf16_matmul) << ir::to_text(test::graph_of(y));
  // The reference: products of the bfloat16 operands summed exactly (double), rounded once.
  // The device sums in float32 first, so a result may sit one bfloat16 step away at a tie.
  const auto got = y.to_vector<float>();
  int exact = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc += double(round_to_bfloat16(av[i * k + p])) * double(round_to_bfloat16(bv[p * n + j]));
      const float want = round_to_bfloat16(static_cast<float>(acc));
      const float g = got[i * n + j];
      EXPECT_EQ(g, round_to_bfloat16(g)) << "the product is rounded to bfloat16";
      EXPECT_NEAR(g, want, std::abs(want) * 0x1p-7 + 1e-6) << i << "," << j;
      exact += g == want;
    }
  EXPECT_GE(exact, m * n * 9 / 10);
}

// A float32 operand with a bfloat16 one (a bfloat16 weight, cache or activation) is autocast
// as PyTorch does, to the float32 result of the bfloat16 op: it was refused as operands of two
// dtypes. Two bfloat16 operands stay the plain bfloat16 op.
TEST(Autocast, AFloat32OperandWithABFloat16OneIsCast) {
  test::fresh_engine();
  const Tensor a = from_vector(grid(4 * 8, 1), {4, 8}), b = from_vector(grid(8 * 3, 2), {8, 3});
  const Tensor x = from_vector(grid(2 * 2 * 5 * 5, 3), {2, 2, 5, 5}), w = from_vector(grid(3 * 2 * 3 * 3, 4), {3, 2, 3, 3});
  const Tensor bias = from_vector(std::vector<float>{0.5f, -1, 2}, {3});
  Autocast bf16;
  const Tensor both_f32 = matmul(a, b), mixed = matmul(a, b.to(DType::BFloat16)), mixed_t = matmul(a.to(DType::BFloat16), b);
  EXPECT_EQ(mixed.dtype(), DType::Float32);
  EXPECT_EQ(mixed.to_vector<float>(), both_f32.to_vector<float>());
  EXPECT_EQ(mixed_t.to_vector<float>(), both_f32.to_vector<float>());
  EXPECT_EQ(matmul(a.to(DType::BFloat16), b.to(DType::BFloat16)).dtype(), DType::BFloat16);
  const Tensor conv = conv2d(x, w, bias), conv_mixed = conv2d(x, w.to(DType::BFloat16), bias.to(DType::BFloat16));
  EXPECT_EQ(conv_mixed.dtype(), DType::Float32);
  EXPECT_EQ(conv_mixed.to_vector<float>(), conv.to_vector<float>());  // the bias is exact in bfloat16
  // A Linear layer with bfloat16 parameters takes a float32 input (its bias added in float32).
  nn::Linear layer(8, 3);
  layer.weight = layer.weight.to(DType::BFloat16).detach();
  layer.bias = layer.bias.to(DType::BFloat16).detach();
  EXPECT_EQ(layer.forward(a).dtype(), DType::Float32);
}

TEST(Autocast, GradientsFlowBackAsFloat32) {
  test::fresh_engine();
  const Tensor x = from_vector(grid(2 * 3 * 8 * 8, 3), {2, 3, 8, 8});
  auto w32 = from_vector(grid(4 * 3 * 3 * 3, 4), {4, 3, 3, 3}).requires_grad_();
  auto w16 = from_vector(grid(4 * 3 * 3 * 3, 4), {4, 3, 3, 3}).requires_grad_();
  auto l32 = from_vector(grid(4 * 8 * 8 * 5, 5), {4 * 8 * 8, 5}).requires_grad_();
  auto l16 = from_vector(grid(4 * 8 * 8 * 5, 5), {4 * 8 * 8, 5}).requires_grad_();
  auto loss_of = [&](const Tensor& w, const Tensor& l) {
    const Tensor h = relu(conv2d(x, w, {}, {.padding = {1, 1}}));
    const Tensor z = matmul(reshape(h, {2, 4 * 8 * 8}), l);
    return mean(z * z);
  };
  const Tensor ref = loss_of(w32, l32);
  ref.backward();
  Tensor mixed;
  {
    Autocast bf16;
    mixed = loss_of(w16, l16);
  }
  mixed.backward();
  EXPECT_EQ(mixed.dtype(), DType::Float32);
  int bf16_grads = 0;
  for (const auto& node : test::graph_of(w16.grad()).nodes)
    bf16_grads += (node->op() == ir::Op::Conv2dGradWeight && node->dtype() == DType::BFloat16);
  EXPECT_EQ(bf16_grads, 1) << "the weight gradient's convolution runs in bfloat16";
  ASSERT_EQ(w16.grad().dtype(), DType::Float32);
  ASSERT_EQ(l16.grad().dtype(), DType::Float32);
  EXPECT_NEAR(mixed.item<float>(), ref.item<float>(), 2e-2 * std::abs(ref.item<float>()));
  for (auto [g16, g32] : {std::pair{w16.grad(), w32.grad()}, std::pair{l16.grad(), l32.grad()}}) {
    const auto a = g16.to_vector<float>(), b = g32.to_vector<float>();
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += b[i] * b[i];
    }
    // Each gradient goes through up to four roundings to bfloat16 (2^-9 each: the conv and
    // matmul results forward, the backward GEMMs' operands and results): a few percent.
    EXPECT_LT(std::sqrt(num / den), 3e-2) << "relative error of a bfloat16 gradient";
    EXPECT_GT(std::sqrt(num / den), 0) << "the bfloat16 run must differ from float32 somewhere";
  }
}

// autocast_round: bfloat16's values, still float32, inside a bfloat16 scope, and its gradient
// rounded likewise; outside one (or for another dtype), the tensor itself.
TEST(Autocast, RoundKeepsBFloat16ValuesInsideAScopeOnly) {
  test::fresh_engine();
  const auto xv = grid(64, 8), cv = grid(64, 9);
  auto x = from_vector(xv, {64}).requires_grad_();
  const Tensor c = from_vector(cv, {64}) * 1.001f;  // not bfloat16 values
  EXPECT_EQ(autocast_round(x).impl(), x.impl()) << "float32 precision: x itself";
  Tensor r, loss;
  {
    Autocast bf16;
    const Tensor i = from_vector<int64_t>({1, 2}, {2});
    EXPECT_EQ(autocast_round(i).impl(), i.impl()) << "not float32: itself";
    r = autocast_round(x);
    loss = sum(r * c);
  }
  EXPECT_EQ(r.dtype(), DType::Float32);
  loss.backward();
  const auto rv = r.to_vector<float>(), g = x.grad().to_vector<float>(),
             cw = c.to_vector<float>();
  int moved = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    EXPECT_EQ(rv[i], round_to_bfloat16(xv[i])) << i;
    EXPECT_EQ(g[i], round_to_bfloat16(cw[i])) << "the gradient is rounded too: " << i;
    moved += rv[i] != xv[i];
  }
  EXPECT_GT(moved, 0);
}

TEST(Autocast, CapturedStepIsReplayedOnlyUnderItsPrecision) {
  test::fresh_engine();
  const Tensor a = from_vector(grid(16 * 16, 6), {16, 16});
  const Tensor b = from_vector(grid(16 * 16, 7), {16, 16});
  Tensor out;
  auto step = compile([&](const Tensor& x) { return matmul(x, b); });
  for (int i = 0; i < 3; ++i) out = step(a);
  EXPECT_GT(metrics::counter("CaptureReplay"), 0);
  const auto fp32 = out.to_vector<float>();
  {
    Autocast bf16;
    out = step(a);
  }
  EXPECT_EQ(metrics::counter("GuardFailAutocast"), 1);
  const auto mixed = out.to_vector<float>();
  bool differs = false;
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    differs = differs || mixed[i] != fp32[i];
    EXPECT_EQ(mixed[i], round_to_bfloat16(mixed[i])) << "traced under autocast: rounded";
  }
  EXPECT_TRUE(differs);
}

TEST(Precision, ParsesItsNamesAndRejectsOthers) {
  EXPECT_EQ(parse_precision("bf16"), Precision::BFloat16);
  EXPECT_EQ(parse_precision("fp32"), Precision::Float32);
  EXPECT_EQ(parse_precision("bfloat16"), Precision::BFloat16);
  EXPECT_NE(test::error_of([] { parse_precision("fp16"); }).find("fp16"), std::string::npos);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BFloat16);
  EXPECT_EQ(dtype_size(DType::BFloat16), 2u);
  EXPECT_NE(test::error_of([] { parse_dtype("half"); }).find("bfloat16"), std::string::npos);
}

}  // namespace
}  // namespace loom
