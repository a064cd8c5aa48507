// Elementwise kernels: constant fill, iota, unary and binary maps, cast and where. Every
// one is a flat loop over contiguous buffers (shape inference made operand shapes equal), split
// into TBB chunks; the inner loops are simple enough for the compiler to vectorize.
#include "runtime/cpu/kernels_impl.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace loom::runtime {
namespace {

using ir::Op;

// Converts to a storage type; bool is "not zero", as in PyTorch.
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<To, BoolStorage>)
    return static_cast<BoolStorage>(v != From(0));
  else
    return static_cast<To>(v);
}

template <class In, class Out, class F>
void map1(const TensorView& x, const TensorView& out, int64_t grain, F f) {
  const In* px = x.as<const In>();
  Out* po = out.as<Out>();
  parallel_range(out.numel(), grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = f(px[i]);
  });
}

template <class In, class Out, class F>
void map2(const TensorView& a, const TensorView& b, const TensorView& out, int64_t grain, F f) {
  const In* pa = a.as<const In>();
  const In* pb = b.as<const In>();
  Out* po = out.as<Out>();
  parallel_range(out.numel(), grain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) po[i] = f(pa[i], pb[i]);
  });
}

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

// Numerically stable: exp never sees a large positive argument.
template <class T>
T sigmoid(T v) {
  if (v >= T(0)) return T(1) / (T(1) + std::exp(-v));
  T z = std::exp(v);
  return z / (T(1) + z);
}

// Unary ops defined on every numeric dtype.
template <class T>
bool unary_any_numeric(Op op, const TensorView& x, const TensorView& out) {
  constexpr int64_t g = kGrainElementwise;
  switch (op) {
    case Op::Neg: map1<T, T>(x, out, g, [](T v) { return T(-v); }); return true;
    case Op::Abs: map1<T, T>(x, out, g, [](T v) { return T(std::abs(v)); }); return true;
    // v < 0 (not v > 0) so that relu(NaN) is NaN, as in PyTorch.
    case Op::Relu: map1<T, T>(x, out, g, [](T v) { return v < T(0) ? T(0) : v; }); return true;
    default: return false;  // not one of these three; the caller tries the float-only ops
  }
}

template <class T>
void unary_float(Op op, const TensorView& x, const TensorView& out) {
  constexpr int64_t g = kGrainTranscendental;
  const T half(0.5), one(1);
  switch (op) {
    case Op::Exp: return map1<T, T>(x, out, g, [](T v) { return std::exp(v); });
    case Op::Log: return map1<T, T>(x, out, g, [](T v) { return std::log(v); });
    case Op::Sqrt: return map1<T, T>(x, out, g, [](T v) { return std::sqrt(v); });
    case Op::Rsqrt: return map1<T, T>(x, out, g, [one](T v) { return one / std::sqrt(v); });
    case Op::Sigmoid: return map1<T, T>(x, out, g, [](T v) { return sigmoid(v); });
    case Op::Tanh: return map1<T, T>(x, out, g, [](T v) { return std::tanh(v); });
    case Op::Silu: return map1<T, T>(x, out, g, [](T v) { return v * sigmoid(v); });
    case Op::Gelu: {
      const T inv_sqrt2 = T(0.70710678118654752440);
      return map1<T, T>(x, out, g, [=](T v) { return v * half * (one + std::erf(v * inv_sqrt2)); });
    }
    case Op::GeluTanh: {
      const T k = T(0.79788456080286535588);  // sqrt(2/pi)
      const T c = T(0.044715);
      return map1<T, T>(x, out, g, [=](T v) {
        return half * v * (one + std::tanh(k * (v + c * v * v * v)));
      });
    }
    case Op::Erf: return map1<T, T>(x, out, g, [](T v) { return std::erf(v); });
    case Op::Sin: return map1<T, T>(x, out, g, [](T v) { return std::sin(v); });
    case Op::Cos: return map1<T, T>(x, out, g, [](T v) { return std::cos(v); });
    default: break;  // the remaining ops are not float unary ops
  }
  assert(false && "unary_float: not a unary op");
}

}  // namespace

void fill_value(const TensorView& out, double value) {
  visit_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = convert<T>(value);
    T* po = out.as<T>();
    parallel_range(out.numel(), kGrainElementwise, [&](int64_t b, int64_t e) {
      std::fill(po + b, po + e, v);
    });
  });
}

