// The fusions' machine code (fused_jit.h) gives the block evaluator's bits, on every instruction
// set this CPU has (AVX2, AVX-512): random chains of the steps it takes, over operands read in
// place (float32; bfloat16 and bool widened by the code), as per-channel splats (planes longer
// and shorter than the splat threshold), as scalars and converted from bool, with NaN, infinities,
// signed zeros, ties and bfloat16 rounding ties among the values, and results of every length
// (full vectors and tails), stored directly, converted (bool, bfloat16), narrowed to bfloat16 or
// bool by the code itself, or over an operand.
#include "ir/program.h"
#include "loom/bfloat16.h"
#include "runtime/cpu/fused_jit.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kernels_fused.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

// Whether the float32 or bfloat16 stored at p is a NaN.
bool is_nan_stored(const unsigned char* p, DType dtype) {
  if (dtype == DType::BFloat16) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return (bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0;
  }
  float v;
  std::memcpy(&v, p, sizeof v);
  return std::isnan(v);
}

using ir::Op;

float special(std::mt19937_64& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  const float values[] = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          // bfloat16 ties (to even down, to even up), the largest finite float
                          std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u),
                          std::numeric_limits<float>::max(), 1e-40f};
  return values[rng() % std::size(values)];
}

// A random fusion over [batch, channels, plane] and its operands.
struct Case {
  ir::Fusion fusion;
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<uint8_t>> bools;
  std::vector<bfloat16> halves;
  std::vector<TensorView> in;
  std::string text;  // the steps, for failure messages
};

Case random_case(std::mt19937_64& rng, int64_t batch, int64_t channels, int64_t plane, int n_steps) {
  Case c;
  const int64_t n = batch * channels * plane;
  std::uniform_real_distribution<float> u(-3, 3);
  auto values = [&](int64_t count) {
    std::vector<float> v(count);
    for (auto& x : v) x = rng() % 8 == 0 ? special(rng) : u(rng);
    return v;
  };
  // Operands: two full ones (the second equal to the first in places: ties), a per-channel
  // one, a scalar, a bool mask, a bfloat16 one (the first, rounded).
  c.floats.push_back(values(n));
  c.floats.push_back(values(n));
  for (int64_t i = 0; i < n; i += 3) c.floats[1][i] = c.floats[0][i];
  c.floats.push_back(values(channels));
  c.floats.push_back(values(1));
  c.bools.emplace_back(n);
  for (auto& b : c.bools[0]) b = rng() % 2;
  for (float x : c.floats[0]) c.halves.push_back(bfloat16(x));
  c.in = {{c.floats[0].data(), DType::Float32, {n}},
          {c.floats[1].data(), DType::Float32, {n}},
          {c.floats[2].data(), DType::Float32, {1, channels, 1}},
          {c.floats[3].data(), DType::Float32, {1}},
          {c.bools[0].data(), DType::Bool, {n}},
          {c.halves.data(), DType::BFloat16, {n}}};
  auto& f = c.fusion;
  f.compute = DType::Float32;
  f.shape = {n};
  f.loads = {{0, DType::Float32, {n}, {1}},
             {1, DType::Float32, {n}, {1}},
             {2, DType::Float32, {batch, channels, plane}, {0, 1, 0}},
             {3, DType::Float32, {n}, {0}},
             {4, DType::Bool, {n}, {1}},
             {5, DType::BFloat16, {n}, {1}}};
  const Op binary[] = {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum,
                       Op::Eq, Op::Ne, Op::Lt, Op::Le, Op::Gt, Op::Ge};
  const Op unary[] = {Op::Neg, Op::Abs, Op::Relu, Op::LogicalNot, Op::Cast, Op::Sqrt, Op::Rsqrt};
  const DType casts[] = {DType::Bool, DType::BFloat16, DType::Float32};
  int values_so_far = static_cast<int>(f.loads.size());
  auto pick = [&] {
    // Mostly recent values, so chains grow long; sometimes any.
    return rng() % 3 == 0 ? static_cast<int>(rng() % values_so_far)
                          : values_so_far - 1 - static_cast<int>(rng() % std::min(values_so_far, 3));
  };
  for (int s = 0; s < n_steps; ++s) {
    ir::FusedStep step{Op::Add, -1, -1, -1, 0, DType::Float32};
    const auto kind = rng() % 10;
    if (kind < 5) {
      step.op = binary[rng() % std::size(binary)];
      step.a = pick();
      step.b = static_cast<int>(rng() % values_so_far);
    } else if (kind < 8) {
      step.op = unary[rng() % std::size(unary)];
      step.a = pick();
      if (step.op == Op::Cast) step.dtype = casts[rng() % std::size(casts)];
    } else if (kind < 9) {
      step.op = Op::Where;
      step.a = pick();
      step.b = static_cast<int>(rng() % values_so_far);
      step.c = static_cast<int>(rng() % values_so_far);
    } else {
      step.op = Op::Constant;
      const double constants[] = {0.0, -0.5, 2.0, std::nan("")};
      step.scalar = constants[rng() % std::size(constants)];
    }
    c.text += std::string(ir::op_name(step.op)) + "(" + std::to_string(step.a) + "," +
              std::to_string(step.b) + "," + std::to_string(step.c) + ") ";
    f.steps.push_back(step);
    ++values_so_far;
  }
  // Every value has its own register; loads read in place have none (as the fusion pass lays
  // them out: contiguous operands of the compute type).
  f.num_registers = values_so_far;
  for (int v = 0; v < values_so_far; ++v) f.register_of.push_back(v < 2 ? -1 : v);
  return c;
}

