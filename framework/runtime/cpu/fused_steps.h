// The one implementation of every elementwise op (run_step), for kernels_fused.cpp only:
// fusions run it, and so does an op alone (elementwise_kernel, which run_kernel calls for every
// dtype), so lazy, eager and compiled execution, fused or not, compute each element with the
// same code and agree exactly. Each step is one simple loop over at most kFusedBlock elements,
// which the compiler vectorises, a splat operand being a scalar in a vector register;
// transcendental functions use Eigen's vectorised versions (vector_map).
#pragma once

// GCC 12 reports its own AVX-512 intrinsics' undefined placeholders as uninitialized when
// Eigen's vectorised sin/cos inline them (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "ir/program.h"
#include "ir/unreachable.h"
#include "runtime/cpu/kernels_fused.h"
#include "runtime/cpu/kernels_impl.h"

#include <Eigen/Core>

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace loom::runtime::fused_steps {

using ir::FusedStep;
using ir::Op;

template <class T>
using Array = Eigen::Array<T, Eigen::Dynamic, 1>;

// d = f(a) over n <= kFusedBlock elements with Eigen's vectorised functions. The operand is
// copied into an aligned buffer padded to whole packets, so every element goes through the
// same packet code wherever it sits: Eigen would otherwise compute unaligned heads and short
// tails with the scalar library function, whose last bits differ, and a value would then
// depend on how a kernel happened to cut its work into blocks.
template <class T, class F>
void vector_map(const T* a, T* d, int64_t n, F f) {
  constexpr int64_t kPacket = 64 / sizeof(T);
  auto aligned = [](const T* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; };
  if (n % kPacket == 0 && aligned(a) && aligned(d)) {  // already whole aligned packets
    Eigen::Map<const Array<T>, Eigen::Aligned64> x(a, n);
    Eigen::Map<Array<T>, Eigen::Aligned64> y(d, n);
    y = f(x);
    return;
  }
  alignas(64) T in[kFusedBlock];
  alignas(64) T out[kFusedBlock];
  const int64_t padded = (n + kPacket - 1) / kPacket * kPacket;
  std::copy(a, a + n, in);
  std::fill(in + n, in + padded, T(0));
  Eigen::Map<Array<T>, Eigen::Aligned64> x(in, padded), y(out, padded);
  y = f(x);
  std::copy(out, out + n, d);
}

// Eigen's vectorised exp clamps its argument below, so that every x under the bound, -Inf
// included, gives the one tiny value exp(bound) (about 3e-39 in float32), where PyTorch gives
// subnormals and, at -Inf, 0 (a softmax's masked lanes); and AVX-512's float exp clamps above at
// 88.376, so that exp(100) was about 2.4e38, not Inf. exp flushes the lanes below the lower
// bound to 0 and those past the largest finite exp to +Inf (exp_flushed), the fused code with
// the same constants. (Left as Eigen computes them: float32's subnormal results, and on
// AVX-512 exp(x) for x in (88.376, 88.723], which stays at exp(88.376).)
template <class T>
constexpr T exp_lower_bound() {
  if constexpr (std::is_same_v<T, double>) return -709.784;  // pexp_double's cst_exp_lo
#if defined(__AVX512F__)
  return -88.3762626647949f;  // pexp<Packet16f>'s exp_lo
#else
  return -88.723f;            // the generic pexp_float's cst_exp_lo (Packet8f, Packet4f)
#endif
}
// The largest x whose exp is finite in T (the float below ln(FLT_MAX); ln(DBL_MAX)).
template <class T>
constexpr T exp_overflow_bound() {
  if constexpr (std::is_same_v<T, double>) return 709.782712893384;
  return 88.72283172607422f;
}

// d = exp(a): Eigen's, 0 below its lower bound and +Inf past the overflow bound.
template <class T>
void exp_flushed(const T* a, T* __restrict d, int64_t n) {
  vector_map(a, d, n, [](const auto& x) { return x.exp(); });
  const T lower = exp_lower_bound<T>(), upper = exp_overflow_bound<T>();
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] < lower) d[i] = T(0);
    if (a[i] > upper) d[i] = std::numeric_limits<T>::infinity();
  }
}