void iota_kernel(const ir::Attr& attr, const TensorView& out) {
  auto dim = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  int64_t size = out.shape[dim];
  int64_t inner = dims_product(out.shape, dim + 1, out.shape.size());
  visit_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.as<T>();
    parallel_range(out.numel(), kGrainElementwise, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = convert<T>((i / inner) % size);
    });
  });
}

void unary_kernel(Op op, const TensorView& x, const TensorView& out) {
  if (op == Op::LogicalNot) {
    visit_dtype(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      map1<T, BoolStorage>(x, out, kGrainElementwise,
                           [](T v) { return static_cast<BoolStorage>(v == T(0)); });
    });
    return;
  }
  visit_numeric(ir::op_name(op), x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (unary_any_numeric<T>(op, x, out)) return;
    if constexpr (std::is_floating_point_v<T>)
      unary_float<T>(op, x, out);
    else
      unsupported_dtype(ir::op_name(op), x.dtype);
  });
}

void cast_kernel(const TensorView& x, const TensorView& out) {
  if (x.dtype == out.dtype) {
    if (x.data != out.data) std::memcpy(out.data, x.data, out.numel() * dtype_size(out.dtype));
    return;
  }
  visit_dtype(x.dtype, [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    visit_dtype(out.dtype, [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      map1<In, Out>(x, out, kGrainElementwise, [](In v) { return convert<Out>(v); });
    });
  });
}

void binary_kernel(Op op, const TensorView& a, const TensorView& b, const TensorView& out) {
  constexpr int64_t g = kGrainElementwise;
  // Comparisons work on every dtype (bool included) and produce bool.
  bool is_comparison = op == Op::Eq || op == Op::Ne || op == Op::Lt || op == Op::Le ||
                       op == Op::Gt || op == Op::Ge;
  if (is_comparison) {
    visit_dtype(a.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using B = BoolStorage;
      switch (op) {
        case Op::Eq: return map2<T, B>(a, b, out, g, [](T x, T y) { return B(x == y); });
        case Op::Ne: return map2<T, B>(a, b, out, g, [](T x, T y) { return B(x != y); });
        case Op::Lt: return map2<T, B>(a, b, out, g, [](T x, T y) { return B(x < y); });
        case Op::Le: return map2<T, B>(a, b, out, g, [](T x, T y) { return B(x <= y); });
        case Op::Gt: return map2<T, B>(a, b, out, g, [](T x, T y) { return B(x > y); });
        case Op::Ge: return map2<T, B>(a, b, out, g, [](T x, T y) { return B(x >= y); });
        default: break;  // not a comparison; excluded by is_comparison
      }
    });
    return;
  }
  visit_numeric(ir::op_name(op), a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr bool fp = std::is_floating_point_v<T>;
    switch (op) {
      case Op::Add: return map2<T, T>(a, b, out, g, [](T x, T y) { return T(x + y); });
      case Op::Sub: return map2<T, T>(a, b, out, g, [](T x, T y) { return T(x - y); });
      case Op::Mul: return map2<T, T>(a, b, out, g, [](T x, T y) { return T(x * y); });
      // NaN wins in maximum/minimum, as in torch.maximum (when y is NaN, x > y is false).
      case Op::Maximum:
        return map2<T, T>(a, b, out, g, [](T x, T y) { return (is_nan(x) || x > y) ? x : y; });
      case Op::Minimum:
        return map2<T, T>(a, b, out, g, [](T x, T y) { return (is_nan(x) || x < y) ? x : y; });
      case Op::Div:
        if constexpr (fp) return map2<T, T>(a, b, out, g, [](T x, T y) { return x / y; });
        break;
      case Op::Pow:
        if constexpr (fp)
          return map2<T, T>(a, b, out, kGrainTranscendental,
                            [](T x, T y) { return std::pow(x, y); });
        break;
      default: assert(false && "binary_kernel: not a binary op"); return;
    }
    unsupported_dtype(ir::op_name(op), a.dtype);
  });
}

void where_kernel(const TensorView& cond, const TensorView& a, const TensorView& b,
                  const TensorView& out) {
  // Only the element width matters, so one instantiation serves int64 and float64 alike.
  visit_width(out.dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const BoolStorage* pc = cond.as<const BoolStorage>();
    const U* pa = a.as<const U>();
    const U* pb = b.as<const U>();
    U* po = out.as<U>();
    parallel_range(out.numel(), kGrainElementwise, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = pc[i] ? pa[i] : pb[i];
    });
  });
}

}  // namespace loom::runtime