std::vector<unsigned char> run(const Case& c, DType out_dtype, const FusedCode* code, bool over_operand) {
  const int64_t n = c.fusion.shape[0];
  std::vector<unsigned char> out(static_cast<std::size_t>(n) * dtype_size(out_dtype), 0xAB);
  if (over_operand) {  // the result written over its first operand (a donated buffer)
    std::vector<float> operand = c.floats[0];
    std::vector<TensorView> in = c.in;
    in[0].data = operand.data();
    fused_kernel(c.fusion, in, {operand.data(), DType::Float32, {n}}, code);
    std::memcpy(out.data(), operand.data(), out.size());
  } else {
    fused_kernel(c.fusion, c.in, {out.data(), out_dtype, {n}}, code);
  }
  return out;
}

// The case with a rounding to bfloat16 appended: a result the code may store as bfloat16.
Case rounded(const Case& c) {
  Case r = c;
  const int last = static_cast<int>(r.fusion.loads.size() + r.fusion.steps.size()) - 1;
  r.fusion.steps.push_back({Op::Cast, last, -1, -1, 0, DType::BFloat16});
  r.fusion.register_of.push_back(r.fusion.num_registers++);
  r.text += "Cast(bfloat16)";
  return r;
}

TEST(FusedCode, GivesTheEvaluatorsBitsOnRandomChains) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  for (FusedIsa isa : fused_isas()) {
    SCOPED_TRACE(fused_isa_name(isa));
    std::mt19937_64 rng(7);
    int compiled = 0, cases = 0, narrowed = 0, widened = 0;
    for (int64_t plane : {1, 5, 100, 128, 300, 1024, 2100}) {
      for (int trial = 0; trial < 12; ++trial) {
        // Short planes over larger batches: the per-channel operand then becomes a pattern
        // written out once (kernels_fused.cpp's pattern_period).
        const int64_t batch = plane < 128 ? 4 + static_cast<int64_t>(rng() % 40) : 1 + static_cast<int64_t>(rng() % 3);
        const int64_t channels = 1 + static_cast<int64_t>(rng() % 4);
        const Case c = random_case(rng, batch, channels, plane, 1 + static_cast<int>(rng() % 12));
        const auto code = compile_fused_code(c.fusion, DType::Float32, isa);
        // Every step here is one the code takes, so there is code exactly when the result
        // depends on an operand read element by element (not only on splats: the per-channel
        // operand is one where its planes are long, the scalar always).
        std::vector<bool> per_element{true, true, plane < 128, false, true, true};
        for (const auto& s : c.fusion.steps)
          per_element.push_back((s.a >= 0 && per_element[s.a]) || (s.b >= 0 && per_element[s.b]) ||
                                (s.c >= 0 && per_element[s.c]));
        ++cases;
        EXPECT_EQ(code != nullptr, per_element.back()) << "plane " << plane << ": " << c.text;
        if (!code) continue;
        ++compiled;
        // The code widens the bfloat16 operand and converts the bool mask itself (AVX2 too,
        // its tail through the stack).
        const bool in_place = code->loads()[5] == FusedCode::Load::BFloat16Elements;
        EXPECT_TRUE(in_place);
        EXPECT_EQ(code->loads()[4], FusedCode::Load::BoolElements);
        widened += in_place;
        for (DType out_dtype : {DType::Float32, DType::Bool, DType::BFloat16}) {
          const auto want = run(c, out_dtype, nullptr, false);
          const auto got = run(c, out_dtype, code.get(), false);
          EXPECT_EQ(want, got) << dtype_name(out_dtype) << " plane " << plane << ": " << c.text;
        }
        EXPECT_EQ(run(c, DType::Float32, nullptr, true), run(c, DType::Float32, code.get(), true))
            << "over its operand, plane " << plane << ": " << c.text;
        // Rounded to bfloat16 at the end: the code stores the bfloat16 result itself.
        const Case r = rounded(c);
        const auto narrow = compile_fused_code(r.fusion, DType::BFloat16, isa);
        ASSERT_NE(narrow, nullptr) << r.text;
        EXPECT_TRUE(narrow->narrows());
        narrowed += narrow->narrows();
        EXPECT_EQ(run(r, DType::BFloat16, nullptr, false), run(r, DType::BFloat16, narrow.get(), false))
            << "narrowed, plane " << plane << ": " << r.text;
        // Stored as bool: the code writes the bytes itself.
        const auto bytes = compile_fused_code(c.fusion, DType::Bool, isa);
        ASSERT_NE(bytes, nullptr) << c.text;
        EXPECT_TRUE(bytes->narrows());
        EXPECT_EQ(run(c, DType::Bool, nullptr, false), run(c, DType::Bool, bytes.get(), false))
            << "as bool, plane " << plane << ": " << c.text;
      }
    }
    // Most chains read an operand element by element: the comparisons above ran the code.
    EXPECT_GT(compiled, cases / 2) << compiled << " of " << cases << " chains compiled";
    EXPECT_EQ(narrowed, compiled);
    EXPECT_EQ(widened, compiled);
  }
}