// d = sigmoid(a) = 1 / (1 + exp(-a)), or silu(a) = a / (1 + exp(-a)) (times_x), as PyTorch's
// CPU kernels compute them, with exp_flushed (0 at +Inf, so 1; Inf at -Inf, so 0, and silu's
// -Inf / Inf NaN, as in PyTorch). (Eigen's float logistic, a rational polynomial plus 0.5,
// cancelled for negative x: 4e-4 relative error near -8, exp(x) below -9.)
template <class T>
void logistic(const T* a, T* __restrict d, int64_t n, bool times_x) {
  alignas(64) T negated[kFusedBlock];
  for (int64_t i = 0; i < n; ++i) negated[i] = -a[i];
  exp_flushed(negated, d, n);
  if (times_x)
    for (int64_t i = 0; i < n; ++i) d[i] = a[i] / (T(1) + d[i]);
  else
    for (int64_t i = 0; i < n; ++i) d[i] = T(1) / (T(1) + d[i]);
}

// d = sqrt(a), correctly rounded (IEEE), as PyTorch computes it and as the fused code does
// (vsqrtps): Eigen's fast float sqrt is an rsqrt estimate and a Newton step, a few ulps off,
// and NaN at +Inf.
template <class T>
void sqrt_exact(const T* a, T* d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_sqrt_ps(_mm512_loadu_ps(a + i)));
  if constexpr (std::is_same_v<T, double>)
    for (; i + 8 <= n; i += 8) _mm512_storeu_pd(d + i, _mm512_sqrt_pd(_mm512_loadu_pd(a + i)));
#elif defined(__AVX__)
  if constexpr (std::is_same_v<T, float>)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_sqrt_ps(_mm256_loadu_ps(a + i)));
  if constexpr (std::is_same_v<T, double>)
    for (; i + 4 <= n; i += 4) _mm256_storeu_pd(d + i, _mm256_sqrt_pd(_mm256_loadu_pd(a + i)));
#endif
  for (; i < n; ++i) d[i] = std::sqrt(a[i]);
}

// A step's operand over a block of n elements: n elements in memory, or one value standing for
// all of them (a splat), `p` then pointing at that value; no pointer for an operand the op
// does not take.
template <class T>
struct Operand {
  const T* p = nullptr;
  bool splat = false;
};

// True when every operand a step has is a splat (an absent operand has no pointer): the step's
// result is then one value too.
template <class T>
bool only_splats(Operand<T> a, Operand<T> b, Operand<T> c) {
  return (!a.p || a.splat) && (!b.p || b.splat) && (!c.p || c.splat);
}

// How the loops of a binary or ternary step read an operand: element i, or the one value (held
// in a register, so the loop reads one stream less).
template <class T>
struct Elems {
  const T* p;
  T operator[](int64_t i) const { return p[i]; }
};
template <class T>
struct Splat {
  T v;
  T operator[](int64_t) const { return v; }
};