// Each step the code takes, alone, on every pair of special values (and ordinary ones), over
// a length with a tail, from float32 and from bfloat16 operands (the specials rounded): the same
// bits as the evaluator; stored as bool, and a rounding step stored as bfloat16, too.
TEST(FusedCode, EachStepGivesTheEvaluatorsBitsOnSpecialValues) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> specials{0.0f, -0.0f, 1.0f, -1.0f, 2.5f, -2.5f, inf, -inf, nan, -nan,
                                    std::bit_cast<float>(0x7f800001u),  // a signalling NaN
                                    std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u),
                                    std::bit_cast<float>(0xbf808000u), std::bit_cast<float>(0x7f7f8000u),
                                    std::numeric_limits<float>::max(), 1e-40f, -1e-40f};
  std::vector<float> a, b, c;
  for (float x : specials)
    for (float y : specials) {
      a.push_back(x);
      b.push_back(y);
      c.push_back(-y);
    }
  const int64_t n = static_cast<int64_t>(a.size());  // 324: 40 (20) vectors and a tail of 4
  std::vector<bfloat16> ha, hb, hc;
  for (int64_t i = 0; i < n; ++i) {
    ha.push_back(bfloat16(a[i]));
    hb.push_back(bfloat16(b[i]));
    hc.push_back(bfloat16(c[i]));
  }
  const std::vector<TensorView> floats{{a.data(), DType::Float32, {n}}, {b.data(), DType::Float32, {n}},
                                       {c.data(), DType::Float32, {n}}};
  const std::vector<TensorView> halves{{ha.data(), DType::BFloat16, {n}}, {hb.data(), DType::BFloat16, {n}},
                                       {hc.data(), DType::BFloat16, {n}}};
  std::vector<ir::FusedStep> steps;
  for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum, Op::Eq, Op::Ne, Op::Lt,
                Op::Le, Op::Gt, Op::Ge})
    steps.push_back({op, 0, 1, -1, 0, DType::Float32});
  steps.push_back({Op::Where, 0, 1, 2, 0, DType::Float32});
  for (Op op : {Op::Neg, Op::Abs, Op::Relu, Op::LogicalNot, Op::Sqrt, Op::Rsqrt})
    steps.push_back({op, 0, -1, -1, 0, DType::Float32});
  for (DType to : {DType::Bool, DType::BFloat16, DType::Float32}) steps.push_back({Op::Cast, 0, -1, -1, 0, to});
  for (FusedIsa isa : fused_isas()) {
    for (DType operands : {DType::Float32, DType::BFloat16}) {
      const auto& in = operands == DType::Float32 ? floats : halves;
      for (const auto& step : steps) {
        ir::Fusion f;
        f.compute = DType::Float32;
        f.shape = {n};
        f.loads = {{0, operands, {n}, {1}}, {1, operands, {n}, {1}}, {2, operands, {n}, {1}}};
        f.steps = {step};
        f.num_registers = 4;
        // Float32 operands are read in place; bfloat16 ones are converted into a register (or
        // widened by the code).
        if (operands == DType::Float32) f.register_of = {-1, -1, -1, 3};
        else f.register_of = {0, 1, 2, 3};
        const std::string what = std::string(fused_isa_name(isa)) + ": " + ir::op_name(step.op) + " to " +
                                 dtype_name(step.dtype) + " from " + dtype_name(operands);
        const bool rounds = step.op == Op::Cast && step.dtype == DType::BFloat16;
        for (DType out : {DType::Float32, DType::BFloat16, DType::Bool}) {
          if (out == DType::BFloat16 && !rounds) continue;
          const auto code = compile_fused_code(f, out, isa);
          ASSERT_NE(code, nullptr) << what;
          EXPECT_EQ(code->narrows(), out != DType::Float32) << what;
          const auto size = static_cast<std::size_t>(n) * dtype_size(out);
          std::vector<unsigned char> want(size), got(size);
          fused_kernel(f, in, {want.data(), out, {n}});
          fused_kernel(f, in, {got.data(), out, {n}}, code.get());
          const std::size_t width = dtype_size(out);
          for (std::size_t i = 0; i < size; i += width) {
            // Which of two NaN operands an add or a product returns is up to the compiler
            // (C++ leaves it open; x86 takes the first source, and a compiler may commute the
            // evaluator's a + b: GCC does under -fsanitize=undefined). Such a result only has
            // to be a NaN on both sides; every other result, the bits.
            const std::size_t e = i / width;
            if (std::isnan(a[e]) && std::isnan(b[e]) && out != DType::Bool &&
                is_nan_stored(&want[i], out) && is_nan_stored(&got[i], out))
              continue;
            ASSERT_EQ(0, std::memcmp(&want[i], &got[i], width))
                << what << ", stored as " << dtype_name(out) << ": of " << a[e] << " and " << b[e]
                << " (element " << e << ")";
          }
        }
      }
    }
  }
}

// Rounding to bfloat16 over a sweep of the float32 bit patterns, dense among the subnormals
// (which the AVX512_BF16 conversion flushes, so their vectors take the integer rounding) and
// around the smallest normal, with vectors of subnormals alone, mixed with other lanes and
// without any: on every instruction set, rounded inside a chain (then scaled by 1) and stored as
// bfloat16 by the code, the bits of bfloat16::round_bits.
TEST(FusedCode, RoundsToBFloat16AsRoundBitsOverTheFloatRange) {
  if (!fused_jit_available())
    GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  std::vector<float> x;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65537)
    x.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t u = 0; u < 0x00900000u; u += 997) x.push_back(std::bit_cast<float>(sign | u));
  const auto n = static_cast<int64_t>(x.size());
  float one = 1.0f;
  const std::vector<TensorView> in{{x.data(), DType::Float32, {n}}, {&one, DType::Float32, {1}}};
  // The rounding, stored as bfloat16 (inside: false), or scaled by 1 after it (true).
  auto fusion = [&](bool inside) {
    ir::Fusion f;
    f.compute = DType::Float32;
    f.shape = {n};
    f.loads = {{0, DType::Float32, {n}, {1}}, {1, DType::Float32, {n}, {0}}};
    f.steps = {{Op::Cast, 0, -1, -1, 0, DType::BFloat16}};
    if (inside) f.steps.push_back({Op::Mul, 2, 1, -1, 0, DType::Float32});
    f.num_registers = static_cast<int>(f.loads.size() + f.steps.size());
    for (int v = 0; v < f.num_registers; ++v) f.register_of.push_back(v == 0 ? -1 : v);
    return f;
  };
  for (FusedIsa isa : fused_isas()) {
    for (bool inside : {false, true}) {
      const std::string what =
          std::string(fused_isa_name(isa)) + (inside ? ": inside a chain" : ": stored");
      const ir::Fusion f = fusion(inside);
      const DType out = inside ? DType::Float32 : DType::BFloat16;
      const auto code = compile_fused_code(f, out, isa);
      ASSERT_NE(code, nullptr) << what;
      std::vector<uint32_t> got(static_cast<std::size_t>(n));
      fused_kernel(f, in, {got.data(), out, {n}}, code.get());
      int differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t want = bfloat16::round_bits(x[i]);
        const uint32_t have =
            inside ? got[i] >> 16 : reinterpret_cast<const uint16_t*>(got.data())[i];
        if (have != want && ++differ <= 3)
          ADD_FAILURE() << what << ": " << std::hex << std::bit_cast<uint32_t>(x[i]) << " gave "
                        << have << ", not " << want;
      }
      EXPECT_EQ(differ, 0) << what;
    }
  }
}