// Constant and the unary ops: d = op(a) over n <= kFusedBlock elements.
template <class T>
void unary_op(const FusedStep& s, const T* a, T* __restrict d, int64_t n) {
  constexpr bool fp = std::is_floating_point_v<T>;
  const T zero(0), one(1);
  switch (s.op) {
    case Op::Constant: std::fill(d, d + n, static_cast<T>(s.scalar)); return;
    case Op::Neg: for (int64_t i = 0; i < n; ++i) d[i] = -a[i]; return;
    case Op::Abs: for (int64_t i = 0; i < n; ++i) d[i] = std::abs(a[i]); return;
    // a < 0 (not a > 0) so that relu(NaN) is NaN, as in PyTorch.
    case Op::Relu: for (int64_t i = 0; i < n; ++i) d[i] = a[i] < zero ? zero : a[i]; return;
    case Op::Exp:
      if constexpr (fp) return exp_flushed(a, d, n);
      break;
    case Op::Log:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.log(); });
      break;
    case Op::Sqrt:
      if constexpr (fp) return sqrt_exact(a, d, n);
      break;
    case Op::Rsqrt:  // 1 / sqrt(a), each rounded: 0 at +Inf, as the fused code computes it
      if constexpr (fp) {
        sqrt_exact(a, d, n);
        for (int64_t i = 0; i < n; ++i) d[i] = one / d[i];
        return;
      }
      break;
    case Op::Sigmoid:
      if constexpr (fp) return logistic(a, d, n, false);
      break;
    case Op::Tanh:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.tanh(); });
      break;
    case Op::Silu:
      if constexpr (fp) return logistic(a, d, n, true);
      break;
    case Op::Sin:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.sin(); });
      break;
    case Op::Cos:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.cos(); });
      break;
    case Op::Erf:
      if constexpr (fp) {
        for (int64_t i = 0; i < n; ++i) d[i] = std::erf(a[i]);
        return;
      }
      break;
    case Op::Gelu:
      if constexpr (fp) {
        const T half(0.5), inv_sqrt2(0.70710678118654752440);
        for (int64_t i = 0; i < n; ++i) d[i] = a[i] * half * (one + std::erf(a[i] * inv_sqrt2));
        return;
      }
      break;
    case Op::GeluTanh:
      if constexpr (fp) {
        const T half(0.5), k(0.79788456080286535588), c3(0.044715);  // k = sqrt(2/pi)
        for (int64_t i = 0; i < n; ++i) d[i] = k * (a[i] + c3 * a[i] * a[i] * a[i]);
        vector_map(d, d, n, [](const auto& x) { return x.tanh(); });
        for (int64_t i = 0; i < n; ++i) d[i] = half * a[i] * (one + d[i]);
        return;
      }
      break;
    case Op::LogicalNot: for (int64_t i = 0; i < n; ++i) d[i] = a[i] == zero ? one : zero; return;
    case Op::Cast:
      // Members of a fusion produce the compute type, bool, or bfloat16 (widen.h), so a cast
      // is a copy, a test or a rounding to bfloat16 (through float32, as cast_kernel converts).
      // (Casts between dtypes, outside fusions, are cast_kernel's.)
      if (s.dtype == DType::Bool) {
        for (int64_t i = 0; i < n; ++i) d[i] = a[i] != zero ? one : zero;
      } else if (s.dtype == DType::BFloat16) {
        if constexpr (fp)
          for (int64_t i = 0; i < n; ++i)
            d[i] = static_cast<T>(round_to_bfloat16(static_cast<float>(a[i])));
        else
          unsupported_dtype("cast", DType::BFloat16);
      } else {
        std::copy(a, a + n, d);
      }
      return;

    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow: case Op::Maximum:
    case Op::Minimum: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt:
    case Op::Ge: case Op::Where:
      LOOM_UNREACHABLE("elementwise step: a binary or ternary op taken for a unary one");
    // Not elementwise: the fusion pass admits none of these, and run_kernel sends them
    // elsewhere.
    case Op::DeviceData: case Op::Iota: case Op::RandUniform: case Op::RandNormal:
    case Op::Sum: case Op::Mean: case Op::Max: case Op::ArgMax:
    case Op::Reshape: case Op::Permute: case Op::Slice: case Op::Expand: case Op::Pad:
    case Op::Concat: case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Im2col: case Op::Gather: case Op::IndexSelect:
    case Op::ScatterAdd: case Op::OneHot: case Op::Count_:
      LOOM_UNREACHABLE("elementwise step: not an elementwise op");
  }
  // Only a floating-point op on an integer or bool T breaks out of the switch.
  if constexpr (!fp) unsupported_dtype(ir::op_name(s.op), storage_dtype_of<T>());
  LOOM_UNREACHABLE("elementwise step: op out of range");
}

// The binary ops and Where: d = op(a, b, c) over n <= kFusedBlock elements, each operand
// read through Elems or Splat.
template <class T, class A, class B, class C>
void nary_op(const FusedStep& s, A a, B b, C c, T* __restrict d, int64_t n) {
  constexpr bool fp = std::is_floating_point_v<T>;
  const T zero(0), one(1);
  switch (s.op) {
    case Op::Add: for (int64_t i = 0; i < n; ++i) d[i] = a[i] + b[i]; return;
    case Op::Sub: for (int64_t i = 0; i < n; ++i) d[i] = a[i] - b[i]; return;
    case Op::Mul: for (int64_t i = 0; i < n; ++i) d[i] = a[i] * b[i]; return;
    case Op::Div:
      if constexpr (fp) {
        for (int64_t i = 0; i < n; ++i) d[i] = a[i] / b[i];
        return;
      }
      break;
    case Op::Pow:
      if constexpr (fp) {
        for (int64_t i = 0; i < n; ++i) d[i] = std::pow(a[i], b[i]);
        return;
      }
      break;
    // NaN wins, as in torch.maximum (when b is NaN, a > b is false).
    case Op::Maximum:
      for (int64_t i = 0; i < n; ++i) d[i] = (a[i] != a[i] || a[i] > b[i]) ? a[i] : b[i];
      return;
    case Op::Minimum:
      for (int64_t i = 0; i < n; ++i) d[i] = (a[i] != a[i] || a[i] < b[i]) ? a[i] : b[i];
      return;
    case Op::Eq: for (int64_t i = 0; i < n; ++i) d[i] = a[i] == b[i] ? one : zero; return;
    case Op::Ne: for (int64_t i = 0; i < n; ++i) d[i] = a[i] != b[i] ? one : zero; return;
    case Op::Lt: for (int64_t i = 0; i < n; ++i) d[i] = a[i] < b[i] ? one : zero; return;
    case Op::Le: for (int64_t i = 0; i < n; ++i) d[i] = a[i] <= b[i] ? one : zero; return;
    case Op::Gt: for (int64_t i = 0; i < n; ++i) d[i] = a[i] > b[i] ? one : zero; return;
    case Op::Ge: for (int64_t i = 0; i < n; ++i) d[i] = a[i] >= b[i] ? one : zero; return;
    case Op::Where: for (int64_t i = 0; i < n; ++i) d[i] = a[i] != zero ? b[i] : c[i]; return;

    case Op::Constant: case Op::Neg: case Op::Abs: case Op::Relu: case Op::Exp: case Op::Log:
    case Op::Sqrt: case Op::Rsqrt: case Op::Sigmoid: case Op::Tanh: case Op::Silu: case Op::Sin:
    case Op::Cos: case Op::Erf: case Op::Gelu: case Op::GeluTanh: case Op::LogicalNot:
    case Op::Cast:
      LOOM_UNREACHABLE("elementwise step: a unary op taken for a binary one");
    case Op::DeviceData: case Op::Iota: case Op::RandUniform: case Op::RandNormal:
    case Op::Sum: case Op::Mean: case Op::Max: case Op::ArgMax:
    case Op::Reshape: case Op::Permute: case Op::Slice: case Op::Expand: case Op::Pad:
    case Op::Concat: case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Im2col: case Op::Gather: case Op::IndexSelect:
    case Op::ScatterAdd: case Op::OneHot: case Op::Count_:
      LOOM_UNREACHABLE("elementwise step: not an elementwise op");
  }
  if constexpr (!fp) unsupported_dtype(ir::op_name(s.op), storage_dtype_of<T>());
  LOOM_UNREACHABLE("elementwise step: op out of range");
}