// exp, sigmoid and silu where the code takes them (fused_code_takes_exp: AVX-512 in a build for
// it, AVX2 in a build for AVX2): the code's polynomials give the evaluator's bits (Eigen's pexp
// and logistic) over the whole float range, the clamps and cut-offs, special values and a
// masked tail, alone, after a shift by a splat (softmax's exp(x - max)), from bfloat16
// operands, and rounded to bfloat16.
TEST(FusedCode, ExpAndLogisticGiveTheEvaluatorsBits) {
  if (std::none_of(fused_isas().begin(), fused_isas().end(), fused_code_takes_exp))
    GTEST_SKIP() << "no fused code here computes this build's exp: it stays on the evaluator";
  std::vector<float> x{0.0f, -0.0f, 1.0f, -1.0f, 88.0f, 88.37f, 88.38f, 88.8f, 89.0f, -87.0f,
                       -88.37f, -88.38f, -100.0f, -104.0f, 1e-30f, -1e-30f, 1e-40f,
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::bit_cast<float>(0x7f800001u),  // a signalling NaN: which operand a max returns shows
                       std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
                       -9.0f, -9.0001f, -8.9999f, 15.72f, 15.73f, 20.0f};
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> wide(-110.0f, 110.0f), narrow(-2.0f, 2.0f);
  while (x.size() < 5000) x.push_back(x.size() % 2 ? wide(rng) : narrow(rng));
  x.push_back(0.5f);  // 5001: a tail of 9 lanes
  const auto n = static_cast<int64_t>(x.size());
  std::vector<bfloat16> h;
  for (float v : x) h.push_back(bfloat16(v));
  float shift = 3.25f;
  const TensorView xs{x.data(), DType::Float32, {n}}, hs{h.data(), DType::BFloat16, {n}},
      ss{&shift, DType::Float32, {1}};
  struct Chain {
    std::string what;
    bool from_halves, shifted, rounded;
  };
  for (FusedIsa isa : fused_isas())
  for (Op op : {Op::Exp, Op::Sigmoid, Op::Silu})
  for (Chain c : {Chain{"(x)", false, false, false}, Chain{"(x - m)", false, true, false},
                  Chain{"(bf16 x - m)", true, true, false}, Chain{"(x - m) to bf16", false, true, true}}) {
    if (!fused_code_takes_exp(isa)) continue;
    c.what = std::string(fused_isa_name(isa)) + ": " + ir::op_name(op) + c.what;
    ir::Fusion f;
    f.compute = DType::Float32;
    f.shape = {n};
    f.loads = {{0, c.from_halves ? DType::BFloat16 : DType::Float32, {n}, {1}},
               {1, DType::Float32, {n}, {0}}};
    int last = 0;
    if (c.shifted) {
      f.steps.push_back({Op::Sub, 0, 1, -1, 0, DType::Float32});
      last = 2;
    }
    f.steps.push_back({op, last, -1, -1, 0, DType::Float32});
    if (c.rounded) f.steps.push_back({Op::Cast, last + (c.shifted ? 1 : 2), -1, -1, 0, DType::BFloat16});
    f.num_registers = static_cast<int>(f.loads.size() + f.steps.size());
    for (int v = 0; v < f.num_registers; ++v) f.register_of.push_back(v);
    const DType out = c.rounded ? DType::BFloat16 : DType::Float32;
    const auto code = compile_fused_code(f, out, isa);
    ASSERT_NE(code, nullptr) << c.what;
    const std::vector<TensorView> in{c.from_halves ? hs : xs, ss};
    const auto size = static_cast<std::size_t>(n) * dtype_size(out);
    std::vector<unsigned char> want(size, 0xAB), got(size, 0xCD);
    fused_kernel(f, in, {want.data(), out, {n}});
    fused_kernel(f, in, {got.data(), out, {n}}, code.get());
    const std::size_t width = dtype_size(out);
    int differ = 0;
    for (std::size_t i = 0; i < size; i += width)
      if (std::memcmp(&want[i], &got[i], width) != 0 && ++differ <= 3)
        ADD_FAILURE() << c.what << ": element " << i / width << " (x = " << x[i / width] << ")";
    EXPECT_EQ(differ, 0) << c.what;
  }
}

// A reduction's prologue (compiler/fuse_reduce.cpp) runs through the code as well: per-channel
// sums and maxima of random chains, as batch norm's statistics and gradients reduce them.
TEST(FusedCode, ReductionProloguesGiveTheEvaluatorsBits) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  std::mt19937_64 rng(11);
  int compiled = 0;
  for (int64_t plane : {5, 64, 300, 1024}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t batch = 2 + static_cast<int64_t>(rng() % 3), channels = 1 + static_cast<int64_t>(rng() % 4);
      Case c = random_case(rng, batch, channels, plane, 1 + static_cast<int>(rng() % 10));
      c.fusion.shape = {batch, channels, plane};
      for (FusedIsa isa : fused_isas()) {
        const auto code = compile_fused_code(c.fusion, DType::Float32, isa);
        if (!code) continue;
        ++compiled;
        for (Op op : {Op::Sum, Op::Max}) {
          for (const std::vector<int64_t>& axes : {std::vector<int64_t>{0, 2}, std::vector<int64_t>{2}}) {
            const Shape out_shape{axes[0] == 0 ? 1 : batch, channels, 1};
            std::vector<uint32_t> want(static_cast<std::size_t>(shape_numel(out_shape))), got(want.size());
            fused_reduce_kernel(op, ir::AxesAttr{axes}, c.fusion, c.in, {want.data(), DType::Float32, out_shape});
            fused_reduce_kernel(op, ir::AxesAttr{axes}, c.fusion, c.in, {got.data(), DType::Float32, out_shape},
                                code.get());
            EXPECT_EQ(want, got) << fused_isa_name(isa) << ": " << ir::op_name(op) << " over " << axes.size()
                                 << " axes, plane " << plane << ": " << c.text;
          }
        }
      }
    }
  }
  EXPECT_GT(compiled, 8);
}

TEST(FusedCode, TakesOnlyTheStepsItComputesExactly) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  const int64_t n = 1000;
  auto fusion = [&](Op op) {
    ir::Fusion f;
    f.compute = DType::Float32;
    f.shape = {n};
    f.loads = {{0, DType::Float32, {n}, {1}}};
    f.steps = {{op, 0, -1, -1, 0, DType::Float32}};
    f.num_registers = 2;
    f.register_of = {-1, 1};
    return f;
  };
  // Square roots are correctly rounded on both sides.
  for (Op op : {Op::Relu, Op::Sqrt, Op::Rsqrt})
    EXPECT_NE(compile_fused_code(fusion(op), DType::Float32), nullptr) << ir::op_name(op);
  // Their bits come from Eigen's and libm's approximations: the evaluator keeps them.
  for (Op op : {Op::Log, Op::Tanh, Op::Erf, Op::Gelu})
    EXPECT_EQ(compile_fused_code(fusion(op), DType::Float32), nullptr) << ir::op_name(op);
  // Exp, sigmoid and silu: the code computes the polynomials the evaluator runs in this
  // build, Eigen's AVX-512 ones in a build for AVX-512 (where AVX2 code leaves them to the
  // evaluator), its generic 8-lane ones in a build for AVX2.
  for (FusedIsa isa : fused_isas()) {
#if defined(__AVX512F__)
    const bool takes = is_avx512(isa);
#else
    const bool takes = isa == FusedIsa::Avx2;
#endif
    EXPECT_EQ(fused_code_takes_exp(isa), takes) << fused_isa_name(isa);
    for (Op op : {Op::Exp, Op::Sigmoid, Op::Silu})
      EXPECT_EQ(compile_fused_code(fusion(op), DType::Float32, isa) != nullptr, takes)
          << fused_isa_name(isa) << " " << ir::op_name(op);
  }
  // A float64 fusion is the evaluator's.
  ir::Fusion f64 = fusion(Op::Relu);
  f64.compute = DType::Float64;
  f64.loads[0].dtype = DType::Float64;
  EXPECT_EQ(compile_fused_code(f64, DType::Float64), nullptr);
}