// The one implementation of every elementwise op: d = op(a, b, c) over n <= kFusedBlock
// elements (unary_op and nary_op hold the arithmetic, one loop per op). Fusions run it in
// their compute type (float or double); elementwise_kernel runs it for an op alone, in any
// dtype. Booleans are 0 or 1 in T. Ops defined on floating point only (shape inference rejects
// them on other dtypes) throw for an integer or bool T.
//
// A splat operand gives each element the value an array of copies would: the same expression
// on the same values. When every operand is a splat (a Constant, a step on per-channel values
// only), the step is computed once and copied; a one-element step takes the same loop (and,
// for a transcendental, the same padded packet path) as a long one, so the bits are the same.
template <class T>
void run_step(const FusedStep& s, Operand<T> a, Operand<T> b, Operand<T> c, T* __restrict d,
              int64_t n) {
  const bool all_splat = only_splats(a, b, c);
  if (all_splat && n > 1) {
    run_step(s, a, b, c, d, 1);
    std::fill(d + 1, d + n, d[0]);
    return;
  }
  if (!b.p) return unary_op<T>(s, a.p, d, n);  // Constant or a unary op
  // Which of the operands are splats, as bits (a: 1, b: 2, c: 4); a one-element step reads
  // its splats as arrays of one.
  const int splats = all_splat ? 0 : (a.splat ? 1 : 0) | (b.splat ? 2 : 0) | (c.splat ? 4 : 0);
  using E = Elems<T>;
  using S = Splat<T>;
  if constexpr (std::is_floating_point_v<T>) {  // only fusions (float or double) have splats
    switch (splats) {
      case 1: return nary_op<T>(s, S{*a.p}, E{b.p}, E{c.p}, d, n);
      case 2: return nary_op<T>(s, E{a.p}, S{*b.p}, E{c.p}, d, n);
      case 3: return nary_op<T>(s, S{*a.p}, S{*b.p}, E{c.p}, d, n);
      case 4: return nary_op<T>(s, E{a.p}, E{b.p}, S{*c.p}, d, n);
      case 5: return nary_op<T>(s, S{*a.p}, E{b.p}, S{*c.p}, d, n);
      case 6: return nary_op<T>(s, E{a.p}, S{*b.p}, S{*c.p}, d, n);
      default: break;  // 0: arrays only (7 is all_splat, taken above)
    }
  }
  assert(splats == 0 && "elementwise step: splat operand outside a fusion");
  nary_op<T>(s, E{a.p}, E{b.p}, E{c.p}, d, n);
}

// Operands in memory, n elements each.
template <class T>
void run_step(const FusedStep& s, const T* a, const T* b, const T* c, T* __restrict d,
              int64_t n) {
  run_step<T>(s, Operand<T>{a}, Operand<T>{b}, Operand<T>{c}, d, n);
}

}  // namespace loom::runtime::fused_steps