// More values live at once than vector registers, or more element operands than general
// registers: no code, and the evaluator's result stands.
TEST(FusedCode, LeavesFusionsTooWideForItsRegistersToTheEvaluator) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  const int64_t n = 777;
  for (int operands : {4, 12, 16}) {
    std::vector<std::vector<float>> data(operands, std::vector<float>(n));
    std::vector<TensorView> in;
    ir::Fusion f;
    f.compute = DType::Float32;
    f.shape = {n};
    for (int k = 0; k < operands; ++k) {
      for (int64_t i = 0; i < n; ++i) data[k][i] = static_cast<float>(k + 1) * 0.25f + static_cast<float>(i % 7);
      in.push_back({data[k].data(), DType::Float32, {n}});
      f.loads.push_back({k, DType::Float32, {n}, {1}});
    }
    // neg of each operand first, all live together, then summed.
    for (int k = 0; k < operands; ++k) f.steps.push_back({Op::Neg, k, -1, -1, 0, DType::Float32});
    int sum = operands;
    for (int k = 1; k < operands; ++k) {
      f.steps.push_back({Op::Add, sum, operands + k, -1, 0, DType::Float32});
      sum = static_cast<int>(f.loads.size() + f.steps.size()) - 1;
    }
    const int values = static_cast<int>(f.loads.size() + f.steps.size());
    f.num_registers = values;
    for (int v = 0; v < values; ++v) f.register_of.push_back(v < operands ? -1 : v);
    const auto code = compile_fused_code(f, DType::Float32);
    EXPECT_EQ(code != nullptr, operands <= 10) << operands << " operands";
    std::vector<float> out(n);
    fused_kernel(f, in, {out.data(), DType::Float32, {n}}, code.get());
    for (int64_t i = 0; i < n; ++i) {
      float want = -data[0][i];
      for (int k = 1; k < operands; ++k) want += -data[k][i];
      ASSERT_EQ(out[i], want) << operands << " operands, element " << i;
    }
  }
}

}  // namespace
}  // namespace loom::runtime

namespace loom::runtime {
namespace {

// A chain longer than the code's first page (the generator grows its buffer): 600 steps.
TEST(FusedCode, LongChainsGiveTheEvaluatorsBits) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  const int64_t n = 1003;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = 0.5f + static_cast<float>(i % 13) * 0.125f;
    y[i] = 0.75f + static_cast<float>(i % 5) * 0.0625f;
  }
  ir::Fusion f;
  f.compute = DType::Float32;
  f.shape = {n};
  f.loads = {{0, DType::Float32, {n}, {1}}, {1, DType::Float32, {n}, {1}}};
  int v = 0;
  for (int s = 0; s < 600; ++s) {
    const Op ops[] = {Op::Mul, Op::Add, Op::Maximum, Op::Sub};
    f.steps.push_back({ops[s % 4], v, 1, -1, 0, DType::Float32});
    v = static_cast<int>(f.loads.size() + f.steps.size()) - 1;
  }
  const int values = static_cast<int>(f.loads.size() + f.steps.size());
  f.num_registers = values;
  for (int k = 0; k < values; ++k) f.register_of.push_back(k < 2 ? -1 : k);
  for (FusedIsa isa : fused_isas()) {
    const auto code = compile_fused_code(f, DType::Float32, isa);
    ASSERT_NE(code, nullptr) << fused_isa_name(isa);
    const std::vector<TensorView> in{{x.data(), DType::Float32, {n}}, {y.data(), DType::Float32, {n}}};
    std::vector<uint32_t> want(n), got(n);
    fused_kernel(f, in, {want.data(), DType::Float32, {n}});
    fused_kernel(f, in, {got.data(), DType::Float32, {n}}, code.get());
    EXPECT_EQ(want, got) << fused_isa_name(isa);
  }
}

// A channels-last batch norm + ReLU rounded to bfloat16 (x bfloat16 [rows, C], per-channel scale
// and shift [1, C]) over 2^21 elements: tasks long enough for the per-channel operands' written-out
// periods to be repeated for the code's longer sub-blocks (kernels_fused.cpp's kCodePattern),
// with periods that do and do not divide it; the same bits as the evaluator, stored as bfloat16
// by the code and as float32.
TEST(FusedCode, ChannelsLastPerChannelOperandsOverLongTasksGiveTheEvaluatorsBits) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-3, 3);
  for (int64_t channels : {3, 16, 48, 64, 100}) {
    SCOPED_TRACE("C = " + std::to_string(channels));
    const int64_t rows = (int64_t{1} << 21) / channels + 5, n = rows * channels;  // and a tail
    std::vector<bfloat16> x(n);
    for (auto& v : x) v = bfloat16(rng() % 64 == 0 ? special(rng) : u(rng));
    std::vector<float> scale(channels), shift(channels);
    for (auto& v : scale) v = u(rng);
    for (auto& v : shift) v = rng() % 8 == 0 ? special(rng) : u(rng);
    ir::Fusion f;
    f.compute = DType::Float32;
    f.shape = {n};
    f.loads = {{0, DType::BFloat16, {n}, {1}},
               {1, DType::Float32, {rows, channels}, {0, 1}},
               {2, DType::Float32, {rows, channels}, {0, 1}}};
    f.steps = {{Op::Mul, 0, 1, -1, 0, DType::Float32},
               {Op::Add, 3, 2, -1, 0, DType::Float32},
               {Op::Relu, 4, -1, -1, 0, DType::Float32},
               {Op::Cast, 5, -1, -1, 0, DType::BFloat16}};
    f.num_registers = 7;
    for (int v = 0; v < 7; ++v) f.register_of.push_back(v);
    const std::vector<TensorView> in{{x.data(), DType::BFloat16, {n}},
                                     {scale.data(), DType::Float32, {1, channels}},
                                     {shift.data(), DType::Float32, {1, channels}}};
    for (FusedIsa isa : fused_isas()) {
      SCOPED_TRACE(fused_isa_name(isa));
      const auto code = compile_fused_code(f, DType::BFloat16, isa);
      ASSERT_NE(code, nullptr);
      ASSERT_TRUE(code->narrows());
      ASSERT_EQ(code->loads()[1], FusedCode::Load::Elements);
      for (DType out : {DType::BFloat16, DType::Float32}) {
        const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(out);
        std::vector<unsigned char> want(bytes, 0xAB), got(bytes, 0xCD);
        fused_kernel(f, in, {want.data(), out, {n}});
        fused_kernel(f, in, {got.data(), out, {n}}, code.get());
        EXPECT_TRUE(want == got) << dtype_name(out);
      }
    }
  }
}

// A bfloat16 result of every length from 0 to 64 (AVX2: the pairs of vectors, then one vector,
// then the tail; AVX-512: vectors and the tail), with a NaN in some: the evaluator's bits, and
// nothing written past the result.
TEST(FusedCode, BFloat16ResultsOfEveryShortLengthGiveTheEvaluatorsBits) {
  if (!fused_jit_available()) GTEST_SKIP() << "no fused machine code here (a CPU without AVX2, or LOOM_FUSED_JIT=0)";
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-3, 3);
  for (FusedIsa isa : fused_isas()) {
    SCOPED_TRACE(fused_isa_name(isa));
    for (int64_t n = 0; n <= 64; ++n) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (auto& v : x) v = u(rng);
      // A NaN that the rounding's add alone would make infinite.
      if (n % 3 == 1) x[static_cast<std::size_t>(n / 2)] = std::bit_cast<float>(0x7f800001u);
      float scale = 1.5f;
      ir::Fusion f;
      f.compute = DType::Float32;
      f.shape = Shape{n};
      f.loads.push_back({0, DType::Float32, Shape{n}, Shape{1}});
      f.loads.push_back({1, DType::Float32, Shape{n}, Shape{0}});
      f.steps = {{Op::Mul, 0, 1, -1, 0, DType::Float32}, {Op::Cast, 2, -1, -1, 0, DType::BFloat16}};
      f.num_registers = 4;
      for (int v = 0; v < 4; ++v) f.register_of.push_back(v == 0 ? -1 : v);
      const auto code = compile_fused_code(f, DType::BFloat16, isa);
      ASSERT_NE(code, nullptr);
      ASSERT_TRUE(code->narrows());
      const std::vector<TensorView> in{{x.data(), DType::Float32, {n}}, {&scale, DType::Float32, {1}}};
      // Guard words after the result, which the code must leave as they are.
      std::vector<uint16_t> want(static_cast<std::size_t>(n) + 16, 0xabcd), got(want.size(), 0xabcd);
      fused_kernel(f, in, {want.data(), DType::BFloat16, {n}});
      fused_kernel(f, in, {got.data(), DType::BFloat16, {n}}, code.get());
      EXPECT_EQ(want, got) << "n = " << n;
    }
  }
}

}  // namespace
}  // namespace loom::runtime
